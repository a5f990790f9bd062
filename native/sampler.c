/* sampler.c — sessions, the thread registry, per-thread CPU timers, the SIGPROF handler
 * and the wall sampler thread.
 *
 * Threads.  Python threads are found in the interpreter's thread-state list: under the
 * GIL at start (PyInterpreterState_ThreadHead), then every wall tick from the native
 * sampler thread by a racy walk through safe reads.  Why a racy walk rather than a
 * Python-side hook: it needs no cooperation from threading (threads started by C
 * extensions or _thread are covered), costs a few loads per thread per tick, and a torn
 * walk (a thread state unlinked while we read) is detected (interp pointer check, cycle
 * bound) and simply retried at the next tick.  A thread is removed only when its tid is
 * gone from two complete scans or from the kernel (tgkill(pid, tid, 0) fails).
 * Slots live in a preallocated array and are never freed or reused during a session, so
 * the pointer a timer carries in sigev_value always points to valid memory; the handler
 * also checks that the slot's tid is its own thread's (a signal queued before a
 * timer_delete is then ignored).
 *
 * CPU.  One POSIX timer per thread on that thread's CPU-time clock ((~tid << 3) | 6, as
 * async-profiler's ctimer), SIGEV_THREAD_ID -> SIGPROF delivered to that very thread, first
 * expiry uniform in (0, period] (as Go does).  The handler walks its own thread's frames:
 * no malloc, no locks, no CPython API.  Weight = period * (1 + overruns).
 *
 * WALL.  A pthread (never a Python thread, all async signals blocked) wakes every
 * interval and samples up to N registered threads (round-robin) through safe reads,
 * without the GIL and without signalling them.  Weight = wall time since that thread's
 * previous wall sample, so skipped or torn ticks never lose time.
 *
 * Idle threads (a notebook kernel has 6-10, nearly all blocked) are cheap: a thread whose
 * CPU clock has not moved since its last wall sample has not run, so its frames, state and
 * GC flag cannot have changed (only a thread changes its own frame chain): the last sample
 * is reused without a walk or a /proc read.  Consecutive identical samples of a thread in
 * one time bucket (cfg.merge_tick_ns) are merged into one record, count and value summed;
 * the bucket is the Profile's own time tick at that elapsed time, and ticks only coarsen
 * as the profile grows, so the Profile is the same as with one record per sample.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <Python.h>
#include "ddp_internal.h"

#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid
#endif

#define MAX_SLOTS 4096
#define MAP_SIZE 16384 /* tid -> slot, open addressing, power of two */
#define DEFAULT_RING_RECORDS 4096
#define IDLE_TICK_NS 50000000LL /* the sampler thread's period when no event needs ticks (lock/park, alloc) */
#define RING_BUDGET_BYTES (32u << 20)
#define DEFAULT_WALL_PER_TICK 64
#define SCAN_MAX (MAX_SLOTS * 2)

enum { ST_IDLE, ST_STARTING, ST_RUNNING, ST_STOPPED };

typedef struct {
    _Atomic int32_t tid;
    _Atomic int32_t active;       /* sampled: has a thread state, not excluded, present */
    _Atomic uintptr_t tstate;
    /* cached label word, (epoch << 32) | (index + 1), valid while epoch is the table's
     * (label_of): one word, as the CPU handler and the wall thread both refresh it */
    _Atomic uint64_t lw_cache;
    _Atomic int32_t excluded;
    int64_t cpu_carry;            /* CPU weight of a torn sample, added to the next (handler only) */
    _Atomic int64_t cpu_sampled;  /* CPU weight its samples carried (handler), for the delivery check */
    /* below: owned by the sampler thread (or by start/stop when it is not running) */
    int has_timer;
    int timer_failed;
    timer_t timer;
    clockid_t clock;
    int64_t last_wall_ns;
    int64_t last_cpu_ns;
    int64_t cpu_first_ns;         /* its CPU clock when first sampled this session (-1: unread) */
    int absent;
    uint32_t seen_gen;
    ddp_record *wlast;            /* last WALL sample (rec_size bytes, malloc'ed on first use) */
    int wfresh;                   /* wlast was taken at last_wall_ns/last_cpu_ns: reusable if not run since */
    int wpend;                    /* wlast not yet written: merged samples accumulate in its count/value */
    int64_t wpend_bucket;
    uintptr_t wlast_tstate;
    ddp_record *park;             /* blocked in a wait when the session started: that wait's record */
    int park_on;                  /* park holds a wait not over yet ... */
    int64_t park_cpu, park_checked; /* ... as its CPU clock, unmoved at the last check, says */
    int dead;                     /* its thread exited: the slot goes back to the pool once flushed */
    int64_t cpu_used_stop;        /* at stop: CPU its clock says it used since first seen (timer threads) */
    int recycled;                 /* in the pool */
} slot_t;

static _Atomic int state = ST_IDLE;
_Atomic int ddp_session_active;
static ddp_config cfg;
static ddp_ring *ring;
static size_t rec_size;
static slot_t *slots;
static _Atomic int32_t nslots;
/* tid -> slot: (tid << 32) | (slot index + 1) per cell, 0 empty; one word, so a reader never
 * pairs one thread's tid with another's slot.  Inserts and deletes take map_lock; lookups
 * do not (a delete's backward shift can hide an entry for a moment: callers that must not
 * miss retry under the lock, slot_get_or_create). */
static _Atomic uint64_t map_cell[MAP_SIZE];
static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;
/* Slots of threads that exited, ready for new threads (under map_lock): a session outlives
 * any number of short-lived threads, not only MAX_SLOTS of them. */
static int32_t free_slot[MAX_SLOTS];
static int nfree;
static struct sigaction old_prof;
static int prof_installed;
static _Atomic int in_handler;
static pthread_t sampler_thread;
static int sampler_started;
static pthread_mutex_t wake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake_cond;
static int wake_stop;
static int my_pid;
static uint64_t rng_state;
static uintptr_t gil_lo, gil_hi;
/* The drain's wake-up (ddp_drain_wait): the wall thread pokes it, ddp_stop ends it. */
static pthread_mutex_t drain_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t drain_cond;
static pthread_once_t drain_once = PTHREAD_ONCE_INIT;
static _Atomic int drain_waiting;
static _Atomic int drain_new_thread;
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

static struct {
    _Atomic uint64_t samples[8], dropped_full[8], dropped_torn[8];
    _Atomic uint64_t carried_full[8]; /* samples whose weight went to their thread's next one: buffers full */
    uint64_t agg_in, agg_out;         /* records into the aggregates, aggregated records out */
    uint64_t agg_full;                /* times the active aggregate was full when records waited */
    _Atomic uint64_t timer_failures, threads_seen, threads_overflow, stale_signals;
    _Atomic int32_t timer_errno; /* errno of the first failed timer_create/settime */
    _Atomic uint64_t handler_ns, handler_calls, wall_ticks, wall_ns, wall_records, wall_unchanged;
    int64_t start_mono_ns, stop_mono_ns;
    int64_t cpu_used_ns, cpu_sampled_ns; /* at stop, threads with a CPU timer then */
    _Atomic int32_t prof_replaced;       /* another SIGPROF handler replaced ours: CPU sampling stopped */
    int32_t parked_at_start;             /* threads found blocked in a wait at the start */
} st;
/* 1: lock/park hooks are in place (ddp_start), the wall thread then looks for threads blocked
 * since before (once, 2 after that) */
static _Atomic int waits_ready;
static uint64_t leaked_bytes; /* buffers kept at release for good: a producer had not left them */

/* The calling thread's tid, cached per thread (a syscall per ALLOC sample otherwise); the
 * fork child's thread gets a new tid, so atfork_child forgets it.  tls_slot caches the
 * thread's slot for the session numbered tls_gen (slots are never reused in a session). */
static DDP_TLS int32_t tls_tid;
static DDP_TLS int32_t tls_slot;
static DDP_TLS uint32_t tls_gen;
static _Atomic uint32_t session_gen;
static inline int32_t my_tid(void)
{
    int32_t t = tls_tid;
    if (__builtin_expect(!t, 0))
        t = tls_tid = (int32_t)syscall(SYS_gettid);
    return t;
}

/* ---- label words: each thread's published label-set id ----------------------------------
 * Python writes a thread's word directly through a memoryview (ddp_label_word, ~0.1 us per
 * label change instead of a cffi call); the CPU handler and the wall thread read it.  Views
 * may be held by Python code for any time (across sessions, a fork, the thread's end), so
 * the words are static storage, never freed: a stale view can at worst write a wrong label,
 * never into freed memory.  A word belongs to a tid from its claim until that tid is gone
 * from the process (reclaimed only when the table is full: nobody writes a dead thread's
 * view, only the thread itself writes its own).  Readers find a tid's word by a scan below
 * lw_hi, cached per session slot and redone when lw_epoch moves (every claim/reclaim). */
#define LW_MAX 4096
typedef struct {
    _Atomic int32_t tid; /* 0: free */
    int32_t pad;
    _Atomic uint64_t id;
} lword_t;
static lword_t lwords[LW_MAX];
static _Atomic int32_t lw_hi;       /* words in use are below this */
static _Atomic uint32_t lw_epoch = 1;
static pthread_mutex_t lw_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t lw_once = PTHREAD_ONCE_INIT;

static int lw_find(int32_t tid)
{
    int n = atomic_load(&lw_hi);
    for (int i = 0; i < n && i < LW_MAX; i++)
        if (atomic_load_explicit(&lwords[i].tid, memory_order_acquire) == tid)
            return i;
    return -1;
}

static void lw_after_fork_child(void)
{
    /* Only the forking thread lives on, under a new tid: every word is stale.  (Python's
     * labeling bumps its view generation at fork, so views are asked for again.) */
    pthread_mutex_init(&lw_lock, NULL);
    int n = atomic_load(&lw_hi);
    for (int i = 0; i < n && i < LW_MAX; i++) {
        atomic_store(&lwords[i].tid, 0);
        atomic_store(&lwords[i].id, 0);
    }
    atomic_store(&lw_hi, 0);
    atomic_fetch_add(&lw_epoch, 1);
}

