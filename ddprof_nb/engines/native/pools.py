"""Samples of threads that run no Python, put under the Python line that asked for the work.

A BLAS, OpenMP, Rust or database pool thread's sample holds only native frames.  Its
*library* is the object of its outermost frame outside the C runtime (``libopenblas``'s
``blas_thread_server``, ``libgomp``'s ``gomp_thread_start``, an extension's worker
function): the library whose pool it is.  A Python thread is *inside* a library at a time
when a record of it around then holds a native frame of that library: its own CPU samples
carry their native frames when native threads are sampled, and each tick in which a pool
thread ran, the sampler walks every blocked Python thread from outside and records where it
waits as a CPU row of count 0 (an *observation*: ``osthreads.c``).  So a pool thread's
sample goes under the stack of the Python thread found inside its library around its time
(records of that thread in it before and after, at most ``span_ns`` apart; else its nearest
record in it, within ``window_ns`` or two time ticks), cut just above its first frame in that library, then a
``[pool: <thread name>]`` frame, then the pool thread's own frames; with none found, under
``[native threads]`` -> ``[library]`` -> thread name.  Event-agnostic: a row's event is kept,
so a pool thread's C allocation (ALLOC, and its LIVE row at stop, recorded with the thread's
native stack by ``nalloc.c``) goes where its CPU would, its ``[malloc]``-like type leaf last.
A WALL sample of such a thread goes under its caller only while it runs (blocked, it is
waiting for work for all its sample can tell), and stays on its own thread: the caller's
wall time is its own.  Such a running WALL sample, and the CPU of a thread that blocks the
profiling signal (read from its clock by the sampler, ending in ``[profiling signal blocked]``),
hold only the thread's entry point's frames, from a walk that may have caught it waiting for
work: the C runtime's frames at their leaf end (``pthread_cond_wait``) are not where it ran, and go.

Limits: two Python threads inside one library at once get each pool sample by nearness in
time alone; a pool that keeps working after its caller returned (asynchronous work) goes
under ``[native threads]`` once no caller is near; a caller blocked in a library without
unwind tables for its wait (no ``.eh_frame``) is not seen inside it.
"""

from __future__ import annotations

import bisect
import os
import re
import sys
from dataclasses import dataclass

import numpy as np

from ...events import EventType, FrameKind
from ...model import Frame, Profile, aggregate_columns, columns
from ...render.format import format_bytes, format_duration

__all__ = ["attribute_pools", "PoolResult", "NATIVE_THREADS", "MASKED"]

NATIVE_THREADS = Frame("[native threads]", kind=FrameKind.THREAD)
MASKED = Frame("[profiling signal blocked]", kind=FrameKind.ERROR)
# the C runtime and loader: every thread starts and waits in them, no pool is theirs; nor is
# the interpreter's (every Python thread is inside it: a thread starting or ending Python there,
# its Python frames not yet or no longer there, would go to whichever Python thread ran)
_RUNTIME = re.compile(r"(^|/)(libc|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s|libdl|librt|libpython[0-9.]*[a-z]*)[.-][^/]*$")
_INTERPRETER = os.path.realpath(sys.executable)  # (an interpreter linked statically: in the executable)
# frames only a thread running Python has: its rows are its own, whatever else it did in the session
_PYTHON_KINDS = (FrameKind.PYTHON, FrameKind.GC)
_CPU, _WALL = EventType.CPU.value, EventType.WALL.value
# what a note says of each event's pool rows: (event, what it is, how its quantity is shown)
_NOTED = ((EventType.CPU, "of CPU", format_duration), (EventType.ALLOC, "allocated", format_bytes),
          (EventType.LIVE, "live at stop", format_bytes))


@dataclass(frozen=True)
class PoolResult:
    profile: Profile
    attributed: dict = None  # event value -> quantity of pool rows under their caller ([pool: <thread>])
    unattributed: dict = None  # ... under [native threads]
    threads: int = 0

    @property
    def attributed_ns(self) -> int:
        return (self.attributed or {}).get(_CPU, 0)

    @property
    def unattributed_ns(self) -> int:
        return (self.unattributed or {}).get(_CPU, 0)

    def notes(self) -> list[str]:
        out = []
        for event, what, fmt in _NOTED:
            yes, no = (self.attributed or {}).get(event.value, 0), (self.unattributed or {}).get(event.value, 0)
            if yes + no <= 0:
                continue
            out.append(f"threads that run no Python: {fmt(yes + no)} {what} on {self.threads} thread(s); "
                       f"{100.0 * yes / (yes + no):.0f}% under the Python line that asked for the work "
                       f"([pool: <thread>]), {fmt(no)} under [native threads] (no Python thread was inside "
                       f"that library then)")
        return out


