/* osthreads.c — threads that run no Python: BLAS, OpenMP, Rust and database pools.
 *
 * Each wall tick of a session with native_threads on, the sampler thread lists
 * /proc/self/task (one getdents) and arms a CPU timer on every thread that is neither a
 * registered Python thread nor the sampler itself: the thread's own CPU clock
 * ((~tid << 3) | 6), SIGEV_THREAD_ID, as cpu.c does for Python threads.  A thread born
 * during the session is armed at its second sighting, so a Python thread whose tid the
 * interpreter has not published yet is not taken for a native one; its first sample then weighs its CPU since its birth
 * (or since the start), so a pool thread seen once keeps its whole CPU.  The SIGPROF
 * handler (cpu.c) hands a signal whose timer value points into this table to
 * osthreads_signal: a record with no Python frames, the thread's native stack (unwind.c);
 * a thread started inside a subinterpreter (which the main interpreter does not list) has its
 * Python frames above it, from the interpreter's thread-local, labelled with that interpreter.
 * No signal is ever sent to a thread: a timer on its own CPU clock fires only while it runs.
 *
 * So that such a sample can be put under the Python line that asked for the work, as a pool
 * starts running and every OBS_EVERY ticks while it runs, each blocked Python thread (up to
 * OBS_PER_TICK) is walked from outside: pc and sp from /proc/self/task/TID/syscall, the same
 * unwind tables, its Python frames through safe reads; written as a CPU record of count 0
 * (an observation: where the thread waited, no CPU).  A running Python thread's own CPU
 * samples carry its native frames (records.c) for the same purpose.
 *
 * An engine's hook on such a thread (nalloc.c: its C allocations, in any session with
 * native_threads on) records through ddp_emit_native, which walks the blocked Python threads
 * itself as such samples start, then every OBS_EVERY intervals while they go on.
 *
 * A thread that blocks SIGPROF (masked.c) never takes its timer's signals: its mask is read
 * as it is armed, and again when its clock ran MASK_CHECK periods that no sample carried.  The
 * sampler thread then reads its clock each tick and records its CPU itself (DDP_REC_MASKED)
 * under its entry point's frames, since where inside them it ran cannot be seen; pools.py puts
 * those under the Python line that asked, as any pool sample.
 *
 * At most OS_MAX threads are armed at once: when the table is full, a thread that runs takes
 * the place of one idle for IDLE_SCANS scans; those left beyond are counted, not sampled.  At the
 * final tick every timer goes and each thread's clock says what its samples should carry.
 *
 * Includes: core.h, unwind.h.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core.h"
#include "unwind.h"

#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid
#endif

#define OS_MAX 256
#define OBS_PER_TICK 8 /* blocked Python threads walked per tick, at most */
#define OBS_DEPTH 128
#define OBS_EVERY 5    /* ticks between walks of the blocked Python threads while a pool runs */
#define IDLE_SCANS 50  /* a full table gives up a thread idle this long for one that runs */
#define WALL_EVERY 5   /* ticks between two WALL samples of one such thread (its weight: the time between) */
#define OUTER_WALK 96  /* ... found by its own handler's walk this deep at most */
#define OUTER_MAX 4    /* a running thread's WALL sample: its entry point's frames (from its last whole walk) */
#define MASK_CHECK 4   /* periods of a thread's CPU with no sample before its signal mask is read again */

typedef struct {
    _Atomic int32_t tid;      /* 0: free */
    _Atomic int32_t armed;    /* its timer's signals are sampled */
    _Atomic int64_t acct_ns;  /* its clock when its CPU was last accounted (handler exchanges) */
    _Atomic int64_t sampled;  /* CPU its samples carried */
    int64_t carry;            /* a dropped sample's weight, for its next (handler only) */
    /* below: the sampler thread's */
    timer_t timer;
    clockid_t clock;
    int64_t base_ns, seen_ns;
    uint32_t seen_gen;
    int sightings;
    int idle;                 /* scans since its clock last moved */
    char comm[16];
    int64_t wall_ns, wall_cpu_ns; /* its last WALL sample: when, and its clock then */
    int64_t last_seen_ns;         /* the last scan that saw it (an exited thread's wall runs to there) */
    uint64_t outer[OUTER_MAX];    /* the outermost pcs of a whole walk of it (leaf first) */
    _Atomic int n_outer;          /* (written after outer: by its handler once, by the wall thread) */
    int outer_tries;              /* its handler's walks for them (a few: each costs a second walk) */
    int masked;                   /* it blocks SIGPROF: the sampler records its CPU (sample_masked) */
    int masked_recorded;          /* ... and did (counted once: an idle masked thread is no news) */
    int64_t check_cpu, check_sampled; /* its clock and sampled CPU when its mask was last read */
    int64_t masked_carry;         /* a dropped masked sample's weight, for its next */
} os_thread;