static void lw_init_once(void) { pthread_atfork(NULL, NULL, lw_after_fork_child); }

/* The word of `tid` (claimed if it has none), or NULL when the table is full of live tids. */
static lword_t *lw_claim(int32_t tid)
{
    if (tid <= 0)
        return NULL;
    pthread_once(&lw_once, lw_init_once);
    pthread_mutex_lock(&lw_lock);
    int i = lw_find(tid);
    if (i < 0) {
        int n = atomic_load(&lw_hi);
        for (int pass = 0; pass < 2 && i < 0; pass++) {
            for (int k = 0; k < n && i < 0; k++)
                if (atomic_load(&lwords[k].tid) == 0)
                    i = k;
            if (i < 0 && n < LW_MAX)
                i = n;
            if (i < 0 && pass == 0) { /* full: free the words of threads gone from the process */
                pid_t pid = getpid();
                for (int k = 0; k < n; k++) {
                    int32_t t = atomic_load(&lwords[k].tid);
                    if (t > 0 && syscall(SYS_tgkill, pid, t, 0) != 0 && errno == ESRCH) {
                        atomic_store(&lwords[k].tid, 0);
                        atomic_store(&lwords[k].id, 0);
                    }
                }
                atomic_fetch_add(&lw_epoch, 1);
            }
        }
        if (i >= 0) {
            atomic_store(&lwords[i].id, 0);
            atomic_store_explicit(&lwords[i].tid, tid, memory_order_release);
            if (i >= n)
                atomic_store(&lw_hi, i + 1);
            atomic_fetch_add(&lw_epoch, 1); /* after the tid is visible: cached misses retry */
        }
    }
    pthread_mutex_unlock(&lw_lock);
    return i >= 0 ? &lwords[i] : NULL;
}

/* The label id of the thread in slot `s` (async-signal-safe: loads and a bounded scan). */
static uint64_t label_of(void *slot);

static uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static uint64_t label_of(void *slot)
{
    slot_t *s = slot;
    int32_t tid = atomic_load_explicit(&s->tid, memory_order_relaxed);
    uint32_t ep = atomic_load(&lw_epoch);
    uint64_t c = atomic_load_explicit(&s->lw_cache, memory_order_relaxed);
    int32_t i;
    if ((uint32_t)(c >> 32) == ep) {
        i = (int32_t)(uint32_t)c - 1;
    } else { /* the table changed since this slot looked: look again (epoch read first) */
        i = lw_find(tid);
        atomic_store_explicit(&s->lw_cache, ((uint64_t)ep << 32) | (uint32_t)(i + 1), memory_order_relaxed);
    }
    if (i < 0 || i >= LW_MAX || atomic_load_explicit(&lwords[i].tid, memory_order_acquire) != tid)
        return 0;
    return atomic_load_explicit(&lwords[i].id, memory_order_relaxed);
}

/* ---- tid -> slot map (lock-free; used by the sampler thread and Python threads) -------- */
static inline uint32_t tid_hash(int32_t tid) { return ((uint32_t)tid * 2654435761u) & (MAP_SIZE - 1); }

static inline int32_t cell_tid(uint64_t c) { return (int32_t)(c >> 32); }
static inline uint64_t make_cell(int32_t tid, int idx) { return ((uint64_t)(uint32_t)tid << 32) | (uint32_t)(idx + 1); }

static int slot_lookup(int32_t tid)
{
    uint32_t h = tid_hash(tid);
    for (int i = 0; i < MAP_SIZE; i++, h = (h + 1) & (MAP_SIZE - 1)) {
        uint64_t c = atomic_load(&map_cell[h]);
        if (!c)
            return -1;
        if (cell_tid(c) == tid)
            return (int)(uint32_t)c - 1;
    }
    return -1;
}

/* A fresh slot (a new index, else one of an exited thread), under map_lock. */
static int slot_take(int32_t tid)
{
    int idx;
    if (atomic_load(&nslots) < MAX_SLOTS)
        idx = atomic_fetch_add(&nslots, 1);
    else if (nfree > 0)
        idx = free_slot[--nfree];
    else
        return -1;
    slot_t *s = &slots[idx];
    ddp_record *wlast = s->wlast, *park = s->park; /* buffers are kept for the next thread */
    memset(s, 0, sizeof *s);
    s->wlast = wlast;
    s->park = park;
    atomic_store(&s->tid, tid);
    s->clock = ((~(clockid_t)tid) << 3) | 6; /* CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED */
    atomic_fetch_add(&st.threads_seen, 1);
    return idx;
}

static int slot_get_or_create(int32_t tid)
{
    int idx = slot_lookup(tid);
    if (idx >= 0)
        return idx;
    pthread_mutex_lock(&map_lock);
    uint32_t h = tid_hash(tid);
    idx = -1;
    for (int i = 0; i < MAP_SIZE; i++, h = (h + 1) & (MAP_SIZE - 1)) {
        uint64_t c = atomic_load(&map_cell[h]);
        if (c && cell_tid(c) == tid) {
            idx = (int)(uint32_t)c - 1;
            break;
        }
        if (!c) {
            idx = slot_take(tid);
            if (idx >= 0)
                atomic_store(&map_cell[h], make_cell(tid, idx));
            break;
        }
    }
    pthread_mutex_unlock(&map_lock);
    if (idx < 0)
        atomic_fetch_add(&st.threads_overflow, 1);
    return idx;
}

/* The slot of a thread that exited goes back to the pool (wall thread only; under map_lock):
 * its map cell is deleted by backward shift, so probe chains stay intact without tombstones.
 * A late signal of its deleted timer cannot arrive (its thread is gone), and the handler
 * checks the slot's tid anyway. */
static void slot_recycle(int idx)
{
    slot_t *s = &slots[idx];
    int32_t tid = atomic_load(&s->tid);
    pthread_mutex_lock(&map_lock);
    if (syscall(SYS_tgkill, my_pid, (int)tid, 0) == 0) { /* the kernel gave its tid to a new thread */
        s->dead = 0;
        pthread_mutex_unlock(&map_lock);
        return;
    }
    uint32_t i = tid_hash(tid);
    int found = 0;
    for (int n = 0; n < MAP_SIZE; n++, i = (i + 1) & (MAP_SIZE - 1)) {
        uint64_t c = atomic_load(&map_cell[i]);
        if (!c)
            break;
        if (cell_tid(c) == tid && (int)(uint32_t)c - 1 == idx) {
            found = 1;
            break;
        }
    }
    if (found && nfree < MAX_SLOTS) {
        uint32_t j = i;
        for (;;) {
            atomic_store(&map_cell[i], 0);
            uint64_t c;
            for (;;) {
                j = (j + 1) & (MAP_SIZE - 1);
                c = atomic_load(&map_cell[j]);
                if (!c)
                    goto done;
                uint32_t k = tid_hash(cell_tid(c));
                /* move j into i unless its home k lies cyclically in (i, j] */
                if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
                    continue;
                break;
            }
            atomic_store(&map_cell[i], c);
            i = j;
        }
    done:
        s->recycled = 1;
        free_slot[nfree++] = idx;
    }
    pthread_mutex_unlock(&map_lock);
}

static int is_excluded_cfg(int32_t tid)
{
    for (int i = 0; i < cfg.n_exclude && i < 8; i++)
        if (cfg.exclude_tids[i] == tid)
            return 1;
    return 0;
}

/* ---- timers ---------------------------------------------------------------------------- */
static void timer_arm(slot_t *s)
{
    if (s->has_timer || s->timer_failed || !(cfg.events & (1u << DDP_EVENT_CPU)) || atomic_load(&st.prof_replaced))
        return;
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGPROF;
    sev.sigev_value.sival_ptr = s;
    sev.sigev_notify_thread_id = atomic_load(&s->tid);
    if (timer_create(s->clock, &sev, &s->timer) != 0) {
        /* EAGAIN (signal queue limit) and friends: this thread gets no CPU samples. */
        int e = errno, zero = 0;
        s->timer_failed = 1;
        if (e != EINVAL && e != ESRCH) { /* EINVAL: the thread exited meanwhile */
            atomic_fetch_add(&st.timer_failures, 1);
            atomic_compare_exchange_strong(&st.timer_errno, &zero, e);
        }
        ddp_set_errno(e);
        return;
    }
    int64_t period = cfg.interval_ns;
    int64_t first = 1 + (int64_t)(rng_next() % (uint64_t)period); /* uniform in (0, period] */
    struct itimerspec its;
    its.it_interval.tv_sec = period / 1000000000LL;
    its.it_interval.tv_nsec = period % 1000000000LL;
    its.it_value.tv_sec = first / 1000000000LL;
    its.it_value.tv_nsec = first % 1000000000LL;
    if (timer_settime(s->timer, 0, &its, NULL) != 0) {
        int e = errno, zero = 0;
        timer_delete(s->timer);
        s->timer_failed = 1;
        atomic_fetch_add(&st.timer_failures, 1);
        atomic_compare_exchange_strong(&st.timer_errno, &zero, e);
        return;
    }
    s->has_timer = 1;
}

static void timer_disarm(slot_t *s)
{
    if (s->has_timer) {
        timer_delete(s->timer);
        s->has_timer = 0;
    }
}

