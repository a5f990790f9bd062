"""Whose threads are whose: the user's, or a Jupyter kernel's and the profiler's own.

A cell profiled in a kernel also samples the kernel's machinery (IOPub, Heartbeat,
Control, the shell channel, output watchers, an idle event loop) and the profiler's
own work.  In wall and park views they swamp the user's code, so every view of the
explorer leaves them out by default (one toggle shows them) and lists the user's
threads first, MainThread at the head.  Pure: reads Profiles, imports no widget.
"""

from __future__ import annotations

import re

import numpy as np

from ..model import selection as aggregate
from ..model import Profile, Thread

__all__ = ["KERNEL_FRAMES", "IDLE_FRAMES", "KERNEL_THREAD_NAMES", "OWN_FRAMES", "Machinery", "find_machinery", "hide_machinery",
           "user_first"]

# Frames of a kernel's machinery: a thread whose every frame matches ran nothing of the user's.
KERNEL_FRAMES = (
    r"[/\\](ipykernel|zmq|tornado|jupyter_client|traitlets|IPython|comm)[/\\]"
    r"|[/\\](threading|selectors|socket|queue|socketserver)\.py$|[/\\](asyncio|concurrent[/\\]futures)[/\\]"
    r"|^\[(no Python frames|truncated|unknown|GC)\]$"
)
# An event loop waiting: machinery in the explorer's views, though the magic keeps the
# threads that only ran it (the user may have started that loop).
IDLE_FRAMES = r"^\[(asyncio loop|idle|select)\]$"
# Threads a kernel (ipykernel 6 and 7) or the profiler starts, by name: some of them run
# a user-visible frame now and then (a pipe watcher, a comm handler) yet are never the user's.
KERNEL_THREAD_NAMES = re.compile(
    r"^(IOPub|Heartbeat|Control|Shell channel|Subshell.*|ddprof_nb-.*)$|\b_watch_pipe_fd\b", re.IGNORECASE)
# The profiler's own work inside the user's threads (the asyncio task sampler's ticks).
OWN_FRAMES = r"^\[ddprof_nb "


class Machinery:
    """What ``hide_machinery`` left out: thread names, and the samples of our own work."""

    def __init__(self, threads: tuple[str, ...] = (), own_samples: int = 0):
        self.threads = threads
        self.own_samples = own_samples

    def __bool__(self) -> bool:
        return bool(self.threads or self.own_samples)

    def describe(self) -> str:
        """``"hid 6 kernel threads and 12 samples of the profiler's own work"``, or ``""``."""
        parts = []
        if self.threads:
            n = len(self.threads)
            parts.append(f"{n} kernel/profiler thread{'s' if n != 1 else ''}")
        if self.own_samples:
            parts.append(f"{self.own_samples:,} sample{'s' if self.own_samples != 1 else ''} of the profiler's own work")
        return "hid " + " and ".join(parts) if parts else ""


def find_machinery(profile: Profile) -> list[int]:
    """Indexes into ``profile.threads`` of the kernel's and the profiler's threads: by
    name, or because every frame they ran is machinery.  MainThread is always the user's."""
    if not len(profile):
        return []
    present = np.unique(profile.thread).tolist()
    machine_frame = aggregate.frame_matches(profile, "|".join((KERNEL_FRAMES, IDLE_FRAMES, OWN_FRAMES)))
    has_user = aggregate._stacks_containing(profile, ~machine_frame)[profile.stack]
    user_threads = set(np.unique(profile.thread[has_user]).tolist())
    out = []
    for i in present:
        name = profile.threads[i].name
        if name == "MainThread":
            continue
        if KERNEL_THREAD_NAMES.search(name) or i not in user_threads:
            out.append(i)
    return out


def hide_machinery(profile: Profile) -> tuple[Profile, Machinery]:
    """``profile`` without the machinery threads and without the samples of the profiler's
    own work; and what was left out."""
    hidden = find_machinery(profile)
    own = aggregate._stacks_containing(profile, aggregate.frame_matches(profile, OWN_FRAMES))[profile.stack] \
        if len(profile) else np.zeros(0, dtype=bool)
    rows = ~own & ~np.isin(profile.thread, hidden)
    if rows.all():
        return profile, Machinery()
    own_samples = int(profile.values[own & ~np.isin(profile.thread, hidden), 0].sum())
    names = tuple(profile.threads[i].name for i in hidden)
    return aggregate._select(profile, rows), Machinery(names, own_samples)


def _rank(t: Thread) -> tuple:
    return (t.name != "MainThread", bool(KERNEL_THREAD_NAMES.search(t.name)), t.name.lower(), t.tid)


def user_first(threads) -> list[Thread]:
    """MainThread, then the user's threads by name, then the kernel's."""
    return sorted(threads, key=_rank)
