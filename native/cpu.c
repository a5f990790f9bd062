/* cpu.c — the CPU engine: per-thread CPU timers and the SIGPROF handler.
 *
 * One POSIX timer per thread on that thread's CPU-time clock ((~tid << 3) | 6, as
 * async-profiler's ctimer), SIGEV_THREAD_ID -> SIGPROF delivered to that very thread, first
 * expiry uniform in (0, period] (as Go does).  The handler walks its own thread's frames:
 * no malloc, no locks, no CPython API.  Weight = the CPU its thread's clock used since its CPU
 * was last accounted (cpu_acct_ns), not period * (1 + overruns): a loaded kernel delivers a
 * thread's timer signals late (seen: 2-14 periods, once 2.5 s of CPU in one signal), and a late
 * signal's overrun count put all that CPU on whatever ran at delivery.  So the sampler thread,
 * which reads each thread's clock every tick anyway, samples a running thread that ran 2
 * periods past its last accounting itself (a walk of its frames, no signal: cpu_kick_check).
 * Weights are clock deltas, so the sampler's sample and a timer signal never count one
 * stretch of CPU twice.  At stop, each thread's CPU
 * clock says how much CPU its samples should have carried (ddp_cpu_thread_totals).
 *
 * An engine of the table (ddp_cpu_engine), started before the wall thread and stopped after
 * it: the registry's threads get a timer as it finds them (thread_seen) and account their
 * CPU as they leave (thread_left); the wall thread's clock reads kick lagging timers
 * (thread_clock).  Threads that run no Python (osthreads.c) and threads as they start
 * (thread_start.c) are this engine's too.
 *
 * Includes: core.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include "core.h"

#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid
#endif

static struct sigaction old_prof;
static int prof_installed;
static _Atomic int in_handler;
static int started;            /* this session's CPU engine started */
static _Atomic int cpu_on;     /* handlers sample (until the totals at stop) */
static uint64_t rng_state;

static uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static void timer_arm(slot_t *s)
{
    if (s->has_timer || s->timer_failed || !(sess_cfg.events & (1u << DDP_EVENT_CPU)) || atomic_load(&sess_stats.prof_replaced))
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
            atomic_fetch_add(&sess_stats.timer_failures, 1);
            atomic_compare_exchange_strong(&sess_stats.timer_errno, &zero, e);
        }
        ddp_set_errno(e);
        return;
    }
    int64_t period = sess_cfg.interval_ns * (sess_cfg.cpu_timer_scale > 1 ? sess_cfg.cpu_timer_scale : 1);
    int64_t first = 1 + (int64_t)(rng_next() % (uint64_t)period); /* uniform in (0, period] */
    /* its first sample weighs the CPU since now (set before the timer can fire) */
    int64_t c = thread_cpu_ns(s);
    atomic_store(&s->cpu_acct_ns, c > 0 ? c : 0);
    struct itimerspec its;
    its.it_interval.tv_sec = period / 1000000000LL;
    its.it_interval.tv_nsec = period % 1000000000LL;
    its.it_value.tv_sec = first / 1000000000LL;
    its.it_value.tv_nsec = first % 1000000000LL;
    if (timer_settime(s->timer, 0, &its, NULL) != 0) {
        int e = errno, zero = 0;
        timer_delete(s->timer);
        s->timer_failed = 1;
        atomic_fetch_add(&sess_stats.timer_failures, 1);
        atomic_compare_exchange_strong(&sess_stats.timer_errno, &zero, e);
        return;
    }
    s->has_timer = 1;
    s->cpu_counted = 1;
}

static void timer_disarm(slot_t *s)
{
    if (s->has_timer) {
        timer_delete(s->timer);
        s->has_timer = 0;
    }
}