def _library(frame: Frame) -> str | None:
    if (frame.kind is not FrameKind.NATIVE or not frame.filename or _RUNTIME.search(frame.filename)
            or frame.filename == _INTERPRETER):
        return None
    return frame.filename


def _short(library: str) -> str:
    return library.rsplit("/", 1)[-1]


class _Tables:
    """A profile's frames and stacks, with new ones interned after them."""

    def __init__(self, profile: Profile):
        self.frames = list(profile.frames)
        self._index = {f: i for i, f in enumerate(self.frames)}
        self.stacks = list(profile.stacks)
        self._interned: dict[tuple[int, ...], int] = {}

    def frame(self, frame: Frame) -> int:
        i = self._index.get(frame)
        if i is None:
            i = self._index[frame] = len(self.frames)
            self.frames.append(frame)
        return i

    def stack(self, frames: tuple[int, ...]) -> int:
        sid = self._interned.get(frames)
        if sid is None:
            sid = self._interned[frames] = len(self.stacks)
            self.stacks.append(frames)
        return sid


def _inside(profile: Profile, libs: list, python_rows: np.ndarray) -> dict[str, list[tuple[int, int, int]]]:
    """Where Python threads were inside each library: library -> sorted (time, thread, row)."""
    inside: dict[str, list[tuple[int, int, int]]] = {}
    of_stack: dict[int, tuple[str, ...]] = {}  # stack -> its libraries, each once
    for row in np.flatnonzero(python_rows).tolist():
        sid = int(profile.stack[row])
        found = of_stack.get(sid)
        if found is None:
            found = of_stack[sid] = tuple(dict.fromkeys(libs[f] for f in profile.stacks[sid] if libs[f] is not None))
        for lib in found:
            inside.setdefault(lib, []).append((int(profile.time_ns[row]), int(profile.thread[row]), row))
    for v in inside.values():
        v.sort()
    return inside


def attribute_pools(profile: Profile, native_tids: set[int], names: dict[int, str], *, raw: bool = False,
                    keep_native: bool = True, window_ns: int = 50_000_000, span_ns: int = 1_000_000_000) -> PoolResult:
    """``profile`` with the rows of ``native_tids`` (threads that run no Python) attributed
    (module docstring), observation rows dropped and, without ``keep_native``, native frames
    left only as the one ``[library]`` frame of a pool sample.  ``raw``: each pool thread's
    samples stay under that thread (its frames, or its library's frame)."""
    window = max(window_ns, 2 * profile.tick_ns)  # (rows' times are their tick's start)
    t = _Tables(profile)
    libs = [_library(f) for f in profile.frames]
    native_kind = [f.kind is FrameKind.NATIVE for f in profile.frames]
    tids = np.array([th.tid for th in profile.threads], dtype=np.int64)
    # a pool row: a native thread's sample with no Python frame (a thread seen running no Python
    # at some tick, as a Python thread is as it starts or ends, keeps the rows it ran Python in)
    is_pool = np.isin(tids[profile.thread], list(native_tids)) if len(profile) else np.zeros(0, bool)
    python_frame = [f.kind in _PYTHON_KINDS for f in profile.frames]
    pythonic = [sid for sid in np.unique(profile.stack[is_pool]).tolist()
                if any(python_frame[f] for f in profile.stacks[sid])]
    if pythonic:
        is_pool &= ~np.isin(profile.stack, pythonic)
    cpu = profile.event == _CPU
    observation = cpu & (profile.values[:, 0] == 0) & (profile.values[:, 1] == 0) & ~is_pool
    inside = _inside(profile, libs, ~is_pool)  # (any event a thread records of itself carries its native frames)
    leaf_kept = [f.kind is FrameKind.ALLOC_TYPE or f == MASKED for f in profile.frames]  # type leaves, MASKED stay
    thread_col, stack_col = profile.thread.copy(), profile.stack.copy()
    running = [ls.get("state") == "cpu" for ls in profile.labelsets]

    def python_only(stack) -> tuple[int, ...]:
        # (native frames collected only to find libraries; a native walk's cut inside the stack goes too)
        return tuple(f for i, f in enumerate(stack)
                     if not native_kind[f] and not (i and profile.frames[f].kind is FrameKind.TRUNCATED))

    own_stacks = _own_stacks(profile, np.flatnonzero(is_pool).tolist(), libs, running)
    attributed: dict[int, int] = {}
    unattributed: dict[int, int] = {}
    for row, own in own_stacks.items():
        lib = next((libs[f] for f in own if libs[f] is not None), None)  # outermost non-runtime frame
        tid = int(tids[profile.thread[row]])
        name = names.get(tid) or profile.threads[profile.thread[row]].name or f"thread {tid}"
        lib_frame = t.frame(Frame(f"[{_short(lib) if lib else 'unknown'}]", lib or "", kind=FrameKind.NATIVE))
        leaf = tuple(f for f in own if leaf_kept[f])
        tail = tuple(own) if keep_native or not lib else (lib_frame,) + leaf
        event, quantity = int(profile.event[row]), int(profile.values[row, 1])
        # (a pool thread blocked is waiting for work, for all its wall sample can tell: its own)
        asked = lib and (event != _WALL or running[int(profile.labels[row])])
        caller = _nearest(inside.get(lib, ()), int(profile.time_ns[row]), window, span_ns) if asked else None
        if raw:
            stack_col[row] = t.stack(tail)
        elif caller is None:
            unattributed[event] = unattributed.get(event, 0) + quantity
            head = (t.frame(NATIVE_THREADS), lib_frame, t.frame(Frame(name, kind=FrameKind.THREAD)))
            stack_col[row] = t.stack(head + (tuple(own) if keep_native else leaf))
        else:
            attributed[event] = attributed.get(event, 0) + quantity
            theirs = profile.stacks[int(profile.stack[caller])]
            cut = next((i for i, f in enumerate(theirs) if libs[f] == lib), len(theirs))
            prefix = tuple(theirs[:cut]) if keep_native else python_only(theirs[:cut])
            stack_col[row] = t.stack(prefix + (t.frame(Frame(f"[pool: {name}]", kind=FrameKind.THREAD)),) + tail)
            if event != _WALL:  # (a thread's wall time is its own: on the caller's it would count twice)
                thread_col[row] = profile.thread[caller]
    if not keep_native:
        mapped: dict[int, int] = {}  # (per stack, not per row)
        for row in np.flatnonzero(~is_pool).tolist():
            sid = int(profile.stack[row])
            if sid not in mapped:
                mapped[sid] = t.stack(python_only(profile.stacks[sid]))
            stack_col[row] = mapped[sid]
    keep = ~observation
    cols = aggregate_columns(profile.event[keep], stack_col[keep], thread_col[keep], profile.labels[keep],
                             profile.time_ns[keep], profile.values[keep])
    out = profile.replace(frames=tuple(t.frames), stacks=t.stacks, **columns(cols))
    n_threads = len(set(tids[np.unique(profile.thread[is_pool])].tolist())) if is_pool.any() else 0
    return PoolResult(out, attributed, unattributed, n_threads)


