/* waits.c — engine: lock-contention (LOCK) and park (PARK) events from the interpreter's
 * blocking waits, hooked by patching GOT entries (gotpatch.c).
 *
 * Why the GOT: CPython's lock waits (3.11/3.12 PyThread_acquire_lock_timed, 3.13 the
 * parking lot), time.sleep, the select module and _socket all end in a few libc calls
 * (sem_clockwait/sem_wait, clock_nanosleep, select/poll/epoll_wait, recv*, accept).
 * Redirecting the importing objects' slots catches every wait, on locks made before the
 * start too, with its exact duration, on the waiting thread itself, whose own frame walk
 * is safe.  Cond waits are the GIL only in libpython's own slots.  Wrappers call the
 * original and keep its result and errno.
 *
 * Records per second are the cost, not waits: short waits are kept with probability d/T at
 * weight T, T rises to keep the rate near half of wait_max_rate, and a token bucket caps
 * bursts, carrying what it drops to the thread's next record (docs/architecture.md).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
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
#include "gotpatch.h"

#define DEFAULT_THRESHOLD_NS 100000
#define DEFAULT_MAX_RATE 400 /* records/s cap (thinning aims at half): a record's stack walk and drain
                              * cost far more than the rest of a wait */
#define KEEP_WINDOW_NS 100000000LL

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
    uint64_t passes;
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
static DDP_TLS inflight_t *w_inflight;
static DDP_TLS int32_t w_tid; /* this thread's tid, cached (a fork child's thread forgets it) */

/* Lock-free: a wrapper may run inside a C signal handler that interrupted this very thread's
 * claim (a handler calling poll or recv), and a mutex there would deadlock.  An entry is ours
 * once its tid moves from 0 to ours. */