static void on_sigprof(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)uc;
    int saved_errno = errno;
    atomic_fetch_add(&in_handler, 1);
    /* Only our timers' signals (SI_TIMER: the kernel's alone).  Anyone may queue a SIGPROF
     * with any si_code < 0, pid and value (rt_sigqueueinfo), so no other is taken; the slot
     * checks below guard the timer's value anyway. */
    if (!atomic_load_explicit(&ddp_session_active, memory_order_acquire) || !atomic_load(&cpu_on) || !si ||
        si->si_code != SI_TIMER)
        goto out;
    if (osthreads_signal(si->si_value.sival_ptr))
        goto out; /* a thread that runs no Python (osthreads.c) */
    slot_t *s = si->si_value.sival_ptr;
    slot_t *base = sess_slots;
    if (!base || s < base || s >= base + MAX_SLOTS || ((char *)s - (char *)base) % sizeof(slot_t)) {
        atomic_fetch_add(&sess_stats.stale_signals, 1);
        goto out;
    }
    if (atomic_load(&s->tid) != my_tid()) {
        atomic_fetch_add(&sess_stats.stale_signals, 1);
        goto out;
    }
    if (!atomic_load(&s->active) || atomic_load(&s->excluded))
        goto out;
    int64_t t0 = ddp_now_ns();
    struct timespec ts;
    int64_t cpu = clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0 ? (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec : 0;
    int64_t prev = cpu > 0 ? atomic_exchange(&s->cpu_acct_ns, cpu) : 0;
    int mode = atomic_load(&ddp_read_mode_now);
    if (mode == DDP_READ_GUARDED && !ddp_saferead_check_segv())
        mode = DDP_READ_SYSCALL; /* our fault handler was replaced: never risk a fault */
    int64_t overrun = si->si_overrun > 0 ? si->si_overrun : 0;
    int64_t used = prev > 0 && cpu >= prev ? cpu - prev : sess_cfg.interval_ns * (1 + overrun);
    int64_t weight = used + s->cpu_carry;
    if (weight <= 0)
        goto out; /* a kick right behind a timer's signal: no CPU since */
    /* (a thread running a subinterpreter: its frames there, above the registered ones) */
    uintptr_t running = ddp_py_running_tstate();
    atomic_store_explicit(&s->in_subinterp, running && running != atomic_load(&s->tstate), memory_order_relaxed);
    int r = produce_running(s, running, DDP_EVENT_CPU, weight, DDP_STATE_CPU, mode, t0);
    /* a torn read or a full ring: the weight goes to this thread's next sample (totals stay exact) */
    s->cpu_carry = r == PROD_TORN || r == PROD_FULL ? weight : 0;
    if (r == PROD_FULL)
        atomic_fetch_add_explicit(&sess_stats.carried_full[DDP_EVENT_CPU], 1, memory_order_relaxed);
    if (r == PROD_OK)
        atomic_fetch_add_explicit(&s->cpu_sampled, weight, memory_order_relaxed);
    atomic_fetch_add_explicit(&sess_stats.handler_ns, (uint64_t)(ddp_now_ns() - t0), memory_order_relaxed);
    atomic_fetch_add_explicit(&sess_stats.handler_calls, 1, memory_order_relaxed);
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
static void cpu_prof_check(void)
{
    if (!prof_installed || atomic_load(&sess_stats.prof_replaced) || prof_is_ours())
        return;
    atomic_store(&sess_stats.prof_replaced, 1);
    int n = atomic_load(&sess_nslots);
    for (int i = 0; i < n && i < MAX_SLOTS; i++)
        timer_disarm(&sess_slots[i]);
}

/* A thread whose timer lags (it ran 2 periods of CPU past its last accounting; 10 with native
 * frames or in a subinterpreter) is sampled by the sampler thread itself: a walk of its frames through safe reads, as a WALL sample's,
 * weighing the CPU since its last accounting (with native frames on, its stack ends in a cut:
 * its native frames are its own handler's to see).  Only a thread that ran since the previous read
 * and that /proc says is running or runnable (not in a syscall): its frames are where it is
 * burning CPU.  No signal: a SIGPROF sent after that read could find the thread gone to sleep
 * meanwhile and cut a C extension's poll, select or nanosleep short (EINTR, never restarted
 * by SA_RESTART).  The pread (~5 us) is paid only for a lagging thread. */
static void cpu_kick_check(slot_t *s, int64_t cpu_now, int64_t cpu_prev)
{
    if (!s->has_timer || cpu_now < 0 || cpu_prev < 0 || cpu_now <= cpu_prev || atomic_load(&sess_stats.prof_replaced) ||
        atomic_load(&s->excluded))
        return;
    /* A walk from outside sees no native frames, nor a subinterpreter's (the thread state it runs
     * in is its own thread-local): when samples carry them, a lag is left to the thread's next
     * signal (its sample weighs the lag too) unless its signals are not coming.  Native threads
     * alone need a Python thread's native frames only to see which library it is inside, which
     * its other samples and the blocked walks say as well: the usual lag. */
    int64_t lag = sess_cfg.native_frames || atomic_load_explicit(&s->in_subinterp, memory_order_relaxed) ? 10 : 2;
    int64_t acct = atomic_load(&s->cpu_acct_ns);
    if (acct <= 0 || cpu_now - acct < lag * sess_cfg.interval_ns)
        return;
    if (!thread_runnable(atomic_load(&s->tid)))
        return;
    /* The CPU from acct to cpu_now is this sample's, unless the thread's handler accounted it
     * meanwhile (the exchange there makes this fail) */
    if (!atomic_compare_exchange_strong(&s->cpu_acct_ns, &acct, cpu_now))
        return;
    int64_t weight = cpu_now - acct;
    int mode = atomic_load(&ddp_read_mode_now);
    int r = produce_outside(s, DDP_EVENT_CPU, weight, DDP_STATE_CPU, mode, ddp_now_ns());
    if (r == PROD_OK) {
        atomic_fetch_add_explicit(&s->cpu_sampled, weight, memory_order_relaxed);
        atomic_fetch_add_explicit(&sess_stats.cpu_kicks, 1, memory_order_relaxed);
    } else {
        /* torn or full: the weight back to the thread's next sample (acct moves back by it,
         * whatever the handler exchanged since) */
        atomic_fetch_sub(&s->cpu_acct_ns, weight);
        if (r == PROD_FULL)
            atomic_fetch_add_explicit(&sess_stats.carried_full[DDP_EVENT_CPU], 1, memory_order_relaxed);
    }
}

/* Threads that exited (or left Python) during the session, with the CPU their clocks said
 * they used in it: their slots serve new threads, and the calibration at stop must still
 * see them, or a short worker keeps only what its timer's signals carried.  Grown as needed
 * (sampler thread only; a session of thread-per-task churn has as many as it had threads);
 * one that cannot be kept (no memory) is counted. */
typedef struct {
    int32_t tid;
    int64_t used, sampled;
} exited_t;
static exited_t *exited;
static int n_exited, cap_exited;

static void cpu_begin(void)
{
    rng_state = (uint64_t)ddp_now_ns() ^ ((uint64_t)sess_pid << 32) ^ 0x9E3779B97F4A7C15ULL;
    if (!rng_state)
        rng_state = 1;
    n_exited = 0;
}

static void keep_exited(int32_t tid, int64_t used, int64_t sampled)
{
    if (n_exited == cap_exited) {
        int cap = cap_exited ? cap_exited * 2 : 1024;
        exited_t *grown = cap > 0 ? realloc(exited, sizeof *exited * (size_t)cap) : NULL;
        if (!grown) {
            sess_stats.cpu_exits_dropped++;
            return;
        }
        exited = grown;
        cap_exited = cap;
    }
    exited[n_exited++] = (exited_t){ tid, used, sampled };
}

/* A thread's CPU that no sample carried, on the stack where its own code began (the start
 * hook's record): 1 when written. */
static int emit_at_start(slot_t *s, int64_t ns)
{
    if (ns <= 0 || !atomic_load_explicit(&s->start_ready, memory_order_acquire))
        return 0;
    const ddp_record *p = s->start_rec;
    size_t ticket;
    ddp_record *rec = ddp_ring_reserve(sess_ring, &ticket);
    if (!rec) {
        atomic_fetch_add_explicit(&sess_stats.dropped_full[DDP_EVENT_CPU], 1, memory_order_relaxed);
        return 0;
    }
    memcpy(rec, p, sizeof(ddp_record) + (size_t)p->depth * sizeof(ddp_frame));
    rec->value = ns;
    rec->ts_ns = ddp_now_ns();
    ddp_ring_publish(sess_ring, ticket);
    atomic_fetch_add_explicit(&sess_stats.samples[DDP_EVENT_CPU], 1, memory_order_relaxed);
    sess_stats.cpu_at_start++;
    sess_stats.cpu_at_start_ns += ns;
    return 1;
}

/* Its CPU from cpu_base_ns to `now`: kept with the exited threads', on its start stack when
 * no sample carried any of it. */
static void account_exit(slot_t *s, int64_t now)
{
    int64_t sampled = atomic_exchange(&s->cpu_sampled, 0);
    if (now < s->cpu_base_ns)
        return;
    int64_t used = now - s->cpu_base_ns;
    if (sampled <= 0 && emit_at_start(s, used))
        sampled = used;
    keep_exited(atomic_load(&s->tid), used, sampled);
}

static void cpu_thread_left(slot_t *s)
{
    if (!s->cpu_counted)
        return;
    s->cpu_counted = 0;
    int64_t now = s->cpu_seen_ns, at_exit = atomic_load(&s->exit_cpu_ns);
    if (!s->dead) { /* alive, out of Python: its clock still reads */
        int64_t c = thread_cpu_ns(s);
        if (c >= 0)
            now = c;
    } else if (at_exit > now) {
        now = at_exit; /* its own last read, later than the sampler's */
    }
    account_exit(s, now);
    s->exit_done = s->dead;
    s->cpu_first_ns = 0; /* back in Python later: a new base */
    s->cpu_left = 1;
}

static void cpu_thread_exited_unseen(slot_t *s)
{
    int64_t at_exit = atomic_load(&s->exit_cpu_ns);
    /* (one a scan found is the registry's: timer or not, as any thread) */
    if (s->exit_done || s->cpu_counted || s->cpu_first_ns || s->cpu_left || at_exit <= 0 ||
        atomic_load(&sess_stats.prof_replaced) || atomic_load(&s->excluded))
        return;
    s->exit_done = 1;
    s->cpu_base_ns = 0; /* born during the session: the start hook saw it begin */
    account_exit(s, at_exit);
}

static int cpu_prof_foreign(void)
{
    struct sigaction cur;
    sigaction(SIGPROF, NULL, &cur);
    /* (our own handler, put back by a tool that saved it while we ran, is no one else's) */
    return (cur.sa_flags & SA_SIGINFO) ? cur.sa_sigaction != NULL && cur.sa_sigaction != on_sigprof
                                       : (cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN);
}

static int cpu_prof_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigprof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGPROF, &sa, &old_prof) != 0) {
        ddp_set_errno(errno);
        return DDP_ESYS;
    }
    prof_installed = 1;
    return DDP_OK;
}