typedef struct {
    int32_t tid;
    int64_t used, sampled;
    char comm[16];
} os_total;

static os_thread ost[OS_MAX]; /* static: a late signal never reads freed memory */
static uint32_t gen;
static int64_t scan_ns; /* this scan's tick time */
static int ran_before, obs_age;
static int task_fd = -1; /* /proc/self/task, kept open: each scan rewinds it */
static uint32_t for_session;
static os_total *totals;
static int n_totals, cap_totals;
static struct {
    uint64_t armed_max, beyond, timer_failures, observations, totals_dropped, scans, evicted, masked;
    int64_t tails_ns, unseen_ns; /* CPU of exited threads after their last read: given to pool threads; left */
    int64_t masked_ns;           /* CPU recorded by the sampler for threads that block SIGPROF */
} st;

/* Every thread's clock at the last two scans (sorted by tid): the process's CPU clock moved
 * by the sum of their moves plus what threads that exited meanwhile used after their last
 * read (their tails), which no thread's clock can say any more. */
#define ALL_MAX 8192
typedef struct {
    int32_t tid;
    int64_t ns;
} clock_read;
static clock_read reads[2][ALL_MAX];
static int n_reads[2], cur;
static int64_t proc_prev = -1;

static int64_t clock_ns(clockid_t c)
{
    struct timespec ts;
    if (clock_gettime(c, &ts) != 0)
        return -1;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void read_comm(int32_t tid, char out[16])
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/comm", (int)tid);
    memset(out, 0, 16);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, out, 15);
    close(fd);
    if (n > 0 && out[n - 1] == '\n')
        out[n - 1] = 0;
}

/* The outermost frames of a whole walk (leaf-first pcs): the thread's entry point, which its
 * running WALL samples show (its library is the pool's). */
static void keep_outer(os_thread *t, const uint64_t *pcs, int n)
{
    int k = n < OUTER_MAX ? n : OUTER_MAX;
    memcpy(t->outer, pcs + n - k, sizeof *pcs * (size_t)k);
    atomic_store_explicit(&t->n_outer, k, memory_order_release);
}

int osthreads_signal(void *value)
{
    os_thread *t = value;
    if (t < ost || t >= ost + OS_MAX || ((char *)t - (char *)ost) % sizeof(os_thread))
        return 0;
    if (!atomic_load(&t->armed) || atomic_load(&t->tid) != my_tid())
        return 1;
    int64_t t0 = ddp_now_ns();
    int64_t cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    int64_t prev = cpu > 0 ? atomic_exchange(&t->acct_ns, cpu) : cpu;
    int64_t weight = (cpu > 0 && prev >= 0 && cpu >= prev ? cpu - prev : 0) + t->carry;
    if (weight <= 0)
        return 1;
    int mode = atomic_load(&ddp_read_mode_now);
    if (mode == DDP_READ_GUARDED && !ddp_saferead_check_segv())
        mode = DDP_READ_SYSCALL;
    /* (a thread started inside a subinterpreter runs Python the main interpreter does not
     * list: its frames, from the interpreter's thread-local, as a registered thread's are) */
    int r = produce_native(my_tid(), ddp_py_running_tstate(), 0, DDP_EVENT_CPU, 1, weight, 0, DDP_STATE_CPU, NULL,
                           0, mode, t0);
    if (!atomic_load_explicit(&t->n_outer, memory_order_relaxed) && (sess_cfg.events & (1u << DDP_EVENT_WALL)) &&
        t->outer_tries++ < 4) {
        uint64_t pcs[OUTER_WALK]; /* (a pool thread's stack may be small: a bounded walk) */
        uint16_t flags = 0;
        int n = uw_unwind_own(pcs, OUTER_WALK, mode, &flags);
        if (n > 0 && !(flags & UW_TRUNCATED))
            keep_outer(t, pcs, n);
    }
    t->carry = r == PROD_OK ? 0 : weight;
    if (r == PROD_OK)
        atomic_fetch_add_explicit(&t->sampled, weight, memory_order_relaxed);
    else if (r == PROD_FULL)
        atomic_fetch_add_explicit(&sess_stats.carried_full[DDP_EVENT_CPU], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&sess_stats.handler_ns, (uint64_t)(ddp_now_ns() - t0), memory_order_relaxed);
    atomic_fetch_add_explicit(&sess_stats.handler_calls, 1, memory_order_relaxed);
    return 1;
}

