/* waits.c — lock-contention and park events: the interpreter's blocking waits, hooked by
 * patching GOT entries (DESIGN §3 option (a)).
 *
 * Why the GOT: CPython's lock waits (PyThread_acquire_lock_timed on 3.11/3.12, the parking
 * lot's _PySemaphore on 3.13) end in sem_clockwait/sem_wait, time.sleep in clock_nanosleep,
 * the select module in select/poll/epoll_wait, _socket in recv, recvfrom, recvmsg, accept and poll.  Redirecting
 * the importing objects' GOT slots catches every Lock, RLock, Condition, Event, Queue, join,
 * sleep and socket wait — locks created before profiling started included — with the exact
 * duration, on the waiting thread itself, whose own frame walk (ddp_emit_own) is safe.
 *
 * Safety rules:
 *  - a slot is patched only when it resolves (by its symbol version) to the very function
 *    this module calls, and either already holds it or still holds the object's own lazy
 *    PLT stub; a slot holding anything else (another hook, an interposer) is left alone;
 *  - cond waits (the GIL) are patched in libpython (or the executable holding it) only:
 *    elsewhere a cond wait is not the GIL;
 *  - stop restores every slot to its exact original value with a compare-and-swap, and only
 *    in objects still loaded; a slot someone re-patched meanwhile is left and counted;
 *  - a fork child restores the slots at once (pthread_atfork) and records nothing;
 *  - wrappers call the original, keep its return value and errno, and record only while a
 *    session with the event is active and the caller is a Python thread;
 *  - no loader function is ever called from inside dl_iterate_phdr (see "ELF walking").
 * Objects loaded during a session (dlopen, a later `import select`) are patched at the wall
 * thread's next tick.
 *
 * Waits across the session's edges count for their part inside it: a wait in flight at
 * stop is recorded by stop, from its start to the stop, with the waiting thread's stack
 * (the in-flight table below); a thread already blocked when the session started (not in
 * a wrapper: the slot was not patched yet) is found by the wall thread (parked.c,
 * parked_at_start) and recorded from the start to when it wakes.
 *
 * Cost control: a wait shorter than the threshold T is recorded with probability d/T and
 * weight T (value) and an unbiased stochastic count, so totals stay unbiased.  Records per
 * second are the main cost (each is a stack walk here and ~15 us of Python at drain time, and
 * a GIL-wait record is taken while the GIL is free), so they are thinned to half of
 * `wait_max_rate` per second without bias by raising the threshold: every 100 ms window
 * (earlier in a burst) scales the effective threshold T_eff >= T by achieved/wanted records,
 * and the rule above runs with T_eff (waits >= T_eff are always kept, exactly, so long waits
 * keep their per-thread accuracy).  Waits >= T left out only because of T_eff are counted
 * as rate_dropped.  A token bucket (GCRA) at `wait_max_rate` with 0.1 s of burst remains as
 * a hard cap for bursts a window did not predict; a record it drops (or the ring refuses)
 * is carried over: its count and value are added to the same thread's next emitted record
 * of the same kind group, so totals stay unbiased (only a carry still pending at stop is
 * lost, and every drop is counted).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <Python.h>
#include "ddp_internal.h"
#include "engine.h"

#define MAX_PATCHES 1024
#define DEFAULT_THRESHOLD_NS 100000
#define DEFAULT_MAX_RATE 400 /* records/s cap (thinning aims at half).  A record costs ~1 us of stack walk in
                              * the waiting thread and ~11 us of drain (bench_locks: drain thread CPU / records),
                              * the rest of a wait ~0.05 us: records/s are the cost (1000/s: ~1.3% of a CPU) */
#define KEEP_WINDOW_NS 100000000LL

typedef struct {
    uintptr_t slot;
    uintptr_t original;
    uintptr_t wrapper;
    uintptr_t obj_base, obj_dyn; /* the object it belongs to */
    uintptr_t relro_lo, relro_hi;
    int kind;
    int seen;                    /* the last scan that found its object loaded */
    int restored;
} patch_t;

static patch_t patches[MAX_PATCHES];
static int npatches;
static pthread_mutex_t patch_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int w_on;           /* wrappers record */
static _Atomic int w_emitting;     /* wrappers inside ddp_emit_own */
static uint32_t w_events;          /* (1 << DDP_EVENT_LOCK) | (1 << DDP_EVENT_PARK) subset */
static int64_t w_threshold;
static int64_t w_rate_interval;    /* ns per token */
static int64_t w_burst_ns;
static _Atomic int64_t w_tat;      /* GCRA theoretical arrival time */
static int64_t w_rate;             /* target records per second */
static _Atomic int64_t w_win_start; /* current thinning window */
static _Atomic uint64_t w_win_kept; /* records kept in it */
static _Atomic int64_t w_teff;      /* effective short-wait threshold (>= w_threshold) */
static int w_atfork_done;

static struct {
    _Atomic uint64_t records, short_skipped, rate_dropped, emit_failed, calls, edge_records;
    uint64_t objects, slots_patched, slots_foreign, restore_mismatch, restore_unloaded, protect_failed, passes;
    uint32_t kinds_patched, kinds_foreign; /* bit per DDP_WAIT_* kind: some slot hooked / left as someone else's */
} ws;

static DDP_TLS uint64_t w_rng;

/* Per thread (kept small: initial-exec TLS comes from a limited static reserve): the hooked
 * waits' exact total for tests (ddp_wait_thread_totals) and the records the hard cap or a
 * full ring dropped, per kind group, awaiting the thread's next emitted record of the group.
 * Valid for session w_gen only. */
enum { G_SEM, G_SLEEP, G_SELECT, G_SOCKET, G_COND, G_N };
typedef struct {
    uint64_t gen;
    int64_t ns, n;
    int64_t carry_count[G_N], carry_value[G_N];
} w_thread_t;
static DDP_TLS w_thread_t w_me;
static _Atomic uint64_t w_gen;

static int kind_group(int kind)
{
    switch (kind) {
    case DDP_WAIT_SEM_WAIT: case DDP_WAIT_SEM_TIMEDWAIT: case DDP_WAIT_SEM_CLOCKWAIT: return G_SEM;
    case DDP_WAIT_CLOCK_NANOSLEEP: case DDP_WAIT_NANOSLEEP: return G_SLEEP;
    case DDP_WAIT_COND_WAIT: case DDP_WAIT_COND_TIMEDWAIT: return G_COND;
    case DDP_WAIT_SELECT: case DDP_WAIT_PSELECT: case DDP_WAIT_POLL: case DDP_WAIT_PPOLL:
    case DDP_WAIT_EPOLL_WAIT: case DDP_WAIT_EPOLL_PWAIT: return G_SELECT;
    default: return G_SOCKET;
    }
}