static int64_t thread_cpu_ns(slot_t *s)
{
    struct timespec ts;
    if (clock_gettime(s->clock, &ts) != 0)
        return -1;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int wall_flush(slot_t *s);

/* A thread seen in the interpreter's list: make sure it has a slot, a timer, a state. */
static void register_thread(uintptr_t tstate, int32_t tid, uint32_t gen, int64_t now)
{
    if (tid <= 0 || is_excluded_cfg(tid))
        return;
    int idx = slot_lookup(tid);
    if (idx < 0 || !atomic_load(&slots[idx].active)) {
        /* New (or label-only) slot: make sure the tid is a live thread of ours, not a
         * value read from a thread state freed under the racy scan. */
        if (syscall(SYS_tgkill, my_pid, tid, 0) != 0)
            return;
        if (idx < 0)
            idx = slot_get_or_create(tid);
        if (idx < 0)
            return;
    }
    slot_t *s = &slots[idx];
    if (s->seen_gen == gen)
        return; /* two thread states with one tid: the older one (seen first) is the thread's */
    s->seen_gen = gen;
    s->absent = 0;
    if (atomic_load(&s->excluded)) {
        atomic_store(&s->active, 0);
        timer_disarm(s);
        return;
    }
    if (atomic_load(&s->tstate) != tstate)
        atomic_store(&s->tstate, tstate);
    if (!atomic_load(&s->active)) {
        s->dead = 0; /* (a tid the kernel gave to a new thread) */
        if (s->wpend)
            wall_flush(s);
        s->wfresh = 0; /* back after an absence: its frames are new */
        s->last_wall_ns = now;
        s->last_cpu_ns = thread_cpu_ns(s);
        if (!s->cpu_first_ns)
            s->cpu_first_ns = s->last_cpu_ns ? s->last_cpu_ns : -1;
        atomic_store(&s->active, 1);
        atomic_store(&drain_new_thread, 1);
    }
    timer_arm(s);
}

/* ---- producing records ------------------------------------------------------------------- */
enum { PROD_OK, PROD_FULL, PROD_TORN };

/* Stack identity for the consumer (it looks stacks up by this instead of their bytes):
 * every byte of the frames, the depth and the flags that change the stack. */
static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t stack_hash_of(uint16_t flags, int depth, const ddp_frame *f)
{
    const uint64_t k1 = 0x9E3779B97F4A7C15ULL, k2 = 0xC2B2AE3D27D4EB4FULL;
    uint64_t h = k2 ^ ((uint64_t)(flags & (DDP_REC_TRUNCATED | DDP_REC_GC)) << 32) ^ (uint64_t)depth;
    for (int i = 0; i < depth; i++) {
        uint64_t w3 = ((uint64_t)(uint32_t)f[i].lasti << 32) | (uint32_t)f[i].firstlineno;
        h = rotl64(h ^ (f[i].code * k1), 31) * k2;
        h = rotl64(h ^ (f[i].fp * k1), 31) * k2;
        h = rotl64(h ^ (w3 * k1), 31) * k2;
    }
    h ^= h >> 33; /* murmur3's finalizer */
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return h;
}

/* Walk `tstate`'s frames into rec (depth, flags, stack_hash); 0 ok, -1 torn (flags INVALID). */
static int walk_into(ddp_record *rec, uintptr_t tstate, int mode)
{
    long tid = rec->tid;
    ddp_frame *frames = (ddp_frame *)(rec + 1);
    volatile int depth = -1;
    volatile uint16_t flags = 0;
    if (mode == DDP_READ_GUARDED) {
        ddp_guard g, *prev = ddp_tls_guard; /* keep an interrupted guard (bench code) intact */
        if (sigsetjmp(g.jb, 0) == 0) {
            DDP_GUARD_ARM(&g);
            uint16_t f = 0;
            int d = ddp_py_walk(tstate, tid, mode, frames, cfg.max_depth, &f);
            if (d >= 0 && ddp_py_gc_on_thread(tstate, mode))
                f |= DDP_REC_GC;
            flags = f;
            depth = d;
        } else {
            depth = -1;
        }
        DDP_GUARD_SET(prev);
    } else {
        uint16_t f = 0;
        int d = ddp_py_walk(tstate, tid, mode, frames, cfg.max_depth, &f);
        if (d >= 0 && ddp_py_gc_on_thread(tstate, mode))
            f |= DDP_REC_GC;
        flags = f;
        depth = d;
    }
    if (depth < 0) {
        rec->depth = 0;
        rec->flags = DDP_REC_INVALID;
        rec->stack_hash = 0;
        return -1;
    }
    rec->depth = (uint16_t)depth;
    rec->flags = flags;
    rec->stack_hash = stack_hash_of(flags, depth, frames);
    return 0;
}

static int produce_ex(slot_t *s, uintptr_t tstate, int event, int64_t count, int64_t weight, uint64_t aux,
                      int tstate_kind, int mode, int64_t ts)
{
    size_t ticket;
    ddp_record *rec = ddp_ring_reserve(ring, &ticket);
    if (!rec)
        return PROD_FULL; /* (counted by the caller: dropped, or carried to a later sample) */
    rec->event = (uint8_t)event;
    rec->state = (uint8_t)tstate_kind;
    rec->tid = atomic_load_explicit(&s->tid, memory_order_relaxed);
    rec->label_id = label_of(s);
    rec->ts_ns = ts;
    rec->count = count;
    rec->value = weight;
    rec->aux = aux;
    rec->reserved = 0;
    rec->reserved2 = 0;
    int torn = walk_into(rec, tstate, mode) < 0;
    ddp_ring_publish(ring, ticket);
    if (torn) {
        atomic_fetch_add_explicit(&st.dropped_torn[event], 1, memory_order_relaxed);
        return PROD_TORN;
    }
    atomic_fetch_add_explicit(&st.samples[event], 1, memory_order_relaxed);
    return PROD_OK;
}

static int produce(slot_t *s, int event, int64_t weight, int tstate_kind, int mode, int64_t ts)
{
    return produce_ex(s, atomic_load_explicit(&s->tstate, memory_order_relaxed), event, 1, weight, 0,
                      tstate_kind, mode, ts);
}

/* Record an event with the CALLING thread's own stack, from ordinary code (the allocator
 * hook, lock/park wrappers) rather than a signal handler.  The caller's frame chain is
 * stable (only this thread changes it), so the same guarded walk as the CPU handler
 * applies; a SIGPROF arriving meanwhile nests safely (the ring is MPMC, guards nest). */
#define SEGV_CHECK_NS 1000000
static _Atomic int64_t own_segv_checked_ns = INT64_MIN / 2;

int ddp_emit_own(int event, int64_t count, int64_t value, uint64_t aux)
{
    if (!atomic_load_explicit(&ddp_session_active, memory_order_acquire))
        return DDP_ENOTRUNNING;
    if (event < 0 || event >= DDP_EVENT_COUNT || !(cfg.events & (1u << event)))
        return DDP_EINVAL;
    uintptr_t tstate = ddp_py_current_tstate();
    if (!tstate)
        return DDP_EINVAL; /* not a Python thread */
    uint32_t gen = atomic_load_explicit(&session_gen, memory_order_relaxed);
    int idx = tls_slot;
    /* (a cached slot is checked against our tid: an exited thread's slot serves another) */
    if (tls_gen != gen || (idx >= 0 && atomic_load_explicit(&slots[idx].tid, memory_order_relaxed) != my_tid())) {
        idx = slot_get_or_create(my_tid());
        tls_slot = idx;
        tls_gen = gen;
    }
    if (idx < 0)
        return DDP_ENOMEM;
    slot_t *s = &slots[idx];
    if (atomic_load(&s->excluded))
        return DDP_OK;
    int64_t now = ddp_now_ns();
    int mode = atomic_load(&ddp_read_mode_now);
    /* Our SIGSEGV handler still in place?  One sigaction syscall, at most once per
     * SEGV_CHECK_NS here (not per sample: ALLOC samples come ~2000/s): this walk reads the
     * calling thread's own frames, which it alone changes, so a fault needs corrupt state;
     * the wall thread also checks every tick, and a failed check switches to syscall reads
     * for good. */
    if (mode == DDP_READ_GUARDED && now - atomic_load_explicit(&own_segv_checked_ns, memory_order_relaxed) >= SEGV_CHECK_NS) {
        if (!ddp_saferead_check_segv())
            mode = DDP_READ_SYSCALL;
        else
            atomic_store_explicit(&own_segv_checked_ns, now, memory_order_relaxed);
    }
    int r = produce_ex(s, tstate, event, count, value, aux, DDP_STATE_OFFCPU, mode, now);
    if (r == PROD_FULL)
        atomic_fetch_add_explicit(&st.dropped_full[event], 1, memory_order_relaxed);
    return r == PROD_OK ? DDP_OK : r == PROD_FULL ? DDP_ENOMEM : DDP_ESYS;
}

int ddp_emit_for(int32_t tid, int event, int64_t count, int64_t value, uint64_t aux, int64_t ts)
{
    if (!atomic_load_explicit(&ddp_session_active, memory_order_acquire) || !slots || !ring)
        return DDP_ENOTRUNNING;
    if (event < 0 || event >= DDP_EVENT_COUNT || !(cfg.events & (1u << event)))
        return DDP_EINVAL;
    int idx = slot_lookup(tid);
    if (idx < 0)
        return DDP_EINVAL;
    slot_t *s = &slots[idx];
    uintptr_t tstate = atomic_load(&s->tstate);
    if (!tstate || atomic_load(&s->excluded))
        return DDP_EINVAL;
    int mode = atomic_load(&ddp_read_mode_now);
    if (mode == DDP_READ_GUARDED && !ddp_saferead_check_segv())
        mode = DDP_READ_SYSCALL;
    int r = produce_ex(s, tstate, event, count, value, aux, DDP_STATE_OFFCPU, mode, ts);
    if (r == PROD_FULL)
        atomic_fetch_add_explicit(&st.dropped_full[event], 1, memory_order_relaxed);
    return r == PROD_OK ? DDP_OK : r == PROD_FULL ? DDP_ENOMEM : DDP_ESYS;
}

static void on_sigprof(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)uc;
    int saved_errno = errno;
    atomic_fetch_add(&in_handler, 1);
    if (!atomic_load_explicit(&ddp_session_active, memory_order_acquire) || !si || si->si_code != SI_TIMER)
        goto out;
    slot_t *s = si->si_value.sival_ptr;
    slot_t *base = slots;
    if (!base || s < base || s >= base + MAX_SLOTS || ((char *)s - (char *)base) % sizeof(slot_t)) {
        atomic_fetch_add(&st.stale_signals, 1);
        goto out;
    }
    if (atomic_load(&s->tid) != my_tid()) {
        atomic_fetch_add(&st.stale_signals, 1);
        goto out;
    }
    if (!atomic_load(&s->active) || atomic_load(&s->excluded))
        goto out;
    int64_t t0 = ddp_now_ns();
    int mode = atomic_load(&ddp_read_mode_now);
    if (mode == DDP_READ_GUARDED && !ddp_saferead_check_segv())
        mode = DDP_READ_SYSCALL; /* our fault handler was replaced: never risk a fault */
    int64_t overrun = si->si_overrun > 0 ? si->si_overrun : 0;
    int64_t weight = cfg.interval_ns * (1 + overrun) + s->cpu_carry;
    int r = produce(s, DDP_EVENT_CPU, weight, DDP_STATE_CPU, mode, t0);
    /* a torn read or a full ring: the weight goes to this thread's next sample (totals stay exact) */
    s->cpu_carry = r == PROD_TORN || r == PROD_FULL ? weight : 0;
    if (r == PROD_FULL)
        atomic_fetch_add_explicit(&st.carried_full[DDP_EVENT_CPU], 1, memory_order_relaxed);
    if (r == PROD_OK)
        atomic_fetch_add_explicit(&s->cpu_sampled, weight, memory_order_relaxed);
    atomic_fetch_add_explicit(&st.handler_ns, (uint64_t)(ddp_now_ns() - t0), memory_order_relaxed);
    atomic_fetch_add_explicit(&st.handler_calls, 1, memory_order_relaxed);
out:
    atomic_fetch_sub(&in_handler, 1);
    errno = saved_errno;
}