static void keep_total(int32_t tid, int64_t used, int64_t sampled, const char *comm)
{
    if (n_totals == cap_totals) {
        int cap = cap_totals ? cap_totals * 2 : 256;
        os_total *grown = realloc(totals, sizeof *totals * (size_t)cap);
        if (!grown) {
            st.totals_dropped++;
            return;
        }
        totals = grown, cap_totals = cap;
    }
    os_total *o = &totals[n_totals++];
    o->tid = tid, o->used = used, o->sampled = sampled;
    memcpy(o->comm, comm, 16);
}

static int counted_before(int32_t tid)
{
    for (int i = 0; i < n_totals; i++)
        if (totals[i].tid == tid)
            return 1;
    return 0;
}

static int n_armed(void)
{
    int n = 0;
    for (int i = 0; i < OS_MAX; i++)
        n += atomic_load(&ost[i].armed);
    return n;
}

static int arm(os_thread *t, int32_t tid)
{
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGPROF;
    sev.sigev_value.sival_ptr = t;
    sev.sigev_notify_thread_id = tid;
    if (timer_create(t->clock, &sev, &t->timer) != 0) {
        if (errno != EINVAL && errno != ESRCH) /* (EINVAL: it exited meanwhile) */
            st.timer_failures++;
        return -1;
    }
    int64_t period = sess_cfg.interval_ns;
    /* first expiry at a random point of the period: pool threads started together never
     * signal in step */
    int64_t first = 1 + (int64_t)(((uint64_t)ddp_now_ns() * 0x9E3779B97F4A7C15ULL >> 11) % (uint64_t)period);
    struct itimerspec its = { { period / 1000000000LL, period % 1000000000LL },
                              { first / 1000000000LL, first % 1000000000LL } };
    atomic_store(&t->armed, 1);
    if (timer_settime(t->timer, 0, &its, NULL) != 0) {
        atomic_store(&t->armed, 0);
        timer_delete(t->timer);
        st.timer_failures++;
        return -1;
    }
    return 0;
}

/* Its clock's CPU since its base, against what its samples carried: kept; the timer goes. */
static int exited_now[OS_MAX], n_exited_now; /* totals of pool threads gone in this scan */

static void retire(os_thread *t)
{
    atomic_store(&t->armed, 0);
    timer_delete(t->timer);
    int64_t now = clock_ns(t->clock);
    int64_t last = atomic_load(&t->acct_ns); /* its handler's last read of its own clock */
    if (now < t->seen_ns)
        now = t->seen_ns > last ? t->seen_ns : last; /* exited: the latest read */
    keep_total(atomic_load(&t->tid), now - t->base_ns, atomic_load(&t->sampled), t->comm);
    if (now < 0 || clock_ns(t->clock) < 0) /* (gone, not turned Python: its tail is in the residual) */
        if (n_exited_now < OS_MAX && n_totals > 0)
            exited_now[n_exited_now++] = n_totals - 1;
    atomic_store(&t->tid, 0);
}

static os_thread *find(int32_t tid)
{
    for (int i = 0; i < OS_MAX; i++)
        if (atomic_load(&ost[i].tid) == tid)
            return &ost[i];
    return NULL;
}

static void read_clock(int32_t tid)
{
    clock_read *r = reads[cur];
    int64_t ns = clock_ns((clockid_t)((~(unsigned)tid << 3) | 6));
    if (ns >= 0 && n_reads[cur] < ALL_MAX)
        r[n_reads[cur]++] = (clock_read){ tid, ns };
}

static int cmp_read(const void *a, const void *b)
{
    int32_t x = ((const clock_read *)a)->tid, y = ((const clock_read *)b)->tid;
    return (x > y) - (x < y);
}

