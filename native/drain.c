/* drain.c — records out of the ring, into aggregates the Python drain reads.
 *
 * Why a native aggregate: the Python drain needs the GIL, and beside dozens of threads that
 * want it too it runs a few times a second; the ring would fill.  The wall thread moves
 * the ring's records into the active aggregate every tick (no GIL), adds its own WALL
 * records there directly (agg_add_direct), and wakes a waiting
 * drain when there is a reason to (ddp_drain_wait).
 *
 * Includes: core.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include "core.h"

/* The drain's wake-up (ddp_drain_wait): the wall thread pokes it, ddp_stop ends it. */
static pthread_mutex_t drain_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t drain_cond;
static pthread_once_t drain_once = PTHREAD_ONCE_INIT;
static _Atomic int drain_waiting;
static int drain_stop; /* under drain_lock */
/* Records leave the ring into the active aggregate (agg.c): moved by the wall thread each
 * tick and by every drain, under agg_lock (the ring's one consumer at a time).  The drain
 * reads the other, retired aggregate; `held` is a record popped when the active one was full. */
#define AGG_KEYS 65536             /* a second of 64 threads' wall samples is ~2,000 keys (32 ms ticks) */
#define AGG_ARENA_BYTES (32u << 20) /* mapped, committed as written */
static pthread_mutex_t agg_lock = PTHREAD_MUTEX_INITIALIZER;
static ddp_agg *aggs[2];
static int agg_active;
static ddp_record *agg_held;
static int agg_has_held;
static _Atomic int agg_quarter; /* the active aggregate is a quarter full: a reason to wake the drain */

static int64_t bucket_fn(int64_t ts) { return bucket_of(ts); }

/* Move the ring's records into the active aggregate (agg_lock held).  A full aggregate
 * leaves them in the ring until the drain has read the other one. */
static void agg_fill_locked(void)
{
    if (!sess_ring || !aggs[0])
        return;
    ddp_agg *a = aggs[agg_active];
    for (;;) {
        if (!agg_has_held) {
            if (!ddp_ring_pop(sess_ring, agg_held))
                break;
            if (agg_held->flags & DDP_REC_INVALID)
                continue; /* a torn read, counted as dropped when it was taken */
            for (int i = 0; ddp_engines[i]; i++) /* (C allocations freed already: nalloc.c) */
                if (ddp_engines[i]->settle && (ddp_engines[i]->events >> agg_held->event & 1u))
                    ddp_engines[i]->settle(agg_held);
            agg_has_held = 1;
        }
        /* (the merge test's shadow records stay one per sample: no time bucket) */
        int64_t bucket = sess_cfg.merge_shadow ? -1 : bucket_of(agg_held->ts_ns);
        if (ddp_agg_add(a, agg_held, bucket, bucket_fn) != 0) {
            sess_stats.agg_full++;
            break;
        }
        agg_has_held = 0;
        sess_stats.agg_in++;
    }
    atomic_store(&agg_quarter, ddp_agg_quarter_full(a));
}

void agg_fill(void)
{
    pthread_mutex_lock(&agg_lock);
    agg_fill_locked();
    pthread_mutex_unlock(&agg_lock);
}

/* A record of an ordinary thread (the wall thread's merged WALL records) straight into the
 * active aggregate: the ring is for signal handlers, and a copy into it, a fresh ring page
 * and a copy out again cost the wall tick ~1-2 us a record on its cold caches.  -1 when the
 * aggregate is busy (a drain reads it out), full, or records wait before it: the caller
 * then takes the ring. */
int agg_add_direct(const ddp_record *r)
{
    if (pthread_mutex_trylock(&agg_lock) != 0)
        return -1;
    int rc = -1;
    if (aggs[0] && !agg_has_held) {
        ddp_agg *a = aggs[agg_active];
        rc = ddp_agg_add(a, r, sess_cfg.merge_shadow ? -1 : bucket_of(r->ts_ns), bucket_fn);
        if (rc == 0) {
            sess_stats.agg_in++;
            atomic_store(&agg_quarter, ddp_agg_quarter_full(a));
        }
    }
    pthread_mutex_unlock(&agg_lock);
    return rc;
}

/* Samples of code the drain has not resolved wake it this long after its last wake at the
 * earliest: one wake per 0.1 s at most while new code keeps appearing, as often as the fixed
 * 0.1 s interval of before (3.11 has no code watcher: dying code must be resolved while it lives). */
#define DRAIN_NEW_CODE_NS 100000000LL
static _Atomic int64_t last_drain_ns;

/* Why a waiting drain should wake now: the ring a quarter full, a new thread to name, or
 * samples of unresolved code (that flag is cleared by any wake: ddp_drain_wait). */
static int drain_reasons(int consume)
{
    int r = 0;
    if (sess_cfg.drain_new_code && atomic_load_explicit(&ddp_new_code_seen, memory_order_relaxed)
        && ddp_now_ns() - atomic_load(&last_drain_ns) >= DRAIN_NEW_CODE_NS)
        r |= DDP_WAKE_CODE;
    if (sess_cfg.drain_early && sess_ring && (ddp_ring_count(sess_ring) >= ddp_ring_capacity(sess_ring) / 4 || atomic_load(&agg_quarter)))
        r |= DDP_WAKE_RING;
    if (consume ? atomic_exchange(&registry_new_thread, 0) : atomic_load(&registry_new_thread))
        r |= DDP_WAKE_THREAD;
    return r;
}

void drain_poke(void)
{
    if (!atomic_load(&drain_waiting) || !drain_reasons(0))
        return;
    pthread_mutex_lock(&drain_lock);
    pthread_cond_signal(&drain_cond);
    pthread_mutex_unlock(&drain_lock);
}

