"""How much of the process's CPU a profile holds, and where the rest went.

The engine samples the threads that run Python.  Libraries run their own pools of native
threads (BLAS, OpenMP, dataframe and database engines, ZeroMQ's I/O threads) whose CPU the
profile does not hold; without a word the CPU profile of a data notebook is wrong by a
factor.  So the engine reads the process's CPU clock and every thread's CPU clock at start
and at stop, and a note names the threads that ran outside the profile, by name, and how
much CPU they used.  A snapshot reads clocks only (``clock_gettime`` keeps the GIL, where
each ``/proc`` file read gave it up: beside a busy thread a snapshot of 11 threads took
20 ms); names are read for the threads a note names.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ...events import EventType
from ...render.format import format_duration

__all__ = ["CpuSnapshot", "snapshot", "coverage_notes"]

# below this share of the process's CPU outside the profile, nothing is said: a notebook
# kernel's own I/O threads (ZeroMQ), an interpreter's helper threads and the clocks'
# granularity stay within it, and a warning on every profile would be read as noise.  When
# every thread is sampled (native_threads) the profile should hold it all: a smaller gap is named.
QUIET_SHARE = 0.05
QUIET_SHARE_ALL_THREADS = 0.02


@dataclass(frozen=True)
class CpuSnapshot:
    process_ns: int
    threads: dict[int, tuple[str, int]]  # tid -> (OS thread name, "" when not read; CPU ns so far)


def thread_name(tid: int) -> str:
    """The OS name of this process's thread ``tid`` ("" when it has exited)."""
    try:
        with open(f"/proc/self/task/{tid}/comm", "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _thread_cpu_ns(tid: int) -> int | None:
    try:
        return time.clock_gettime_ns((~tid << 3) | 6)  # (its CPU clock: CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED)
    except OSError:
        return None  # exited meanwhile


def snapshot(names: bool = False) -> CpuSnapshot:
    """The process's CPU clock and every thread's (their names too with ``names``)."""
    threads = {}
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = []
    for tid in tids:
        ns = _thread_cpu_ns(tid)
        if ns is not None:
            threads[tid] = (thread_name(tid) if names else "", ns)
    return CpuSnapshot(time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID), threads)


def coverage_notes(start: CpuSnapshot, stop: CpuSnapshot, profile, own_tids: set[int] = frozenset(),
                   own_names: tuple[str, ...] = ("ddprof_nb-",), quiet_share: float = QUIET_SHARE) -> list[str]:
    """Notes when the profile's CPU total, with the profiler's own threads, misses more than
    ``quiet_share`` of the process's CPU in the session: the threads outside it (by name, with their
    CPU), the profiler's own threads, and what is left (threads that started and ended unseen)."""
    process = stop.process_ns - start.process_ns
    if process <= 0 or not stop.threads:
        return []
    cpu = profile.event == EventType.CPU.value
    in_profile = int(profile.values[cpu, 1].sum()) if cpu.any() else 0
    sampled = {profile.threads[i].tid for i in np.unique(profile.thread[cpu])} if cpu.any() else set()
    missing = process - in_profile
    if missing <= quiet_share * process:
        return []
    own = 0  # (the profiler's own threads: its overhead, which alone never makes a note)
    outside: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for tid, (name, ns) in stop.threads.items():
        if tid in sampled:
            continue
        used = ns - start.threads[tid][1] if tid in start.threads else ns
        if used <= 0:
            continue
        name = name or thread_name(tid) or f"thread {tid}"
        if tid in own_tids or name.startswith(own_names):
            own += used
        else:
            outside[name] += used
            count[name] += 1
    total_outside = sum(outside.values())
    if missing - own <= quiet_share * process:
        return []
    share = in_profile / process
    parts = [f"cpu: the profile holds {format_duration(in_profile)} of the process's {format_duration(process)} "
             f"of CPU in the session ({share:.0%})"]
    if total_outside:
        names = ", ".join(f"{name}{f' ×{count[name]}' if count[name] > 1 else ''} {format_duration(ns)}"
                          for name, ns in outside.most_common(4))
        more = f" and {len(outside) - 4} more" if len(outside) > 4 else ""
        parts.append(f"{format_duration(total_outside)} ran on threads that run no Python, not in this profile "
                     f"({names}{more}): native worker pools (BLAS, OpenMP, a library's own threads; "
                     "native_threads='attribute' samples them)")
    if own:
        parts.append(f"{format_duration(own)} was the profiler's own threads")
    rest = missing - total_outside - own
    if rest > quiet_share * process:
        parts.append(f"{format_duration(rest)} went to threads that ended before stop outside the profile "
                     "(or to the clocks' rounding), not in this profile")
    return ["; ".join(parts)]