/* The process's CPU since the last scan that no thread alive now accounts for: the tails of
 * threads that exited meanwhile, handed to the pool threads gone in this scan (in equal
 * parts); with none, counted as unseen (threads that started and ended between two scans,
 * or Python threads' tails, which thread_start.c keeps). */
static void settle_tails(void)
{
    int64_t proc = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    clock_read *now = reads[cur], *before = reads[cur ^ 1];
    int n = n_reads[cur], m = n_reads[cur ^ 1];
    qsort(now, (size_t)n, sizeof *now, cmp_read);
    if (proc_prev >= 0 && proc > proc_prev) {
        int64_t moved = 0;
        for (int i = 0, j = 0; i < n; i++) {
            while (j < m && before[j].tid < now[i].tid)
                j++;
            moved += j < m && before[j].tid == now[i].tid ? now[i].ns - before[j].ns : now[i].ns; /* (new: born since) */
        }
        int64_t rest = proc - proc_prev - moved;
        if (rest > 0 && n_exited_now) {
            for (int k = 0; k < n_exited_now; k++)
                totals[exited_now[k]].used += rest / n_exited_now;
            st.tails_ns += rest;
        } else if (rest > 0) {
            st.unseen_ns += rest;
        }
    }
    proc_prev = proc;
    cur ^= 1;
    n_reads[cur] = 0;
    n_exited_now = 0;
}

/* The thread just read (the last of this scan's reads) ran since the previous scan. */
static int ran_since_last_scan(int32_t tid)
{
    if (!n_reads[cur] || reads[cur][n_reads[cur] - 1].tid != tid)
        return 0;
    clock_read key = { tid, 0 };
    const clock_read *was = bsearch(&key, reads[cur ^ 1], (size_t)n_reads[cur ^ 1], sizeof key, cmp_read);
    return !was || reads[cur][n_reads[cur] - 1].ns > was->ns;
}

/* The table is full and a thread that runs wants in: the longest idle one leaves (its CPU so
 * far kept, as if it had exited; seen again later, it counts from then). */
static os_thread *evict_idle(void)
{
    os_thread *best = NULL;
    for (int i = 0; i < OS_MAX; i++)
        if (atomic_load(&ost[i].armed) && ost[i].idle >= IDLE_SCANS && (!best || ost[i].idle > best->idle))
            best = &ost[i];
    if (best) {
        retire(best);
        st.evicted++;
    }
    return best;
}

static void seen(int32_t tid, int32_t self, int64_t *ran)
{
    if (tid <= 0)
        return;
    read_clock(tid);
    if (tid == self)
        return;
    os_thread *t = find(tid);
    /* a Python thread (or one the session excludes): cpu.c's.  One whose slot went inactive
     * left Python (a C library's callback thread after its callback): its C work is ours */
    int idx = slot_lookup(tid);
    int py = idx >= 0 && (atomic_load(&sess_slots[idx].active) || atomic_load(&sess_slots[idx].excluded));
    if (py) {
        if (t && t->sightings >= 2)
            retire(t);
        else if (t)
            atomic_store(&t->tid, 0);
        return;
    }
    if (!t) {
        for (int i = 0; i < OS_MAX && !t; i++)
            if (!atomic_load(&ost[i].tid))
                t = &ost[i];
        if (!t && ran_since_last_scan(tid))
            t = evict_idle();
        if (!t) {
            st.beyond++;
            return;
        }
        memset((void *)((char *)t + offsetof(os_thread, carry)), 0, sizeof *t - offsetof(os_thread, carry));
        atomic_store(&t->sampled, 0);
        atomic_store(&t->acct_ns, 0);
        t->clock = (clockid_t)((~(unsigned)tid << 3) | 6);
        atomic_store(&t->tid, tid);
    }
    t->seen_gen = gen;
    t->last_seen_ns = scan_ns;
    /* one there at the start that registered as no Python thread then is a native one */
    if (t->sightings == 0 && !thread_born_in_session(tid))
        t->sightings = 1;
    else if (t->sightings == 0) /* born since the last scan: its wall time counts from here */
        t->wall_ns = scan_ns, t->wall_cpu_ns = clock_ns(t->clock);
    if (++t->sightings == 2) {
        int64_t now = clock_ns(t->clock);
        if (now < 0) {
            atomic_store(&t->tid, 0);
            return;
        }
        /* born in the session: all its CPU is the session's (its first sample carries it);
         * one that was counted before (it ran Python meanwhile, a C library's callback
         * thread: cpu.c counted that part): from now */
        t->base_ns = thread_born_in_session(tid) && !counted_before(tid) && idx < 0 ? 0 : now;
        t->seen_ns = now;
        atomic_store(&t->acct_ns, t->base_ns);
        read_comm(tid, t->comm);
        if (!t->wall_ns || t->wall_cpu_ns < 0) /* (there at the start: from here) */
            t->wall_ns = ddp_now_ns(), t->wall_cpu_ns = now;
        if (arm(t, tid) != 0) {
            atomic_store(&t->tid, 0);
            return;
        }
        t->check_cpu = now;
        t->masked = masks_sigprof(tid);
        *ran += now - t->base_ns;
    } else if (t->sightings > 2) {
        int64_t now = clock_ns(t->clock);
        if (now > t->seen_ns)
            *ran += now - t->seen_ns, t->seen_ns = now, t->idle = 0;
        else
            t->idle++;
        /* its clock ran for several periods and no signal came: has it blocked SIGPROF since? */
        if (!t->masked && now - t->check_cpu >= MASK_CHECK * sess_cfg.interval_ns) {
            int64_t sampled = atomic_load(&t->sampled);
            if (sampled == t->check_sampled)
                t->masked = masks_sigprof(tid);
            t->check_cpu = now, t->check_sampled = sampled;
        }
    }
}