static void drain_cond_init(void)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&drain_cond, &ca);
    pthread_condattr_destroy(&ca);
}

void drain_begin(void)
{
    pthread_once(&drain_once, drain_cond_init); /* never destroyed: a drain may still be leaving a wait */
    pthread_mutex_lock(&drain_lock);
    drain_stop = 0;
    pthread_mutex_unlock(&drain_lock);
    atomic_store(&registry_new_thread, 0);
}

int drain_alloc(void)
{
    for (int i = 0; i < 2; i++)
        aggs[i] = ddp_agg_new(sess_cfg.agg_keys > 0 ? (uint32_t)sess_cfg.agg_keys : AGG_KEYS, AGG_ARENA_BYTES);
    agg_active = 0;
    agg_held = malloc(sess_rec_size);
    agg_has_held = 0;
    atomic_store(&agg_quarter, 0);
    atomic_store(&last_drain_ns, ddp_now_ns());
    return aggs[0] && aggs[1] && agg_held ? 0 : -1;
}

void drain_end(void)
{
    pthread_mutex_lock(&drain_lock); /* a waiting drain returns DDP_ENOTRUNNING */
    drain_stop = 1;
    pthread_cond_broadcast(&drain_cond);
    pthread_mutex_unlock(&drain_lock);
}

void drain_free(void)
{
    for (int i = 0; i < 2; i++) {
        ddp_agg_free(aggs[i]);
        aggs[i] = NULL;
    }
    free(agg_held);
    agg_held = NULL;
    agg_has_held = 0;
}

void drain_after_fork(void)
{
    pthread_mutex_init(&drain_lock, NULL); /* no drain waits in this child */
    pthread_mutex_init(&agg_lock, NULL);
    drain_cond_init();
    atomic_store(&drain_waiting, 0);
    /* forgotten, not freed: the fork may have caught another thread half-way through freeing them */
    aggs[0] = aggs[1] = NULL;
    agg_held = NULL;
    agg_has_held = 0;
}

void drain_stats(ddp_stats *out)
{
    out->agg_folded = (aggs[0] ? ddp_agg_folded(aggs[0]) : 0) + (aggs[1] ? ddp_agg_folded(aggs[1]) : 0);
    uint64_t keys = sess_cfg.agg_keys > 0 ? (uint64_t)sess_cfg.agg_keys : AGG_KEYS;
    out->agg_bytes = 2 * ((uint64_t)AGG_ARENA_BYTES + 2 * keys * sizeof(uint32_t));
}

int ddp_drain(void *buf, int max_records)
{
    int s = atomic_load(&sess_state);
    if (!sess_ring || (s != ST_RUNNING && s != ST_STOPPED))
        return DDP_ENOTRUNNING;
    if (!buf || max_records < 0)
        return DDP_EINVAL;
    /* The retired aggregate is read out; once it is, the active one retires and a fresh one
     * takes new records.  A call returns fewer than max_records only when both are empty. */
    int n = 0;
    pthread_mutex_lock(&agg_lock);
    agg_fill_locked();
    while (n < max_records) {
        ddp_agg *r = aggs[1 - agg_active];
        sess_stats.agg_coarsened += ddp_agg_coarsen(r, bucket_under); /* (once: before its first take) */
        n += ddp_agg_take(r, (char *)buf + (size_t)n * sess_rec_size, max_records - n, sess_rec_size);
        if (n == max_records)
            break;
        if (!ddp_agg_keys(aggs[agg_active]) && !agg_has_held)
            break;
        ddp_agg_reset(r);
        agg_active = 1 - agg_active;
        agg_fill_locked();
    }
    sess_stats.agg_out += (uint64_t)n;
    pthread_mutex_unlock(&agg_lock);
    return n;
}

int ddp_pending(void)
{
    int s = atomic_load(&sess_state);
    if (!sess_ring || (s != ST_RUNNING && s != ST_STOPPED))
        return 0;
    pthread_mutex_lock(&agg_lock);
    int n = (int)ddp_ring_count(sess_ring) + (int)ddp_agg_keys(aggs[0]) + (int)ddp_agg_keys(aggs[1]);
    pthread_mutex_unlock(&agg_lock);
    return n;
}

int ddp_drain_wait(int64_t timeout_ns)
{
    if (timeout_ns < 0)
        return DDP_EINVAL;
    if (atomic_load(&sess_state) != ST_RUNNING)
        return DDP_ENOTRUNNING;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t end = (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec + timeout_ns;
    struct timespec deadline = { end / 1000000000LL, end % 1000000000LL };
    int r = 0;
    pthread_mutex_lock(&drain_lock);
    atomic_store(&drain_waiting, 1);
    for (;;) {
        if (drain_stop || atomic_load(&sess_state) != ST_RUNNING) {
            r = DDP_ENOTRUNNING;
            break;
        }
        if ((r = drain_reasons(1)) != 0)
            break;
        if (pthread_cond_timedwait(&drain_cond, &drain_lock, &deadline) == ETIMEDOUT) {
            r = drain_stop ? DDP_ENOTRUNNING : drain_reasons(1);
            break;
        }
    }
    atomic_store(&drain_waiting, 0);
    pthread_mutex_unlock(&drain_lock);
    if (r >= 0) /* this wake drains every record so far, new code included */
        atomic_store(&ddp_new_code_seen, 0);
    atomic_store(&last_drain_ns, ddp_now_ns());
    return r;
}

int ddp_drain_wait_take(int64_t timeout_ns, void *buf, int max_records, int *taken)
{
    if (!taken)
        return DDP_EINVAL;
    *taken = 0;
    int r = ddp_drain_wait(timeout_ns);
    if (r >= 0) {
        int n = ddp_drain(buf, max_records);
        if (n < 0)
            return n;
        *taken = n;
    }
    return r;
}
