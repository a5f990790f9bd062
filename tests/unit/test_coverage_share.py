"""When the CPU coverage note speaks: a gap of the process's CPU outside the profile above 5 %
(threads that run no Python are not sampled), above 2 % when every thread is sampled."""

from __future__ import annotations

import numpy as np

from ddprof_nb.engines.native.process_cpu import QUIET_SHARE_ALL_THREADS, CpuSnapshot, coverage_notes
from ddprof_nb.events import EventType
from ddprof_nb.model import Frame, Metadata, ProfileBuilder


def _cpu_profile(ns: int):
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10**9, interval_ns=10**7, engine="test"))
    stack = b.stack_id([b.frame_id(Frame("work", "/app/w.py", 3, 1))])
    b.add_many(EventType.CPU, np.array([stack], np.int32), np.array([b.thread_id(1, "MainThread")], np.int32),
               np.array([b.labels_id({})], np.int32), np.array([0]), np.array([[1, ns]], np.int64))
    return b.build()


def _notes(in_profile: int, process: int, **kw):
    start = CpuSnapshot(0, {1: ("python", 0), 2: ("pool", 0)})
    stop = CpuSnapshot(process, {1: ("python", in_profile), 2: ("pool", process - in_profile)})
    return coverage_notes(start, stop, _cpu_profile(in_profile), **kw)


def test_a_three_percent_gap_is_named_only_when_every_thread_is_sampled():
    assert _notes(970, 1000) == []
    (note,) = _notes(970, 1000, quiet_share=QUIET_SHARE_ALL_THREADS)
    assert note.startswith("cpu: the profile holds") and "pool" in note, note
    assert _notes(990, 1000, quiet_share=QUIET_SHARE_ALL_THREADS) == []


def test_a_six_percent_gap_is_always_named():
    (note,) = _notes(940, 1000)
    assert "97%" not in note and "(94%)" in note, note