static int prof_is_ours(void)
{
    struct sigaction cur;
    return sigaction(SIGPROF, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigprof;
}

/* Someone replaced our SIGPROF handler during the session (a vmprof- or Scalene-style tool
 * starting its own): our timers' signals would now land in their handler and skew their
 * profile, so every CPU timer goes, and the CPU view ends here (said in the notes). */
static void prof_check(void)
{
    if (!prof_installed || atomic_load(&st.prof_replaced) || prof_is_ours())
        return;
    atomic_store(&st.prof_replaced, 1);
    int n = atomic_load(&nslots);
    for (int i = 0; i < n && i < MAX_SLOTS; i++)
        timer_disarm(&slots[i]);
}

/* ---- the wall sampler thread --------------------------------------------------------------- */
/* Thread state without signalling it: CPU clock progress first, /proc syscall if idle. */
static int thread_state_of(slot_t *s, int64_t dwall, int64_t cpu_now)
{
    int64_t dcpu = (cpu_now >= 0 && s->last_cpu_ns >= 0) ? cpu_now - s->last_cpu_ns : -1;
    if (dcpu >= 0 && dwall > 0 && dcpu * 2 >= dwall)
        return DDP_STATE_CPU;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)atomic_load(&s->tid));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return DDP_STATE_OFFCPU;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return DDP_STATE_OFFCPU;
    buf[n] = 0;
    if (!strncmp(buf, "running", 7))
        return DDP_STATE_CPU;
    char *end;
    long nr = strtol(buf, &end, 10);
    if (nr == SYS_futex && gil_lo) {
        unsigned long long uaddr = strtoull(end, NULL, 16);
        if (uaddr >= gil_lo && uaddr < gil_hi) /* blocked on the GIL's mutex or condition */
            return DDP_STATE_GIL;
    }
    return DDP_STATE_OFFCPU;
}

typedef struct {
    uintptr_t tstate[SCAN_MAX];
    int32_t tid[SCAN_MAX];
    int n;
} scan_buf;

static void scan_cb(uintptr_t tstate, long tid, void *ctx)
{
    scan_buf *b = ctx;
    if (b->n < SCAN_MAX) {
        b->tstate[b->n] = tstate;
        b->tid[b->n] = (int32_t)tid;
        b->n++;
    }
}

static void registry_tick(scan_buf *b, uint32_t gen, int64_t now)
{
    int mode = atomic_load(&ddp_read_mode_now);
    volatile int rc = -1;
    b->n = 0;
    if (mode == DDP_READ_GUARDED) {
        ddp_guard g;
        if (sigsetjmp(g.jb, 0) == 0) {
            DDP_GUARD_ARM(&g);
            rc = ddp_py_scan_threads(mode, scan_cb, b);
        }
        DDP_GUARD_SET(NULL);
    } else {
        rc = ddp_py_scan_threads(mode, scan_cb, b);
    }
    /* Oldest first (new thread states are pushed at the head).  On 3.11 a new thread
     * state carries its *creator's* native id until the new thread binds it, so a tid can
     * appear twice; register_thread keeps the first (older) one per scan. */
    for (int i = b->n - 1; i >= 0; i--)
        register_thread(b->tstate[i], b->tid[i], gen, now);
    int n = atomic_load(&nslots);
    if (n > MAX_SLOTS)
        n = MAX_SLOTS;
    for (int i = 0; i < n; i++) {
        slot_t *s = &slots[i];
        if (!atomic_load(&s->active))
            continue;
        if (atomic_load(&s->excluded)) {
            atomic_store(&s->active, 0);
            timer_disarm(s);
            continue;
        }
        if (s->seen_gen == gen)
            continue;
        /* Not in this scan.  Gone from the kernel: certainly exited.  Still alive but
         * missing from two complete scans: its thread state is gone (it left Python). */
        int dead = syscall(SYS_tgkill, my_pid, (int)atomic_load(&s->tid), 0) != 0;
        if (rc == 0)
            s->absent++;
        if (dead || s->absent >= 2) {
            atomic_store(&s->active, 0);
            timer_disarm(s);
            s->dead = dead;
        }
    }
    /* Near full: slots that never became active (a thread seen only by its own records, e.g.
     * an allocation, that exited before a scan found it) are checked too, a few per tick. */
    static int sweep;
    if (n >= MAX_SLOTS / 4 * 3 && nfree < 1024)
        for (int k = 0; k < 512 && n; k++) {
            slot_t *s = &slots[sweep++ % n];
            if (!s->dead && !atomic_load(&s->active) && !atomic_load(&s->excluded) &&
                syscall(SYS_tgkill, my_pid, (int)atomic_load(&s->tid), 0) != 0)
                s->dead = 1;
        }
    /* Exited threads' slots, once nothing of theirs is pending, serve new threads. */
    for (int i = 0; i < n; i++) {
        slot_t *s = &slots[i];
        if (s->dead && !s->recycled && !s->wpend && !s->park_on && !s->has_timer && !atomic_load(&s->active))
            slot_recycle(i);
    }
}

/* The start (ns since session start) of the time bucket a WALL sample at `elapsed` may be
 * merged in: model.tick_for's rule, min_tick * 2**k with at most max_ticks ticks over the
 * elapsed time.  A profile's final tick is tick_for(its duration) >= this, a power-of-two
 * multiple aligned at 0, so samples merged here share one tick of the final Profile. */
int64_t ddp_merge_bucket(int64_t elapsed, int64_t min_tick, int32_t max_ticks)
{
    if (min_tick <= 0 || max_ticks <= 0)
        return -1;
    if (elapsed < 0)
        elapsed = 0;
    int64_t tick = min_tick;
    while (tick < INT64_MAX / 2 / max_ticks && elapsed > tick * max_ticks)
        tick <<= 1;
    return elapsed / tick * tick;
}

static inline int64_t bucket_of(int64_t ts)
{
    return ddp_merge_bucket(ts - st.start_mono_ns, cfg.merge_tick_ns, cfg.merge_max_ticks);
}

/* Write a slot's pending WALL record (count samples) to the ring; 0 when the ring is full
 * (the record stays pending: later samples of the thread add to it). */
static int wall_flush(slot_t *s)
{
    ddp_record *p = s->wlast;
    size_t ticket;
    ddp_record *rec = ddp_ring_reserve(ring, &ticket);
    if (!rec)
        return 0;
    s->wpend = 0;
    memcpy(rec, p, sizeof(ddp_record) + (size_t)p->depth * sizeof(ddp_frame));
    ddp_ring_publish(ring, ticket);
    atomic_fetch_add_explicit(&st.samples[DDP_EVENT_WALL], (uint64_t)p->count, memory_order_relaxed);
    atomic_fetch_add_explicit(&st.wall_records, 1, memory_order_relaxed);
    return 1;
}

/* Test mode: the sample as its own record (aux 1), to check merged records against. */
static void wall_shadow(const ddp_record *src, int64_t dwall, int64_t now)
{
    size_t ticket;
    ddp_record *rec = ddp_ring_reserve(ring, &ticket);
    if (!rec)
        return;
    memcpy(rec, src, sizeof(ddp_record) + (size_t)src->depth * sizeof(ddp_frame));
    rec->count = 1;
    rec->value = dwall;
    rec->ts_ns = now;
    rec->aux = 1;
    ddp_ring_publish(ring, ticket);
}

static int same_sample(const ddp_record *a, const ddp_record *b)
{
    return a->state == b->state && a->flags == b->flags && a->depth == b->depth && a->label_id == b->label_id &&
           a->stack_hash == b->stack_hash && !memcmp(a + 1, b + 1, (size_t)a->depth * sizeof(ddp_frame));
}

/* Pending records whose bucket is over, or whose thread left, go to the ring now. */
static void wall_flush_stale(int64_t now, int all)
{
    int n = atomic_load(&nslots);
    if (n > MAX_SLOTS)
        n = MAX_SLOTS;
    int64_t bucket = bucket_of(now);
    for (int i = 0; i < n; i++) {
        slot_t *s = &slots[i];
        if (s->wpend && (all || bucket < 0 || s->wpend_bucket != bucket || !atomic_load(&s->active) ||
                         atomic_load(&s->excluded)))
            wall_flush(s);
    }
}

