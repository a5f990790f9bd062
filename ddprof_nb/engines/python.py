"""The portable engine: a Python thread reading ``sys._current_frames()`` each interval.

It runs wherever CPython runs (macOS, Windows, versions whose layout the native engine
does not know) at the cost of what it cannot see, which every profile it takes states
in ``metadata.notes``:

- It reads stacks only while its sampler thread holds the GIL.  C code that keeps the
  GIL (a long regex, a C extension that never releases it) delays the sample and is
  charged to the Python line that called it; the weights stay right, because each
  sample carries the wall time and the thread CPU time elapsed since that thread's
  previous sample.  C code that releases the GIL (I/O, hashlib, large numpy kernels)
  is sampled on time.
- No allocation, lock or park events, no native (C) frames, no GIL-wait state.
- When threads running Python take turns on the GIL, the sampler thread may wait for
  it several switch intervals; the CPU a thread spent meanwhile is charged to the stack
  and labels seen at the late sample (labels that changed in between lose it).  A
  listener splitting it at label changes was tried: it fixes the labels but charges the
  earlier stretch to the wrong stack (the code that changed the labels), worse for
  asyncio, whose every task step changes them.  The thread that calls ``stop()`` is
  an exception: at the last tick it is inside our own frames, so its last stretch goes
  to the stack of its previous sample.

CPU weights come from each thread's own CPU clock: on Linux the kernel's per-thread
clock id made from the thread's tid (what ``pthread_getcpuclockid`` returns, built
without dereferencing a ``pthread_t`` that may belong to a thread that just exited);
elsewhere ``time.pthread_getcpuclockid``; where that is missing (macOS, Windows) the
per-thread times of psutil when it is installed and its thread ids are the ones
Python reports; otherwise no CPU events, and the profile says so.

Invariants: the sampler thread never appears in samples; a thread id reused by a new
thread never inherits the old thread's clock or name; an exception while sampling
drops that sample (counted in ``metadata.dropped`` and reported in the notes) and
sampling goes on; stacks deeper than ``max_depth`` keep their leaf-most frames under a
``[truncated]`` root pseudo-frame.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import Callable

from .. import labeling as _labels
from ..errors import NotRunningError
from ..events import EventType, FrameKind
from ..model import Frame, LabelSet, Metadata, Profile, ProfileBuilder
from ..render.format import format_count
from .base import Engine

THREAD_NAME = "ddprof_nb-python-sampler"
_LINUX = sys.platform.startswith("linux")
_MAX_ERROR_KINDS = 5  # distinct error messages kept for the notes
_LIVE_FLUSH_S = 0.5  # a live session's rows reach its view at least this often (ddprof_nb.live)
# threads threading adopted after they started elsewhere (their CPU clock predates us)
_DUMMY_THREAD = getattr(threading, "_DummyThread", ())

NOTE_GIL = (
    "python engine: stacks are read only while its sampler thread holds the GIL, so time "
    "in C code that keeps the GIL is charged, late, to the Python line that called it "
    "(C code that releases the GIL is sampled on time)"
)
NOTE_BLIND = (
    "python engine: no allocation, lock or park events, no native (C) frames, "
    "no GIL-wait state"
)


# -- per-thread CPU clocks -------------------------------------------------------------
def _linux_thread_clock(tid: int) -> int:
    """The kernel's CPU clock id of thread ``tid`` (CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD),
    the value glibc's pthread_getcpuclockid computes from the thread's tid."""
    return ((~tid) << 3) | 6


def _live_tids() -> frozenset[int] | None:
    """The OS ids of this process's threads (Linux), else None."""
    if not _LINUX:
        return None
    try:
        return frozenset(int(t) for t in os.listdir("/proc/self/task"))
    except (OSError, ValueError):
        return None


def _linux_tid_of_clock(clock: int) -> int:
    return ~(clock >> 3)


class _ClockSource:
    """Reads threads' CPU time in ns.  ``kind`` names the method ('' = none available).

    ``begin_tick()`` is called once per sampling tick, ``reader(ident, tid)`` once per
    new thread; a reader returns the thread's CPU ns or None once the thread is gone.
    """

    def __init__(self, kind: str, note: str):
        self.kind = kind
        self.note = note

    def begin_tick(self) -> None:
        pass

    def reader(self, ident: int, tid: int | None) -> Callable[[], int | None] | None:
        return None

    def tid_of(self, ident: int) -> int | None:
        """The OS thread id of a thread threading does not know, where the clock tells."""
        return None


