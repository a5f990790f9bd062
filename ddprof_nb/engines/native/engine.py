"""The native engine: per-thread CPU timers + a native wall sampler (native/cpu.c, native/wall.c).

The heavy lifting is in C and in this package's ``binding``, ``decode`` and ``session``; this class wires a session to a
drain thread and a ProfileBuilder.  The drain thread ("ddprof_nb-drain") is started
before the session so its tid can be excluded from sampling: the profiler's own threads
never appear in samples.  It sleeps in C, without the GIL, and converts records only when
there is work: the buffer a quarter full, a new thread to name while it lives, samples
naming code it has not resolved yet (0.1 s after its last wake at the earliest: code can
die, and 3.11 has no code watcher to resolve it as it dies), or ``DRAIN_INTERVAL`` (1 s)
elapsed.  Each wake takes the GIL from the profiled code (with ~3 context switches of a
busy thread), so code already resolved waits: a loop of known code wakes it once a second,
not ten times.  Wall samples carry
``state=cpu|off-cpu|gil`` in their labels (see ``decode.STATE_LABELS``).
"""

from __future__ import annotations

import errno
import os
import threading
import time

import numpy as np

from ... import labeling as _labels
from ...config import SamplerConfig
from ...errors import EngineUnavailableError, NotRunningError, ProfilerBusyError
from ...events import EventType
from ...model import Metadata, Profile, ProfileBuilder
from ...render.format import format_bytes, format_count, format_duration
from ..base import Engine
from . import binding
from .alloc import AllocTracker
from .decode import RecordConverter
from .lockpark import WAIT_KINDS, WaitClassifier
from .session import Session, after_fork_child, cpu_thread_totals, wait_stats