/* A blocked Python thread's stack, from outside: pc and sp of its syscall, then the walk (1: recorded). */
static int observe(slot_t *s, int64_t ts, int mode)
{
    int32_t tid = atomic_load(&s->tid);
    char buf[256];
    if (task_file_read(tid, "syscall", buf, sizeof buf) <= 0) /* (not the wall thread's kept files: any thread) */
        return 0;
    uint64_t sp, pc;
    if (!task_syscall_regs(buf, &sp, &pc)) /* "running": its own samples say where */
        return 0;
    uint64_t pcs[OBS_DEPTH];
    uint16_t flags = 0;
    int d = uw_unwind_regs(pc, sp, 0, pcs, OBS_DEPTH, mode, &flags);
    if (d <= 0)
        return 0;
    if (produce_native(tid, atomic_load(&s->tstate), label_of(s), DDP_EVENT_CPU, 0, 0, 0, DDP_STATE_OFFCPU, pcs, d,
                       mode, ts) != PROD_OK)
        return 0;
    __atomic_fetch_add(&st.observations, 1, __ATOMIC_RELAXED); /* (the wall thread's, or a hook's: below) */
    return 1;
}

/* (the /proc read says whether it runs: a running one's own CPU samples carry its native
 * frames; ~10 us a thread, paid only in ticks when a native thread ran) */
static int observe_blocked(int64_t ts)
{
    int mode = atomic_load(&ddp_read_mode_now);
    int n = atomic_load(&sess_nslots), done = 0, recorded = 0;
    for (int i = 0; i < n && i < MAX_SLOTS && done < OBS_PER_TICK; i++) {
        slot_t *s = &sess_slots[i];
        if (!atomic_load(&s->active) || atomic_load(&s->excluded) || !atomic_load(&s->tstate))
            continue;
        recorded += observe(s, ts, mode);
        done++;
    }
    return recorded;
}

/* ---- a hook's sample on a thread that runs no Python (nalloc.c: its C allocations) ---------- */
static _Atomic int64_t callers_seen_ns; /* when a hook last walked the blocked Python threads */

/* The calling thread's tid and its own native stack (under its Python frames if it runs
 * Python in a subinterpreter now).  As such a thread's
 * samples start, then at most every OBS_EVERY intervals while they go on, the blocked Python
 * threads are walked here too (observe_blocked), so that pools.py finds the caller waiting on
 * this pool: the wall tick walks them only when a pool's CPU moves (CPU sessions), and a short
 * pool can come and go between two ticks.  No lock, no malloc. */