class _PosixClocks(_ClockSource):
    def __init__(self, getclock, use_tid: bool):
        super().__init__(
            "pthread_getcpuclockid",
            "python engine: cpu = each thread's CPU clock (pthread_getcpuclockid) between its samples",
        )
        self._getclock = getclock
        self._use_tid = use_tid  # Linux: clock ids from tids, checked at start

    def _clock_for(self, ident: int, tid: int | None) -> int | None:
        if self._use_tid and tid:
            return _linux_thread_clock(tid)
        try:
            clock = self._getclock(ident)
        except (OSError, OverflowError, ValueError):
            return None
        if _LINUX and tid and _linux_tid_of_clock(clock) != tid:
            return None  # the pthread_t no longer describes that thread (it exited)
        return clock

    def reader(self, ident, tid):
        clock = self._clock_for(ident, tid)
        if clock is None:
            return None
        gettime = time.clock_gettime_ns

        def read() -> int | None:
            try:
                return gettime(clock)
            except OSError:  # EINVAL: the thread exited
                return None

        return read if read() is not None else None

    def tid_of(self, ident):
        if not _LINUX:
            return None
        try:
            return _linux_tid_of_clock(self._getclock(ident))
        except (OSError, OverflowError, ValueError):
            return None


class _PsutilClocks(_ClockSource):
    """psutil's per-thread (user + system) times, read for all threads once per tick."""

    def __init__(self, process):
        super().__init__(
            "psutil",
            "python engine: cpu = psutil's per-thread user+system times between samples "
            "(no pthread_getcpuclockid here; their resolution is the OS's, often 10-16 ms)",
        )
        self._process = process
        self._times: dict[int, int] = {}

    def begin_tick(self) -> None:
        try:
            self._times = {t.id: int((t.user_time + t.system_time) * 1e9) for t in self._process.threads()}
        except Exception:  # noqa: BLE001 - psutil errors (AccessDenied, ...) mean: no data this tick
            self._times = {}

    def reader(self, ident, tid):
        if not tid:
            return None
        times = self  # read the tick's table through self: begin_tick replaces it
        return lambda: times._times.get(tid)


def _psutil_clocks() -> _ClockSource | None:
    try:
        import psutil  # noqa: PLC0415 - optional
    except Exception:  # noqa: BLE001 - missing or broken install
        return None
    try:
        process = psutil.Process()
        ids = {t.id for t in process.threads()}
    except Exception:  # noqa: BLE001
        return None
    # macOS psutil numbers threads 1..n instead of giving their OS ids: unusable here
    if threading.get_native_id() not in ids:
        return None
    return _PsutilClocks(process)


def cpu_clock_source() -> _ClockSource:
    """The best per-thread CPU clock of this platform (see the module docstring)."""
    getclock = getattr(time, "pthread_getcpuclockid", None)
    if getclock is not None:
        try:
            mine = getclock(threading.get_ident())
            time.clock_gettime_ns(mine)
        except (OSError, OverflowError, ValueError):
            getclock = None
    if getclock is not None:
        use_tid = _LINUX and mine == _linux_thread_clock(threading.get_native_id())
        return _PosixClocks(getclock, use_tid)
    found = _psutil_clocks()
    if found is not None:
        return found
    return _ClockSource(
        "",
        "python engine: no per-thread CPU clock on this platform (no pthread_getcpuclockid; "
        "psutil not installed, or its thread ids are not the OS ids Python reports, as on macOS): "
        "CPU not sampled, and wall samples carry no state label",
    )


# -- the engine -------------------------------------------------------------------------
class _ThreadState:
    """What the sampler remembers of one live thread between ticks."""

    __slots__ = ("owner", "tid", "read_cpu", "last_wall", "last_cpu", "last_stack", "last_labels")

    def __init__(self, owner, tid, read_cpu, last_wall, last_cpu):
        self.owner = owner  # the threading.Thread (None for threads threading does not know)
        self.tid = tid
        self.read_cpu = read_cpu
        self.last_wall = last_wall
        self.last_cpu = last_cpu
        self.last_stack = -1  # the builder's id of the stack its latest sample read (-1: none yet)
        self.last_labels = 0  # and the label set id it had then