static w_thread_t *me_now(void)
{
    uint64_t gen = atomic_load_explicit(&w_gen, memory_order_relaxed);
    if (w_me.gen != gen) {
        memset(&w_me, 0, sizeof w_me);
        w_me.gen = gen;
    }
    return &w_me;
}

static inline uint64_t rng(void)
{
    uint64_t x = w_rng;
    if (!x)
        x = (uint64_t)ddp_now_ns() ^ ((uint64_t)(uintptr_t)&w_rng << 16) ^ 0x9E3779B97F4A7C15ULL;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return w_rng = x;
}

static int take_token(int64_t now)
{
    int64_t tat = atomic_load_explicit(&w_tat, memory_order_relaxed);
    for (;;) {
        int64_t base = tat > now ? tat : now;
        if (base - now > w_burst_ns)
            return 0;
        if (atomic_compare_exchange_weak(&w_tat, &tat, base + w_rate_interval))
            return 1;
    }
}

/* The event a wait of this kind is provisionally recorded as; Python decides the final one
 * from the stack (a sem wait under Condition.wait is PARK).  -1: not wanted. */
static int provisional_event(int kind)
{
    int lock = (w_events >> DDP_EVENT_LOCK) & 1, park = (w_events >> DDP_EVENT_PARK) & 1;
    switch (kind) {
    case DDP_WAIT_SEM_WAIT:
    case DDP_WAIT_SEM_TIMEDWAIT:
    case DDP_WAIT_SEM_CLOCKWAIT:
        return lock ? DDP_EVENT_LOCK : park ? DDP_EVENT_PARK : -1;
    case DDP_WAIT_COND_WAIT:
    case DDP_WAIT_COND_TIMEDWAIT:
        return lock ? DDP_EVENT_LOCK : -1;
    default:
        return park ? DDP_EVENT_PARK : -1;
    }
}

/* One kept record: every 100 ms (earlier in a burst) move the effective threshold so that
 * records/s approach w_rate (the records of short waits scale as 1/T_eff). */
static void window_kept(int64_t t1, int64_t teff)
{
    uint64_t kept = atomic_fetch_add_explicit(&w_win_kept, 1, memory_order_relaxed) + 1;
    int64_t win = atomic_load_explicit(&w_win_start, memory_order_relaxed);
    /* a window also closes after a tenth of a second's records: a burst (or a session's
     * start, at the configured threshold) is thinned within ~0.1 s of its records */
    if (!((t1 - win >= KEEP_WINDOW_NS || (double)kept > 0.1 * (double)w_rate) && t1 > win))
        return;
    if (!atomic_compare_exchange_strong(&w_win_start, &win, t1))
        return;
    kept = atomic_exchange(&w_win_kept, 0);
    double f = (double)kept * 1e9 / (double)(t1 - win) / (double)w_rate; /* achieved / wanted */
    double nt = (double)teff * (f > 64 ? 64 : f < 0.25 ? 0.25 : f);
    if (nt < (double)w_threshold)
        nt = (double)w_threshold;
    if (nt > 10e9)
        nt = 10e9;
    atomic_store_explicit(&w_teff, (int64_t)nt, memory_order_relaxed);
}

/* ---- waits in flight: one entry per Python thread that waited in a wrapper --------------
 * Static storage (never freed: a wrapper may sit blocked across any number of sessions),
 * claimed once per thread; t0 != 0 while the thread is in a recorded wait of session `gen`.
 * Whoever swaps t0 to 0 first records the wait: the wrapper when it returns, or stop
 * (wait_flush_inflight) for a wait still going on then. */
#define INFLIGHT_MAX 4096
typedef struct {
    _Atomic int32_t tid;
    _Atomic int32_t kind;
    _Atomic int64_t t0;
    _Atomic uint64_t gen;
} inflight_t;
static inflight_t inflight[INFLIGHT_MAX];
static _Atomic int32_t inflight_hi;
static pthread_mutex_t inflight_lock = PTHREAD_MUTEX_INITIALIZER;
static DDP_TLS inflight_t *w_inflight;
static DDP_TLS int32_t w_tid; /* this thread's tid, cached (a fork child's thread forgets it) */

static inflight_t *inflight_claim(int32_t tid)
{
    pthread_mutex_lock(&inflight_lock);
    inflight_t *e = NULL;
    int n = atomic_load(&inflight_hi);
    for (int pass = 0; pass < 2 && !e; pass++) {
        for (int i = 0; i < n && !e; i++) {
            int32_t zero = 0;
            if (atomic_compare_exchange_strong(&inflight[i].tid, &zero, tid))
                e = &inflight[i];
        }
        if (!e && n < INFLIGHT_MAX) {
            e = &inflight[n];
            atomic_store(&e->tid, tid);
            atomic_store(&inflight_hi, n + 1);
        }
        if (!e && pass == 0) /* full: entries of threads gone from the process are free again */
            for (int i = 0; i < n; i++) {
                int32_t t = atomic_load(&inflight[i].tid);
                if (t > 0 && syscall(SYS_tgkill, getpid(), t, 0) != 0 && errno == ESRCH) {
                    atomic_store(&inflight[i].t0, 0);
                    atomic_store(&inflight[i].tid, 0);
                }
            }
    }
    pthread_mutex_unlock(&inflight_lock);
    return e;
}

static inflight_t *inflight_mine(void)
{
    int32_t tid = w_tid;
    if (!tid)
        tid = w_tid = (int32_t)syscall(SYS_gettid);
    if (w_inflight && atomic_load_explicit(&w_inflight->tid, memory_order_relaxed) == tid)
        return w_inflight;
    if (!ddp_py_current_tstate())
        return NULL; /* only Python threads' waits are recorded */
    return w_inflight = inflight_claim(tid);
}

static inflight_t *wait_begin(int kind, int64_t t0)
{
    inflight_t *e = inflight_mine();
    if (e) {
        atomic_store_explicit(&e->kind, kind, memory_order_relaxed);
        atomic_store_explicit(&e->gen, atomic_load_explicit(&w_gen, memory_order_relaxed), memory_order_relaxed);
        atomic_store(&e->t0, t0);
    }
    return e;
}

static void wait_done(int kind, int64_t t0, int failed);

static void wait_end(int kind, int64_t t0, int failed, inflight_t *e)
{
    if (e) {
        uint64_t gen = atomic_load_explicit(&e->gen, memory_order_relaxed);
        if (!atomic_exchange(&e->t0, 0) || gen != atomic_load(&w_gen))
            return; /* recorded by stop already, or of a session that has ended */
    }
    wait_done(kind, t0, failed);
}

