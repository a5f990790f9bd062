"""The native engine: per-thread CPU timers + a native wall sampler (native/cpu.c, native/wall.c).

The heavy lifting is in C and in this package's ``binding``, ``decode`` and ``session``; this class wires a session to a
drain thread and a ProfileBuilder.  The drain thread ("ddprof_nb-drain") is started
before the session so its tid can be excluded from sampling: the profiler's own threads
never appear in samples.  It sleeps in C, without the GIL, and converts records only when
there is work: the buffer a quarter full, a new thread to name while it lives, samples
naming code it has not resolved yet (0.1 s after its last wake at the earliest: code can
die, and 3.11 has no code watcher to resolve it as it dies), or ``DRAIN_INTERVAL`` (1 s)
elapsed: ``QUIET_DRAIN_INTERVAL`` (10 s) in a CPU/wall session without a live view, whose
records nothing reads before stop (stop converts what waited: at most ~10 s of records).  Each wake takes the GIL from the profiled code (with
~3 context switches of a busy thread), so code already resolved waits: a loop of known code
wakes it once a second at most, not ten times.  Records that wait are merged in the native
aggregate, and when the drain takes them, again under the time tick of the latest one
(native/agg.c: ddp_agg_coarsen), so a later drain converts fewer records for the same
Profile: an idle thread's stack once per tick of the Profile, not once per 10 ms of the
session's first seconds.  Wall samples carry
``state=cpu|off-cpu|gil`` in their labels (see ``decode.STATE_LABELS``).
"""

from __future__ import annotations

import os
import threading
import time

from ... import labeling as _labels
from ...config import SamplerConfig
from ...errors import EngineUnavailableError, NotRunningError, ProfilerBusyError
from ...events import EventType
from ...model import Metadata, Profile, ProfileBuilder
from ...render.format import format_duration
from ..base import Engine
from . import binding, process_cpu
from .alloc import AllocTracker
from .cpu_totals import calibrate_cpu
from .decode import RecordConverter
from .lockpark import WaitClassifier
from .nativeframes import NativeMerger
from .session_notes import session_notes
from .pools import MASKED, attribute_pools
from .session import Session, after_fork_child, cpu_thread_totals, native_alloc_threads, native_thread_totals

_active: "NativeEngine | None" = None
DRAIN_INTERVAL = 1.0  # seconds between drains at most; new code makes it come sooner (module docstring)
QUIET_DRAIN_INTERVAL = 10.0  # the same for CPU/wall sessions without a live view (module docstring)


def _after_fork_child() -> None:
    global _active
    if _active is not None:
        _active._forked = True
        _active = None
    after_fork_child()


# ---- labels: each thread's label word (native/labels.c), written by ddprof_nb.labeling ----------
_labels_pid = 0  # the process whose threads' words were synced (a fork child syncs again)


def _label_view():
    """Slot provider for ``labeling``: a one-item 'Q' view of the calling thread's native
    label word.  The word is static storage in the native module (never freed), so the view
    stays valid whatever happens to sessions or this thread; None when the table is full."""
    ptr = binding.lib.ddp_label_word()
    if ptr == binding.ffi.NULL:
        return None
    return memoryview(binding.ffi.buffer(ptr, 8)).cast("Q")


def _mirror_labels() -> None:
    """Keep the native label words in step with ``labeling`` from now on, in and out of
    sessions (a label change is then a memoryview store; the provider stays registered
    so no word goes stale between sessions).  Threads that published before this (or
    before a fork) have their words written here once."""
    global _labels_pid
    if _labels_pid == os.getpid():
        return
    if _label_view not in _labels._providers:
        _labels.add_slot_provider(_label_view)
    else:
        _labels._mirrors_changed()  # after a fork: views are asked for again (new tids)
    _labels_pid = os.getpid()
    by_ident = {t.ident: t.native_id for t in threading.enumerate()}
    for ident, label_id in list(_labels.thread_label_ids.items()):
        tid = by_ident.get(ident)
        if tid and label_id:
            binding.lib.ddp_set_thread_labels_for(tid, label_id)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_child)


def _name_started_thread(thread: threading.Thread) -> None:
    engine, tid = _active, thread.native_id
    if engine is not None and tid:
        engine._names[tid] = thread.name