/* One WALL sample of slot s into *scratch (swapped with the slot's wlast when kept). */
static void wall_sample(slot_t *s, ddp_record **scratch)
{
    int64_t now = ddp_now_ns();
    int64_t dwall = now - s->last_wall_ns;
    if (dwall <= 0)
        return;
    if (!s->wlast && !(s->wlast = malloc(rec_size)))
        return; /* no memory: its time carries to a later sample */
    int64_t cpu_now = thread_cpu_ns(s);
    uint64_t label = label_of(s);
    uintptr_t tstate = atomic_load_explicit(&s->tstate, memory_order_relaxed);
    ddp_record *last = s->wlast;
    /* Not run since its last sample: same frames, state and GC flag. */
    int unchanged = s->wfresh && cpu_now >= 0 && cpu_now == s->last_cpu_ns && last->label_id == label &&
                    s->wlast_tstate == tstate;
    ddp_record *rec = last;
    if (unchanged) {
        atomic_fetch_add_explicit(&st.wall_unchanged, 1, memory_order_relaxed);
    } else {
        rec = *scratch;
        memset(rec, 0, sizeof *rec);
        rec->event = DDP_EVENT_WALL;
        rec->state = (uint8_t)thread_state_of(s, dwall, cpu_now);
        rec->tid = atomic_load_explicit(&s->tid, memory_order_relaxed);
        /* The thread runs on while we read it, so its label is read right before its
         * frames (not before the state above, whose /proc read can take 50 us), and again
         * after them: if it changed (this thread was preempted during the walk, and an
         * asyncio task's step ended meanwhile), label and frames are of different moments
         * (the idle loop under the task's labels): read both again, so they are of one;
         * a thread that changes labels faster than we can walk it (ASan) is a torn read. */
        rec->label_id = label_of(s);
        int torn = walk_into(rec, tstate, atomic_load(&ddp_read_mode_now)) < 0;
        for (int tries = 0; !torn; tries++) {
            uint64_t now_label = label_of(s);
            if (now_label == rec->label_id)
                break;
            if (tries == 2) {
                torn = 1;
                break;
            }
            rec->label_id = now_label;
            torn = walk_into(rec, tstate, atomic_load(&ddp_read_mode_now)) < 0;
        }
        if (torn) {
            atomic_fetch_add_explicit(&st.dropped_torn[DDP_EVENT_WALL], 1, memory_order_relaxed);
            return; /* a torn read keeps its time for the next sample */
        }
    }
    if (cfg.merge_shadow)
        wall_shadow(rec, dwall, now);
    int64_t bucket = bucket_of(now);
    int fresh = 1; /* after this sample, wlast holds the thread's current stack */
    if (s->wpend && bucket >= 0 && s->wpend_bucket == bucket && (unchanged || same_sample(last, rec))) {
        last->count += 1;
        last->value += dwall;
        last->ts_ns = now;
    } else if (s->wpend && !wall_flush(s)) {
        /* the ring is full: this sample's time goes to the thread's pending record (its stack
         * stands for both), so the thread's wall total stays exact */
        last->count += 1;
        last->value += dwall;
        last->ts_ns = now;
        atomic_fetch_add_explicit(&st.carried_full[DDP_EVENT_WALL], 1, memory_order_relaxed);
        fresh = unchanged; /* a new stack was walked and not kept: the pending one is not reusable */
    } else {
        if (!unchanged) {
            s->wlast = rec;
            *scratch = last;
            last = rec;
        }
        last->count = 1;
        last->value = dwall;
        last->ts_ns = now;
        s->wpend = 1;
        s->wpend_bucket = bucket;
        if (bucket < 0)
            wall_flush(s); /* merging off */
    }
    s->wfresh = fresh;
    s->wlast_tstate = tstate;
    s->last_wall_ns = now;
    s->last_cpu_ns = cpu_now;
}

static void wall_tick(int *cursor, ddp_record **scratch)
{
    wall_flush_stale(ddp_now_ns(), 0);
    int n = atomic_load(&nslots);
    if (n > MAX_SLOTS)
        n = MAX_SLOTS;
    int budget = cfg.wall_threads_per_tick > 0 ? cfg.wall_threads_per_tick : DEFAULT_WALL_PER_TICK;
    int start = n ? *cursor % n : 0;
    for (int k = 0; k < n && budget > 0; k++) {
        int i = (start + k) % n;
        slot_t *s = &slots[i];
        if (!atomic_load(&s->active) || atomic_load(&s->excluded))
            continue;
        budget--;
        wall_sample(s, scratch);
        *cursor = (i + 1) % n;
    }
}

/* ---- aggregation (agg.c): records leave the ring without the GIL ------------------------------ */
static int64_t bucket_fn(int64_t ts) { return bucket_of(ts); }

/* Move the ring's records into the active aggregate (agg_lock held).  A full aggregate
 * leaves them in the ring until the drain has read the other one. */
static void agg_fill_locked(void)
{
    if (!ring || !aggs[0])
        return;
    ddp_agg *a = aggs[agg_active];
    for (;;) {
        if (!agg_has_held) {
            if (!ddp_ring_pop(ring, agg_held))
                break;
            if (agg_held->flags & DDP_REC_INVALID)
                continue; /* a torn read, counted as dropped when it was taken */
            agg_has_held = 1;
        }
        /* (the merge test's shadow records stay one per sample: no time bucket) */
        int64_t bucket = cfg.merge_shadow ? -1 : bucket_of(agg_held->ts_ns);
        if (ddp_agg_add(a, agg_held, bucket, bucket_fn) != 0) {
            st.agg_full++;
            break;
        }
        agg_has_held = 0;
        st.agg_in++;
    }
    atomic_store(&agg_quarter, ddp_agg_quarter_full(a));
}

static void agg_fill(void)
{
    pthread_mutex_lock(&agg_lock);
    agg_fill_locked();
    pthread_mutex_unlock(&agg_lock);
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
    if (cfg.drain_new_code && atomic_load_explicit(&ddp_new_code_seen, memory_order_relaxed)
        && ddp_now_ns() - atomic_load(&last_drain_ns) >= DRAIN_NEW_CODE_NS)
        r |= DDP_WAKE_CODE;
    if (cfg.drain_early && ring && (ddp_ring_count(ring) >= ddp_ring_capacity(ring) / 4 || atomic_load(&agg_quarter)))
        r |= DDP_WAKE_RING;
    if (consume ? atomic_exchange(&drain_new_thread, 0) : atomic_load(&drain_new_thread))
        r |= DDP_WAKE_THREAD;
    return r;
}

static void drain_poke(void)
{
    if (!atomic_load(&drain_waiting) || !drain_reasons(0))
        return;
    pthread_mutex_lock(&drain_lock);
    pthread_cond_signal(&drain_cond);
    pthread_mutex_unlock(&drain_lock);
}

/* ---- waits that began before the session: threads blocked when it started ----------------
 * A wait the hooks did not see begin (the thread was blocked before the slots were patched)
 * still counts from the session's start: the thread's blocking syscall names the wait's
 * kind, its frames (still while it is blocked) its stack, and its CPU clock, unmoved while
 * it stays blocked, tells the tick it woke (charged half-way between the two last checks). */
static int blocked_kind(int32_t tid)
{
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *end;
    long nr = strtol(buf, &end, 10);
    if (end == buf)
        return 0; /* "running" */
    switch (nr) {
    case SYS_futex: {
        unsigned long long uaddr = strtoull(end, NULL, 16);
        return gil_lo && uaddr >= gil_lo && uaddr < gil_hi ? DDP_WAIT_COND_TIMEDWAIT : DDP_WAIT_SEM_CLOCKWAIT;
    }
    case SYS_clock_nanosleep: return DDP_WAIT_CLOCK_NANOSLEEP;
    case SYS_nanosleep: return DDP_WAIT_NANOSLEEP;
    case SYS_pselect6: return DDP_WAIT_PSELECT;
    case SYS_ppoll: return DDP_WAIT_PPOLL;
    case SYS_epoll_pwait: return DDP_WAIT_EPOLL_PWAIT;
    case SYS_recvfrom: return DDP_WAIT_RECVFROM;
    case SYS_recvmsg: return DDP_WAIT_RECVMSG;
    case SYS_accept4: return DDP_WAIT_ACCEPT4;
#ifdef SYS_select
    case SYS_select: return DDP_WAIT_SELECT;
#endif
#ifdef SYS_poll
    case SYS_poll: return DDP_WAIT_POLL;
#endif
#ifdef SYS_epoll_wait
    case SYS_epoll_wait: return DDP_WAIT_EPOLL_WAIT;
#endif
#ifdef SYS_accept
    case SYS_accept: return DDP_WAIT_ACCEPT;
#endif
    default: return 0;
    }
}

static void park_scan(int64_t now)
{
    int n = atomic_load(&nslots);
    for (int i = 0; i < n && i < MAX_SLOTS; i++) {
        slot_t *s = &slots[i];
        int32_t tid = atomic_load(&s->tid);
        uintptr_t tstate = atomic_load(&s->tstate);
        if (!atomic_load(&s->active) || atomic_load(&s->excluded) || !tstate || ddp_waits_inflight(tid))
            continue;
        int64_t cpu = thread_cpu_ns(s); /* first: a wake after it shows at the next tick */
        int kind = blocked_kind(tid);
        int ev = kind ? ddp_waits_event_for(kind) : -1;
        if (ev < 0 || cpu < 0)
            continue;
        if (!s->park && !(s->park = malloc(rec_size)))
            continue;
        ddp_record *rec = s->park;
        memset(rec, 0, sizeof *rec);
        rec->event = (uint8_t)ev;
        rec->state = DDP_STATE_OFFCPU;
        rec->tid = tid;
        rec->label_id = label_of(s);
        rec->count = 1;
        rec->aux = (uint64_t)kind;
        if (walk_into(rec, tstate, atomic_load(&ddp_read_mode_now)) < 0)
            continue;
        s->park_on = 1;
        s->park_cpu = cpu;
        s->park_checked = now;
        st.parked_at_start++;
    }
}