static void wait_done(int kind, int64_t t0, int failed)
{
    int64_t t1 = ddp_now_ns();
    int64_t d = t1 - t0;
    atomic_fetch_add_explicit(&ws.calls, 1, memory_order_relaxed);
    int ev = provisional_event(kind);
    if (ev < 0)
        return;
    w_thread_t *me = me_now();
    me->ns += d;
    me->n++;
    int64_t count = 1, value = d;
    uint64_t aux = (uint64_t)kind | (failed ? DDP_WAIT_FAILED : 0);
    /* T = the effective threshold (>= the configured one; raised to hold records/s) */
    int64_t T = atomic_load_explicit(&w_teff, memory_order_relaxed);
    if (d < T) {
        if ((int64_t)(rng() % (uint64_t)T) >= d) {
            if (d < w_threshold)
                atomic_fetch_add_explicit(&ws.short_skipped, 1, memory_order_relaxed);
            else /* only the records-per-second thinning left this one out */
                atomic_fetch_add_explicit(&ws.rate_dropped, 1, memory_order_relaxed);
            return;
        }
        /* recorded with p = d/T: weight T; count T/d rounded stochastically (unbiased) */
        value = T;
        int64_t dd = d > 0 ? d : 1;
        count = T / dd;
        if ((int64_t)(rng() % (uint64_t)dd) < T % dd)
            count++;
        aux |= DDP_WAIT_SAMPLED;
    }
    window_kept(t1, T);
    /* what earlier records of this group could not emit rides on this one */
    int g = kind_group(kind);
    me->carry_count[g] += count;
    me->carry_value[g] += value;
    if (!take_token(t1)) {
        atomic_fetch_add_explicit(&ws.rate_dropped, 1, memory_order_relaxed);
        return;
    }
    atomic_fetch_add(&w_emitting, 1);
    if (atomic_load(&w_on)) {
        int rc = ddp_emit_own(ev, me->carry_count[g], me->carry_value[g], aux);
        if (rc == DDP_OK || rc == DDP_EINVAL) /* EINVAL: not a Python thread, nothing to carry */
            me->carry_count[g] = me->carry_value[g] = 0;
        if (rc == DDP_OK)
            atomic_fetch_add_explicit(&ws.records, 1, memory_order_relaxed);
        else if (rc != DDP_EINVAL)
            atomic_fetch_add_explicit(&ws.emit_failed, 1, memory_order_relaxed);
    }
    atomic_fetch_sub(&w_emitting, 1);
}

/* ---- wrappers: same signature as the original; errno and the result kept exactly --------- */
#define WAIT_BODY(KIND, CALL, FAILED)                                \
    if (!atomic_load_explicit(&w_on, memory_order_relaxed))          \
        return CALL;                                                 \
    int64_t t0 = ddp_now_ns();                                       \
    inflight_t *w_fl_ = wait_begin(KIND, t0);                       \
    __typeof__(CALL) r = CALL;                                       \
    int e = errno;                                                   \
    wait_end(KIND, t0, FAILED, w_fl_);                              \
    errno = e;                                                       \
    return r;

static int w_sem_wait(sem_t *s) { WAIT_BODY(DDP_WAIT_SEM_WAIT, sem_wait(s), r != 0) }
static int w_sem_timedwait(sem_t *s, const struct timespec *t)
{
    WAIT_BODY(DDP_WAIT_SEM_TIMEDWAIT, sem_timedwait(s, t), r != 0)
}
static int w_sem_clockwait(sem_t *s, clockid_t c, const struct timespec *t)
{
    WAIT_BODY(DDP_WAIT_SEM_CLOCKWAIT, sem_clockwait(s, c, t), r != 0)
}
static int w_clock_nanosleep(clockid_t c, int f, const struct timespec *t, struct timespec *rem)
{
    WAIT_BODY(DDP_WAIT_CLOCK_NANOSLEEP, clock_nanosleep(c, f, t, rem), r != 0)
}
static int w_nanosleep(const struct timespec *t, struct timespec *rem)
{
    WAIT_BODY(DDP_WAIT_NANOSLEEP, nanosleep(t, rem), r != 0)
}
static int w_select(int n, fd_set *a, fd_set *b, fd_set *c, struct timeval *t)
{
    WAIT_BODY(DDP_WAIT_SELECT, select(n, a, b, c, t), r < 0)
}
static int w_pselect(int n, fd_set *a, fd_set *b, fd_set *c, const struct timespec *t, const sigset_t *m)
{
    WAIT_BODY(DDP_WAIT_PSELECT, pselect(n, a, b, c, t, m), r < 0)
}
static int w_poll(struct pollfd *p, nfds_t n, int t) { WAIT_BODY(DDP_WAIT_POLL, poll(p, n, t), r < 0) }
static int w_ppoll(struct pollfd *p, nfds_t n, const struct timespec *t, const sigset_t *m)
{
    WAIT_BODY(DDP_WAIT_PPOLL, ppoll(p, n, t, m), r < 0)
}
static int w_sock_poll(struct pollfd *p, nfds_t n, int t) { WAIT_BODY(DDP_WAIT_SOCK_POLL, poll(p, n, t), r < 0) }
static int w_epoll_wait(int f, struct epoll_event *e_, int n, int t)
{
    WAIT_BODY(DDP_WAIT_EPOLL_WAIT, epoll_wait(f, e_, n, t), r < 0)
}
static int w_epoll_pwait(int f, struct epoll_event *e_, int n, int t, const sigset_t *m)
{
    WAIT_BODY(DDP_WAIT_EPOLL_PWAIT, epoll_pwait(f, e_, n, t, m), r < 0)
}
static ssize_t w_recv(int f, void *b, size_t n, int fl) { WAIT_BODY(DDP_WAIT_RECV, recv(f, b, n, fl), r < 0) }
static ssize_t w_recvfrom(int f, void *b, size_t n, int fl, struct sockaddr *a, socklen_t *al)
{
    WAIT_BODY(DDP_WAIT_RECVFROM, recvfrom(f, b, n, fl, a, al), r < 0)
}
static ssize_t w_recvmsg(int f, struct msghdr *m, int fl) { WAIT_BODY(DDP_WAIT_RECVMSG, recvmsg(f, m, fl), r < 0) }
static int w_accept(int f, struct sockaddr *a, socklen_t *al) { WAIT_BODY(DDP_WAIT_ACCEPT, accept(f, a, al), r < 0) }
static int w_accept4(int f, struct sockaddr *a, socklen_t *al, int fl)
{
    WAIT_BODY(DDP_WAIT_ACCEPT4, accept4(f, a, al, fl), r < 0)
}
static int w_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
{
    WAIT_BODY(DDP_WAIT_COND_WAIT, pthread_cond_wait(c, m), r != 0)
}
static int w_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *t)
{
    WAIT_BODY(DDP_WAIT_COND_TIMEDWAIT, pthread_cond_timedwait(c, m, t), r != 0)
}