class PythonEngine(Engine):
    """Samples every thread's Python stack from a sampler thread (see module docstring)."""

    name = "python"
    supported_events = frozenset({EventType.CPU, EventType.WALL})

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None if hasattr(sys, "_current_frames") else "sys._current_frames() is missing"

    def __init__(self, config):
        super().__init__(config)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._builder: ProfileBuilder | None = None
        self._clocks: _ClockSource | None = None
        self._states: dict[int, _ThreadState] = {}
        self._initial = weakref.WeakSet()  # threading.Threads alive at start
        self._initial_tids: frozenset[int] | None = None  # Linux: every thread's tid at start
        self._frame_ids: dict[tuple[int, int], tuple[object, int]] = {}  # (id(code), lasti) -> (code, frame id)
        self._label_ids: dict[tuple[int, str], int] = {}
        self._comm: dict[int, str] = {}
        self._me = 0
        self._stopper = 0  # ident of the thread inside stop()
        self._start_mono = 0
        self._ticks = 0
        self._samples = {EventType.CPU: 0, EventType.WALL: 0}
        self._dropped = {EventType.CPU: 0, EventType.WALL: 0}
        self._errors: dict[str, int] = {}
        self._want_cpu = EventType.CPU in config.events
        self._want_wall = EventType.WALL in config.events
        self._started = False
        self._stopped = False
        self._truncated_id = -1

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            raise RuntimeError("a PythonEngine is started once")
        self._started = True
        self._clocks = cpu_clock_source()
        start_ns = time.time_ns()
        self._start_mono = time.monotonic_ns()
        self._builder = ProfileBuilder(Metadata(start_ns=start_ns, interval_ns=self.config.interval_ns, engine=self.name))
        self._truncated_id = self._builder.frame_id(Frame("[truncated]", kind=FrameKind.TRUNCATED))
        if self.live is not None:
            self._builder.tap = self.live.feed
        # baseline every live thread now, so its first sample's CPU weight starts here
        self._clocks.begin_tick()
        threads = {t.ident: t for t in threading.enumerate() if t.ident is not None}
        self._initial.update(threads.values())
        self._initial_tids = _live_tids()
        for ident in sys._current_frames():  # (a thread without frames is dead: a stale _DummyThread)
            self._states[ident] = self._new_state(ident, threads.get(ident), self._start_mono, at_start=True)
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self) -> Profile:
        if not self._started or self._stopped:
            raise NotRunningError("the python engine is not running")
        self._stopped = True
        self._stopper = threading.get_ident()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        builder = self._builder
        assert builder is not None
        end_mono = time.monotonic_ns()
        builder.metadata = builder.metadata.replace(
            notes=tuple(dict.fromkeys(self._notes(end_mono))),
            dropped={e: n for e, n in self._dropped.items() if n},
            extra={"cpu_clock": self._clocks.kind or "none", "ticks": str(self._ticks),
                   "wall_state_label": "state=cpu|off-cpu" if self._clocks.kind else "none"},
        )
        return builder.build(end_ns=builder.metadata.start_ns + (end_mono - self._start_mono))

    def _notes(self, end_mono: int) -> list[str]:
        secs = max((end_mono - self._start_mono) / 1e9, 1e-9)
        target = 1e9 / self.config.interval_ns
        notes = [NOTE_GIL, NOTE_BLIND, self._clocks.note]
        if self._want_cpu and self._clocks.kind:
            n = self._samples[EventType.CPU]
            notes.append(f"cpu: {format_count(n)} samples ({format_count(n / secs)}/s across all threads; "
                         f"target {format_count(target)}/s per busy thread)")
        if self._want_wall:
            n = self._samples[EventType.WALL]
            state = "; labels state=cpu|off-cpu" if self._clocks.kind else ""
            notes.append(f"wall: {format_count(n)} samples in {format_count(self._ticks)} ticks "
                         f"({format_count(self._ticks / secs)} ticks/s, target {format_count(target)}/s){state}")
        if self._errors:
            total = sum(self._errors.values())
            detail = "; ".join(f"{msg} (x{n})" for msg, n in self._errors.items())
            dropped = sum(self._dropped.values())
            notes.append(f"python engine: {total} sampling error(s), {dropped} sample(s) dropped: {detail}")
        return notes

    # -- sampling ---------------------------------------------------------------------
    def _run(self) -> None:
        self._me = threading.get_ident()
        interval = self.config.interval_ns / 1e9
        deadline = time.monotonic() + interval
        flushed = time.monotonic()
        while not self._stop.wait(max(0.0, deadline - time.monotonic())):
            self._tick()
            deadline += interval
            if self.live is not None and deadline - flushed >= _LIVE_FLUSH_S:  # the live view reads the rows so far
                self._builder.flush()
                flushed = deadline
            now = time.monotonic()
            if deadline < now:  # the GIL was held past a whole interval: no burst to catch up
                deadline = now + interval
        self._tick(final=True)  # the last stretch of every thread, up to stop()

    def _error(self, exc: BaseException, dropped: tuple[EventType, ...]) -> None:
        msg = f"{type(exc).__name__}: {exc}"[:200]
        if msg in self._errors or len(self._errors) < _MAX_ERROR_KINDS:
            self._errors[msg] = self._errors.get(msg, 0) + 1
        else:
            self._errors["other errors"] = self._errors.get("other errors", 0) + 1
        for e in dropped:
            self._dropped[e] += 1

    def _wanted(self) -> tuple[EventType, ...]:
        return tuple(e for e, on in ((EventType.CPU, self._want_cpu and bool(self._clocks.kind)),
                                     (EventType.WALL, self._want_wall)) if on)

    def _tick(self, final: bool = False) -> None:
        """One sample of every thread; never raises (errors are counted)."""
        try:
            self._ticks += 1
            self._clocks.begin_tick()
            now = time.monotonic_ns()
            frames = sys._current_frames()
            threads = {t.ident: t for t in threading.enumerate() if t.ident is not None}
        except Exception as exc:  # noqa: BLE001 - a sampler must not die silently
            self._error(exc, self._wanted())
            return
        for ident, frame in frames.items():
            if ident == self._me:
                continue
            try:
                self._sample(ident, frame, threads.get(ident), now, final and ident == self._stopper)
            except Exception as exc:  # noqa: BLE001
                self._error(exc, self._wanted())
        # forget threads that exited (their ident may be reused by a new thread); threading's
        # own table is no proof of life: it never forgets a _DummyThread
        for ident in [i for i in self._states if i not in frames]:
            del self._states[ident]

    def _new_state(self, ident: int, owner, now: int, at_start: bool = False) -> _ThreadState:
        tid = getattr(owner, "native_id", None) if owner is not None else None
        if tid is None or isinstance(owner, _DUMMY_THREAD):
            # a _DummyThread may be stale: threading never forgets one, and its pthread ident
            # is reused by later foreign threads; it describes this thread only if the ids match
            live = self._clocks.tid_of(ident)
            if live is not None and tid is not None and live != tid:
                owner = None
            tid = live or tid
        read_cpu = self._clocks.reader(ident, tid) if (self._want_cpu or self._want_wall) else None
        cpu = read_cpu() if read_cpu is not None else None
        if cpu is not None and not at_start and self._born_while_profiling(owner, tid):
            cpu = 0  # its clock began at zero when it was created: its first sample counts all of it
        last_wall = now if at_start else max(self._start_mono, now - self.config.interval_ns)
        return _ThreadState(owner, tid or ident, read_cpu, last_wall, cpu)

    def _born_while_profiling(self, owner, tid: int | None) -> bool:
        if self._initial_tids is not None and tid:
            # the OS's word, for threads threading does not know too: a sampler thread that
            # waits for the GIL may first see a short foreign thread late, or only once
            return tid not in self._initial_tids
        return owner is not None and owner not in self._initial and not isinstance(owner, _DUMMY_THREAD)

    def _thread_name(self, st: _ThreadState, owner) -> str:
        if owner is not None:
            return owner.name
        name = self._comm.get(st.tid)
        if name is None:
            name = f"Thread {st.tid}"
            if _LINUX:
                try:
                    with open(f"/proc/self/task/{st.tid}/comm") as f:
                        name = f.read().strip() or name
                except OSError:
                    pass
            self._comm[st.tid] = name
        return name

    def _sample(self, ident: int, frame, owner, now: int, stopping: bool = False) -> None:
        st = self._states.get(ident)
        if st is not None and owner is not st.owner:
            if st.owner is None:
                if owner is not None and getattr(owner, "native_id", None) == st.tid:
                    st.owner = owner  # a foreign thread that threading now knows (its _DummyThread)
                elif not isinstance(owner, _DUMMY_THREAD) or self._clocks.tid_of(ident) not in (None, st.tid):
                    st = None  # a new thread under a reused ident (a stale _DummyThread is no news)
            elif owner is not None:
                st = None  # a new thread under a reused ident
        elif st is not None and (st.owner is None or isinstance(st.owner, _DUMMY_THREAD)) \
                and self._clocks.tid_of(ident) not in (None, st.tid):
            st = None  # a foreign thread exited and another took its ident between two ticks
        if st is None:
            st = self._states[ident] = self._new_state(ident, owner, now)
        builder = self._builder
        cpu = st.read_cpu() if st.read_cpu is not None else None
        if cpu is None:  # no reading this tick: keep the baseline, the next delta covers the gap
            cpu_delta = 0
        else:
            cpu_delta = cpu - st.last_cpu if st.last_cpu is not None and cpu >= st.last_cpu else 0
            st.last_cpu = cpu
        wall_delta = now - st.last_wall
        st.last_wall = now
        if not (self._want_wall or (self._want_cpu and cpu_delta > 0)):
            return
        # The thread inside stop() is seen in our own frames, which used next to none of the
        # time since its previous sample (and are dropped from the profile): that stretch,
        # up to the stop, goes to the stack (and the labels) its previous sample read.
        if stopping and st.last_stack >= 0:
            stack, label_id = st.last_stack, st.last_labels
        else:
            stack, label_id = self._stack_id(frame), _labels.thread_label_ids.get(ident, 0)
        st.last_stack, st.last_labels = stack, label_id
        thread = builder.thread_id(st.tid, self._thread_name(st, st.owner))
        rel = now - self._start_mono
        if self._want_wall and wall_delta > 0:
            state = ("cpu" if cpu_delta * 2 > wall_delta else "off-cpu") if cpu is not None else ""
            builder.add(EventType.WALL, stack, thread, self._labels_id(label_id, state), rel, 1, wall_delta)
            self._samples[EventType.WALL] += 1
        if self._want_cpu and cpu_delta > 0:
            builder.add(EventType.CPU, stack, thread, self._labels_id(label_id, ""), rel, 1, cpu_delta)
            self._samples[EventType.CPU] += 1

    def _labels_id(self, label_id: int, state: str) -> int:
        key = (label_id, state)
        found = self._label_ids.get(key)
        if found is None:
            labels: LabelSet = _labels.labelset(label_id)
            if state:
                labels = labels.merged({"state": state})
            found = self._label_ids[key] = self._builder.labels_id(labels)
        return found

    def _stack_id(self, frame) -> int:
        """The builder's id of ``frame``'s stack: root first, at most max_depth frames
        (leaf-most kept) under a ``[truncated]`` root when deeper."""
        builder = self._builder
        cache = self._frame_ids
        ids: list[int] = []
        left = self.config.max_depth
        while frame is not None:
            if not left:
                ids.append(self._truncated_id)
                break
            code = frame.f_code
            key = (id(code), frame.f_lasti)
            hit = cache.get(key)
            if hit is None:  # the cache holds the code object, so its id stays its own
                line = frame.f_lineno or code.co_firstlineno
                hit = cache[key] = (code, builder.frame_id(Frame(code.co_qualname, code.co_filename, line, code.co_firstlineno)))
            ids.append(hit[1])
            frame = frame.f_back
            left -= 1
        ids.reverse()
        return builder.stack_id(ids)
