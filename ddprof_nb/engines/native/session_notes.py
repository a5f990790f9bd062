"""What a native session's counters say, as Profile notes: rates, losses, degradations.

One function per source of counters (the session, the lock/park hooks, the allocation
samplers); ``session_notes`` puts them in the order a reader meets them in a profile.
"""

from __future__ import annotations

import errno
import os

from ...events import EventType
from ...render.format import format_bytes, format_count, format_duration
from .alloc import AllocTracker
from .lockpark import WAIT_KINDS
from .session import wait_stats

__all__ = ["session_notes", "lockpark_notes", "alloc_notes", "native_alloc_notes", "late_signals_note", "timer_note"]


def session_notes(config, stats: dict, conv, errors) -> list[str]:
    """Every note of a session, from ``Session.stats()`` (+ ``alloc``/``alloc_native`` when
    allocations were sampled), the converter's counts and the drain's ``errors``."""
    secs = max(max(0, stats["stop_mono_ns"] - stats["start_mono_ns"]) / 1e9, 1e-9)
    notes = _sample_notes(config, stats, secs) + _loss_notes(stats, conv)
    notes.extend(lockpark_notes(config.events))
    if "alloc" in stats:
        notes.extend(alloc_notes(config.alloc_rate, stats["alloc"], conv.alloc))
        notes.extend(native_alloc_notes(config.native_alloc, stats["alloc_native"]))
    notes.extend(errors)
    return notes


def _sample_notes(config, stats: dict, secs: float) -> list[str]:
    """Rates of the samplers, the signal handler's cost, how memory was read, timers."""
    notes = []
    cpu, wall = stats["samples"][EventType.CPU], stats["samples"][EventType.WALL]
    if EventType.CPU in config.events:
        notes.append(f"cpu: {format_count(cpu)} samples ({format_count(cpu / secs)}/s across all threads; "
                     f"target {format_count(1e9 / config.interval_ns)}/s per busy thread)")
    if EventType.WALL in config.events:
        ticks = stats["wall_ticks"]
        notes.append(f"wall: {format_count(wall)} samples in {format_count(ticks)} ticks "
                     f"({format_count(ticks / secs)} ticks/s, target {format_count(1e9 / config.interval_ns)}/s); "
                     "labels state=cpu|off-cpu|gil")
        if stats["wall_records"] < wall:
            notes.append(f"wall: {wall} samples arrived as {stats['wall_records']} records (a thread's identical "
                         f"samples within one time tick merged); {stats['wall_unchanged']} samples of threads that "
                         "had not run since their previous sample reused its stack")
    if stats.get("cpu_kicks") and EventType.CPU in config.events:
        notes.append(f"cpu: {format_count(stats['cpu_kicks'])} sample(s) taken by the sampler thread (a walk of "
                     "a running thread's frames) because the kernel's timer signal was late")
    if stats["handler_calls"]:
        notes.append(f"signal handler: {format_duration(stats['handler_ns'] / stats['handler_calls'])} "
                     "per CPU sample")
    if stats["segv_replaced"]:
        notes.append("degraded: another library replaced the SIGSEGV/SIGBUS handler while profiling; "
                     "safe reads switched to process_vm_readv (slower, still safe)")
    elif stats["read_mode"] == 1:
        notes.append("safe reads: process_vm_readv")
    if stats["prof_replaced"] and EventType.CPU in config.events:
        notes.append("cpu: degraded: another tool installed its own SIGPROF handler during the session (a "
                     "setitimer/vmprof-style profiler); CPU sampling stopped then so as not to feed it our timer "
                     "signals, and its handler was left in place at stop")
    if stats["timer_failures"]:
        notes.append(timer_note(stats["timer_failures"], stats.get("timer_errno", 0)))
    late = late_signals_note(stats["cpu_used_ns"], stats["cpu_sampled_ns"], config.interval_ns)
    if late and EventType.CPU in config.events:
        notes.append(late)
    if stats.get("cpu_at_start") and EventType.CPU in config.events:
        notes.append(f"cpu: {format_count(stats['cpu_at_start'])} short-lived thread(s) ended before any CPU sample "
                     f"caught them: their clocks' {format_duration(stats['cpu_at_start_ns'])} is on the stack where "
                     "their own code began (their entry function; where inside it is unknown)")
    if stats.get("cpu_exits_dropped"):
        notes.append(f"degraded: {stats['cpu_exits_dropped']} exited thread(s)' CPU could not be kept (no memory): "
                     "the CPU totals miss it")
    if stats["threads_overflow"]:
        notes.append(f"degraded: {stats['threads_overflow']} thread(s) beyond the 4096-thread table were not sampled")
    return notes


def _loss_notes(stats: dict, conv) -> list[str]:
    """Samples dropped, carried or folded; frames and code objects not resolved."""
    notes = []
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
    return notes