enum { WHERE_ANY, WHERE_LIBPYTHON };

typedef struct {
    const char *name;
    int kind;
    void *wrapper;
    void *real;   /* what this module's own calls go to (its GOT is never patched) */
    int where;
} hook_t;

static const hook_t hooks[] = {
    {"sem_wait", DDP_WAIT_SEM_WAIT, (void *)w_sem_wait, (void *)sem_wait, WHERE_ANY},
    {"sem_timedwait", DDP_WAIT_SEM_TIMEDWAIT, (void *)w_sem_timedwait, (void *)sem_timedwait, WHERE_ANY},
    {"sem_clockwait", DDP_WAIT_SEM_CLOCKWAIT, (void *)w_sem_clockwait, (void *)sem_clockwait, WHERE_ANY},
    {"clock_nanosleep", DDP_WAIT_CLOCK_NANOSLEEP, (void *)w_clock_nanosleep, (void *)clock_nanosleep, WHERE_ANY},
    {"nanosleep", DDP_WAIT_NANOSLEEP, (void *)w_nanosleep, (void *)nanosleep, WHERE_ANY},
    {"select", DDP_WAIT_SELECT, (void *)w_select, (void *)select, WHERE_ANY},
    {"pselect", DDP_WAIT_PSELECT, (void *)w_pselect, (void *)pselect, WHERE_ANY},
    {"poll", DDP_WAIT_POLL, (void *)w_poll, (void *)poll, WHERE_ANY},
    {"ppoll", DDP_WAIT_PPOLL, (void *)w_ppoll, (void *)ppoll, WHERE_ANY},
    {"epoll_wait", DDP_WAIT_EPOLL_WAIT, (void *)w_epoll_wait, (void *)epoll_wait, WHERE_ANY},
    {"epoll_pwait", DDP_WAIT_EPOLL_PWAIT, (void *)w_epoll_pwait, (void *)epoll_pwait, WHERE_ANY},
    {"recv", DDP_WAIT_RECV, (void *)w_recv, (void *)recv, WHERE_ANY},
    {"recvfrom", DDP_WAIT_RECVFROM, (void *)w_recvfrom, (void *)recvfrom, WHERE_ANY},
    {"recvmsg", DDP_WAIT_RECVMSG, (void *)w_recvmsg, (void *)recvmsg, WHERE_ANY},
    {"accept", DDP_WAIT_ACCEPT, (void *)w_accept, (void *)accept, WHERE_ANY},
    {"accept4", DDP_WAIT_ACCEPT4, (void *)w_accept4, (void *)accept4, WHERE_ANY},
    {"pthread_cond_wait", DDP_WAIT_COND_WAIT, (void *)w_cond_wait, (void *)pthread_cond_wait, WHERE_LIBPYTHON},
    {"pthread_cond_timedwait", DDP_WAIT_COND_TIMEDWAIT, (void *)w_cond_timedwait, (void *)pthread_cond_timedwait,
     WHERE_LIBPYTHON},
};
#define NHOOKS ((int)(sizeof hooks / sizeof hooks[0]))

static const hook_t *hook_by_name(const char *name)
{
    for (int i = 0; i < NHOOKS; i++)
        if (strcmp(hooks[i].name, name) == 0)
            return &hooks[i];
    return NULL;
}


/* ---- ELF walking ----------------------------------------------------------------------- *
 * Loader locks.  dl_iterate_phdr holds the loader's write lock while it calls us, and dlsym
 * takes the loader's main lock, which dlopen holds while it waits for the write lock: a
 * dlsym inside the callback deadlocks against any dlopen on another thread.  So a pass runs
 * in three steps: collect the (symbol, version) pairs the unscanned objects import (inside
 * the iteration, loads only), resolve them (outside it), patch (inside a second iteration:
 * an object on the list cannot be unmapped under us, dlclose unmaps after unlisting).
 * Restoring also runs inside an iteration, so it only ever writes into mapped objects.
 * Objects loaded during a session are found by the wall thread's tick (patch_new_objects),
 * from the loader's load counter: dlopen itself is not wrapped, because glibc's dlopen
 * resolves relative names and $ORIGIN against its caller's address, which a wrapper
 * would change for every caller. */
#if defined(__x86_64__)
#define R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define R_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define R_GLOB_DAT R_AARCH64_GLOB_DAT
#else
#define DDP_WAITS_NO_ARCH 1
#endif

#define MAX_WANTS 96   /* distinct (symbol, version) imports of the hooked names */
#define MAX_DONE 2048  /* objects scanned this session */

typedef struct {
    uintptr_t base;
    const char *name;
    const ElfW(Sym) *symtab;
    const char *strtab;
    const ElfW(Half) *versym;
    const ElfW(Verneed) *verneed;
    long verneednum;
    uintptr_t dyn;              /* with base: the object's identity */
    uintptr_t lo, hi;           /* the object's mapped range (lazy PLT stubs point inside) */
    uintptr_t relro_lo, relro_hi;
    int is_libpython, is_socket;
    int incomplete;             /* an import could not be resolved yet: scan it again later */
} obj_t;

typedef struct {
    int hook;                   /* index in hooks[] */
    char ver[32];               /* "" when unversioned */
    void *target;               /* what the loader resolves it to */
    int resolved;
} want_t;

enum { SCAN_COLLECT, SCAN_PATCH, SCAN_LIST, SCAN_RESTORE };

typedef struct {
    int mode;
    uintptr_t self_base, libpython_base;
    want_t *wants;
    int nwants;
    /* SCAN_LIST */
    uint64_t *addr, *val;
    int32_t *kind;
    int cap, n;
    int ro_taken;               /* SCAN_PATCH: the read-only snapshot is taken (ro_snapshot) */
} scan_ctx;

static struct { uintptr_t base, dyn; int seen; } done[MAX_DONE];
static int ndone;                   /* under patch_lock */
static int pass_no;                 /* numbers the collect iterations (patch_t.seen, done[].seen) */
static unsigned long long seen_adds; /* the loader's load counter when the last pass began */
static int w_retry;                 /* an object was still being loaded: pass again at the next tick */
static uintptr_t self_base_cache, libpython_base_cache;
static int bases_known;

static uintptr_t fix(uintptr_t base, uintptr_t p) { return p < base ? p + base : p; }

static void mark_present(uintptr_t base, uintptr_t dyn)
{
    for (int i = 0; i < npatches; i++)
        if (patches[i].obj_base == base && patches[i].obj_dyn == dyn)
            patches[i].seen = pass_no;
    for (int i = 0; i < ndone; i++)
        if (done[i].base == base && done[i].dyn == dyn)
            done[i].seen = pass_no;
}

/* Forget the patches and scans of objects unloaded since (dlclose): a library loaded again,
 * perhaps at the same address, is then scanned afresh, and stop never writes into it on
 * behalf of the old one. */