static void cpu_prof_forget(void)
{
    if (prof_installed) {
        sigaction(SIGPROF, &old_prof, NULL);
        prof_installed = 0;
    }
}

static void cpu_prof_stop(void)
{
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
            atomic_store(&sess_stats.prof_replaced, 1);
        }
        prof_installed = 0;
    }
    for (int spins = 0; atomic_load(&in_handler) && spins < 1000000; spins++)
        sched_yield();
}


/* What the CPU timers' signals accounted against what the threads' clocks say they
 * used: a kernel that checks CPU timers only at ticks the thread is on CPU for (an
 * overloaded machine or VM) delivers late, coalesced or no signals (seen: none for
 * 0.1 s of CPU beside CPU hogs on 2 vCPUs); the engine says so in a note. */
static void cpu_totals_at_stop(void)
{
    int n = atomic_load(&sess_nslots);
    if (n > MAX_SLOTS)
        n = MAX_SLOTS;
    for (int i = 0; sess_slots && i < n; i++) /* started and ended since the sampler's last tick */
        if (!atomic_load(&sess_slots[i].active) && atomic_load(&sess_slots[i].start_ready))
            cpu_thread_exited_unseen(&sess_slots[i]);
    for (int i = 0; sess_slots && i < n; i++) {
        slot_t *s = &sess_slots[i];
        s->cpu_used_stop = 0;
        if (!s->cpu_counted || s->cpu_first_ns <= 0)
            continue;
        int64_t now = s->has_timer ? thread_cpu_ns(s) : -1;
        if (now < 0) /* exited since the last tick: its own last read, else the sampler's */
            now = atomic_load(&s->exit_cpu_ns) > s->cpu_seen_ns ? atomic_load(&s->exit_cpu_ns) : s->cpu_seen_ns;
        if (now >= s->cpu_base_ns) {
            s->cpu_used_stop = now - s->cpu_base_ns;
            sess_stats.cpu_used_ns += s->cpu_used_stop;
            sess_stats.cpu_sampled_ns += atomic_load_explicit(&s->cpu_sampled, memory_order_relaxed);
        }
    }
    for (int i = 0; i < n_exited; i++) {
        sess_stats.cpu_used_ns += exited[i].used;
        sess_stats.cpu_sampled_ns += exited[i].sampled;
    }
}