static inflight_t *inflight_claim(int32_t tid)
{
    for (int pass = 0; pass < 2; pass++) {
        int n = atomic_load(&inflight_hi);
        for (int i = 0; i < n; i++) {
            int32_t zero = 0;
            if (atomic_compare_exchange_strong(&inflight[i].tid, &zero, tid))
                return &inflight[i];
        }
        while (n < INFLIGHT_MAX) { /* a new entry (claimed by its tid too: a scan may race us to it) */
            if (atomic_compare_exchange_weak(&inflight_hi, &n, n + 1)) {
                int32_t zero = 0;
                if (atomic_compare_exchange_strong(&inflight[n].tid, &zero, tid))
                    return &inflight[n];
                n = atomic_load(&inflight_hi);
            }
        }
        /* full: entries of threads gone from the process are free again */
        for (int i = 0; i < n && pass == 0; i++) {
            int32_t t = atomic_load(&inflight[i].tid);
            if (t > 0 && syscall(SYS_tgkill, getpid(), t, 0) != 0 && errno == ESRCH) {
                atomic_store(&inflight[i].t0, 0); /* (before the tid: a new owner's wait is never cleared) */
                atomic_compare_exchange_strong(&inflight[i].tid, &t, 0);
            }
        }
    }
    return NULL;
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

/* Hooked everywhere but in our own object and the C library; the cond waits (the GIL) in
 * libpython (or the executable holding it) only: elsewhere a cond wait is not the GIL. */
static const gp_hook hooks[] = {
    {"sem_wait", DDP_WAIT_SEM_WAIT, (void *)w_sem_wait, (void *)sem_wait},
    {"sem_timedwait", DDP_WAIT_SEM_TIMEDWAIT, (void *)w_sem_timedwait, (void *)sem_timedwait},
    {"sem_clockwait", DDP_WAIT_SEM_CLOCKWAIT, (void *)w_sem_clockwait, (void *)sem_clockwait},
    {"clock_nanosleep", DDP_WAIT_CLOCK_NANOSLEEP, (void *)w_clock_nanosleep, (void *)clock_nanosleep},
    {"nanosleep", DDP_WAIT_NANOSLEEP, (void *)w_nanosleep, (void *)nanosleep},
    {"select", DDP_WAIT_SELECT, (void *)w_select, (void *)select},
    {"pselect", DDP_WAIT_PSELECT, (void *)w_pselect, (void *)pselect},
    {"poll", DDP_WAIT_POLL, (void *)w_poll, (void *)poll},
    {"ppoll", DDP_WAIT_PPOLL, (void *)w_ppoll, (void *)ppoll},
    {"epoll_wait", DDP_WAIT_EPOLL_WAIT, (void *)w_epoll_wait, (void *)epoll_wait},
    {"epoll_pwait", DDP_WAIT_EPOLL_PWAIT, (void *)w_epoll_pwait, (void *)epoll_pwait},
    {"recv", DDP_WAIT_RECV, (void *)w_recv, (void *)recv},
    {"recvfrom", DDP_WAIT_RECVFROM, (void *)w_recvfrom, (void *)recvfrom},
    {"recvmsg", DDP_WAIT_RECVMSG, (void *)w_recvmsg, (void *)recvmsg},
    {"accept", DDP_WAIT_ACCEPT, (void *)w_accept, (void *)accept},
    {"accept4", DDP_WAIT_ACCEPT4, (void *)w_accept4, (void *)accept4},
    {"pthread_cond_wait", DDP_WAIT_COND_WAIT, (void *)w_cond_wait, (void *)pthread_cond_wait},
    {"pthread_cond_timedwait", DDP_WAIT_COND_TIMEDWAIT, (void *)w_cond_timedwait, (void *)pthread_cond_timedwait},
};
#define NHOOKS ((int)(sizeof hooks / sizeof hooks[0]))

static void *route(const gp_obj *o, const gp_hook *h, int *kind)
{
    *kind = h->kind;
    if ((h->kind == DDP_WAIT_COND_WAIT || h->kind == DDP_WAIT_COND_TIMEDWAIT) && !o->is_libpython)
        return NULL;
    if (h->kind == DDP_WAIT_POLL && strstr(o->name, "/_socket.")) {
        *kind = DDP_WAIT_SOCK_POLL; /* socket timeouts wait in poll(): name them socket */
        return (void *)w_sock_poll;
    }
    return h->wrapper;
}

static gp_set gp = { .hooks = hooks, .nhooks = NHOOKS, .route = route };

#ifdef GP_NO_ARCH
#define DDP_WAITS_NO_ARCH 1
#endif

/* Hook every loaded object not scanned yet this session (patch_lock held). */
static void patch_pass(void) { gp_pass(&gp); }

static void restore_all(int check_loaded) { gp_restore_all(&gp, check_loaded); }

/* No prepare handler: fork must never wait for patch_lock, which a pass holds across dlvsym
 * (the loader's main lock; see gotpatch.c on the cycle through glibc's at-fork lock).
 * gotpatch.c's own handler keeps the patch records whole across the fork. */
static void atfork_child(void)
{
    /* The child records nothing and runs on the original functions. */
    atomic_store(&w_on, 0);
    atomic_store(&w_emitting, 0);
    pthread_mutex_init(&patch_lock, NULL);
    w_tid = 0;
    w_inflight = NULL;
    int n = atomic_load(&inflight_hi); /* every other thread is gone: so are their waits */
    for (int i = 0; i < n; i++) {
        atomic_store(&inflight[i].t0, 0);
        atomic_store(&inflight[i].tid, 0);
    }
    atomic_store(&inflight_hi, 0);
    if (gp.npatches)
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
    if (!w_atfork_done) { /* (outside patch_lock: pthread_atfork takes glibc's at-fork lock) */
        pthread_atfork(NULL, NULL, atfork_child);
        w_atfork_done = 1;
    }
    pthread_mutex_lock(&patch_lock);
    memset(&ws, 0, sizeof ws);
    memset(&gp.st, 0, sizeof gp.st);
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
    if (atomic_load(&w_on) && gp_loaded_since(&gp)) { /* objects were loaded since the last pass */
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
    if (gp.npatches || gp.ndone)
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
    .after_fork = NULL, /* its own pthread_atfork child handler: runs before any engine's */
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
    out->objects = gp.st.objects;
    out->slots_patched = gp.st.slots_patched;
    out->slots_foreign = gp.st.slots_foreign;
    out->restore_mismatch = gp.st.restore_mismatch;
    out->restore_unloaded = gp.st.restore_unloaded;
    out->active_patches = gp.npatches;
    out->threshold_ns = w_threshold;
    out->protect_failed = gp.st.protect_failed;
    out->passes = ws.passes;
    out->edge_records = atomic_load(&ws.edge_records);
    out->kinds_patched = gp.st.kinds_patched;
    out->kinds_foreign = gp.st.kinds_foreign;
    out->passes_deferred = gp.st.passes_deferred;
    out->slots_rebound = gp.st.slots_rebound;
    out->slots_unhooked = gp.st.slots_unhooked;
    return DDP_OK;
}

int ddp_wait_slots(uint64_t *addr, uint64_t *val, int32_t *kind, int cap)
{
#ifdef DDP_WAITS_NO_ARCH
    return 0;
#else
    if (cap < 0 || (cap && (!addr || !val || !kind)))
        return DDP_EINVAL;
    pthread_mutex_lock(&patch_lock);
    int n = gp_list(&gp, addr, val, kind, cap);
    pthread_mutex_unlock(&patch_lock);
    return n;
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