static void drop_unloaded(void)
{
    int k = 0;
    for (int i = 0; i < npatches; i++) {
        if (patches[i].seen == pass_no)
            patches[k++] = patches[i];
        else
            ws.restore_unloaded++;
    }
    npatches = k;
    k = 0;
    for (int i = 0; i < ndone; i++)
        if (done[i].seen == pass_no)
            done[k++] = done[i];
    ndone = k;
}

static int is_done(uintptr_t base, uintptr_t dyn)
{
    for (int i = 0; i < ndone; i++)
        if (done[i].base == base && done[i].dyn == dyn)
            return 1;
    return 0;
}

static const char *sym_version(obj_t *o, size_t symidx)
{
    if (!o->versym || !o->verneed)
        return NULL;
    ElfW(Half) v = o->versym[symidx] & 0x7fff;
    if (v < 2)
        return NULL;
    const ElfW(Verneed) *vn = o->verneed;
    for (long i = 0; i < o->verneednum && vn; i++) {
        const ElfW(Vernaux) *va = (const ElfW(Vernaux) *)((const char *)vn + vn->vn_aux);
        for (int j = 0; j < vn->vn_cnt; j++) {
            if (va->vna_other == v)
                return o->strtab + va->vna_name;
            if (!va->vna_next)
                break;
            va = (const ElfW(Vernaux) *)((const char *)va + va->vna_next);
        }
        if (!vn->vn_next)
            break;
        vn = (const ElfW(Verneed) *)((const char *)vn + vn->vn_next);
    }
    return NULL;
}

static want_t *want_find(scan_ctx *c, int hook, const char *ver)
{
    for (int i = 0; i < c->nwants; i++)
        if (c->wants[i].hook == hook && strcmp(c->wants[i].ver, ver) == 0)
            return &c->wants[i];
    return NULL;
}

/* The read-only ("r--") mappings of the process, read from /proc/self/maps inside the
 * patching iteration (no object is listed or unlisted meanwhile).  dlopen lists an object
 * before it relocates it, on its own thread: until the loader has made the object's RELRO
 * read-only it is still writing into those pages, so such an object is neither patched nor
 * has its protection touched (making its RELRO read-only then crashed that dlopen).  Once
 * protected, RELRO stays read-only: the snapshot cannot be stale in the unsafe direction. */
#define MAX_RO 8192
static struct { uintptr_t lo, hi; } ro_maps[MAX_RO];
static int nro;
static int ro_unknown; /* no /proc: every RELRO taken as protected (a dlopen racing a pass may crash) */

static void ro_snapshot(void)
{
    char buf[4096];
    nro = 0;
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    ro_unknown = fd < 0;
    if (fd < 0)
        return;
    size_t have = 0;
    for (;;) {
        ssize_t n = read(fd, buf + have, sizeof buf - 1 - have);
        if (n <= 0)
            break;
        have += (size_t)n;
        buf[have] = 0;
        char *line = buf, *nl;
        while ((nl = memchr(line, '\n', (size_t)(buf + have - line))) != NULL) {
            *nl = 0;
            char *end;
            uintptr_t lo = (uintptr_t)strtoull(line, &end, 16), hi;
            if (*end == '-') {
                hi = (uintptr_t)strtoull(end + 1, &end, 16);
                if (end[0] == ' ' && end[1] == 'r' && end[2] == '-' && end[3] == '-' && nro < MAX_RO) {
                    ro_maps[nro].lo = lo;
                    ro_maps[nro].hi = hi;
                    nro++;
                }
            }
            line = nl + 1;
        }
        have = (size_t)(buf + have - line);
        memmove(buf, line, have);
        if (have >= sizeof buf - 1)
            have = 0; /* a line longer than the buffer (a long path): its address was read */
    }
    close(fd);
}

static int page_read_only(uintptr_t page)
{
    if (ro_unknown)
        return 1;
    int lo = 0, hi = nro - 1; /* /proc/self/maps is sorted by address */
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (page < ro_maps[mid].lo)
            hi = mid - 1;
        else if (page >= ro_maps[mid].hi)
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

/* The pages [align_down(relro_lo), align_down(relro_hi)) the loader makes read-only
 * (_dl_protect_relro) once it has relocated the object; lo == hi: none. */
static void relro_pages(uintptr_t relro_lo, uintptr_t relro_hi, uintptr_t *lo, uintptr_t *hi)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    *lo = *hi = 0;
    if (relro_lo < relro_hi) {
        *lo = relro_lo & ~(pg - 1);
        *hi = relro_hi & ~(pg - 1);
    }
}

/* Store val into a GOT slot that still holds `expect`.  A slot in the object's protected
 * RELRO pages (read-only: the caller checked, or the slot holds our wrapper, which we only
 * wrote into protected RELRO) is made writable for the store and read-only again after it.
 * Any other page is writable as it is and its protection is never touched (with 16K/64K
 * pages the RELRO's last page also holds .data, which must stay writable).  A slot holding
 * something else is left alone, its page's protection untouched.  0 done, 1 the slot held
 * something else, -1 mprotect refused. */
