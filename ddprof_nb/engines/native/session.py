"""One native sampling session: configure, start, wait, drain, stop (native/session.c).

``Session`` owns the process's drain buffer and hands each batch of raw records to a
``decode.RecordConverter``; the module-level functions read the C side's counters.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ...events import EventType
from ...model import MAX_TICKS, MIN_TICK_NS
from .binding import FRAME_SIZE, check, ffi, lib, require

if TYPE_CHECKING:
    from .decode import RecordConverter

__all__ = ["Session", "READ_MODES", "wait_stats", "cpu_thread_totals", "after_fork_child"]

READ_MODES = {"guarded": 0, "syscall": 1}


_scratch = {"buf": None, "size": 0}


def _drain_buffer(nbytes: int):
    """The process's drain buffer, kept between sessions (only one runs at a time; a
    session holds its own reference, so a replaced buffer lives on while it is used).
    Never freed on purpose: freeing a malloc'd block of megabytes makes glibc raise its
    mmap threshold (up to 32 MiB), after which every thread arena keeps megabytes of
    freed memory and RSS creeps over start/stop cycles.  Only a larger need replaces it."""
    if _scratch["size"] < nbytes:
        _scratch["buf"], _scratch["size"] = ffi.new("char[]", nbytes), nbytes
    return _scratch["buf"]


class Session:
    """One native sampling session (the C side allows one per process at a time)."""

    BATCH = 1024

    def __init__(self, interval_ns: int, max_depth: int, events, *, ring_records: int = 0, agg_keys: int = 0,
                 wall_threads_per_tick: int = 0, read_mode: str = "guarded", exclude_tids=(),
                 alloc_rate: int = 0, native_alloc: bool = False, wait_threshold_ns: int = 0,
                 wait_max_rate: int = 0, merge_wall: bool = True, drain_early: bool = True, drain_new_code: bool = True,
                 merge_shadow: bool = False, cpu_timer_scale: int = 1, native_frames: bool = False,
                 native_threads: bool = False):
        """``merge_wall``: identical WALL samples of a thread within one Profile time tick
        become one record (exact; off = one record per sample).  ``drain_early``: ``wait()``
        returns once the buffer is a quarter full; ``drain_new_code``: once samples name code
        no ``drain`` has resolved (0.1 s after the last wake at the earliest).  ``merge_shadow``
        (tests): every WALL sample is also written on its own with aux = 1, to check merged
        records against; ``cpu_timer_scale`` (tests): the CPU timers' period is that many
        intervals, so they signal late and the sampler thread's kicks take the samples."""
        require()
        if ffi.sizeof("ddp_frame") != FRAME_SIZE:
            raise EngineUnavailableError("native module's frame record has an unexpected size; reinstall ddprof_nb")
        if read_mode not in READ_MODES:
            raise ValueError(f"invalid read_mode {read_mode!r}; expected one of {', '.join(READ_MODES)}")
        if len(exclude_tids) > 8:
            raise ValueError("at most 8 excluded threads")
        cfg = ffi.new("ddp_config *")
        cfg.interval_ns = int(interval_ns)
        cfg.max_depth = int(max_depth)
        mask = 0
        for e in events:
            mask |= 1 << EventType.parse(e).value
        cfg.events = mask
        cfg.ring_records = int(ring_records)
        cfg.agg_keys = int(agg_keys)  # keys per native aggregate, 0 = default
        cfg.wall_threads_per_tick = int(wall_threads_per_tick)
        cfg.read_mode = READ_MODES[read_mode]
        cfg.n_exclude = len(exclude_tids)
        for i, t in enumerate(exclude_tids):
            cfg.exclude_tids[i] = int(t)
        cfg.alloc_rate = int(alloc_rate)  # allocations: mean bytes between samples, 0 = default
        cfg.native_alloc = int(bool(native_alloc))  # allocations: also C allocations of extension modules
        cfg.native_frames = int(bool(native_frames))  # samples of a thread's own stack: its native frames too
        cfg.native_threads = int(bool(native_threads))  # CPU, C allocations: threads that run no Python too
        cfg.wait_threshold_ns = int(wait_threshold_ns)  # lock/park: short-wait sampling threshold, 0 = default
        cfg.wait_max_rate = int(wait_max_rate)  # lock/park: records per second, 0 = default
        if merge_wall:
            # the Profile's time ticks: merging stays exact
            cfg.merge_tick_ns, cfg.merge_max_ticks = MIN_TICK_NS, MAX_TICKS
        cfg.drain_early = int(bool(drain_early))
        cfg.drain_new_code = int(bool(drain_new_code))
        cfg.merge_shadow = int(bool(merge_shadow))
        cfg.cpu_timer_scale = int(cpu_timer_scale)
        self._cfg = cfg
        self.record_size = 0
        self._buf = None  # drain()'s half of the process's drain buffer
        self._wait_buf = None  # wait()'s half: it takes records there without holding _lock
        self._taken = 0  # records wait() took into _wait_buf, not yet fed
        self._waiting = False  # a wait() is in its C call, writing into _wait_buf after _taken
        self._taken_out = ffi.new("int *")
        self._lock = threading.Lock()  # guards the fields above (the C side lets one consumer pop at a time)

    def start(self) -> None:
        # the drain buffer is allocated before start, so the allocation sampler never sees it
        size = ffi.sizeof("ddp_record") + self._cfg.max_depth * FRAME_SIZE
        _drain_buffer(2 * size * self.BATCH)
        check(lib.ddp_start(self._cfg), "cannot start the native sampler")
        self.record_size = lib.ddp_record_size()
        buf = _drain_buffer(2 * self.record_size * self.BATCH)
        self._buf, self._wait_buf = buf, buf + self.record_size * self.BATCH

    def stop(self) -> None:
        check(lib.ddp_stop(), "cannot stop the native sampler")

    def release(self) -> None:
        lib.ddp_release()

    def drain(self, converter: "RecordConverter", final: bool = False) -> int:
        """Move the ready records into ``converter``; returns how many were read.  A wake's
        drain stops at the records ``wait`` took if they did not fill a batch (the ring was
        empty then: later ones wait for the next wake); the ``final`` drain empties the ring."""
        with self._lock:
            if self._buf is None:
                return 0
            converter.resolver.absorb_graveyard()
            try:
                return self._feed_ready(converter, final)
            finally:
                if converter.new_codes:  # one cffi call (a GIL handoff) per wake that met new code
                    codes, fps = zip(*converter.new_codes)
                    converter.new_codes.clear()
                    lib.ddp_known_add(ffi.new("uint64_t[]", codes), ffi.new("uint64_t[]", fps), len(codes))

    def _feed_ready(self, converter: "RecordConverter", final: bool) -> int:
        total = 0
        if self._taken and not self._waiting:  # (a wait in its C call writes after them: its own drain feeds them)
            total, self._taken = self._taken, 0  # taken by wait(); short of a batch, the ring was empty then
            converter.feed(self._wait_buf, total, self.record_size)
            if total < self.BATCH and not final:
                return total
        while True:
            n = lib.ddp_drain(self._buf, self.BATCH)
            if n < 0:
                check(n, "cannot drain the native sampler")
            if n == 0:
                return total
            converter.feed(self._buf, n, self.record_size)
            total += n
            if n < self.BATCH:
                return total

    def wait(self, timeout_s: float) -> int:
        """Block, without the GIL, until the drain has work (a ``DDP_WAKE_*`` mask; 0 on
        timeout) or the session stops (-1).  Unless stopped, the records ready then are
        taken into the wait buffer in the same C call, for the next ``drain``: every cffi
        call releases the GIL, so a wake that waited, then called ``ddp_drain``, handed the
        GIL to the profiled thread and back once more (a context switch of that thread).
        One thread waits; ``drain`` may run meanwhile from any thread (``_lock`` is not held
        while blocked)."""
        with self._lock:
            if self._buf is None:
                return -1
            if self._waiting:
                raise RuntimeError("another thread is already waiting on this session")
            # records taken earlier but not fed yet (a wake whose drain was skipped at stop): never over them
            held, self._waiting = self._taken, True
        rc = -1
        self._taken_out[0] = 0
        try:
            rc = lib.ddp_drain_wait_take(max(0, int(timeout_s * 1e9)), self._wait_buf + held * self.record_size,
                                         self.BATCH - held, self._taken_out)
        finally:
            with self._lock:
                self._taken, self._waiting = held + max(0, self._taken_out[0]), False
        if rc < 0 and rc != lib.DDP_ENOTRUNNING:
            check(rc, "cannot drain the native sampler")
        return rc if rc >= 0 else -1

    @staticmethod
    def stats() -> dict:
        s = ffi.new("ddp_stats *")
        lib.ddp_get_stats(s)
        out = {name: getattr(s, name) for name in (
            "timer_failures", "threads_seen", "threads_overflow", "stale_signals", "faults", "handler_ns",
            "handler_calls", "wall_ticks", "wall_ns", "wall_records", "wall_unchanged", "graveyard_overflow",
            "read_mode", "segv_replaced",
            "start_mono_ns", "stop_mono_ns", "timer_errno", "cpu_used_ns", "cpu_sampled_ns", "prof_replaced",
            "parked_at_start", "leaked_bytes", "agg_in", "agg_out", "agg_full", "agg_bytes",
            "agg_folded", "agg_coarsened", "cpu_kicks", "cpu_at_start", "cpu_at_start_ns", "cpu_exits_dropped")}
        for name in ("samples", "dropped_full", "dropped_torn", "carried_full"):
            out[name] = {e: int(getattr(s, name)[e.value]) for e in EventType}
        return out


