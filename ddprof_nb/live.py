"""A running session seen while it runs: the rows drained so far, kept aggregated, and the
thread that hands a snapshot of them to a view about once a second.

``LiveAggregate.feed`` is a ``ProfileBuilder.tap``: the engine's consumer (the native drain
thread, the python engine's sampling thread) calls it with each batch of rows it adds,
holding the GIL; it only copies the new frames and stacks and queues the batch.  The
refresh thread (``LiveRefresher``, "ddprof_nb-live": its name marks it as the profiler's
own in every view) folds the queued batches into the running aggregate, keyed by (event,
stack, thread) with the time dropped, plus one count per (event, thread, second) for the
recent activity, so each refresh costs what arrived since the last one plus the unique
keys, never the whole session again.

A *sink* shows the snapshots: ``update(snapshot)`` from the refresh thread, ``finish(profile,
error)`` from the front end once the session stopped (the explorer widget in a notebook, a
line on stderr elsewhere: ``ddprof_nb.live_display``).  The sampler stops the refresh
thread before its engine, so no refresh outlives the session.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .events import EventType
from .model import EMPTY_LABELS, Metadata, Profile, aggregate_columns

__all__ = ["LiveAggregate", "LiveSnapshot", "LiveRefresher", "REFRESH_S", "RECENT_S", "THREAD_NAME", "shown_event"]

REFRESH_S = 1.0  # seconds between refreshes
RECENT_S = 10  # seconds of per-thread activity a snapshot carries
THREAD_NAME = "ddprof_nb-live"
_KEEP_S = 60  # seconds of per-thread activity kept (older seconds are never shown)
_NS = 1_000_000_000


@dataclass
class LiveSnapshot:
    """What the session sampled so far, as one refresh shows it."""

    profile: Profile  # every row drained so far, aggregated without time (whole stacks)
    elapsed_s: float  # since the session started
    samples: dict[EventType, int]  # samples per event so far
    # per event, per thread index: samples in each of the last ``RECENT_S`` whole seconds, oldest first
    recent: dict[EventType, dict[int, list[int]]] = field(default_factory=dict)
    refresh: int = 0  # 1 for the first snapshot


def shown_event(profile: Profile) -> EventType | None:
    """The event a live display shows: CPU when it has some (where the time goes while the cell
    runs), else the first event with some.  Rows that weigh nothing (the observations behind
    native_threads' attribution: CPU rows of count 0, in an alloc-only session too) show nothing."""
    events = [e for e in profile.events if profile.total(e, 0) or profile.total(e)]
    if not events:
        return None
    return EventType.CPU if EventType.CPU in events else events[0]


class LiveAggregate:
    """The running aggregate a live view reads (see the module docstring)."""

    def __init__(self, start_mono_ns: int | None = None):
        self.start_mono_ns = time.monotonic_ns() if start_mono_ns is None else start_mono_ns
        self._lock = threading.Lock()
        self._frames: list = []
        self._stacks: list = []
        self._threads: list = []
        self._queued: list[tuple[np.ndarray, ...]] = []
        self._agg: tuple[np.ndarray, ...] | None = None  # event, stack, thread, values
        self._seconds: dict[tuple[int, int, int], int] = {}  # (event, thread, second) -> samples
        self._samples: dict[int, int] = {}
        self.rows = 0  # rows fed so far

    # -- the consumer's side (a ProfileBuilder tap) -----------------------------------------
    def feed(self, builder, event, stack, thread, labels, time_ns, values) -> None:
        frames, stacks, threads = builder.interned_since(len(self._frames), len(self._stacks))
        with self._lock:
            self._frames.extend(frames)
            self._stacks.extend(stacks)
            self._threads = threads
            self._queued.append((event, stack, thread, time_ns, values))
            self.rows += len(stack)

    # -- the refresh thread's side ------------------------------------------------------------
    def snapshot(self, refresh: int = 0) -> LiveSnapshot:
        with self._lock:
            queued, self._queued = self._queued, []
            frames, stacks, threads = list(self._frames), list(self._stacks), list(self._threads)
        if queued:
            self._fold(queued)
        agg = self._agg
        if agg is None:
            agg = (np.zeros(0, np.uint8), np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros((0, 2), np.int64))
        n = len(agg[0])
        zeros = np.zeros(n, dtype=np.int64)
        elapsed_ns = max(0, time.monotonic_ns() - self.start_mono_ns)
        profile = Profile(frames=frames, stacks=stacks, threads=threads, labelsets=[EMPTY_LABELS], event=agg[0],
                          stack=agg[1], thread=agg[2], labels=zeros, time_ns=zeros, values=agg[3],
                          metadata=Metadata(end_ns=elapsed_ns))
        return LiveSnapshot(profile, elapsed_ns / 1e9, {EventType.from_id(e): n for e, n in self._samples.items()},
                            self._recent(elapsed_ns // _NS), refresh)

    def _fold(self, queued: list) -> None:
        ev, st, th, t, vals = (np.concatenate([np.asarray(c) for c in col]) for col in zip(*queued))
        vals = vals.reshape(-1, 2)
        zeros = np.zeros(len(ev), dtype=np.int64)
        sec = t // _NS
        # per (event, thread, second): few rows (threads x the seconds since the last refresh)
        e2, _, th2, _, s2, v2 = aggregate_columns(ev, zeros, th, zeros, sec, vals)
        for e, thr, s, c in zip(e2.tolist(), th2.tolist(), s2.tolist(), v2[:, 0].tolist()):
            key = (e, thr, s)
            self._seconds[key] = self._seconds.get(key, 0) + c
            self._samples[e] = self._samples.get(e, 0) + c
        if self._agg is not None:
            a = self._agg
            ev, st, th = np.concatenate([a[0], ev]), np.concatenate([a[1], st]), np.concatenate([a[2], th])
            vals = np.concatenate([a[3], vals])
            zeros = np.zeros(len(ev), dtype=np.int64)
        e3, s3, t3, _, _, v3 = aggregate_columns(ev, st, th, zeros, zeros, vals)
        self._agg = (np.asarray(e3, np.uint8), np.asarray(s3, np.int32), np.asarray(t3, np.int32), v3)
        newest = int(sec.max())
        if len(self._seconds) > 64 and any(k[2] < newest - _KEEP_S for k in self._seconds):
            self._seconds = {k: v for k, v in self._seconds.items() if k[2] >= newest - _KEEP_S}

    def _recent(self, now_s: int) -> dict[EventType, dict[int, list[int]]]:
        # the current second is unfinished, and the one before still partly in the sampler's
        # buffers (the drain runs about once a second): both are left out
        last = now_s - 1
        first = last - RECENT_S
        out: dict[EventType, dict[int, list[int]]] = {}
        for (e, thr, s), c in self._seconds.items():
            if first <= s < last:
                row = out.setdefault(EventType.from_id(e), {}).setdefault(thr, [0] * RECENT_S)
                row[s - first] += c
        return out


class LiveRefresher:
    """The thread that calls ``sink.update(snapshot)`` every ``period`` seconds until stopped.

    A sink that raises is called no more (its first error is kept in ``error``): the
    session goes on; the view stops refreshing."""

    def __init__(self, aggregate: LiveAggregate, sink, period: float = REFRESH_S):
        if not period > 0:
            raise ValueError(f"invalid live refresh period {period!r}: give seconds > 0")
        self.aggregate = aggregate
        self.sink = sink
        self.period = period
        self.refreshes = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                snapshot = self.aggregate.snapshot(self.refreshes + 1)
                if self._stop.is_set():
                    break
                self.sink.update(snapshot)
                self.refreshes += 1
            except Exception as exc:  # noqa: BLE001 - a broken view must not break the session
                self.error = f"{type(exc).__name__}: {exc}"
                break

    def stop(self) -> None:
        """Stop refreshing; returns once the thread has ended (a refresh in progress ends first)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