static int write_slot(uintptr_t slot, uintptr_t relro_lo, uintptr_t relro_hi, uintptr_t expect, uintptr_t val)
{
    if (__atomic_load_n((uintptr_t *)slot, __ATOMIC_SEQ_CST) != expect)
        return 1;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t page = slot & ~(pg - 1), rlo, rhi;
    relro_pages(relro_lo, relro_hi, &rlo, &rhi);
    int ro = page >= rlo && page < rhi;
    if (ro && mprotect((void *)page, pg, PROT_READ | PROT_WRITE) != 0)
        return -1;
    int ok = __atomic_compare_exchange_n((uintptr_t *)slot, &expect, val, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    if (ro)
        mprotect((void *)page, pg, PROT_READ);
    return ok ? 0 : 1;
}

static void patch_one(obj_t *o, uintptr_t slot, uintptr_t cur, unsigned type, size_t si, const hook_t *h,
                      void *wrapper, int kind, scan_ctx *c)
{
    if (cur == (uintptr_t)wrapper)
        return; /* ours already (an object scanned again) */
    const char *ver = sym_version(o, si);
    want_t *w = want_find(c, (int)(h - hooks), ver ? ver : "");
    if (!w || !w->resolved) {
        o->incomplete = 1; /* loaded between the passes with a new version: next pass */
        return;
    }
    /* Patch only slots that resolve (by their symbol version) to the very function this
     * module calls, and hold it or their own lazy PLT stub: anything else is someone else's. */
    int lazy = cur >= o->lo && cur < o->hi && type == R_JUMP_SLOT;
    if (w->target != h->real || (cur != (uintptr_t)h->real && !lazy)) {
        ws.slots_foreign++;
        ws.kinds_foreign |= 1u << kind;
        return;
    }
    if (npatches >= MAX_PATCHES) {
        o->incomplete = 1;
        return;
    }
    int rc = write_slot(slot, o->relro_lo, o->relro_hi, cur, (uintptr_t)wrapper);
    if (rc < 0) {
        ws.protect_failed++;
        return;
    }
    if (rc > 0) { /* changed under us (lazy binding resolved it just now): next pass */
        o->incomplete = 1;
        return;
    }
    patch_t *p = &patches[npatches++];
    memset(p, 0, sizeof *p);
    p->seen = pass_no;
    p->slot = slot;
    p->original = cur;
    p->wrapper = (uintptr_t)wrapper;
    p->obj_base = o->base;
    p->obj_dyn = o->dyn;
    p->relro_lo = o->relro_lo;
    p->relro_hi = o->relro_hi;
    p->kind = kind;
    ws.slots_patched++;
    ws.kinds_patched |= 1u << kind;
}

static void visit_rela(obj_t *o, const ElfW(Rela) *rel, size_t bytes, scan_ctx *c)
{
    size_t n = bytes / sizeof(ElfW(Rela));
    for (size_t i = 0; i < n; i++) {
        unsigned type = (unsigned)ELF64_R_TYPE(rel[i].r_info);
        if (type != R_JUMP_SLOT && type != R_GLOB_DAT)
            continue;
        size_t si = ELF64_R_SYM(rel[i].r_info);
        if (!si)
            continue;
        if (o->symtab[si].st_shndx != SHN_UNDEF)
            continue; /* defined here: not an import */
        const hook_t *h = hook_by_name(o->strtab + o->symtab[si].st_name);
        if (!h)
            continue;
        if (h->where == WHERE_LIBPYTHON && !o->is_libpython)
            continue;
        void *wrapper = h->wrapper;
        int kind = h->kind;
        if (o->is_socket && h->kind == DDP_WAIT_POLL) {
            wrapper = (void *)w_sock_poll; /* socket timeouts wait in poll(): name them socket */
            kind = DDP_WAIT_SOCK_POLL;
        }
        uintptr_t slot = o->base + rel[i].r_offset;
        uintptr_t cur = __atomic_load_n((uintptr_t *)slot, __ATOMIC_SEQ_CST);
        if (c->mode == SCAN_LIST) {
            if (c->n < c->cap) {
                c->addr[c->n] = slot;
                c->val[c->n] = cur;
                c->kind[c->n] = kind;
            }
            c->n++;
        } else if (c->mode == SCAN_COLLECT) {
            const char *ver = sym_version(o, si);
            if (!ver)
                ver = "";
            if (cur != (uintptr_t)wrapper && !want_find(c, (int)(h - hooks), ver) && c->nwants < MAX_WANTS &&
                strlen(ver) < sizeof c->wants[0].ver) {
                want_t *w = &c->wants[c->nwants++];
                memset(w, 0, sizeof *w);
                w->hook = (int)(h - hooks);
                strcpy(w->ver, ver);
            }
        } else {
            patch_one(o, slot, cur, type, si, h, wrapper, kind, c);
        }
    }
}

static void restore_object(uintptr_t base, uintptr_t dyn)
{
    for (int i = 0; i < npatches; i++) {
        patch_t *p = &patches[i];
        if (p->restored || p->obj_base != base || p->obj_dyn != dyn)
            continue;
        p->restored = 1;
        /* only a slot still holding our wrapper: one someone re-patched since stays theirs */
        int rc = write_slot(p->slot, p->relro_lo, p->relro_hi, p->wrapper, p->original);
        if (rc > 0)
            ws.restore_mismatch++;
        else if (rc < 0)
            ws.protect_failed++;
    }
}

/* Called by dl_iterate_phdr with the loader's write lock held: loads and stores only (no
 * dlsym, dladdr, dlopen or anything else that takes a loader lock). */
static int visit_object(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    scan_ctx *c = ctx;
    uintptr_t base = info->dlpi_addr;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    obj_t o;
    memset(&o, 0, sizeof o);
    o.base = base;
    o.name = name;
    o.lo = UINTPTR_MAX;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC)
            o.dyn = base + ph->p_vaddr;
        else if (ph->p_type == PT_GNU_RELRO) {
            o.relro_lo = base + ph->p_vaddr;
            o.relro_hi = o.relro_lo + ph->p_memsz;
        } else if (ph->p_type == PT_LOAD) {
            uintptr_t lo = base + ph->p_vaddr, hi = lo + ph->p_memsz;
            if (lo < o.lo)
                o.lo = lo;
            if (hi > o.hi)
                o.hi = hi;
        }
    }
    if (!o.dyn)
        return 0;
    if (c->mode == SCAN_RESTORE) {
        restore_object(base, o.dyn);
        return 0;
    }
    if (base == c->self_base && base)
        return 0;
    if (strstr(name, "linux-vdso") || strstr(name, "/libc.so") || strstr(name, "/ld-linux") ||
        strstr(name, "libpthread.so") || strstr(name, "/libdl.so"))
        return 0;
    if (c->mode == SCAN_COLLECT) /* still loaded: its patches and done entry stay (drop_unloaded) */
        mark_present(base, o.dyn);
    if ((c->mode == SCAN_COLLECT || c->mode == SCAN_PATCH) && is_done(base, o.dyn))
        return 0;
    uintptr_t jmprel = 0, rela = 0;
    size_t pltrelsz = 0, relasz = 0;
    long pltrel = 0;
    for (const ElfW(Dyn) *d = (const ElfW(Dyn) *)o.dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_JMPREL: jmprel = fix(base, d->d_un.d_ptr); break;
        case DT_PLTRELSZ: pltrelsz = d->d_un.d_val; break;
        case DT_PLTREL: pltrel = (long)d->d_un.d_val; break;
        case DT_RELA: rela = fix(base, d->d_un.d_ptr); break;
        case DT_RELASZ: relasz = d->d_un.d_val; break;
        case DT_SYMTAB: o.symtab = (const ElfW(Sym) *)fix(base, d->d_un.d_ptr); break;
        case DT_STRTAB: o.strtab = (const char *)fix(base, d->d_un.d_ptr); break;
        case DT_VERSYM: o.versym = (const ElfW(Half) *)fix(base, d->d_un.d_ptr); break;
        case DT_VERNEED: o.verneed = (const ElfW(Verneed) *)fix(base, d->d_un.d_ptr); break;
        case DT_VERNEEDNUM: o.verneednum = (long)d->d_un.d_val; break;
        }
    }
    if (!o.symtab || !o.strtab)
        return 0;
    if (c->mode == SCAN_PATCH) {
        if (!c->ro_taken) {
            ro_snapshot();
            c->ro_taken = 1;
        }
        uintptr_t rlo, rhi;
        relro_pages(o.relro_lo, o.relro_hi, &rlo, &rhi);
        if (rlo < rhi && !page_read_only(rlo)) {
            w_retry = 1; /* being relocated by a dlopen on another thread: the next tick */
            return 0;
        }
    }
    o.is_libpython = base == c->libpython_base;
    o.is_socket = strstr(name, "/_socket.") != NULL;
    if (jmprel && pltrel == DT_RELA)
        visit_rela(&o, (const ElfW(Rela) *)jmprel, pltrelsz, c);
    if (rela)
        visit_rela(&o, (const ElfW(Rela) *)rela, relasz, c); /* GLOB_DAT: -fno-plt builds */
    if (c->mode == SCAN_PATCH && !o.incomplete && ndone < MAX_DONE) {
        done[ndone].base = base;
        done[ndone].dyn = o.dyn;
        done[ndone].seen = pass_no;
        ndone++;
        ws.objects++;
    }
    return 0;
}

