/* sampler_thread.c — the wall thread: the tick that drives the whole session.
 *
 * A pthread (never a Python thread, all async signals blocked, named "ddprof_nb-wall") wakes
 * every interval; each tick it checks our fault handler, rescans the thread registry, runs the
 * started engines' ticks (WALL samples among them), moves the ring's records into the aggregate
 * and pokes the drain.  It names no engine: what it ticks is the table's.  As it ends, the
 * engines' final ticks write what they hold, so stop finds every record in the ring or the
 * aggregates.
 *
 * Includes: core.h.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include "core.h"

#define IDLE_TICK_NS 50000000LL /* the period when no started engine wants a tick every interval (lock/park, alloc) */

static pthread_t sampler_thread;
static int sampler_started;
/* The tick's sleep is a futex wait on this word with an absolute deadline, and stop sets it
 * and wakes the futex: one syscall per tick.  A condition variable cost a second one (glibc
 * wakes its own internal futex as a timed-out waiter leaves) and its bookkeeping: ~10 % of the
 * wall thread's CPU in perf, beside 8 idle threads. */
static _Atomic int wake_stop;

/* Sleep until the CLOCK_MONOTONIC time `deadline` (ns) or a stop; may return early (EINTR,
 * a spurious wake): the caller checks the clock. */
static void sleep_until(int64_t deadline)
{
    struct timespec ts = { deadline / 1000000000LL, deadline % 1000000000LL };
    syscall(SYS_futex, &wake_stop, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, 0, &ts, NULL, FUTEX_BITSET_MATCH_ANY);
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
    uint32_t ticks = 1;
    /* Without CPU or WALL events a tick only notices new threads (a drain wake names them),
     * prefaults the ring and pokes the drain: 20 per second do, and each tick is a thread
     * wake on a possibly busy CPU (lock/park: 35 of 140 context switches a 0.35 s session
     * added to bench_locks' thread pool, 0.9 ms of its 3.8 ms of direct CPU). */
    int64_t period = sess_cfg.interval_ns;
    if (!engines_fast_ticks() && period < IDLE_TICK_NS)
        period = IDLE_TICK_NS;
    int64_t next = ddp_now_ns() + period;
    while (!atomic_load(&wake_stop)) {
        sleep_until(next);
        if (atomic_load(&wake_stop))
            break;
        int64_t t0 = ddp_now_ns();
        if (t0 < next)
            continue; /* woken early: not a tick */
        /* Our SIGSEGV handler every tick (wall reads rely on it), SIGBUS every 16th (one
         * sigaction syscall each; a bus error needs a truncated mapping, far rarer). */
        if (atomic_load(&ddp_read_mode_now) == DDP_READ_GUARDED) {
            if (ticks & 15)
                ddp_saferead_check_segv();
            else
                ddp_saferead_check();
        }
        ticks++;
        registry_tick(t0);
        engines_tick(t0, 0); /* (wall: samples; cpu: our handler checked; waits: objects loaded since hooked) */
        agg_fill();
        drain_poke();
        ddp_ring_prefault(sess_ring); /* pages ahead of the producers, off their path (ring.c) */
        int64_t t1 = ddp_now_ns();
        atomic_fetch_add(&sess_stats.wall_ticks, 1);
        atomic_fetch_add(&sess_stats.wall_ns, (uint64_t)(t1 - t0));
        next += period;
        if (next <= t1)
            next = t1 + period; /* late: skip ticks (weights are time-based) */
    }
    if (engines_final_scan())
        registry_tick(ddp_now_ns()); /* threads gone since the last tick leave first */
    agg_fill();                    /* room for the last records */
    engines_tick(ddp_now_ns(), 1); /* the engines' last records (wall: up to now; waits: since the start) */
    agg_fill();
    task_files_close();
    return NULL;
}

int sampler_thread_start(void)
{
    atomic_store(&wake_stop, 0);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the sampler thread starts with signals blocked */
    int prc = pthread_create(&sampler_thread, NULL, sampler_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (prc == 0)
        sampler_started = 1;
    return prc;
}

void sampler_thread_stop(void)
{
    if (sampler_started) {
        atomic_store(&wake_stop, 1);
        syscall(SYS_futex, &wake_stop, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, INT_MAX, NULL, NULL, 0);
        pthread_join(sampler_thread, NULL);
        sampler_started = 0;
    }
}

void sampler_thread_after_fork(void)
{
    /* POSIX: the child has no sampler thread */
    sampler_started = 0;
    task_files_close(); /* the parent's copies: no thread reads them here */
}