static void park_emit(slot_t *s, int64_t end)
{
    s->park_on = 0;
    ddp_record *p = s->park;
    if (end <= st.start_mono_ns)
        return;
    p->value = end - st.start_mono_ns;
    p->ts_ns = end;
    size_t ticket;
    ddp_record *rec = ddp_ring_reserve(ring, &ticket);
    if (!rec) {
        atomic_fetch_add_explicit(&st.dropped_full[p->event], 1, memory_order_relaxed);
        return;
    }
    memcpy(rec, p, sizeof(ddp_record) + (size_t)p->depth * sizeof(ddp_frame));
    ddp_ring_publish(ring, ticket);
    atomic_fetch_add_explicit(&st.samples[p->event], 1, memory_order_relaxed);
    ddp_waits_count_edge();
}

/* Each tick (and at the end, `final`): which threads blocked since the start have woken. */
static void park_tick(int64_t now, int final)
{
    int n = atomic_load(&nslots);
    for (int i = 0; i < n && i < MAX_SLOTS; i++) {
        slot_t *s = &slots[i];
        if (!s->park_on)
            continue;
        int64_t cpu = thread_cpu_ns(s);
        if (cpu != s->park_cpu) /* it ran (or exited) since the last check: it woke in between */
            park_emit(s, s->park_checked + (now - s->park_checked) / 2);
        else if (final)
            park_emit(s, now);
        else
            s->park_checked = now;
    }
}

static void *sampler_main(void *arg)
{
    (void)arg;
    sigset_t set;
    sigfillset(&set);
    sigdelset(&set, SIGSEGV); /* synchronous faults must stay deliverable (guarded reads) */
    sigdelset(&set, SIGBUS);
    sigdelset(&set, SIGFPE);
    sigdelset(&set, SIGILL);
    pthread_sigmask(SIG_SETMASK, &set, NULL);
    pthread_setname_np(pthread_self(), "ddprof_nb-wall"); /* its comm in /proc: benchmarks find it */
    scan_buf *b = malloc(sizeof *b);
    ddp_record *scratch = malloc(rec_size);
    if (!b || !scratch) {
        free(b);
        free(scratch);
        return NULL;
    }
    uint32_t gen = 1; /* 1 was the start-time registration */
    int cursor = 0;
    /* Without CPU or WALL events a tick only notices new threads (a drain wake names them),
     * prefaults the ring and pokes the drain: 20 per second do, and each tick is a thread
     * wake on a possibly busy CPU (lock/park: 35 of 140 context switches a 0.35 s session
     * added to bench_locks' thread pool, 0.9 ms of its 3.8 ms of direct CPU). */
    int64_t period = cfg.interval_ns;
    if (!(cfg.events & ((1u << DDP_EVENT_CPU) | (1u << DDP_EVENT_WALL))) && period < IDLE_TICK_NS)
        period = IDLE_TICK_NS;
    int64_t next = ddp_now_ns() + period;
    pthread_mutex_lock(&wake_lock);
    while (!wake_stop) {
        struct timespec ts = { next / 1000000000LL, next % 1000000000LL };
        int rc = pthread_cond_timedwait(&wake_cond, &wake_lock, &ts);
        if (wake_stop)
            break;
        if (rc != ETIMEDOUT)
            continue;
        pthread_mutex_unlock(&wake_lock);
        int64_t t0 = ddp_now_ns();
        /* Our SIGSEGV handler every tick (wall reads rely on it), SIGBUS every 16th (one
         * sigaction syscall each; a bus error needs a truncated mapping, far rarer). */
        if (atomic_load(&ddp_read_mode_now) == DDP_READ_GUARDED) {
            if (gen & 15)
                ddp_saferead_check_segv();
            else
                ddp_saferead_check();
        }
        prof_check(); /* one sigaction syscall */
        registry_tick(b, ++gen, t0);
        if (cfg.events & (1u << DDP_EVENT_WALL))
            wall_tick(&cursor, &scratch);
        ddp_nalloc_tick(); /* C allocations: objects loaded since the last look get hooked */
        if (atomic_load(&waits_ready)) {
            ddp_waits_tick(); /* objects loaded since the last look get their waits hooked */
            if (atomic_load(&waits_ready) == 1) {
                park_scan(t0);
                atomic_store(&waits_ready, 2);
            } else {
                park_tick(t0, 0);
            }
        }
        agg_fill();
        drain_poke();
        ddp_ring_prefault(ring); /* pages ahead of the producers, off their path (ring.c) */
        int64_t t1 = ddp_now_ns();
        atomic_fetch_add(&st.wall_ticks, 1);
        atomic_fetch_add(&st.wall_ns, (uint64_t)(t1 - t0));
        next += period;
        if (next <= t1)
            next = t1 + period; /* late: skip ticks (weights are time-based) */
        pthread_mutex_lock(&wake_lock);
    }
    pthread_mutex_unlock(&wake_lock);
    agg_fill();                        /* room in the ring for the last records */
    wall_flush_stale(ddp_now_ns(), 1); /* the session ends: every merged sample to the ring */
    park_tick(ddp_now_ns(), 1);        /* and every wait still going on since the start */
    agg_fill();
    for (int i = 0; i < atomic_load(&nslots) && i < MAX_SLOTS; i++)
        if (slots[i].wpend) { /* the ring stayed full: lost, and said */
            atomic_fetch_add_explicit(&st.dropped_full[DDP_EVENT_WALL], (uint64_t)slots[i].wlast->count,
                                      memory_order_relaxed);
            slots[i].wpend = 0;
        }
    free(b);
    free(scratch);
    return NULL;
}

/* ---- sessions ------------------------------------------------------------------------------- */
/* Producers that may still be inside the ring or a slot: a signal handler, a wait wrapper's
 * emit.  Stop waits for them (bounded); release frees only when none is left. */
static int producers_inside(void) { return atomic_load(&in_handler) || ddp_waits_emitting(); }

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
        leaked_bytes += (ring ? ddp_ring_capacity(ring) * rec_size : 0) + MAX_SLOTS * sizeof(slot_t);
        ring = NULL;
        slots = NULL;
        rec_size = 0;
        return;
    }
    /* (a new session maps a fresh ring: creating one writes nothing, see ring.c, and the
     * memory goes back to the system between sessions) */
    ddp_ring_free(ring);
    ring = NULL;
    for (int i = 0; i < 2; i++) {
        ddp_agg_free(aggs[i]);
        aggs[i] = NULL;
    }
    free(agg_held);
    agg_held = NULL;
    agg_has_held = 0;
    int n = atomic_load(&nslots);
    for (int i = 0; slots && i < n && i < MAX_SLOTS; i++) {
        free(slots[i].wlast);
        free(slots[i].park);
    }
    free(slots);
    slots = NULL;
    rec_size = 0;
}

static void drain_cond_init(void)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&drain_cond, &ca);
    pthread_condattr_destroy(&ca);
}

static void atfork_child(void)
{
    /* POSIX: the child has no timers and no sampler thread.  Put the signal handlers
     * back and forget the session so the child runs on unharmed and may profile itself. */
    tls_tid = 0; /* this thread's tid in the child */
    tls_gen = 0;
    pthread_mutex_init(&map_lock, NULL); /* another thread may have held it at fork */
    if (atomic_load(&state) == ST_IDLE)
        return;
    atomic_store(&ddp_session_active, 0);
    if (prof_installed) {
        sigaction(SIGPROF, &old_prof, NULL);
        prof_installed = 0;
    }
    ddp_saferead_after_fork_child();
    ddp_py_after_fork_child();
    ddp_alloc_after_fork_child(); /* allocations: hooks become pass-throughs */
    pthread_mutex_init(&wake_lock, NULL);
    pthread_mutex_init(&drain_lock, NULL); /* no drain waits in this child */
    pthread_mutex_init(&agg_lock, NULL);
    drain_cond_init();
    atomic_store(&drain_waiting, 0);
    sampler_started = 0;
    /* Our copies of the buffers are forgotten, not freed: the fork may have caught another
     * thread half-way through freeing them (a release), and freeing again crashed the child. */
    ring = NULL;
    slots = NULL;
    aggs[0] = aggs[1] = NULL;
    agg_held = NULL;
    agg_has_held = 0;
    rec_size = 0;
    atomic_store(&in_handler, 0);
    my_pid = getpid();
    atomic_store(&state, ST_IDLE);
}

static int register_at_start(void)
{
    /* Under the GIL: the official API gives a consistent list. */
    int64_t now = ddp_now_ns();
    PyInterpreterState *interp = PyInterpreterState_Get();
    int n = 0;
    for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t; t = PyThreadState_Next(t))
        n++;
    PyThreadState **all = malloc(sizeof(*all) * (size_t)(n ? n : 1));
    if (!all)
        return -1;
    n = 0;
    for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t; t = PyThreadState_Next(t))
        all[n++] = t;
    for (int i = n - 1; i >= 0; i--) /* oldest first, as registry_tick */
        if (all[i]->native_thread_id)
            register_thread((uintptr_t)all[i], (int32_t)all[i]->native_thread_id, 1, now);
    free(all);
    return 0;
}

int ddp_running(void) { return atomic_load(&state) == ST_RUNNING; }