_active: "NativeEngine | None" = None
DRAIN_INTERVAL = 1.0  # seconds between drains at most; new code makes it come sooner (module docstring)


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
        if drain_interval is None:
            drain_interval = DRAIN_INTERVAL
        self._drain_interval = drain_interval
        self._session_knobs = {"merge_wall": merge_wall, "drain_early": drain_early,
                               "drain_new_code": drain_new_code}
        self._read_mode = read_mode
        self._wall_per_tick = wall_threads_per_tick
        self._wait_knobs = {"wait_threshold_ns": wait_threshold_ns, "wait_max_rate": wait_max_rate}  # lock/park
        self._session = None
        self._converter = None
        self._thread = None
        self._stop_event = threading.Event()
        self._go = threading.Event()
        self._drain_tid = 0
        self._names: dict[int, str] = {}
        self._errors: list[str] = []
        self._forked = False
        self._start_ns = 0

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
        session = Session(
            self.config.interval_ns, self.config.max_depth, self.config.events,
            ring_records=self._ring_records, agg_keys=self._agg_keys, wall_threads_per_tick=self._wall_per_tick,
            read_mode=self._read_mode, exclude_tids=(self._drain_tid,),
            alloc_rate=self.config.alloc_rate, native_alloc=self.config.native_alloc, **self._session_knobs,
            **self._wait_knobs,  # lock/park: short-wait threshold, records/s (0 = defaults)
        )
        try:
            session.start()
        except BaseException:
            self._stop_event.set()
            self._go.set()
            self._thread.join()
            raise
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
        if EventType.ALLOC in self.config.events:  # allocations: type leaves, LIVE at stop
            self._converter.alloc = AllocTracker(self._converter.builder)
        if self.live is not None:
            self._converter.builder.tap = self.live.feed
        self._refresh_names()
        # threads started from now on are named as they start: the drain names the threads
        # it finds alive, but it needs the GIL, which beside dozens of busy threads it gets a
        # few times a second, and a short thread is gone by then
        _labels.add_start_hook(_name_started_thread)
        _labels.install_propagation()
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
        session = self._session  # stop() clears it before joining this thread
        if session is None:
            return
        self._refresh_names()
        session.drain(self._converter)
        if self._converter.alloc is not None:  # allocations
            self._converter.alloc.flush()
        if self.live is not None:  # the live view reads what was drained so far
            self._converter.builder.flush()

    def _drain_loop(self) -> None:
        self._go.wait()
        session = self._session
        while session is not None and not self._stop_event.is_set():
            if session.wait(self._drain_interval) < 0 or self._stop_event.is_set():
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
        secs = max(duration_ns / 1e9, 1e-9)
        notes = []
        cpu, wall = stats["samples"][EventType.CPU], stats["samples"][EventType.WALL]
        if EventType.CPU in self.config.events:
            notes.append(f"cpu: {format_count(cpu)} samples ({format_count(cpu / secs)}/s across all threads; "
                         f"target {format_count(1e9 / self.config.interval_ns)}/s per busy thread)")
        if EventType.WALL in self.config.events:
            ticks = stats["wall_ticks"]
            notes.append(f"wall: {format_count(wall)} samples in {format_count(ticks)} ticks "
                         f"({format_count(ticks / secs)} ticks/s, target {format_count(1e9 / self.config.interval_ns)}/s); "
                         "labels state=cpu|off-cpu|gil")
            if stats["wall_records"] < wall:
                notes.append(f"wall: {wall} samples arrived as {stats['wall_records']} records (a thread's identical "
                             f"samples within one time tick merged); {stats['wall_unchanged']} samples of threads that "
                             "had not run since their previous sample reused its stack")
        if stats["handler_calls"]:
            notes.append(f"signal handler: {format_duration(stats['handler_ns'] / stats['handler_calls'])} "
                         "per CPU sample")
        if stats["segv_replaced"]:
            notes.append("degraded: another library replaced the SIGSEGV/SIGBUS handler while profiling; "
                         "safe reads switched to process_vm_readv (slower, still safe)")
        elif stats["read_mode"] == 1:
            notes.append("safe reads: process_vm_readv")
        if stats["prof_replaced"] and EventType.CPU in self.config.events:
            notes.append("cpu: degraded: another tool installed its own SIGPROF handler during the session (a "
                         "setitimer/vmprof-style profiler); CPU sampling stopped then so as not to feed it our timer "
                         "signals, and its handler was left in place at stop")
        if stats["timer_failures"]:
            notes.append(_timer_note(stats["timer_failures"], stats.get("timer_errno", 0)))
        late = _late_signals_note(stats["cpu_used_ns"], stats["cpu_sampled_ns"], self.config.interval_ns)
        if late and EventType.CPU in self.config.events:
            notes.append(late)
        if stats["threads_overflow"]:
            notes.append(f"degraded: {stats['threads_overflow']} thread(s) beyond the 4096-thread table were not sampled")
        torn = sum(stats["dropped_torn"].values())
        if torn:
            notes.append(f"{torn} sample(s) dropped as torn/inconsistent reads (their time carried to the next sample)")
        full = sum(stats["dropped_full"].values())
        if full:
            notes.append(f"{full} sample(s) dropped: sample buffer full")
        carried = sum(stats["carried_full"].values())
        if carried:
            notes.append(f"{carried} CPU/wall sample(s) found the sample buffer full: each one's time went to its "
                         "thread's next sample (thread totals stay exact; their stacks are thinned)")
        if stats["agg_in"]:
            notes.append(f"native aggregation: {stats['agg_in']} records merged into {stats['agg_out']} before the "
                         f"drain (fixed size {format_bytes(stats['agg_bytes'])})"
                         + (f"; full {stats['agg_full']} time(s), records waited in the ring" if stats["agg_full"] else ""))
        if stats["agg_folded"]:
            notes.append(f"degraded: {stats['agg_folded']} sample(s) found the native aggregate full (more distinct "
                         "stacks than it holds before the drain came) and were added to their thread's previous "
                         "record: thread and event totals stay exact, the split between stacks is thinned")
        if conv.unknown_frames:
            notes.append(f"{conv.unknown_frames} frame(s) could not be resolved (code freed before resolution): [unknown]")
        if stats["graveyard_overflow"]:
            notes.append(f"{stats['graveyard_overflow']} dying code object(s) not kept: graveyard full")
        notes.extend(self._lockpark_notes())  # lock/park
        if "alloc" in stats:  # allocations
            notes.extend(_alloc_notes(self.config.alloc_rate, stats["alloc"], conv.alloc))
            notes.extend(_native_alloc_notes(self.config.native_alloc, stats["alloc_native"]))
        notes.extend(self._errors)
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
                "wall_state_label": "state=cpu|off-cpu|gil",
            },
        )
        builder = conv.builder
        builder.metadata = meta
        profile = builder.build(end_ns=meta.end_ns)
        note = _calibrate_cpu(profile, stats.get("cpu_threads") or {})
        return profile.with_metadata(notes=meta.notes + (note,)) if note else profile

    # ---- lock/park ------------------------------------------------------------------------
    def _lockpark_notes(self) -> list[str]:
        """What the lock/park hooks saw and what they cannot see."""
        if not any(e in self.config.events for e in (EventType.LOCK, EventType.PARK)):
            return []
        w = wait_stats()
        notes = [
            f"lock/park: {w['slots_patched']} GOT slot(s) hooked in {w['objects']} loaded object(s); "
            f"{w['records']} wait(s) recorded; waits under {format_duration(w['threshold_ns'])} sampled with "
            f"p = d/T and weight T ({w['short_skipped']} skipped); objects loaded during the session were hooked "
            f"at the sampler's next tick ({w['passes']} patch pass(es)); lock creation sites are unknown (locks "
            "created before start are covered)"
        ]
        if w["edge_records"]:
            notes.append(f"lock/park: {w['edge_records']} wait(s) that began before the start or were still going on "
                         "at stop counted for their part inside the session")
        if w["protect_failed"]:
            notes.append(f"lock/park: {w['protect_failed']} slot(s) left unhooked: their page's protection could not "
                         "be changed")
        if w["rate_dropped"]:
            notes.append(f"lock/park: {w['rate_dropped']} wait(s) thinned out by the records-per-second limit "
                         "(kept waits weighted 1/p, and waits over the hard cap added to their thread's next record, "
                         "so totals stay unbiased)")
        if not w["slots_patched"]:
            notes.append("lock/park: degraded: no wait function could be hooked in this process")
        else:
            missed = [WAIT_KINDS[k] for k in sorted(WAIT_KINDS) if w["kinds_foreign"] >> k & 1
                      and not w["kinds_patched"] >> k & 1]
            if missed:
                notes.append(f"lock/park: degraded: {', '.join(missed)} could not be hooked (every import of it resolves "
                             "to another library's function, e.g. a sanitizer's interceptor): waits in it are not seen"
                             + (" (lock waits, and parks in Event/Condition/Queue)" if "sem_wait" in missed else ""))
        if w["restore_mismatch"]:
            notes.append(f"lock/park: {w['restore_mismatch']} slot(s) re-patched by someone else were left as found")
        return notes