def wait_stats() -> dict:
    """Lock/park hook counters (native/waits.c): patched slots, records, sampled-out, dropped."""
    s = ffi.new("ddp_wait_stats *")
    lib.ddp_wait_get_stats(s)
    return {name: int(getattr(s, name)) for name in (
        "records", "short_skipped", "rate_dropped", "emit_failed", "calls", "objects", "slots_patched",
        "slots_foreign", "restore_mismatch", "restore_unloaded", "active_patches", "threshold_ns",
        "protect_failed", "passes", "edge_records", "kinds_patched", "kinds_foreign", "passes_deferred",
        "slots_rebound", "slots_unhooked")}


def cpu_thread_totals() -> dict[int, tuple[int, int]]:
    """After a session's stop, before its release: {tid: (CPU its clock says it used, CPU its
    samples carried)} for each thread that had a CPU timer in the session, those that exited
    too (a tid that left Python and came back is summed)."""
    n = lib.ddp_cpu_thread_totals(ffi.NULL, ffi.NULL, ffi.NULL, 0)
    if n <= 0:
        return {}
    tid, used, sampled = ffi.new("int32_t[]", n), ffi.new("int64_t[]", n), ffi.new("int64_t[]", n)
    n = min(n, lib.ddp_cpu_thread_totals(tid, used, sampled, n))
    totals: dict[int, tuple[int, int]] = {}
    for i in range(n):
        u, s = totals.get(tid[i], (0, 0))
        totals[tid[i]] = (u + used[i], s + sampled[i])
    return totals


