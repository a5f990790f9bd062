/* session.c — one profiling session at a time: start, stop, release, fork, stats.
 *
 * A session owns the ring, the thread slots and the aggregates; it starts the wall thread
 * and, through the engine table (enginectl.c), the engines whose events it wants, CPU and
 * WALL among them.  Engines nest around the wall thread: those with_gil start before it
 * (under the GIL, before the threads present are registered) and stop after it, the others
 * start after it and stop before it.
 *
 * Includes: core.h (and Python.h for the GIL); engines only through the table.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <Python.h>
#include "core.h"
#include "unwind.h"

#define DEFAULT_RING_RECORDS 4096
#define RING_BUDGET_BYTES (32u << 20)

static uint64_t leaked_bytes; /* buffers kept at release for good: a producer had not left them */
/* ---- sessions ------------------------------------------------------------------------------- */
/* Producers that may still be inside the ring or a slot: a signal handler, an engine's
 * emit.  Stop waits for them (bounded); release frees only when none is left. */
static int producers_inside(void) { return engines_emitting(); }

static void free_session(void)
{
    /* A producer still inside (a thread stopped by a debugger or the cgroup freezer in the
     * handler, or preempted for longer than stop waited) would write into freed memory:
     * the buffers are then kept for good (counted) rather than freed under it. */
    for (int spins = 0; producers_inside() && spins < 1000; spins++) {
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    if (producers_inside()) {
        leaked_bytes += (sess_ring ? ddp_ring_capacity(sess_ring) * sess_rec_size : 0) + MAX_SLOTS * sizeof(slot_t);
        sess_ring = NULL;
        sess_slots = NULL;
        sess_rec_size = 0;
        return;
    }
    /* (a new session maps a fresh ring: creating one writes nothing, see ring.c, and the
     * memory goes back to the system between sessions) */
    ddp_ring_free(sess_ring);
    sess_ring = NULL;
    drain_free();
    uw_collect(); /* unwind tables replaced during the session: no walk can see them now */
    int n = atomic_load(&sess_nslots);
    for (int i = 0; sess_slots && i < n && i < MAX_SLOTS; i++) {
        free(sess_slots[i].wlast);
        free(sess_slots[i].park);
        free(sess_slots[i].start_rec);
    }
    free(sess_slots);
    sess_slots = NULL;
    sess_rec_size = 0;
}

static void atfork_child(void)
{
    /* POSIX: the child has no timers and no sampler thread.  Put the signal handlers
     * back and forget the session so the child runs on unharmed and may profile itself. */
    threads_after_fork();
    if (atomic_load(&sess_state) == ST_IDLE)
        return;
    atomic_store(&ddp_session_active, 0);
    ddp_saferead_after_fork_child();
    ddp_py_after_fork_child();
    engines_after_fork(); /* (cpu: our SIGPROF handler goes; alloc: its hooks become pass-throughs) */
    sampler_thread_after_fork();
    drain_after_fork();
    /* Our copies of the buffers are forgotten, not freed: the fork may have caught another
     * thread half-way through freeing them (a release), and freeing again crashed the child. */
    sess_ring = NULL;
    sess_slots = NULL;
    sess_rec_size = 0;
    sess_pid = getpid();
    atomic_store(&sess_state, ST_IDLE);
}

int ddp_running(void) { return atomic_load(&sess_state) == ST_RUNNING; }

int ddp_start(const ddp_config *c)
{
    static int atfork_done;
    if (!c)
        return DDP_EINVAL;
    if (c->interval_ns < 100000 || c->interval_ns > 60000000000LL || c->max_depth < 1 || c->max_depth > 4096 ||
        c->ring_records < 0 || c->agg_keys < 0 || (uint32_t)c->agg_keys > DDP_AGG_MAX_KEYS || c->n_exclude < 0 || c->n_exclude > 8 || c->merge_tick_ns < 0 || c->merge_max_ticks < 0 ||
        (c->read_mode != DDP_READ_GUARDED && c->read_mode != DDP_READ_SYSCALL))
        return DDP_EINVAL;
    uint32_t supported = engines_events();
    if (!c->events || (c->events & ~supported))
        return DDP_EINVAL;
    int expect = ST_IDLE;
    if (!atomic_compare_exchange_strong(&sess_state, &expect, ST_STARTING))
        return DDP_EBUSY;
    if (!Py_IsInitialized()) {
        atomic_store(&sess_state, ST_IDLE);
        return DDP_EUNSUPPORTED;
    }
    if (!atfork_done) {
        pthread_atfork(NULL, NULL, atfork_child);
        atfork_done = 1;
    }
    sess_cfg = *c;
    sess_pid = getpid();
    ddp_saferead_set_pid(sess_pid);
    memset(&sess_stats, 0, sizeof sess_stats);
    engines_reset();
    drain_begin();
    atomic_store(&ddp_fault_count, 0);
    atomic_store(&ddp_graveyard_overflow, 0);
    /* native frames: the loaded objects' unwind tables, before the GIL is taken (the loader's
     * lock, which dl_iterate_phdr takes, may be held by a thread waiting for the GIL) */
    if ((sess_cfg.native_frames || sess_cfg.native_threads) && uw_refresh() < 0)
        sess_cfg.native_frames = sess_cfg.native_threads = 0;

    int rc = DDP_OK;
    PyGILState_STATE g = PyGILState_Ensure();
    rc = ddp_py_init();
    if (rc != DDP_OK)
        goto fail_gil;
    ddp_py_gil_range(&sess_gil_lo, &sess_gil_hi);

    sess_rec_size = sizeof(ddp_record) + (size_t)sess_cfg.max_depth * sizeof(ddp_frame);
    size_t records = sess_cfg.ring_records > 0 ? (size_t)sess_cfg.ring_records : DEFAULT_RING_RECORDS;
    if (sess_cfg.ring_records <= 0 && records * sess_rec_size > RING_BUDGET_BYTES)
        records = RING_BUDGET_BYTES / sess_rec_size < 256 ? 256 : RING_BUDGET_BYTES / sess_rec_size;
    sess_ring = ddp_ring_new(records, sess_rec_size);
    sess_slots = calloc(MAX_SLOTS, sizeof(slot_t));
    int aggs_ok = drain_alloc() == 0;
    if (!sess_ring || !sess_slots || !aggs_ok) {
        rc = DDP_ENOMEM;
        goto fail_gil;
    }
    threads_reset();
    records_reset();
    ddp_bloom_clear();
    /* the "known" filter is kept: it mirrors the process's code cache (engines/native/codes.py), which
     * outlives sessions, so the next cell's samples of code resolved before wake nobody */
    atomic_store(&ddp_new_code_seen, 0);
    ddp_py_graveyard_clear();
    for (int i = 0; i < sess_cfg.n_exclude; i++) {
        int idx = slot_get_or_create(sess_cfg.exclude_tids[i]);
        if (idx >= 0)
            atomic_store(&sess_slots[idx].excluded, 1);
    }
    atomic_store(&ddp_read_mode_now, sess_cfg.read_mode);
    if (sess_cfg.read_mode == DDP_READ_GUARDED && ddp_saferead_install() < 0)
        atomic_store(&ddp_read_mode_now, DDP_READ_SYSCALL);
    /* engines that need the GIL or must be ready before the wall thread start now: the wall
     * sampler, the CPU timers' handler (another tool's: DDP_ESIGNAL), the PyMem hooks */
    if ((rc = engines_start(1)) != DDP_OK)
        goto fail_gil;
    sess_stats.start_mono_ns = ddp_now_ns();
    atomic_store_explicit(&ddp_session_active, 1, memory_order_release);
    register_at_start(); /* (CPU: each gets its timer) */
    atomic_store(&registry_new_thread, 0); /* the engine names the threads present at start itself */
    ddp_py_watcher_start(); /* resolve sampled code objects as they die (3.12+ watcher, 3.11 dealloc wrapper) */
    PyGILState_Release(g);

    int prc = sampler_thread_start();
    if (prc != 0) {
        ddp_set_errno(prc);
        ddp_stop();
        g = PyGILState_Ensure();
        ddp_py_watcher_stop();
        PyGILState_Release(g);
        free_session();
        atomic_store(&sess_state, ST_IDLE);
        return DDP_ESYS;
    }
    atomic_store(&sess_state, ST_RUNNING);
    /* the other engines start without the GIL (lock/park: dl_iterate_phdr takes the loader lock) */
    engines_start(0);
    return DDP_OK;

fail_gil:
    atomic_store(&ddp_session_active, 0);
    ddp_saferead_uninstall();
    PyGILState_Release(g);
    free_session();
    atomic_store(&sess_state, ST_IDLE);
    return rc;
}

int ddp_stop(void)
{
    int s = atomic_load(&sess_state);
    if (s != ST_RUNNING && s != ST_STARTING)
        return DDP_ENOTRUNNING;
    drain_end();
    engines_stop(0); /* lock/park: restore the GOT slots first (a no-op without them) */
    sampler_thread_stop();
    /* allocations: takes the GIL, restores the allocators, freezes LIVE; CPU: threading's hook
     * back, each thread's CPU against its samples, the timers and our handler gone */
    engines_stop(1);
    atomic_store_explicit(&ddp_session_active, 0, memory_order_release);
    registry_stop();
    ddp_saferead_uninstall();
    sess_stats.stop_mono_ns = ddp_now_ns();
    atomic_store(&sess_state, ST_STOPPED);
    return DDP_OK;
}

void ddp_release(void)
{
    if (atomic_load(&sess_state) == ST_RUNNING)
        ddp_stop();
    if (Py_IsInitialized()) {
        PyGILState_STATE g = PyGILState_Ensure();
        ddp_py_watcher_stop();
        PyGILState_Release(g);
    }
    ddp_py_graveyard_clear();
    if (atomic_load(&sess_state) == ST_STOPPED) {
        free_session();
        atomic_store(&sess_state, ST_IDLE);
    }
}

int ddp_record_size(void) { return sess_ring ? (int)sess_rec_size : 0; }

int ddp_get_stats(ddp_stats *out)
{
    if (!out)
        return DDP_EINVAL;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < 8; i++) {
        out->samples[i] = atomic_load(&sess_stats.samples[i]);
        out->dropped_full[i] = atomic_load(&sess_stats.dropped_full[i]);
        out->dropped_torn[i] = atomic_load(&sess_stats.dropped_torn[i]);
    }
    out->timer_failures = atomic_load(&sess_stats.timer_failures);
    out->threads_seen = atomic_load(&sess_stats.threads_seen);
    out->threads_overflow = atomic_load(&sess_stats.threads_overflow);
    out->stale_signals = atomic_load(&sess_stats.stale_signals);
    out->faults = atomic_load(&ddp_fault_count);
    out->handler_ns = atomic_load(&sess_stats.handler_ns);
    out->handler_calls = atomic_load(&sess_stats.handler_calls);
    out->wall_ticks = atomic_load(&sess_stats.wall_ticks);
    out->wall_ns = atomic_load(&sess_stats.wall_ns);
    out->wall_records = atomic_load(&sess_stats.wall_records);
    out->wall_unchanged = atomic_load(&sess_stats.wall_unchanged);
    out->graveyard_overflow = atomic_load(&ddp_graveyard_overflow);
    out->read_mode = atomic_load(&ddp_read_mode_now);
    out->segv_replaced = atomic_load(&ddp_segv_replaced);
    out->start_mono_ns = sess_stats.start_mono_ns;
    out->stop_mono_ns = sess_stats.stop_mono_ns;
    out->cpu_used_ns = sess_stats.cpu_used_ns;
    out->cpu_sampled_ns = sess_stats.cpu_sampled_ns;
    out->timer_errno = atomic_load(&sess_stats.timer_errno);
    out->prof_replaced = atomic_load(&sess_stats.prof_replaced);
    out->parked_at_start = sess_stats.parked_at_start;
    out->cpu_at_start = sess_stats.cpu_at_start;
    out->cpu_at_start_ns = sess_stats.cpu_at_start_ns;
    out->cpu_exits_dropped = sess_stats.cpu_exits_dropped;
    for (int i = 0; i < 8; i++)
        out->carried_full[i] = atomic_load(&sess_stats.carried_full[i]);
    out->agg_in = sess_stats.agg_in;
    out->agg_out = sess_stats.agg_out;
    out->agg_full = sess_stats.agg_full;
    out->agg_coarsened = sess_stats.agg_coarsened;
    out->cpu_kicks = atomic_load(&sess_stats.cpu_kicks);
    drain_stats(out);
    out->leaked_bytes = leaked_bytes;
    return DDP_OK;
}

uint64_t ddp_dropped(int event)
{
    if (event < 0 || event >= DDP_EVENT_COUNT)
        return 0;
    return atomic_load(&sess_stats.dropped_full[event]) + atomic_load(&sess_stats.dropped_torn[event]);
}