int ddp_emit_native(int event, int64_t count, int64_t value, uint64_t aux)
{
    if (!atomic_load_explicit(&ddp_session_active, memory_order_acquire) || !sess_ring || !sess_slots)
        return DDP_ENOTRUNNING;
    if (event < 0 || event >= DDP_EVENT_COUNT || !(sess_cfg.events & (1u << event)) || !sess_cfg.native_threads)
        return DDP_EINVAL;
    int64_t now = ddp_now_ns(), last = atomic_load_explicit(&callers_seen_ns, memory_order_relaxed);
    int walk = now - last >= OBS_EVERY * sess_cfg.interval_ns &&
               atomic_compare_exchange_strong(&callers_seen_ns, &last, now);
    int mode = atomic_load(&ddp_read_mode_now);
    if (walk && mode == DDP_READ_GUARDED && !ddp_saferead_check_segv()) /* (the wall thread checks each tick) */
        mode = DDP_READ_SYSCALL;
    int r = produce_native(my_tid(), ddp_py_running_tstate(), 0, event, count, value, aux, DDP_STATE_OFFCPU, NULL,
                           0, mode, now);
    if (r == PROD_FULL)
        atomic_fetch_add_explicit(&sess_stats.dropped_full[event], 1, memory_order_relaxed);
    if (walk && !observe_blocked(now)) /* none blocked (the caller still starting the pool?): again an interval on */
        atomic_store_explicit(&callers_seen_ns, now - (OBS_EVERY - 1) * sess_cfg.interval_ns, memory_order_relaxed);
    return r == PROD_OK ? DDP_OK : r == PROD_FULL ? DDP_ENOMEM : DDP_ESYS;
}

/* ---- threads that block SIGPROF: their CPU read by the sampler -------------------------------- */
/* Its entry point's frames: walked at the start, or now if it waits. */
static void learn_outer(os_thread *t, int32_t tid, int mode)
{
    uint64_t pcs[MASKED_WALK];
    int n = masked_entry_at_start(tid, pcs);
    if (n <= 0)
        n = walk_waiting(tid, t->clock, mode, pcs, MASKED_WALK);
    if (n > 0)
        keep_outer(t, pcs, n);
}

/* Each tick, the CPU of each such thread since its last record, once it reaches a period (as its
 * timer would have fired), under its entry point's frames (with none known yet: none). */
static void sample_masked(int64_t now)
{
    int mode = atomic_load(&ddp_read_mode_now);
    for (int i = 0; i < OS_MAX; i++) {
        os_thread *t = &ost[i];
        int32_t tid = atomic_load(&t->tid);
        if (!tid || !t->masked || !atomic_load(&t->armed))
            continue;
        if (!atomic_load_explicit(&t->n_outer, memory_order_acquire))
            learn_outer(t, tid, mode);
        int64_t cpu = clock_ns(t->clock);
        if (cpu < 0 || cpu - atomic_load(&t->acct_ns) + t->masked_carry < sess_cfg.interval_ns)
            continue;
        int64_t prev = atomic_exchange(&t->acct_ns, cpu); /* (shared with its handler, should it unblock) */
        int64_t weight = (cpu > prev ? cpu - prev : 0) + t->masked_carry;
        uint64_t pcs[OUTER_MAX];
        int n = atomic_load_explicit(&t->n_outer, memory_order_acquire);
        memcpy(pcs, t->outer, sizeof *pcs * (size_t)n);
        int r = produce_native_flagged(tid, 0, 0, DDP_EVENT_CPU, 1, weight, 0, DDP_STATE_CPU, pcs, n, mode, now,
                                       DDP_REC_MASKED);
        t->masked_carry = r == PROD_OK ? 0 : weight;
        if (r == PROD_OK) {
            atomic_fetch_add_explicit(&t->sampled, weight, memory_order_relaxed);
            st.masked_ns += weight;
            st.masked += !t->masked_recorded;
            t->masked_recorded = 1;
        } else if (r == PROD_FULL) {
            atomic_fetch_add_explicit(&sess_stats.carried_full[DDP_EVENT_CPU], 1, memory_order_relaxed);
        }
    }
}

/* ---- WALL samples of these threads (sessions with the wall event) -------------------------- */
/* Each thread every WALL_EVERY ticks, weighing the time since its previous one (from the scan
 * that first saw it, for one born in the session; to the last that saw it, for one gone): blocked, the
 * native frames it waits in (from outside: the sp and pc of its /proc syscall line, kept if its
 * clock stood still meanwhile); running, only its entry point's frames from its last whole
 * walk (where it runs is its own CPU samples' to say).  pools.py puts them under their caller,
 * or [native threads], where the explorer hides the idle ones.  A thread started inside a
 * subinterpreter has its Python frames too, found in that interpreter's thread list. */