/* Our own object's and libpython's load addresses, in dl_iterate_phdr's convention (outside
 * any iteration: dladdr and dlopen take loader locks). */
static void scan_init(scan_ctx *c, int mode)
{
    memset(c, 0, sizeof *c);
    c->mode = mode;
    if (!bases_known) {
        Dl_info di;
        if (dladdr((void *)w_sem_wait, &di))
            self_base_cache = (uintptr_t)di.dli_fbase;
        if (dladdr((void *)PyEval_SaveThread, &di))
            libpython_base_cache = (uintptr_t)di.dli_fbase;
        /* dl_iterate_phdr reports the executable with dlpi_addr 0 when it is not PIE: dladdr's
         * fbase is then its load address, not 0.  Normalize to dlpi_addr's convention. */
        if (libpython_base_cache) {
            Dl_info dm;
            void *h = dlopen(NULL, RTLD_NOW | RTLD_NOLOAD);
            struct link_map *lm = NULL;
            if (h && dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm) {
                for (; lm; lm = lm->l_next) {
                    if (dladdr((void *)lm->l_ld, &dm) && (uintptr_t)dm.dli_fbase == libpython_base_cache) {
                        libpython_base_cache = lm->l_addr;
                        break;
                    }
                }
            }
            if (h)
                dlclose(h);
        }
        bases_known = 1;
    }
    c->self_base = self_base_cache;
    c->libpython_base = libpython_base_cache;
}

static int counters_cb(struct dl_phdr_info *info, size_t size, void *ctx)
{
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs)
        *(unsigned long long *)ctx = info->dlpi_adds;
    return 1; /* the counters are the same in every entry: the first one is enough */
}

static unsigned long long loader_adds(void)
{
    unsigned long long adds = 0;
    dl_iterate_phdr(counters_cb, &adds);
    return adds;
}

/* Hook every loaded object not scanned yet this session (patch_lock held). */
static void patch_pass(void)
{
    want_t wants[MAX_WANTS];
    scan_ctx c;
    scan_init(&c, SCAN_COLLECT);
    c.wants = wants;
    seen_adds = loader_adds(); /* before the scan: an object loaded during it is seen next tick */
    w_retry = 0;
    pass_no++;
    dl_iterate_phdr(visit_object, &c);
    drop_unloaded();
    if (!c.nwants)
        return;
    for (int i = 0; i < c.nwants; i++) { /* outside the iteration: dlsym takes the loader lock */
        const char *name = hooks[wants[i].hook].name;
        wants[i].target = wants[i].ver[0] ? dlvsym(RTLD_DEFAULT, name, wants[i].ver) : dlsym(RTLD_DEFAULT, name);
        wants[i].resolved = 1;
    }
    c.mode = SCAN_PATCH;
    dl_iterate_phdr(visit_object, &c);
}

static void restore_all(int check_loaded)
{
    if (check_loaded) {
        scan_ctx c;
        memset(&c, 0, sizeof c);
        c.mode = SCAN_RESTORE;
        dl_iterate_phdr(visit_object, &c);
        for (int i = 0; i < npatches; i++)
            if (!patches[i].restored)
                ws.restore_unloaded++; /* its object is gone: nothing to put back */
    } else { /* a fork child: one thread, every object as in the parent */
        for (int i = 0; i < npatches; i++)
            write_slot(patches[i].slot, patches[i].relro_lo, patches[i].relro_hi, patches[i].wrapper,
                       patches[i].original);
    }
    npatches = 0;
    ndone = 0;
}

/* fork() waits until no thread of ours is inside the loader (patch_lock is held around every
 * dl_iterate_phdr, dlsym and dladdr of this file): a loader lock copied held into the child
 * would hang its first dlopen (an import of an extension module) forever. */
static void atfork_prepare(void) { pthread_mutex_lock(&patch_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&patch_lock); }

static void atfork_child(void)
{
    /* The child records nothing and runs on the original functions. */
    atomic_store(&w_on, 0);
    atomic_store(&w_emitting, 0);
    pthread_mutex_init(&patch_lock, NULL);
    pthread_mutex_init(&inflight_lock, NULL);
    w_tid = 0;
    w_inflight = NULL;
    int n = atomic_load(&inflight_hi); /* every other thread is gone: so are their waits */
    for (int i = 0; i < n; i++) {
        atomic_store(&inflight[i].t0, 0);
        atomic_store(&inflight[i].tid, 0);
    }
    atomic_store(&inflight_hi, 0);
    if (npatches)
        restore_all(0);
}

#define W_EVENTS ((1u << DDP_EVENT_LOCK) | (1u << DDP_EVENT_PARK))
/* threads blocked since before the start: looked for at the first tick, then followed */
static _Atomic int w_parked_scanned;

static int waits_start(const ddp_config *cfg)
{
#ifdef DDP_WAITS_NO_ARCH
    (void)cfg;
    return DDP_EUNSUPPORTED;
#else
    if (!w_atfork_done) { /* (before patch_lock: the prepare handler takes it) */
        pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
        w_atfork_done = 1;
    }
    pthread_mutex_lock(&patch_lock);
    memset(&ws, 0, sizeof ws);
    w_events = cfg->events & W_EVENTS;
    atomic_store(&w_parked_scanned, 0);
    w_threshold = cfg->wait_threshold_ns > 0 ? cfg->wait_threshold_ns : DEFAULT_THRESHOLD_NS;
    int rate = cfg->wait_max_rate > 0 ? cfg->wait_max_rate : DEFAULT_MAX_RATE;
    w_rate = rate / 2 > 0 ? rate / 2 : 1; /* thinning aims at half the cap: the cap then rarely bites */
    w_rate_interval = 1000000000LL / rate; /* the hard cap: absorbs what thinning mispredicts */
    if (w_rate_interval < 1)
        w_rate_interval = 1;
    w_burst_ns = 100000000LL; /* a tenth of a second's worth of tokens: bursts stay small */
    atomic_store(&w_tat, 0);
    atomic_store(&w_win_start, ddp_now_ns());
    atomic_store(&w_win_kept, 0);
    atomic_store(&w_teff, w_threshold);
    atomic_fetch_add(&w_gen, 1); /* every thread's totals and carries start afresh */
    atomic_store(&w_on, 1);
    patch_pass();
    ws.passes++;
    pthread_mutex_unlock(&patch_lock);
    return DDP_OK;
#endif
}