int ddp_start(const ddp_config *c)
{
    static int atfork_done;
    if (!c)
        return DDP_EINVAL;
    if (c->interval_ns < 100000 || c->interval_ns > 60000000000LL || c->max_depth < 1 || c->max_depth > 4096 ||
        c->ring_records < 0 || c->agg_keys < 0 || c->n_exclude < 0 || c->n_exclude > 8 || c->merge_tick_ns < 0 || c->merge_max_ticks < 0 ||
        (c->read_mode != DDP_READ_GUARDED && c->read_mode != DDP_READ_SYSCALL))
        return DDP_EINVAL;
    uint32_t supported = (1u << DDP_EVENT_CPU) | (1u << DDP_EVENT_WALL);
    supported |= ddp_waits_events_mask(); /* lock/park (waits.c) */
    supported |= 1u << DDP_EVENT_ALLOC;   /* allocations (alloc.c) */
    if (!c->events || (c->events & ~supported))
        return DDP_EINVAL;
    int expect = ST_IDLE;
    if (!atomic_compare_exchange_strong(&state, &expect, ST_STARTING))
        return DDP_EBUSY;
    if (!Py_IsInitialized()) {
        atomic_store(&state, ST_IDLE);
        return DDP_EUNSUPPORTED;
    }
    if (!atfork_done) {
        pthread_atfork(NULL, NULL, atfork_child);
        atfork_done = 1;
    }
    cfg = *c;
    my_pid = getpid();
    ddp_saferead_set_pid(my_pid);
    rng_state = (uint64_t)ddp_now_ns() ^ ((uint64_t)my_pid << 32) ^ 0x9E3779B97F4A7C15ULL;
    if (!rng_state)
        rng_state = 1;
    memset(&st, 0, sizeof st);
    atomic_store(&waits_ready, 0);
    pthread_once(&drain_once, drain_cond_init); /* never destroyed: a drain may still be leaving a wait */
    pthread_mutex_lock(&drain_lock);
    drain_stop = 0;
    pthread_mutex_unlock(&drain_lock);
    atomic_store(&drain_new_thread, 0);
    atomic_store(&ddp_fault_count, 0);
    atomic_store(&ddp_graveyard_overflow, 0);

    int rc = DDP_OK;
    PyGILState_STATE g = PyGILState_Ensure();
    rc = ddp_py_init();
    if (rc != DDP_OK)
        goto fail_gil;
    ddp_py_gil_range(&gil_lo, &gil_hi);

    int want_cpu = (cfg.events & (1u << DDP_EVENT_CPU)) != 0;
    if (want_cpu) {
        struct sigaction cur;
        sigaction(SIGPROF, NULL, &cur);
        /* (our own handler, put back by a tool that saved it while we ran, is no one else's) */
        int custom = (cur.sa_flags & SA_SIGINFO) ? cur.sa_sigaction != NULL && cur.sa_sigaction != on_sigprof
                                                 : (cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN);
        if (custom) {
            rc = DDP_ESIGNAL;
            goto fail_gil;
        }
    }
    rec_size = sizeof(ddp_record) + (size_t)cfg.max_depth * sizeof(ddp_frame);
    size_t records = cfg.ring_records > 0 ? (size_t)cfg.ring_records : DEFAULT_RING_RECORDS;
    if (cfg.ring_records <= 0 && records * rec_size > RING_BUDGET_BYTES)
        records = RING_BUDGET_BYTES / rec_size < 256 ? 256 : RING_BUDGET_BYTES / rec_size;
    ring = ddp_ring_new(records, rec_size);
    slots = calloc(MAX_SLOTS, sizeof(slot_t));
    for (int i = 0; i < 2; i++)
        aggs[i] = ddp_agg_new(cfg.agg_keys > 0 ? (uint32_t)cfg.agg_keys : AGG_KEYS, AGG_ARENA_BYTES);
    agg_active = 0;
    agg_held = malloc(rec_size);
    agg_has_held = 0;
    atomic_store(&agg_quarter, 0);
    if (!ring || !slots || !aggs[0] || !aggs[1] || !agg_held) {
        rc = DDP_ENOMEM;
        goto fail_gil;
    }
    for (int i = 0; i < MAP_SIZE; i++)
        atomic_store(&map_cell[i], 0);
    nfree = 0;
    atomic_store(&nslots, 0);
    atomic_fetch_add(&session_gen, 1); /* every thread's cached slot is stale */
    atomic_store(&own_segv_checked_ns, INT64_MIN / 2);
    ddp_bloom_clear();
    /* the "known" filter is kept: it mirrors the process's code cache (_binding.py), which
     * outlives sessions, so the next cell's samples of code resolved before wake nobody */
    atomic_store(&ddp_new_code_seen, 0);
    atomic_store(&last_drain_ns, ddp_now_ns());
    ddp_py_graveyard_clear();
    for (int i = 0; i < cfg.n_exclude; i++) {
        int idx = slot_get_or_create(cfg.exclude_tids[i]);
        if (idx >= 0)
            atomic_store(&slots[idx].excluded, 1);
    }
    atomic_store(&ddp_read_mode_now, cfg.read_mode);
    if (cfg.read_mode == DDP_READ_GUARDED && ddp_saferead_install() < 0)
        atomic_store(&ddp_read_mode_now, DDP_READ_SYSCALL);
    if (want_cpu) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigprof;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGPROF, &sa, &old_prof) != 0) {
            ddp_set_errno(errno);
            rc = DDP_ESYS;
            goto fail_gil;
        }
        prof_installed = 1;
    }
    /* ---- allocations: install the PyMem hooks (needs the GIL, held here) ---- */
    if ((cfg.events & (1u << DDP_EVENT_ALLOC)) && (rc = ddp_alloc_start(&cfg)) != DDP_OK)
        goto fail_gil;
    /* ---- end allocations ---- */
    st.start_mono_ns = ddp_now_ns();
    atomic_store_explicit(&ddp_session_active, 1, memory_order_release);
    register_at_start();
    atomic_store(&drain_new_thread, 0); /* the engine names the threads present at start itself */
    ddp_py_watcher_start(); /* resolve sampled code objects as they die (3.12+ watcher, 3.11 dealloc wrapper) */
    PyGILState_Release(g);

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wake_cond, &ca);
    pthread_condattr_destroy(&ca);
    wake_stop = 0;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the sampler thread starts with signals blocked */
    int prc = pthread_create(&sampler_thread, NULL, sampler_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (prc != 0) {
        ddp_set_errno(prc);
        ddp_stop();
        g = PyGILState_Ensure();
        ddp_py_watcher_stop();
        PyGILState_Release(g);
        free_session();
        atomic_store(&state, ST_IDLE);
        return DDP_ESYS;
    }
    sampler_started = 1;
    atomic_store(&state, ST_RUNNING);
    /* ---- lock/park: patch GOT slots now, without the GIL (dl_iterate_phdr takes the loader lock) */
    if ((cfg.events & ddp_waits_events_mask()) && ddp_waits_start(&cfg) == DDP_OK)
        atomic_store(&waits_ready, 1);
    /* ---- end lock/park ---- */
    ddp_nalloc_start(&cfg); /* C allocations: patch GOT slots, without the GIL (as lock/park) */
    return DDP_OK;

fail_gil:
    atomic_store(&ddp_session_active, 0);
    if (prof_installed) {
        sigaction(SIGPROF, &old_prof, NULL);
        prof_installed = 0;
    }
    ddp_saferead_uninstall();
    PyGILState_Release(g);
    free_session();
    atomic_store(&state, ST_IDLE);
    return rc;
}

int ddp_stop(void)
{
    int s = atomic_load(&state);
    if (s != ST_RUNNING && s != ST_STARTING)
        return DDP_ENOTRUNNING;
    pthread_mutex_lock(&drain_lock); /* a waiting drain returns DDP_ENOTRUNNING */
    drain_stop = 1;
    pthread_cond_broadcast(&drain_cond);
    pthread_mutex_unlock(&drain_lock);
    ddp_waits_stop(); /* lock/park: restore the GOT slots first (a no-op without them) */
    ddp_nalloc_stop(); /* C allocations: the same, before ddp_alloc_stop freezes LIVE */
    if (sampler_started) {
        pthread_mutex_lock(&wake_lock);
        wake_stop = 1;
        pthread_cond_signal(&wake_cond);
        pthread_mutex_unlock(&wake_lock);
        pthread_join(sampler_thread, NULL);
        sampler_started = 0;
        pthread_cond_destroy(&wake_cond);
    }
    ddp_alloc_stop(); /* allocations: takes the GIL, restores the allocators, freezes LIVE */
    atomic_store_explicit(&ddp_session_active, 0, memory_order_release);
    int n = atomic_load(&nslots);
    if (n > MAX_SLOTS)
        n = MAX_SLOTS;
    /* What the CPU timers' signals accounted against what the threads' clocks say they
     * used: a kernel that checks CPU timers only at ticks the thread is on CPU for (an
     * overloaded machine or VM) delivers late, coalesced or no signals (seen: none for
     * 0.1 s of CPU beside CPU hogs on 2 vCPUs); the engine says so in a note. */
    for (int i = 0; slots && i < n; i++) {
        slot_t *s = &slots[i];
        int64_t now = s->has_timer && s->cpu_first_ns > 0 ? thread_cpu_ns(s) : -1;
        s->cpu_used_stop = 0;
        if (now >= s->cpu_first_ns && s->cpu_first_ns > 0) {
            s->cpu_used_stop = now - s->cpu_first_ns;
            st.cpu_used_ns += s->cpu_used_stop;
            st.cpu_sampled_ns += atomic_load_explicit(&s->cpu_sampled, memory_order_relaxed);
        }
    }
    for (int i = 0; slots && i < n; i++) {
        timer_disarm(&slots[i]);
        atomic_store(&slots[i].active, 0);
    }
    if (prof_installed) {
        if (prof_is_ours()) {
            /* SIG_IGN discards SIGPROFs still queued for any thread, so restoring a SIG_DFL
             * disposition can never let a late timer signal kill the process. */
            struct sigaction ign;
            memset(&ign, 0, sizeof ign);
            ign.sa_handler = SIG_IGN;
            sigemptyset(&ign.sa_mask);
            sigaction(SIGPROF, &ign, NULL);
            sigaction(SIGPROF, &old_prof, NULL);
        } else {
            /* Another tool installed its SIGPROF handler over ours: it stays (what we saved
             * would take SIGPROF from it, and its timer's next signal could kill the process). */
            atomic_store(&st.prof_replaced, 1);
        }
        prof_installed = 0;
    }
    for (int spins = 0; atomic_load(&in_handler) && spins < 1000000; spins++)
        sched_yield();
    ddp_saferead_uninstall();
    st.stop_mono_ns = ddp_now_ns();
    atomic_store(&state, ST_STOPPED);
    return DDP_OK;
}