def _calibrate_cpu(profile: Profile, totals: dict[int, tuple[int, int]]) -> str | None:
    """Scale each thread's CPU samples so that they add up to what its own CPU clock says it
    used during the session (in place; returns a note, or None when nothing was scaled).

    A thread's CPU timer signals when the kernel finds its period used up, at a clock tick
    the thread is running for: a thread that runs in short bursts between ticks (a worker
    waking every few ms, a busy machine) is signalled late, and the CPU it used since its
    last signal is never signalled at all at stop.  Its samples still say where its CPU
    went; its clock says how much: the total comes from the clock, the split from the
    samples (every sample of the thread weighted alike)."""
    rows = profile.event == EventType.CPU.value
    if not totals or not rows.any():
        return None
    factors = []
    for index, thread in enumerate(profile.threads):
        used = totals.get(thread.tid, (0, 0))[0]
        sel = rows & (profile.thread == index)
        recorded = int(profile.values[sel, 1].sum()) if used else 0
        if recorded <= 0:
            continue
        k = used / recorded
        profile.values[sel, 1] = np.rint(profile.values[sel, 1] * k).astype(np.int64)
        factors.append(k)
    if not factors:
        return None
    return (f"cpu: each thread's CPU total is its own CPU clock's ({len(factors)} thread(s); its samples, which "
            f"split it between stacks, had accounted x{format_count(1 / max(factors))} to x{format_count(1 / min(factors))} of it: "
            "timer signals come at clock ticks the thread runs for, and the last period before stop never signals)")


def _late_signals_note(used_ns: int, sampled_ns: int, interval_ns: int) -> str | None:
    """A note when the CPU timers' signals accounted well under the CPU the threads used
    (the kernel checks a thread's CPU timer only at clock ticks it is on CPU for: on an
    overloaded machine or VM their signals come late, coalesced, or not before stop)."""
    if used_ns < 20 * interval_ns or sampled_ns >= 0.75 * used_ns:
        return None
    return (f"degraded: the CPU timers' signals accounted {format_duration(sampled_ns)} of the "
            f"{format_duration(used_ns)} of CPU the sampled threads used: the kernel delivered them late or not at all (an overloaded machine or "
            "VM?); the CPU view misses the rest, other events are unaffected")


def _timer_note(failures: int, err: int) -> str:
    """Why some threads have no CPU samples: the errno of the first failed timer_create."""
    why = f"{errno.errorcode.get(err, err)}: {os.strerror(err)}" if err else "unknown error"
    if err == errno.EAGAIN:
        try:
            import resource

            limit = resource.getrlimit(resource.RLIMIT_SIGPENDING)[0]
            limit = "unlimited" if limit == resource.RLIM_INFINITY else str(limit)
        except (ImportError, AttributeError, OSError, ValueError):
            limit = "?"
        why = (f"EAGAIN: the per-user limit of pending signals, RLIMIT_SIGPENDING = {limit} (ulimit -i), is used up; "
               "each POSIX timer reserves one")
    return (f"degraded: {failures} thread(s) got no CPU timer (timer_create failed, {why}); "
            "their CPU time is missing; wall time and other events are unaffected")