def native_thread_totals() -> tuple[dict[int, tuple[int, int]], dict[int, str], dict[str, int]]:
    """After a session's stop, before its release: the threads that run no Python and had a
    CPU timer, as ``cpu_thread_totals`` gives Python threads', their OS names, and the
    sampler's counts about them."""
    n = lib.ddp_native_threads(ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, 0)
    names_of_stats = ("armed_max", "beyond", "timer_failures", "observations", "totals_dropped", "scans",
                      "tails_ns", "unseen_ns", "evicted", "masked", "masked_ns")
    out = ffi.new("uint64_t[]", len(names_of_stats))
    lib.ddp_native_threads_stats(out, len(names_of_stats))
    stats = dict(zip(names_of_stats, out))
    if n <= 0:
        return {}, {}, stats
    tid, used, sampled = ffi.new("int32_t[]", n), ffi.new("int64_t[]", n), ffi.new("int64_t[]", n)
    names = ffi.new("char[]", 16 * n)
    n = min(n, lib.ddp_native_threads(tid, used, sampled, names, n))
    totals: dict[int, tuple[int, int]] = {}
    named: dict[int, str] = {}
    raw = ffi.buffer(names)[:]
    for i in range(n):
        u, s = totals.get(tid[i], (0, 0))
        totals[tid[i]] = (u + used[i], s + sampled[i])
        named[tid[i]] = raw[16 * i:16 * i + 16].split(b"\0", 1)[0].decode("utf-8", "replace") or f"thread {tid[i]}"
    return totals, named, stats


def native_alloc_threads() -> tuple[dict[int, str], int]:
    """After a session's stop, before its release: the threads that run no Python whose C
    allocations were recorded, {tid: OS name}, and how many more were refused (table full)."""
    n = lib.ddp_alloc_threads(ffi.NULL, ffi.NULL, 0)
    refused = int(lib.ddp_alloc_threads_refused())
    if n <= 0:
        return {}, refused
    tid, names = ffi.new("int32_t[]", n), ffi.new("char[]", 16 * n)
    n = min(n, lib.ddp_alloc_threads(tid, names, n))
    raw = ffi.buffer(names)[:]
    return {tid[i]: raw[16 * i:16 * i + 16].split(b"\0", 1)[0].decode("utf-8", "replace") or f"thread {tid[i]}"
            for i in range(n)}, refused


def after_fork_child() -> None:
    """In a forked child: forget the parent's session (C state is reset by pthread_atfork)."""
    if lib is not None:
        lib.ddp_release()