static void wall_natives(int64_t now, int final_tick)
{
    int mode = atomic_load(&ddp_read_mode_now);
    for (int i = 0; i < OS_MAX; i++) {
        os_thread *t = &ost[i];
        int32_t tid = atomic_load(&t->tid);
        int64_t dwall = now - t->wall_ns;
        if (!tid || t->sightings < 2 || dwall <= 0 || (!final_tick && dwall < WALL_EVERY * sess_cfg.interval_ns))
            continue;
        int64_t cpu = clock_ns(t->clock);
        if (cpu < 0)
            continue; /* gone: the next scan records its last stretch (wall_exited) */
        int state = cpu - t->wall_cpu_ns >= dwall / 2 ? DDP_STATE_CPU : DDP_STATE_OFFCPU;
        uint64_t sp = 0, pc = 0, pcs[OBS_DEPTH];
        int n = 0;
        char buf[256];
        if (state == DDP_STATE_OFFCPU && task_syscall_line(tid, buf, sizeof buf) > 0) {
            if (!strncmp(buf, "running", 7))
                state = DDP_STATE_CPU;
            else if (task_syscall_regs(buf, &sp, &pc)) {
                uint16_t flags = 0;
                n = uw_unwind_regs(pc, sp, 0, pcs, OBS_DEPTH, mode, &flags);
                if (clock_ns(t->clock) != cpu)
                    n = 0; /* it ran meanwhile: not the stack those registers described */
                else if (n > 0 && !(flags & UW_TRUNCATED))
                    keep_outer(t, pcs, n);
            }
        }
        /* a thread started inside a subinterpreter (3.13+: found in that interpreter's list):
         * its Python frames, with the native ones it waits in; running, those alone */
        uintptr_t sub = ddp_py_subinterp_tstate(tid, mode);
        if (sub && state == DDP_STATE_CPU)
            n = 0;
        else if (!sub && n == 0 && (n = atomic_load_explicit(&t->n_outer, memory_order_acquire)) > 0)
            memcpy(pcs, t->outer, sizeof *pcs * (size_t)n);
        if (produce_native(tid, sub, 0, DDP_EVENT_WALL, 1, dwall, 0, state, pcs, n, mode, now) == PROD_FULL)
            atomic_fetch_add_explicit(&sess_stats.dropped_full[DDP_EVENT_WALL], 1, memory_order_relaxed);
        t->wall_ns = now, t->wall_cpu_ns = cpu;
    }
}

/* A thread gone since the last scan: its stretch since its last WALL sample, to the last scan
 * that saw it (it exited within a tick after); running if its clock moved through half of it. */
static void wall_exited(os_thread *t)
{
    int64_t dwall = t->last_seen_ns - t->wall_ns;
    if (!t->wall_ns || dwall <= 0)
        return;
    int64_t cpu = t->seen_ns, last = atomic_load(&t->acct_ns);
    if (last > cpu)
        cpu = last; /* (its handler's last read of its own clock) */
    int state = (cpu - t->wall_cpu_ns) * 2 >= dwall ? DDP_STATE_CPU : DDP_STATE_OFFCPU;
    uint64_t pcs[OUTER_MAX];
    int n = atomic_load_explicit(&t->n_outer, memory_order_acquire);
    if (n > 0)
        memcpy(pcs, t->outer, sizeof *pcs * (size_t)n);
    if (produce_native(atomic_load(&t->tid), 0, 0, DDP_EVENT_WALL, 1, dwall, 0, state, pcs, n,
                       atomic_load(&ddp_read_mode_now), t->last_seen_ns) == PROD_FULL)
        atomic_fetch_add_explicit(&sess_stats.dropped_full[DDP_EVENT_WALL], 1, memory_order_relaxed);
}

static void begin(void)
{
    for (int i = 0; i < OS_MAX; i++)
        atomic_store(&ost[i].tid, 0), atomic_store(&ost[i].armed, 0);
    n_totals = 0;
    memset(&st, 0, sizeof st);
    n_reads[0] = n_reads[1] = 0;
    n_exited_now = 0;
    proc_prev = -1;
    ran_before = obs_age = 0;
    for_session = atomic_load(&sess_gen);
}