/* ---- the engine ---------------------------------------------------------------------------- */
static int cpu_start(const ddp_config *cfg)
{
    (void)cfg;
    if (cpu_prof_foreign())
        return DDP_ESIGNAL;
    cpu_begin();
    int rc = cpu_prof_install();
    if (rc != DDP_OK)
        return rc;
    started = 1;
    atomic_store(&cpu_on, 1);
    thread_start_hook_on(); /* (without it, threads are found by the scan alone) */
    if (sess_cfg.native_threads)
        masked_look_at_start();
    return DDP_OK;
}

static void cpu_stop(void)
{
    if (!started) {
        n_exited = 0; /* (the totals read after a session without CPU are empty) */
        return;
    }
    thread_start_hook_off();
    atomic_store(&cpu_on, 0); /* no handler samples or exit is read past the totals */
    cpu_totals_at_stop();
    int n = atomic_load(&sess_nslots);
    for (int i = 0; sess_slots && i < n && i < MAX_SLOTS; i++)
        timer_disarm(&sess_slots[i]);
    cpu_prof_stop();
    started = 0;
}

/* Each tick: our handler still ours; in CPU-only sessions (the wall sampler reads each
 * thread's clock anyway otherwise: thread_clock), each thread the latest scan found has its
 * clock read, for the case it exits before stop, and a lagging timer kicked; threads that
 * run no Python. */