def _own_stacks(profile: Profile, rows: list, libs: list, running: list) -> dict[int, tuple[int, ...]]:
    """Each pool row's own frames (root first).  A masked thread's CPU row and a running WALL
    row hold only the thread's entry point's frames, walked perhaps while it waited: the C
    runtime's frames at their leaf end (``pthread_cond_wait``) are not where it ran, and go; a
    masked row recorded before its thread was first caught waiting has no entry point, and
    takes the one another of its rows has."""
    masked = [f == MASKED for f in profile.frames]
    native = [f.kind is FrameKind.NATIVE for f in profile.frames]

    def entry_only(own) -> tuple[int, ...]:
        end = len(own) - (bool(own) and masked[own[-1]])
        j = end
        while j > 0 and native[own[j - 1]] and libs[own[j - 1]] is None:
            j -= 1
        return tuple(own[:j]) + tuple(own[end:]) if j > 0 else tuple(own)

    out: dict[int, tuple[int, ...]] = {}
    entry: dict[int, tuple[int, ...]] = {}  # thread -> a masked row's entry point
    for row in rows:
        own = profile.stacks[int(profile.stack[row])]
        if own and masked[own[-1]]:
            own = entry_only(own)
            if any(libs[f] is not None for f in own):
                entry.setdefault(int(profile.thread[row]), own)
        elif int(profile.event[row]) == _WALL and running[int(profile.labels[row])]:
            own = entry_only(own)
        out[row] = tuple(own)
    for row, own in out.items():
        if own and masked[own[-1]] and not any(libs[f] is not None for f in own):
            out[row] = entry.get(int(profile.thread[row]), own)
    return out


def _nearest(seen: list[tuple[int, int, int]], t: int, window_ns: int, span_ns: int) -> int | None:
    """The row of the Python thread inside the library at ``t``: the one whose records in it
    (``seen``: sorted (time, thread, row)) come both before and after ``t`` within
    ``span_ns`` (it stayed inside between them), else the record nearest ``t`` within
    ``window_ns``."""
    if not seen:
        return None
    k = bisect.bisect_left(seen, (t, -1, -1))
    before, after = (seen[k - 1] if k > 0 else None), (seen[k] if k < len(seen) else None)
    if before and after and before[1] == after[1] and after[0] - before[0] <= span_ns:
        return before[2] if t - before[0] <= after[0] - t else after[2]
    best, best_d = None, window_ns + 1
    for near in (before, after):
        if near is not None and abs(near[0] - t) < best_d:
            best, best_d = near[2], abs(near[0] - t)
    return best