/* Objects loaded since the last pass get their waits hooked. */
static void patch_new_objects(void)
{
#ifndef DDP_WAITS_NO_ARCH
    if (!atomic_load(&w_on))
        return;
    pthread_mutex_lock(&patch_lock);
    if (atomic_load(&w_on) && (w_retry || loader_adds() != seen_adds)) { /* objects loaded since the last pass */
        patch_pass();
        ws.passes++;
    }
    pthread_mutex_unlock(&patch_lock);
#endif
}

/* Waits still going on at stop: recorded from their start to now, with the waiting thread's
 * stack (it is blocked, so its frames hold still; a torn read drops the record, counted). */
static void flush_inflight(void)
{
    int64_t now = ddp_now_ns();
    uint64_t gen = atomic_load(&w_gen);
    int n = atomic_load(&inflight_hi);
    for (int i = 0; i < n && i < INFLIGHT_MAX; i++) {
        inflight_t *e = &inflight[i];
        if (!atomic_load(&e->t0) || atomic_load(&e->gen) != gen)
            continue;
        int32_t tid = atomic_load(&e->tid);
        int kind = atomic_load(&e->kind);
        int64_t t0 = atomic_exchange(&e->t0, 0);
        int ev = provisional_event(kind);
        if (!t0 || ev < 0 || now <= t0)
            continue;
        if (ddp_emit_for(tid, ev, 1, now - t0, (uint64_t)kind, now) == DDP_OK)
            atomic_fetch_add_explicit(&ws.edge_records, 1, memory_order_relaxed);
    }
}

static void waits_stop(void)
{
    pthread_mutex_lock(&patch_lock);
    atomic_store(&w_on, 0);
    if (npatches || ndone)
        restore_all(1);
    for (int spins = 0; atomic_load(&w_emitting) && spins < 10000000; spins++)
        sched_yield();
    if (w_events)
        flush_inflight();
    w_events = 0;
    pthread_mutex_unlock(&patch_lock);
}

static int waits_inflight(int32_t tid)
{
    uint64_t gen = atomic_load(&w_gen);
    int n = atomic_load(&inflight_hi);
    for (int i = 0; i < n && i < INFLIGHT_MAX; i++)
        if (atomic_load(&inflight[i].tid) == tid && atomic_load(&inflight[i].t0) && atomic_load(&inflight[i].gen) == gen)
            return 1;
    return 0;
}

static int waits_event_for(int kind) { return atomic_load(&w_on) ? provisional_event(kind) : -1; }

static int waits_emitting(void) { return atomic_load(&w_emitting); }

static void waits_tick(int64_t now, int final)
{
    int edges = 0;
    if (final) {
        edges = ddp_parked_tick(now, 1); /* every wait still going on since the start */
    } else {
        patch_new_objects();
        if (!atomic_exchange(&w_parked_scanned, 1))
            ddp_parked_scan(now, waits_inflight, waits_event_for);
        else
            edges = ddp_parked_tick(now, 0);
    }
    atomic_fetch_add_explicit(&ws.edge_records, (uint64_t)edges, memory_order_relaxed);
}

const ddp_engine ddp_waits_engine = {
    .name = "waits",
    .events = W_EVENTS,
    .with_gil = 0,
    .start = waits_start,
    .stop = waits_stop,
    .tick = waits_tick,
    .emitting = waits_emitting,
    .after_fork = NULL, /* its own pthread_atfork: the prepare handler takes patch_lock */
};

int ddp_wait_get_stats(ddp_wait_stats *out)
{
    if (!out)
        return DDP_EINVAL;
    memset(out, 0, sizeof *out);
    out->records = atomic_load(&ws.records);
    out->short_skipped = atomic_load(&ws.short_skipped);
    out->rate_dropped = atomic_load(&ws.rate_dropped);
    out->emit_failed = atomic_load(&ws.emit_failed);
    out->calls = atomic_load(&ws.calls);
    out->objects = ws.objects;
    out->slots_patched = ws.slots_patched;
    out->slots_foreign = ws.slots_foreign;
    out->restore_mismatch = ws.restore_mismatch;
    out->restore_unloaded = ws.restore_unloaded;
    out->active_patches = npatches;
    out->threshold_ns = w_threshold;
    out->protect_failed = ws.protect_failed;
    out->passes = ws.passes;
    out->edge_records = atomic_load(&ws.edge_records);
    out->kinds_patched = ws.kinds_patched;
    out->kinds_foreign = ws.kinds_foreign;
    return DDP_OK;
}

int ddp_wait_slots(uint64_t *addr, uint64_t *val, int32_t *kind, int cap)
{
#ifdef DDP_WAITS_NO_ARCH
    return 0;
#else
    if (cap < 0 || (cap && (!addr || !val || !kind)))
        return DDP_EINVAL;
    scan_ctx c;
    pthread_mutex_lock(&patch_lock);
    scan_init(&c, SCAN_LIST);
    c.addr = addr;
    c.val = val;
    c.kind = kind;
    c.cap = cap;
    dl_iterate_phdr(visit_object, &c);
    pthread_mutex_unlock(&patch_lock);
    return c.n;
#endif
}

uint64_t ddp_wait_wrapper(int kind)
{
    for (int i = 0; i < NHOOKS; i++)
        if (hooks[i].kind == kind)
            return (uint64_t)(uintptr_t)hooks[i].wrapper;
    if (kind == DDP_WAIT_SOCK_POLL)
        return (uint64_t)(uintptr_t)w_sock_poll;
    return 0;
}

int ddp_wait_thread_totals(int64_t *ns, int64_t *count)
{
    if (!ns || !count)
        return DDP_EINVAL;
    w_thread_t *me = me_now();
    *ns = me->ns;
    *count = me->n;
    return DDP_OK;
}

int ddp_wait_inject(int kind, int64_t d_ns)
{
    if (kind <= 0 || kind > DDP_WAIT_SOCK_POLL || d_ns < 0)
        return DDP_EINVAL;
    if (!atomic_load(&w_on))
        return DDP_ENOTRUNNING;
    wait_done(kind, ddp_now_ns() - d_ns, 0);
    return DDP_OK;
}
