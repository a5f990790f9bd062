/* threads.c — the thread registry: a slot per Python thread, a tid -> slot map.
 *
 * Python threads are found in the interpreter's thread-state list: under the GIL at start
 * (PyInterpreterState_ThreadHead), then every wall tick from the native sampler thread by a
 * racy walk through safe reads.  Why a racy walk rather than a Python-side hook: it needs
 * no cooperation from threading (threads started by C extensions or _thread are covered),
 * costs a few loads per thread per tick, and a torn walk (a thread state unlinked while we
 * read) is detected (interp pointer check, cycle bound) and simply retried at the next
 * tick.  A thread is removed only when its tid is gone from two complete scans or from the
 * kernel (tgkill(pid, tid, 0) fails).  Slots live in a preallocated array that never moves
 * during a session, so the pointer a timer carries in sigev_value always points to valid
 * memory; a slot whose thread exited goes back to a pool for new threads, and the handler
 * checks that the slot's tid is its own thread's (a signal queued before a timer_delete is
 * then ignored).
 *
 * The registry owns a thread's state: its tid, thread state, CPU clock, whether it was born
 * in the session or left, and what its clock said then.  Engines that sample threads (CPU,
 * wall) sit above it: it tells them of threads joining, seen, leaving through the engine
 * table (engines_thread_*), never by name, so no call goes up.
 *
 * Includes: core.h (and Python.h for the start-time list, taken under the GIL).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <Python.h>
#include "core.h"

#define MAP_SIZE 16384 /* tid -> slot, open addressing, power of two */

DDP_TLS int32_t tls_tid;
DDP_TLS int32_t tls_slot;
DDP_TLS uint32_t tls_gen;

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
/* The scans (wall thread): numbered from 1, the start-time registration; a slot found by the
 * latest has its number as seen_gen.  The buffer holds one scan's (tstate, tid) pairs. */
#define SCAN_MAX (MAX_SLOTS * 2)
typedef struct {
    uintptr_t tstate[SCAN_MAX];
    int32_t tid[SCAN_MAX];
    int n;
} scan_buf_t;
static scan_buf_t scan;
static uint32_t scan_gen;
_Atomic int registry_new_thread;

/* ---- tid -> slot map (lock-free; used by the sampler thread and Python threads) -------- */
static inline uint32_t tid_hash(int32_t tid) { return ((uint32_t)tid * 2654435761u) & (MAP_SIZE - 1); }

static inline int32_t cell_tid(uint64_t c) { return (int32_t)(c >> 32); }
static inline uint64_t make_cell(int32_t tid, int idx) { return ((uint64_t)(uint32_t)tid << 32) | (uint32_t)(idx + 1); }

int slot_lookup(int32_t tid)
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
    if (atomic_load(&sess_nslots) < MAX_SLOTS)
        idx = atomic_fetch_add(&sess_nslots, 1);
    else if (nfree > 0)
        idx = free_slot[--nfree];
    else
        return -1;
    slot_t *s = &sess_slots[idx];
    ddp_record *wlast = s->wlast, *park = s->park, *start_rec = s->start_rec; /* buffers are kept for the next thread */
    memset(s, 0, sizeof *s);
    s->wlast = wlast;
    s->park = park;
    s->start_rec = start_rec;
    atomic_store(&s->tid, tid);
    s->clock = ((~(clockid_t)tid) << 3) | 6; /* CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED */
    atomic_fetch_add(&sess_stats.threads_seen, 1);
    return idx;
}

int slot_get_or_create(int32_t tid)
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
        atomic_fetch_add(&sess_stats.threads_overflow, 1);
    return idx;
}

/* The slot of a thread that exited goes back to the pool (wall thread only; under map_lock):
 * its map cell is deleted by backward shift, so probe chains stay intact without tombstones.
 * A late signal of its deleted timer cannot arrive (its thread is gone), and the handler
 * checks the slot's tid anyway. */
