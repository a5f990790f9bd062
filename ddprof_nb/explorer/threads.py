"""Whose threads are whose: the user's, or a Jupyter kernel's and the profiler's own.

A cell profiled in a kernel also samples the kernel's machinery (IOPub, Heartbeat,
Control, the shell channel, output watchers, an idle event loop) and the profiler's
own work, and pools of threads that run no Python wait for work.  In wall and park views they
swamp the user's code, so every view of the explorer leaves them out by default (one toggle
shows them) and lists the user's
threads first, MainThread at the head.  Pure: reads Profiles, imports no widget.
"""

from __future__ import annotations

import re

import numpy as np

from ..model import selection as aggregate
from ..events import EventType
from ..model import Profile, Thread

__all__ = ["KERNEL_FRAMES", "IDLE_FRAMES", "KERNEL_THREAD_NAMES", "OWN_FRAMES", "NATIVE_THREADS_ROOT", "Machinery",
           "find_machinery", "hide_machinery", "idle_pool_rows", "user_first"]

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


# Threads that run no Python waiting for work (a BLAS or database pool between calls): their
# wall samples under this root, not running, would swamp the wall view as a kernel's threads do.
NATIVE_THREADS_ROOT = "[native threads]"


class Machinery:
    """What ``hide_machinery`` left out: thread names, the samples of our own work, and the
    idle wall samples of threads that run no Python."""

    def __init__(self, threads: tuple[str, ...] = (), own_samples: int = 0, idle_pool_samples: int = 0):
        self.threads = threads
        self.own_samples = own_samples
        self.idle_pool_samples = idle_pool_samples

    def __add__(self, other: "Machinery") -> "Machinery":
        return Machinery(tuple(dict.fromkeys(self.threads + other.threads)), self.own_samples + other.own_samples,
                         self.idle_pool_samples + other.idle_pool_samples)

    def __bool__(self) -> bool:
        return bool(self.threads or self.own_samples or self.idle_pool_samples)

    def describe(self) -> str:
        """``"hid 6 kernel threads and 12 samples of the profiler's own work"``, or ``""``."""
        parts = []
        if self.threads:
            n = len(self.threads)
            parts.append(f"{n} kernel/profiler thread{'s' if n != 1 else ''}")
        if self.own_samples:
            parts.append(f"{self.own_samples:,} sample{'s' if self.own_samples != 1 else ''} of the profiler's own work")
        if self.idle_pool_samples:
            n = self.idle_pool_samples
            parts.append(f"{n:,} idle wall sample{'s' if n != 1 else ''} of threads that run no Python")
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


def idle_pool_rows(profile: Profile) -> np.ndarray:
    """Rows of wall samples of threads that run no Python, under ``[native threads]`` (no
    Python line asked for their work then) and not running: a pool waiting for work."""
    if not len(profile):
        return np.zeros(0, dtype=bool)
    under_root = np.array([bool(st) and profile.frames[st[0]].name == NATIVE_THREADS_ROOT for st in profile.stacks]
                          or [False])
    not_running = np.array([ls.get("state") not in (None, "cpu") for ls in profile.labelsets] or [False])
    return (profile.event == EventType.WALL.value) & under_root[profile.stack] & not_running[profile.labels]


def hide_machinery(profile: Profile) -> tuple[Profile, Machinery]:
    """``profile`` without the machinery threads, the samples of the profiler's own work and
    the idle wall samples of threads that run no Python; and what was left out."""
    hidden = find_machinery(profile)
    own = aggregate._stacks_containing(profile, aggregate.frame_matches(profile, OWN_FRAMES))[profile.stack] \
        if len(profile) else np.zeros(0, dtype=bool)
    idle = idle_pool_rows(profile)
    in_hidden = np.isin(profile.thread, hidden)
    rows = ~own & ~idle & ~in_hidden
    if rows.all():
        return profile, Machinery()
    own_samples = int(profile.values[own & ~in_hidden, 0].sum())
    idle_samples = int(profile.values[idle & ~own & ~in_hidden, 0].sum())
    names = tuple(profile.threads[i].name for i in hidden)
    return aggregate._select(profile, rows), Machinery(names, own_samples, idle_samples)


def _rank(t: Thread) -> tuple:
    return (t.name != "MainThread", bool(KERNEL_THREAD_NAMES.search(t.name)), t.name.lower(), t.tid)


def user_first(threads) -> list[Thread]:
    """MainThread, then the user's threads by name, then the kernel's."""
    return sorted(threads, key=_rank)