class NativeEngine(Engine):
    """CPU and wall sampling of every Python thread, in native code (Linux, CPython 3.11-3.15, GIL builds)."""

    name = "native"
    supported_events = frozenset({EventType.CPU, EventType.WALL})
    supported_events |= {EventType.LOCK, EventType.PARK}  # lock/park: GOT-hooked waits (native/waits.c)
    supported_events |= {EventType.ALLOC}  # allocations (native/alloc.c); LIVE is produced at stop

    def __init__(self, config: SamplerConfig, *, ring_records: int = 0, agg_keys: int = 0,
                 drain_interval: float | None = None,
                 read_mode: str = "guarded", wall_threads_per_tick: int = 0,
                 wait_threshold_ns: int = 0, wait_max_rate: int = 0,
                 merge_wall: bool = True, drain_early: bool = True, drain_new_code: bool = True):
        """``ring_records``, ``agg_keys``, ``read_mode``, ``wall_threads_per_tick``, ``drain_interval`` (max
        seconds between drains), ``drain_early``, ``drain_new_code`` and ``merge_wall`` are
        tuning/test knobs."""
        super().__init__(config)
        self._ring_records = ring_records
        self._agg_keys = agg_keys
        self._drain_interval = drain_interval  # None: chosen at start (_default_drain_interval)
        self._session_knobs = {"merge_wall": merge_wall, "drain_early": drain_early,
                               "drain_new_code": drain_new_code}
        self._read_mode = read_mode
        self._wall_per_tick = wall_threads_per_tick
        self._wait_knobs = {"wait_threshold_ns": wait_threshold_ns, "wait_max_rate": wait_max_rate}  # lock/park
        self._session = None
        self._converter = None
        self._thread = None
        self._stop_event = threading.Event()
        # one drain at a time: the converter and the allocation tracker are not thread-safe, and a
        # drain forced from another thread (tests do) beside the drain thread's counted rows twice
        self._drain_lock = threading.Lock()
        self._go = threading.Event()
        self._drain_tid = 0
        self._names: dict[int, str] = {}
        self._errors: list[str] = []
        self._forked = False
        # threads that run no Python: their CPU and C allocations sampled, attributed at stop (pools.py)
        on = config.native_threads != "off"
        self._cpu_pools = on and EventType.CPU in config.events
        self._pools = self._cpu_pools or (on and EventType.ALLOC in config.events and config.native_alloc)
        self._alloc_refused = 0  # threads that run no Python beyond the names table (their allocations not recorded)
        self._pool_tids: set[int] = set()
        self._pool_stats: dict[str, int] = {}
        self._start_ns = 0
        self._cpu_at = None  # (start, stop) process_cpu snapshots of a CPU session

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return binding.unavailable_reason()

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        global _active
        reason = self.unavailable_reason()
        if reason:
            raise EngineUnavailableError(reason)
        if _active is not None or self._session is not None:
            raise ProfilerBusyError("a native profile is already being taken in this process")
        self._thread = threading.Thread(target=self._drain_loop, name="ddprof_nb-drain", daemon=True)
        self._thread.start()
        while self._thread.native_id is None:  # set before run(): at most a few microseconds
            time.sleep(0.0001)
        self._drain_tid = self._thread.native_id
        # before the session records: its first call imports concurrent.futures (logging, re,
        # dataclasses: several MB of allocations), which are not the user's
        _labels.install_propagation()
        session = Session(
            self.config.interval_ns, self.config.max_depth, self.config.events,
            ring_records=self._ring_records, agg_keys=self._agg_keys, wall_threads_per_tick=self._wall_per_tick,
            read_mode=self._read_mode, exclude_tids=(self._drain_tid,),
            alloc_rate=self.config.alloc_rate, native_alloc=self.config.native_alloc,
            native_frames=bool(self.config.native), native_threads=self._pools, **self._session_knobs,
            **self._wait_knobs,  # lock/park: short-wait threshold, records/s (0 = defaults)
        )
        try:
            session.start()
        except BaseException:
            self._stop_event.set()
            self._go.set()
            self._thread.join()
            raise
        if EventType.CPU in self.config.events:
            self._cpu_at = (process_cpu.snapshot(), None)
        stats = session.stats()
        mono0 = stats["start_mono_ns"]
        self._start_ns = time.time_ns() - (time.monotonic_ns() - mono0)
        self._session = session
        self._converter = RecordConverter(
            ProfileBuilder(), mono0, exclude_tids=(self._drain_tid,), thread_names=self._names,
            base_labels=dict(self.config.labels),
        )
        # ---- lock/park: classify wait records at drain time (lockpark.py)
        waits = [e for e in self.config.events if e in (EventType.LOCK, EventType.PARK)]
        if waits:
            self._converter.waits = WaitClassifier(self._converter.builder, waits)
        # ---- end lock/park
        if self.config.native or self._pools:  # native frames: named, merged between the Python ones
            self._converter.native = NativeMerger(self._converter.builder,
                                                  keep_eval=self.config.native == "interpreter")
        if EventType.ALLOC in self.config.events:  # allocations: type leaves, LIVE at stop
            self._converter.alloc = AllocTracker(self._converter.builder)
        if self.live is not None:
            self._converter.builder.tap = self.live.feed
        self._refresh_names()
        # threads started from now on are named as they start: the drain names the threads
        # it finds alive, but it needs the GIL, which beside dozens of busy threads it gets a
        # few times a second, and a short thread is gone by then
        _labels.add_start_hook(_name_started_thread)
        _mirror_labels()
        _active = self
        self._go.set()

    def exclude_thread(self, tid: int) -> bool:
        return self._session is not None and binding.lib.ddp_exclude_thread(int(tid)) == 0

    def _refresh_names(self) -> None:
        for t in threading.enumerate():
            if t.native_id and t.native_id not in self._names:
                self._names[t.native_id] = t.name

    def _drain_once(self) -> None:
        with self._drain_lock:
            session = self._session  # stop() clears it before joining this thread
            if session is None:
                return
            self._refresh_names()
            session.drain(self._converter)
            if self._converter.alloc is not None:  # allocations
                self._converter.alloc.flush()
            if self.live is not None:  # the live view reads what was drained so far
                self._converter.builder.flush()

    def _default_drain_interval(self) -> float:
        """A live view shows what was drained, and allocation and lock/park records are
        followed on the Python side as they come: a drain a second.  Otherwise records
        wait in the native aggregate, merged there, until there is work (module docstring)."""
        if self.live is not None or not set(self.config.events) <= {EventType.CPU, EventType.WALL}:
            return DRAIN_INTERVAL
        return QUIET_DRAIN_INTERVAL

    def _drain_loop(self) -> None:
        try:  # its OS name too: `top -H`, other profilers and the process-CPU note tell it as ours
            with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
                f.write(self._thread.name)
        except OSError:
            pass
        self._go.wait()
        session = self._session
        interval = self._drain_interval if self._drain_interval is not None else self._default_drain_interval()
        while session is not None and not self._stop_event.is_set():
            if session.wait(interval) < 0 or self._stop_event.is_set():
                break  # stopped: stop() drains the rest
            try:
                self._drain_once()
            except Exception as exc:  # noqa: BLE001 - keep sampling; report in notes
                if len(self._errors) < 5:
                    self._errors.append(f"drain error: {type(exc).__name__}: {exc}")

    def stop(self) -> Profile:
        global _active
        if self._session is None:
            raise NotRunningError("the native engine is not running")
        if self._forked:  # a forked child holding the parent's engine: nothing of it runs here
            self._session = None
            raise NotRunningError("this native profile was started in the parent process (before fork)")
        session, self._session = self._session, None
        if self._cpu_at is not None:  # (before our threads are joined: their CPU is named as ours; named now,
            # since the wall thread, which builds the tables of libraries loaded in the session, is gone after)
            self._cpu_at = (self._cpu_at[0], process_cpu.snapshot(names=True))
        try:
            session.stop()
        finally:
            self._stop_event.set()
            if self._thread is not None:
                self._thread.join()
            _active = None
        try:
            self._refresh_names()
            session.drain(self._converter, final=True)
            self._converter.name_threads()
            stats = session.stats()
            stats["cpu_threads"] = cpu_thread_totals()
            if self._cpu_pools:  # threads that run no Python: their clocks calibrate their samples too
                totals, names, self._pool_stats = native_thread_totals()
                self._pool_tids = set(totals)
                self._names.update(names)
                python = stats["cpu_threads"]  # (a thread in both ran Python, then C work of its own: both count)
                stats["cpu_threads"] = {tid: tuple(a + b for a, b in zip(totals.get(tid, (0, 0)), python.get(tid, (0, 0))))
                                        for tid in totals.keys() | python.keys()}
            if self._pools and self._converter.alloc is not None:  # ... and those whose C allocations were recorded
                names, self._alloc_refused = native_alloc_threads()
                self._pool_tids |= set(names)
                self._names.update(names)
            self._converter.name_threads()
            if self._converter.alloc is not None:  # allocations: last ALLOC rows, then LIVE
                self._converter.alloc.flush(final=True)
                self._converter.alloc.add_live()
                stats["alloc"] = AllocTracker.stats()
                stats["alloc_native"] = AllocTracker.native_stats()
        finally:
            session.release()
        return self._build(stats)

    # -- the profile ------------------------------------------------------------------
    def _build(self, stats: dict) -> Profile:
        conv = self._converter
        duration_ns = max(0, stats["stop_mono_ns"] - stats["start_mono_ns"])
        dropped = {}
        for e in self.supported_events:
            n = stats["dropped_full"][e] + stats["dropped_torn"][e]
            if n:
                dropped[e] = n
        notes = session_notes(self.config, stats, conv, self._errors)
        meta = Metadata(
            start_ns=self._start_ns,
            end_ns=self._start_ns + duration_ns,
            interval_ns=self.config.interval_ns,
            engine=self.name,
            dropped=dropped,
            notes=tuple(notes),
            extra={
                "read_mode": "syscall" if stats["read_mode"] == 1 else "guarded",
                "handler_mean_ns": str(stats["handler_ns"] // max(1, stats["handler_calls"])),
                "threads_seen": str(stats["threads_seen"]),
                "wall_records": str(stats["wall_records"]),
                "wall_unchanged": str(stats["wall_unchanged"]),
                "cpu_kicks": str(stats.get("cpu_kicks", 0)),  # CPU samples the sampler thread took
                "wall_state_label": "state=cpu|off-cpu|gil",
                # alloc/live counts are estimated objects: the number of samples is said here
                **({"samples_alloc": str(stats["alloc"]["sampled"] + stats["alloc_native"]["sampled"]),
                    "samples_live": str(conv.alloc.live_rows)} if "alloc" in stats else {}),
            },
        )
        builder = conv.builder
        builder.metadata = meta
        profile = builder.build(end_ns=meta.end_ns)
        profile, cpu_notes = calibrate_cpu(profile, stats.get("cpu_threads") or {}, self._names, self.config.labels)
        if self._cpu_at is not None and self._cpu_at[1] is not None:
            quiet = process_cpu.QUIET_SHARE if self.config.native_threads == "off" else process_cpu.QUIET_SHARE_ALL_THREADS
            cpu_notes += process_cpu.coverage_notes(*self._cpu_at, profile, own_tids={self._drain_tid}, quiet_share=quiet)
        if self._pools:
            pools = attribute_pools(profile, self._pool_tids, self._names, raw=self.config.native_threads == "raw",
                                    keep_native=bool(self.config.native))
            profile = pools.profile
            cpu_notes += pools.notes()
            if self._alloc_refused:
                cpu_notes.append(f"alloc: {self._alloc_refused} thread(s) that run no Python beyond the 4096 named per "
                                 "session: their C allocations were not recorded")
            if self._pool_stats.get("unseen_ns", 0) >= self.config.interval_ns:
                cpu_notes.append(f"threads that run no Python: {format_duration(self._pool_stats['unseen_ns'])} of CPU "
                                 "went to threads that started and ended between two scans (not in the profile)")
            if self._pool_stats.get("masked"):
                cpu_notes.append(f"threads that run no Python: {self._pool_stats['masked']} thread(s) block the "
                                 f"profiling signal (SIGPROF; numexpr's pool does): their "
                                 f"{format_duration(self._pool_stats['masked_ns'])} of CPU was read from their clocks "
                                 f"each tick, under their entry point's frames and {MASKED.name} (where inside "
                                 "them it ran is unknown)")
            if self._pool_stats.get("beyond"):
                cpu_notes.append(f"threads that run no Python: {self._pool_stats['beyond']} sightings of threads "
                                 "beyond the 256 sampled at once (their CPU is not in the profile; a thread that "
                                 "runs takes the place of one idle for 50 ticks)")
        return profile.with_metadata(notes=meta.notes + tuple(cpu_notes)) if cpu_notes else profile