static void final(void)
{
    for (int i = 0; i < OS_MAX; i++)
        if (atomic_load(&ost[i].tid) && ost[i].sightings >= 2)
            retire(&ost[i]);
        else
            atomic_store(&ost[i].tid, 0);
}

void osthreads_tick(int64_t now, int final_tick)
{
    if (!sess_cfg.native_threads || !(sess_cfg.events & (1u << DDP_EVENT_CPU)))
        return;
    if (for_session != atomic_load(&sess_gen))
        begin();
    /* final, or another tool's SIGPROF handler replaced ours: every timer goes (cpu.c stops
     * the Python threads' too), each thread's CPU so far kept */
    int wall = (sess_cfg.events & (1u << DDP_EVENT_WALL)) != 0;
    if (final_tick || atomic_load(&sess_stats.prof_replaced)) {
        if (wall && final_tick)
            wall_natives(now, 1); /* (their wall time runs to the stop) */
        final();
        if (task_fd >= 0)
            close(task_fd);
        task_fd = -1;
        return;
    }
    gen++;
    st.scans++;
    scan_ns = now;
    if (task_fd < 0)
        task_fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int fd = task_fd;
    if (fd < 0 || lseek(fd, 0, SEEK_SET) != 0)
        return;
    int64_t ran = 0;
    int32_t self = my_tid();
    char buf[4096];
    long got;
    while ((got = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0)
        for (long off = 0; off < got;) {
            struct dirent64 *d = (struct dirent64 *)(buf + off);
            off += d->d_reclen;
            if (d->d_name[0] >= '1' && d->d_name[0] <= '9')
                seen((int32_t)atoi(d->d_name), self, &ran);
        }
    for (int i = 0; i < OS_MAX; i++) /* gone since the last scan */
        if (atomic_load(&ost[i].tid) && ost[i].seen_gen != gen) {
            if (ost[i].sightings >= 2 && wall)
                wall_exited(&ost[i]);
            if (ost[i].sightings >= 2)
                retire(&ost[i]);
            else
                atomic_store(&ost[i].tid, 0);
        }
    settle_tails();
    sample_masked(now);
    if (wall)
        wall_natives(now, 0);
    uint64_t a = (uint64_t)n_armed();
    if (a > st.armed_max)
        st.armed_max = a;
    /* blocked callers: as a pool starts running, then every OBS_EVERY ticks while it runs
     * (pools.py takes a caller inside a library between two of its records up to 1 s apart) */
    if (ran > 0 && (!ran_before || ++obs_age >= OBS_EVERY)) {
        observe_blocked(now);
        obs_age = 0;
    }
    ran_before = ran > 0;
}

void osthreads_after_fork(void)
{
    /* the child has no timers and none of these threads */
    for (int i = 0; i < OS_MAX; i++)
        atomic_store(&ost[i].tid, 0), atomic_store(&ost[i].armed, 0);
    for_session = 0;
    masked_after_fork();
    if (task_fd >= 0)
        close(task_fd); /* (the parent's threads' directory) */
    task_fd = -1;
}

int ddp_native_threads(int32_t *tid, int64_t *used, int64_t *sampled, char *names, int cap)
{
    if (cap < 0 || (cap && (!tid || !used || !sampled || !names)))
        return DDP_EINVAL;
    if (atomic_load(&sess_state) != ST_STOPPED)
        return DDP_ENOTRUNNING;
    for (int i = 0; i < n_totals && i < cap; i++) {
        tid[i] = totals[i].tid;
        used[i] = totals[i].used;
        sampled[i] = totals[i].sampled;
        memcpy(names + 16 * i, totals[i].comm, 16);
    }
    return n_totals;
}

int ddp_native_threads_stats(uint64_t *out, int n)
{
    uint64_t v[11] = { st.armed_max, st.beyond, st.timer_failures, st.observations, st.totals_dropped, st.scans,
                       (uint64_t)st.tails_ns, (uint64_t)st.unseen_ns, st.evicted, st.masked, (uint64_t)st.masked_ns };
    for (int i = 0; i < n && i < 11; i++)
        out[i] = v[i];
    return 11;
}