# ---- allocations ------------------------------------------------------------------------------
def _alloc_notes(rate: int, st: dict, tracker: AllocTracker) -> list[str]:
    """Profile notes of the allocation sampler: rate, typing coverage, losses, limits."""
    notes = [f"alloc: {st['sampled']} samples of the Python allocators (Poisson over bytes, mean {format_bytes(rate)}; "
             "Horvitz-Thompson weights); "
             f"live: {tracker.live_rows} sampled blocks still allocated at stop"]
    total = tracker.typed + tracker.untyped
    if total:
        notes.append(f"alloc type leaf: known for {format_count(100 * tracker.typed / total)}% of samples "
                     "(unknown for MEM-domain buffers and objects freed before their type could be read)")
    if st["emit_failed"]:
        notes.append(f"alloc: {st['emit_failed']} sample(s) lost (sample buffer full)")
    if st["live_overflow"]:
        notes.append(f"live: {st['live_overflow']} sample(s) not tracked (live table full): live heap underestimated")
    if st["notes_dropped"]:
        notes.append(f"alloc: {st['notes_dropped']} type note(s) lost")
    if st["left_installed"]:
        notes.append("alloc: another allocator was installed over ours while profiling; ours stays in place as a "
                     "pass-through (no sampling) so theirs keeps working")
    if st["unlinked"]:
        which = " and ".join(name for bit, name in ((1, "PyMem"), (2, "PyObject")) if st["unlinked"] & bit)
        notes.append(f"alloc: degraded: another tool unlinked our {which} allocator hook (took it out of the chain) during the "
                     "session (tracemalloc.stop() puts back the allocator it saved, which can be older than ours): "
                     "allocations after that were not sampled, and live omits that allocator's blocks (their frees "
                     "went unseen)")
    return notes


# C allocations of extension modules (native/nalloc.c); the names follow DDP_NALLOC_* order
_NALLOC_KINDS = ("PyTraceMalloc_Track", "PyTraceMalloc_Untrack", "malloc", "calloc", "realloc", "free",
                 "posix_memalign", "aligned_alloc", "memalign", "mmap", "mmap64", "munmap", "mremap")


def _native_alloc_notes(enabled: bool, st: dict) -> list[str]:
    """Which allocation sources were active, what was hooked, what could not be."""
    if not enabled:
        return ["alloc: sources: Python allocators (PyMem, PyObject) only; C allocations of extension modules "
                "(numpy array data, malloc) not sampled (native_alloc=False)"]
    hooked = [k for i, k in enumerate(_NALLOC_KINDS) if st["kinds_patched"] >> i & 1]
    notes = [f"alloc: sources: Python allocators (PyMem, PyObject) and C allocations of extension modules: "
             f"{', '.join(hooked) or 'nothing'} hooked ({st['slots_patched']} GOT slots in {st['objects']} objects; "
             f"{st['sampled']} samples); numpy array data through PyTraceMalloc_Track "
             f"({st['tracking_objects']} object(s) report buffers there, their own malloc calls are left to it)"]
    if st["not_python"]:
        notes.append(f"alloc: {st['not_python']} C allocation sample(s) on threads running no Python "
                     "(native worker threads) were not recorded")
    if st["emit_failed"]:
        notes.append(f"alloc: {st['emit_failed']} C allocation sample(s) lost (sample buffer full)")
    if st["live_overflow"]:
        notes.append(f"live: {st['live_overflow']} C allocation sample(s) not tracked (live table full)")
    if st["maps_trimmed"]:
        notes.append(f"live: {st['maps_trimmed']} sampled mapping(s) partly unmapped: live counts the larger piece "
                     "left of each (a hole in the middle drops the smaller side)")
    if st["slots_foreign"]:
        foreign = [k for i, k in enumerate(_NALLOC_KINDS) if st["kinds_foreign"] >> i & 1]
        notes.append(f"alloc: {st['slots_foreign']} slot(s) of {', '.join(foreign)} resolve to another allocator "
                     "(an interposed malloc such as jemalloc or tcmalloc, or another tool's hook) and were left "
                     "alone: blocks allocated there are not sampled")
    if st["protect_failed"]:
        notes.append(f"alloc: {st['protect_failed']} GOT slot(s) could not be made writable: not hooked")
    if st["restore_mismatch"]:
        notes.append(f"alloc: degraded: another tool (memray, for one) re-patched {st['restore_mismatch']} of our C "
                     "allocator slots during the session and they were left theirs: C allocations after that were "
                     "not sampled, and live may hold C blocks whose free went unseen")
    notes.append("alloc: not sampled: the RAW domain (PyMem_RawMalloc: the interpreter's own C buffers, zlib and "
                 "bz2 streams included), the interpreter's direct malloc and mmap calls, file mappings (mmap of a "
                 "file: its pages are the file's), and the blocks of allocators linked statically into a library "
                 "(e.g. jemalloc or mimalloc inside a wheel: their arenas show as [mmap] where they grow, not per block)")
    return notes