static void cpu_tick(int64_t now, int final)
{
    if (!final) {
        cpu_prof_check(); /* one sigaction syscall */
        uint32_t gen = registry_scan();
        int n = atomic_load(&sess_nslots);
        for (int i = 0; !(sess_cfg.events & (1u << DDP_EVENT_WALL)) && i < n && i < MAX_SLOTS; i++) {
            slot_t *s = &sess_slots[i];
            if (!s->has_timer || s->seen_gen != gen || !atomic_load(&s->active) || atomic_load(&s->excluded))
                continue;
            int64_t c = thread_cpu_ns(s);
            cpu_kick_check(s, c, s->cpu_seen_ns);
            if (c >= 0)
                s->cpu_seen_ns = c;
        }
    }
    osthreads_tick(now, final);
}

static int cpu_emitting(void) { return atomic_load(&in_handler) || thread_exits_inside(); }

static void cpu_after_fork(void)
{
    /* POSIX: the child has no timers; our handler goes (no signal of ours comes). */
    cpu_prof_forget();
    atomic_store(&in_handler, 0);
    atomic_store(&cpu_on, 0);
    started = 0;
    osthreads_after_fork();
}

static void cpu_thread_gone(slot_t *s)
{
    cpu_thread_left(s);
    timer_disarm(s);
}

const ddp_engine ddp_cpu_engine = {
    .name = "cpu",
    .events = 1u << DDP_EVENT_CPU,
    .with_gil = 1, /* the handler in place before the session turns active and timers are armed */
    .fast_ticks = 1,
    .start = cpu_start,
    .stop = cpu_stop,
    .tick = cpu_tick,
    .emitting = cpu_emitting,
    .after_fork = cpu_after_fork,
    .thread_seen = timer_arm,
    .thread_left = cpu_thread_gone,
    .thread_ended_unseen = cpu_thread_exited_unseen,
    .thread_clock = cpu_kick_check,
};

int ddp_cpu_thread_totals(int32_t *tid, int64_t *used, int64_t *sampled, int cap)
{
    if (cap < 0 || (cap && (!tid || !used || !sampled)))
        return DDP_EINVAL;
    if (atomic_load(&sess_state) != ST_STOPPED || !sess_slots)
        return DDP_ENOTRUNNING;
    int n = 0, ns = atomic_load(&sess_nslots);
    for (int i = 0; i < ns && i < MAX_SLOTS; i++) {
        slot_t *s = &sess_slots[i];
        if (s->cpu_used_stop <= 0)
            continue;
        if (n < cap) {
            tid[n] = atomic_load(&s->tid);
            used[n] = s->cpu_used_stop;
            sampled[n] = atomic_load(&s->cpu_sampled);
        }
        n++;
    }
    for (int i = 0; i < n_exited; i++, n++) /* a tid may repeat (it left Python and came back) */
        if (n < cap) {
            tid[n] = exited[i].tid;
            used[n] = exited[i].used;
            sampled[n] = exited[i].sampled;
        }
    return n;
}