static void slot_recycle(int idx)
{
    slot_t *s = &sess_slots[idx];
    int32_t tid = atomic_load(&s->tid);
    pthread_mutex_lock(&map_lock);
    if (syscall(SYS_tgkill, sess_pid, (int)tid, 0) == 0) { /* the kernel gave its tid to a new thread */
        s->dead = 0;
        s->exit_done = 0; /* (the old thread's start and exit are not the new one's) */
        atomic_store(&s->start_ready, 0);
        atomic_store(&s->exit_cpu_ns, 0);
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
    for (int i = 0; i < sess_cfg.n_exclude && i < 8; i++)
        if (sess_cfg.exclude_tids[i] == tid)
            return 1;
    return 0;
}

/* The process's threads at the start (sorted): a thread not among them was born during
 * the session, so all the CPU its clock shows is the session's, including what it used
 * before a tick first found it. */
static int32_t *start_tids;
static int n_start_tids;

static int cmp_tid(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void list_start_tids(void)
{
    n_start_tids = -1; /* unknown: every thread is taken as older than the session */
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return;
    int cap = 0, n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long tid = strtol(e->d_name, NULL, 10);
        if (tid <= 0)
            continue;
        if (n == cap) {
            int32_t *grown = realloc(start_tids, sizeof(int32_t) * (size_t)(cap ? cap * 2 : 256));
            if (!grown) {
                closedir(d);
                return;
            }
            start_tids = grown;
            cap = cap ? cap * 2 : 256;
        }
        start_tids[n++] = (int32_t)tid;
    }
    closedir(d);
    qsort(start_tids, (size_t)n, sizeof(int32_t), cmp_tid);
    n_start_tids = n;
}

int thread_born_in_session(int32_t tid)
{
    return n_start_tids >= 0 && !bsearch(&tid, start_tids, (size_t)n_start_tids, sizeof(int32_t), cmp_tid);
}

int64_t thread_cpu_ns(slot_t *s)
{
    struct timespec ts;
    if (clock_gettime(s->clock, &ts) != 0)
        return -1;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* An excluded thread (the profiler's own): not sampled, and its CPU is not the user's. */
static void unsample(slot_t *s)
{
    atomic_store(&s->active, 0);
    s->cpu_counted = 0;
    engines_thread_left(s);
}

/* A thread seen in the interpreter's list: make sure it has a slot and a state; the engines
 * that sample it hear of it. */
static void register_thread(uintptr_t tstate, int32_t tid, uint32_t gen, int64_t now)
{
    if (tid <= 0 || is_excluded_cfg(tid))
        return;
    int idx = slot_lookup(tid);
    if (idx < 0 || !atomic_load(&sess_slots[idx].active)) {
        /* New (or label-only) slot: make sure the tid is a live thread of ours, not a
         * value read from a thread state freed under the racy scan. */
        if (syscall(SYS_tgkill, sess_pid, tid, 0) != 0)
            return;
        if (idx < 0)
            idx = slot_get_or_create(tid);
        if (idx < 0)
            return;
    }
    slot_t *s = &sess_slots[idx];
    if (s->seen_gen == gen)
        return; /* two thread states with one tid: the older one (seen first) is the thread's */
    s->seen_gen = gen;
    s->absent = 0;
    if (atomic_load(&s->excluded)) {
        unsample(s);
        return;
    }
    if (atomic_load(&s->tstate) != tstate)
        atomic_store(&s->tstate, tstate);
    if (!atomic_load(&s->active)) {
        s->dead = 0; /* (a tid the kernel gave to a new thread) */
        int64_t c = thread_cpu_ns(s);
        if (!s->cpu_first_ns) {
            s->cpu_first_ns = c ? c : -1;
            /* gen 1: found at the start; cpu_left: back in Python, its earlier CPU counted */
            s->cpu_base_ns = gen != 1 && !s->cpu_left && thread_born_in_session(tid) ? 0 : s->cpu_first_ns;
        }
        s->cpu_seen_ns = c;
        engines_thread_joined(s, now);
        atomic_store(&s->active, 1);
        atomic_store(&registry_new_thread, 1);
    }
    engines_thread_seen(s);
}

static void scan_cb(uintptr_t tstate, long tid, void *ctx)
{
    (void)ctx;
    if (scan.n < SCAN_MAX) {
        scan.tstate[scan.n] = tstate;
        scan.tid[scan.n] = (int32_t)tid;
        scan.n++;
    }
}

/* A slot the start hook took that no scan has made active: its thread exited before a scan
 * found it (its CPU, from its own last clock read, is accounted), or it is still starting. */
static void start_only_check(slot_t *s)
{
    if (!s->exit_done && !s->cpu_counted && atomic_load(&s->exit_cpu_ns) > 0)
        engines_thread_ended_unseen(s);
    if (s->exit_done && syscall(SYS_tgkill, sess_pid, (int)atomic_load(&s->tid), 0) != 0)
        s->dead = 1; /* its slot serves new threads */
}

void registry_tick(int64_t now)
{
    uint32_t gen = ++scan_gen;
    scan_buf_t *b = &scan;
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
    int n = atomic_load(&sess_nslots);
    if (n > MAX_SLOTS)
        n = MAX_SLOTS;
    for (int i = 0; i < n; i++) {
        slot_t *s = &sess_slots[i];
        if (!atomic_load(&s->active)) {
            if (atomic_load(&s->start_ready) && !s->dead)
                start_only_check(s);
            continue;
        }
        if (atomic_load(&s->excluded)) {
            unsample(s);
            continue;
        }
        if (s->seen_gen == gen)
            continue;
        /* Not in this scan.  Gone from the kernel: certainly exited.  Still alive but
         * missing from two complete scans: its thread state is gone (it left Python). */
        int dead = syscall(SYS_tgkill, sess_pid, (int)atomic_load(&s->tid), 0) != 0;
        if (rc == 0)
            s->absent++;
        if (dead || s->absent >= 2) {
            atomic_store(&s->active, 0);
            s->dead = dead;
            engines_thread_left(s);
        }
    }
    /* Near full: slots that never became active (a thread seen only by its own records, e.g.
     * an allocation, that exited before a scan found it) are checked too, a few per tick. */
    static int sweep; /* kept in [0, n): a counter that only grew overflowed after hours of churn */
    if (n >= MAX_SLOTS / 4 * 3 && nfree < 1024)
        for (int k = 0; k < 512 && n; k++) {
            sweep = sweep + 1 < n ? sweep + 1 : 0;
            slot_t *s = &sess_slots[sweep];
            if (!s->dead && !atomic_load(&s->active) && !atomic_load(&s->excluded) &&
                syscall(SYS_tgkill, sess_pid, (int)atomic_load(&s->tid), 0) != 0)
                s->dead = 1;
        }
    /* Exited threads' slots, once nothing of theirs is pending, serve new threads. */
    for (int i = 0; i < n; i++) {
        slot_t *s = &sess_slots[i];
        if (s->dead && !s->recycled && !s->wpend && !s->park_on && !s->has_timer && !atomic_load(&s->active))
            slot_recycle(i);
    }
}

uint32_t registry_scan(void) { return scan_gen; }

void registry_stop(void)
{
    int n = atomic_load(&sess_nslots);
    for (int i = 0; sess_slots && i < n && i < MAX_SLOTS; i++)
        atomic_store(&sess_slots[i].active, 0);
}

int register_at_start(void)
{
    list_start_tids();
    scan_gen = 1;
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

int ddp_exclude_thread(int32_t tid)
{
    if (atomic_load(&sess_state) != ST_RUNNING || !sess_slots)
        return DDP_ENOTRUNNING;
    int idx = slot_get_or_create(tid);
    if (idx < 0)
        return DDP_ENOMEM;
    atomic_store(&sess_slots[idx].excluded, 1); /* the handler drops from now; the timer goes next tick */
    return DDP_OK;
}

void threads_reset(void)
{
    for (int i = 0; i < MAP_SIZE; i++)
        atomic_store(&map_cell[i], 0);
    nfree = 0;
    scan_gen = 0;
    atomic_store(&registry_new_thread, 0);
    atomic_store(&sess_nslots, 0);
    atomic_fetch_add(&sess_gen, 1); /* every thread's cached slot is stale */
}

void threads_after_fork(void)
{
    tls_tid = 0; /* this thread's tid in the child */
    tls_gen = 0;
    pthread_mutex_init(&map_lock, NULL); /* another thread may have held it at fork */
}