def lockpark_notes(events) -> list[str]:
    """What the lock/park hooks saw and what they cannot see."""
    if not any(e in events for e in (EventType.LOCK, EventType.PARK)):
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
    if w["passes_deferred"] or w["slots_rebound"]:
        notes.append(f"lock/park: the dynamic loader was busy during {w['passes_deferred']} patch pass(es) (their "
                     f"read-only slots waited for a later tick) and bound {w['slots_rebound']} hooked slot(s) again "
                     "(hooked again at the next pass): waits in between were not seen")
    if w["protect_failed"]:
        notes.append(f"lock/park: {w['protect_failed']} slot(s) left unhooked: their page's protection could not "
                     "be changed")
    if w["slots_unhooked"]:
        notes.append(f"lock/park: {w['slots_unhooked']} slot(s) left unhooked (out of memory, or more symbol "
                     "versions of the wait functions than the patcher holds): their waits were not seen")
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


def late_signals_note(used_ns: int, sampled_ns: int, interval_ns: int) -> str | None:
    """A note when the CPU timers' signals accounted well under the CPU the threads used
    (the kernel checks a thread's CPU timer only at clock ticks it is on CPU for: on an
    overloaded machine or VM their signals come late, coalesced, or not before stop)."""
    if used_ns < 20 * interval_ns or sampled_ns >= 0.75 * used_ns:
        return None
    return (f"degraded: the CPU timers' signals accounted {format_duration(sampled_ns)} of the "
            f"{format_duration(used_ns)} of CPU the sampled threads used: the kernel delivered them late or not at all (an overloaded machine or "
            "VM?); each thread's CPU total is still its clock's, but its split between stacks rests on fewer samples")


def timer_note(failures: int, err: int) -> str:
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
def alloc_notes(rate: int, st: dict, tracker: AllocTracker) -> list[str]:
    """Profile notes of the allocation sampler: rate, typing coverage, losses, limits."""
    sub = st.get("subinterp_sampled", 0)
    notes = [f"alloc: {st['sampled'] + sub} samples of the Python allocators (Poisson over bytes, mean {format_bytes(rate)}; "
             "Horvitz-Thompson weights); "
             f"live: {tracker.live_rows} sampled blocks still allocated at stop"]
    if sub:
        notes.append(f"alloc: {sub} of those samples were taken in subinterpreters (labelled interp=<id>; "
                     "their objects' types are not read)")
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


def native_alloc_notes(enabled: bool, st: dict) -> list[str]:
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
                     "(native worker threads) were not recorded (native_threads='attribute' records them, "
                     "under the Python line that asked for the work)")
    if st["emit_failed"]:
        notes.append(f"alloc: {st['emit_failed']} C allocation sample(s) lost (sample buffer full)")
    if st["live_overflow"]:
        notes.append(f"live: {st['live_overflow']} C allocation sample(s) not tracked (live table full)")
    if st["maps_trimmed"]:
        notes.append(f"live: {st['maps_trimmed']} sampled mapping(s) partly unmapped: live counts the larger piece "
                     "left of each (a hole in the middle drops the smaller side)")
    if st["maps_measured"]:
        notes.append(f"live: [mmap] counts the pages a sampled mapping holds resident at stop, not the address space "
                     f"it maps: {st['maps_resident_bytes'] / 2**20:.1f} MiB of {st['maps_mapped_bytes'] / 2**20:.1f} MiB "
                     f"in {st['maps_measured']} mapping(s) held ({st['maps_measure_ns'] / 1e6:.2f} ms to measure)")
    if st["maps_unmeasured"]:
        notes.append(f"live: {st['maps_unmeasured']} sampled mapping(s) past the measuring budget (64 GiB of address "
                     "space per stop) count the bytes they map, not the pages they hold")
    if st["slots_foreign"]:
        foreign = [k for i, k in enumerate(_NALLOC_KINDS) if st["kinds_foreign"] >> i & 1]
        notes.append(f"alloc: {st['slots_foreign']} slot(s) of {', '.join(foreign)} resolve to another allocator "
                     "(an interposed malloc such as jemalloc or tcmalloc, or another tool's hook) and were left "
                     "alone: blocks allocated there are not sampled")
    if st["protect_failed"]:
        notes.append(f"alloc: {st['protect_failed']} GOT slot(s) could not be made writable: not hooked")
    if st["slots_unhooked"]:
        notes.append(f"alloc: {st['slots_unhooked']} GOT slot(s) left unhooked (out of memory, or more symbol "
                     "versions of the allocator functions than the patcher holds): their blocks are not sampled")
    if st["restore_mismatch"]:
        notes.append(f"alloc: degraded: another tool (memray, for one) re-patched {st['restore_mismatch']} of our C "
                     "allocator slots during the session and they were left theirs: C allocations after that were "
                     "not sampled, and live may hold C blocks whose free went unseen")
    notes.append("alloc: not sampled: the RAW domain (PyMem_RawMalloc: the interpreter's own C buffers, zlib and "
                 "bz2 streams included), the interpreter's direct malloc and mmap calls, file mappings (mmap of a "
                 "file: its pages are the file's), and the blocks of allocators linked statically into a library "
                 "(e.g. jemalloc or mimalloc inside a wheel: their arenas show as [mmap] where they grow, not per block)")
    return notes
