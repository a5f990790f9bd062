"""The portable engine: a Python thread reading ``sys._current_frames()`` each interval.

It runs wherever CPython runs (macOS, Windows, unknown layouts) at the cost of what it
cannot see: it samples only when it gets the GIL, so C code that holds the GIL delays
its samples (their weights stay right: each sample is weighted by the wall time and
the thread CPU time elapsed since that thread's previous sample), and it has no
allocation, lock or park events.  CPU weights come from each thread's CPU clock
(``time.pthread_getcpuclockid`` on Linux/BSD, psutil where installed); where neither
exists CPU is not sampled and the profile says so.
"""

from __future__ import annotations

import sys
import threading
import time

from .. import labeling as _labels
from ..events import EventType, FrameKind
from ..model import Frame, Metadata, Profile, ProfileBuilder
from .base import Engine

_THREAD_NAME = "ddprof_nb-python-sampler"


def _thread_cpu_clock(ident: int):
    """A function returning the thread's CPU time in ns, or None when the OS can't tell."""
    getclock = getattr(time, "pthread_getcpuclockid", None)
    if getclock is None:
        return None
    try:
        clock = getclock(ident)
        time.clock_gettime_ns(clock)
    except (OSError, OverflowError, ValueError):
        return None
    return lambda: time.clock_gettime_ns(clock)


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
        self._code_frames: dict[tuple, int] = {}
        self._last: dict[int, tuple[int, int | None]] = {}  # ident -> (wall ns, cpu ns)
        self._clocks: dict[int, object] = {}
        self._names: dict[int, tuple[int, str]] = {}
        self._notes: list[str] = []
        self._start_mono = 0

    def start(self) -> None:
        start_ns = time.time_ns()
        self._start_mono = time.monotonic_ns()
        self._builder = ProfileBuilder(Metadata(start_ns=start_ns, interval_ns=self.config.interval_ns, engine=self.name))
        self._thread = threading.Thread(target=self._run, name=_THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self) -> Profile:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        builder = self._builder
        assert builder is not None
        notes = list(self._notes) + [
            "python engine: samples are taken when the sampler thread holds the GIL; "
            "C code that holds the GIL is attributed to its calling line"
        ]
        if EventType.CPU in self.config.events and not self._clocks:
            notes.append("python engine: no per-thread CPU clock on this platform; CPU not sampled")
        builder.metadata = builder.metadata.replace(notes=tuple(dict.fromkeys(notes)))
        return builder.build(end_ns=time.time_ns())

    # -- sampling ------------------------------------------------------------------------
    def _run(self) -> None:
        interval = self.config.interval_ns / 1e9
        me = threading.get_ident()
        want_cpu = EventType.CPU in self.config.events
        want_wall = EventType.WALL in self.config.events
        while not self._stop.wait(interval):
            try:
                self._sample_once(me, want_cpu, want_wall)
            except Exception as exc:  # noqa: BLE001 - a sampler must not die silently
                self._notes.append(f"python engine: sampling error {type(exc).__name__}: {exc}")

    def _sample_once(self, me: int, want_cpu: bool, want_wall: bool) -> None:
        builder = self._builder
        now = time.monotonic_ns()
        rel = now - self._start_mono
        frames = sys._current_frames()
        for t in threading.enumerate():
            if t.ident is not None and t.ident not in self._names:
                self._names[t.ident] = (t.native_id or t.ident, t.name)
        for ident, frame in frames.items():
            if ident == me:
                continue
            tid, name = self._names.get(ident, (ident, f"Thread {ident}"))
            clock = self._clocks.get(ident)
            if clock is None and ident not in self._clocks:
                clock = self._clocks[ident] = _thread_cpu_clock(ident)
            cpu_now = clock() if clock else None
            last_wall, last_cpu = self._last.get(ident, (now - self.config.interval_ns, cpu_now))
            self._last[ident] = (now, cpu_now)
            stack = self._stack_id(frame)
            thread = builder.thread_id(tid, name)
            labels = _labels.thread_label_ids.get(ident, 0)
            labelset = _labels.labelset(labels)
            cpu_delta = (cpu_now - last_cpu) if (cpu_now is not None and last_cpu is not None) else 0
            if want_wall:
                state = "cpu" if cpu_delta * 2 > (now - last_wall) else "off-cpu"
                lid = builder.labels_id(labelset.merged({"state": state}))
                builder.add(EventType.WALL, stack, thread, lid, rel, 1, now - last_wall)
            if want_cpu and cpu_delta > 0:
                builder.add(EventType.CPU, stack, thread, builder.labels_id(labelset), rel, 1, cpu_delta)

    def _stack_id(self, frame) -> int:
        builder = self._builder
        ids: list[int] = []
        depth = 0
        max_depth = self.config.max_depth
        while frame is not None and depth < max_depth:
            code = frame.f_code
            key = (code, frame.f_lineno)
            fid = self._code_frames.get(key)
            if fid is None:
                fid = self._code_frames[key] = builder.frame_id(
                    Frame(code.co_qualname, code.co_filename, frame.f_lineno or 0, code.co_firstlineno)
                )
            ids.append(fid)
            frame = frame.f_back
            depth += 1
        if frame is not None:
            ids.append(builder.frame_id(Frame("[truncated]", kind=FrameKind.TRUNCATED)))
        ids.reverse()
        return builder.stack_id(ids)