void ddp_release(void)
{
    if (atomic_load(&state) == ST_RUNNING)
        ddp_stop();
    if (Py_IsInitialized()) {
        PyGILState_STATE g = PyGILState_Ensure();
        ddp_py_watcher_stop();
        PyGILState_Release(g);
    }
    ddp_py_graveyard_clear();
    if (atomic_load(&state) == ST_STOPPED) {
        free_session();
        atomic_store(&state, ST_IDLE);
    }
}

int ddp_cpu_thread_totals(int32_t *tid, int64_t *used, int64_t *sampled, int cap)
{
    if (cap < 0 || (cap && (!tid || !used || !sampled)))
        return DDP_EINVAL;
    if (atomic_load(&state) != ST_STOPPED || !slots)
        return DDP_ENOTRUNNING;
    int n = 0, ns = atomic_load(&nslots);
    for (int i = 0; i < ns && i < MAX_SLOTS; i++) {
        slot_t *s = &slots[i];
        if (s->cpu_used_stop <= 0)
            continue;
        if (n < cap) {
            tid[n] = atomic_load(&s->tid);
            used[n] = s->cpu_used_stop;
            sampled[n] = atomic_load(&s->cpu_sampled);
        }
        n++;
    }
    return n;
}

int ddp_record_size(void) { return ring ? (int)rec_size : 0; }

int ddp_drain(void *buf, int max_records)
{
    int s = atomic_load(&state);
    if (!ring || (s != ST_RUNNING && s != ST_STOPPED))
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
        n += ddp_agg_take(r, (char *)buf + (size_t)n * rec_size, max_records - n, rec_size);
        if (n == max_records)
            break;
        if (!ddp_agg_keys(aggs[agg_active]) && !agg_has_held)
            break;
        ddp_agg_reset(r);
        agg_active = 1 - agg_active;
        agg_fill_locked();
    }
    st.agg_out += (uint64_t)n;
    pthread_mutex_unlock(&agg_lock);
    return n;
}

int ddp_pending(void)
{
    int s = atomic_load(&state);
    if (!ring || (s != ST_RUNNING && s != ST_STOPPED))
        return 0;
    pthread_mutex_lock(&agg_lock);
    int n = (int)ddp_ring_count(ring) + (int)ddp_agg_keys(aggs[0]) + (int)ddp_agg_keys(aggs[1]);
    pthread_mutex_unlock(&agg_lock);
    return n;
}

int ddp_drain_wait(int64_t timeout_ns)
{
    if (timeout_ns < 0)
        return DDP_EINVAL;
    if (atomic_load(&state) != ST_RUNNING)
        return DDP_ENOTRUNNING;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t end = (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec + timeout_ns;
    struct timespec deadline = { end / 1000000000LL, end % 1000000000LL };
    int r = 0;
    pthread_mutex_lock(&drain_lock);
    atomic_store(&drain_waiting, 1);
    for (;;) {
        if (drain_stop || atomic_load(&state) != ST_RUNNING) {
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

int ddp_get_stats(ddp_stats *out)
{
    if (!out)
        return DDP_EINVAL;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < 8; i++) {
        out->samples[i] = atomic_load(&st.samples[i]);
        out->dropped_full[i] = atomic_load(&st.dropped_full[i]);
        out->dropped_torn[i] = atomic_load(&st.dropped_torn[i]);
    }
    out->timer_failures = atomic_load(&st.timer_failures);
    out->threads_seen = atomic_load(&st.threads_seen);
    out->threads_overflow = atomic_load(&st.threads_overflow);
    out->stale_signals = atomic_load(&st.stale_signals);
    out->faults = atomic_load(&ddp_fault_count);
    out->handler_ns = atomic_load(&st.handler_ns);
    out->handler_calls = atomic_load(&st.handler_calls);
    out->wall_ticks = atomic_load(&st.wall_ticks);
    out->wall_ns = atomic_load(&st.wall_ns);
    out->wall_records = atomic_load(&st.wall_records);
    out->wall_unchanged = atomic_load(&st.wall_unchanged);
    out->graveyard_overflow = atomic_load(&ddp_graveyard_overflow);
    out->read_mode = atomic_load(&ddp_read_mode_now);
    out->segv_replaced = atomic_load(&ddp_segv_replaced);
    out->start_mono_ns = st.start_mono_ns;
    out->stop_mono_ns = st.stop_mono_ns;
    out->cpu_used_ns = st.cpu_used_ns;
    out->cpu_sampled_ns = st.cpu_sampled_ns;
    out->timer_errno = atomic_load(&st.timer_errno);
    out->prof_replaced = atomic_load(&st.prof_replaced);
    out->parked_at_start = st.parked_at_start;
    for (int i = 0; i < 8; i++)
        out->carried_full[i] = atomic_load(&st.carried_full[i]);
    out->agg_in = st.agg_in;
    out->agg_out = st.agg_out;
    out->agg_full = st.agg_full;
    out->agg_folded = (aggs[0] ? ddp_agg_folded(aggs[0]) : 0) + (aggs[1] ? ddp_agg_folded(aggs[1]) : 0);
    uint64_t keys = cfg.agg_keys > 0 ? (uint64_t)cfg.agg_keys : AGG_KEYS;
    out->agg_bytes = 2 * ((uint64_t)AGG_ARENA_BYTES + 2 * keys * sizeof(uint32_t));
    out->leaked_bytes = leaked_bytes;
    return DDP_OK;
}

uint64_t ddp_dropped(int event)
{
    if (event < 0 || event >= DDP_EVENT_COUNT)
        return 0;
    return atomic_load(&st.dropped_full[event]) + atomic_load(&st.dropped_torn[event]);
}

int ddp_set_thread_labels_for(int32_t tid, uint64_t id)
{
    if (tid <= 0)
        return DDP_EINVAL;
    lword_t *w = lw_claim(tid); /* in or out of a session: the words outlive sessions */
    if (!w)
        return DDP_ENOMEM;
    atomic_store(&w->id, id);
    return DDP_OK;
}

int ddp_set_thread_labels(uint64_t id) { return ddp_set_thread_labels_for(my_tid(), id); }

uint64_t *ddp_label_word(void)
{
    lword_t *w = lw_claim(my_tid());
    return w ? (uint64_t *)&w->id : NULL;
}

int ddp_exclude_thread(int32_t tid)
{
    if (atomic_load(&state) != ST_RUNNING || !slots)
        return DDP_ENOTRUNNING;
    int idx = slot_get_or_create(tid);
    if (idx < 0)
        return DDP_ENOMEM;
    atomic_store(&slots[idx].excluded, 1); /* the handler drops from now; the timer goes next tick */
    return DDP_OK;
}

/* ---- test and benchmark helpers ------------------------------------------------------------- */
int64_t ddp_bench_walk(int read_mode, int iterations, int max_depth, int *depth_out)
{
    uintptr_t tstate = ddp_py_current_tstate();
    if (atomic_load(&state) == ST_IDLE) { /* outside a session: interpreter addresses, with the GIL */
        PyGILState_STATE gs = PyGILState_Ensure();
        ddp_py_init();
        PyGILState_Release(gs);
    }
    if (!tstate || iterations <= 0 || max_depth < 1 || max_depth > 4096)
        return DDP_EINVAL;
    int installed_here = 0;
    if (read_mode == DDP_READ_GUARDED) {
        installed_here = ddp_saferead_install();
        if (installed_here < 0)
            return DDP_ESYS;
    }
    ddp_saferead_set_pid(getpid());
    ddp_frame *frames = malloc(sizeof(ddp_frame) * (size_t)max_depth);
    if (!frames)
        return DDP_ENOMEM;
    int64_t t0 = ddp_now_ns();
    volatile int depth = -1;
    for (int i = 0; i < iterations; i++) {
        uint16_t flags = 0;
        if (read_mode == DDP_READ_GUARDED) {
            ddp_guard g, *prev = ddp_tls_guard;
            ddp_saferead_check_segv(); /* the handler does this per sample too */
            if (sigsetjmp(g.jb, 0) == 0) {
                DDP_GUARD_ARM(&g);
                depth = ddp_py_walk(tstate, 0, read_mode, frames, max_depth, &flags);
                ddp_py_gc_on_thread(tstate, read_mode);
            }
            DDP_GUARD_SET(prev);
        } else {
            depth = ddp_py_walk(tstate, 0, read_mode, frames, max_depth, &flags);
            ddp_py_gc_on_thread(tstate, read_mode);
        }
    }
    int64_t elapsed = ddp_now_ns() - t0;
    free(frames);
    if (installed_here == 1)
        ddp_saferead_uninstall();
    if (depth_out)
        *depth_out = depth;
    return elapsed;
}

int ddp_test_safe_read(uint64_t addr, int read_mode)
{
    int installed_here = 0;
    if (read_mode == DDP_READ_GUARDED) {
        installed_here = ddp_saferead_install();
        if (installed_here < 0)
            return DDP_ESYS;
    }
    ddp_saferead_set_pid(getpid());
    volatile int rc = -1;
    char buf[64];
    if (read_mode == DDP_READ_GUARDED) {
        ddp_guard g, *prev = ddp_tls_guard;
        if (sigsetjmp(g.jb, 0) == 0) {
            DDP_GUARD_ARM(&g);
            /* no plausibility filter: exercise the fault path itself */
            ddp_guarded_copy(buf, (uintptr_t)addr, sizeof buf);
            rc = 0;
        } else {
            rc = -1;
        }
        DDP_GUARD_SET(prev);
    } else {
        rc = ddp_safe_read(buf, (uintptr_t)addr, sizeof buf, DDP_READ_SYSCALL);
    }
    if (installed_here == 1)
        ddp_saferead_uninstall();
    return rc;
}
