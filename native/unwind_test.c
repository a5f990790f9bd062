/* unwind_test.c — the unwinder on its own, for tests and benchmarks: a CPU timer (or a
 * signal sent to a thread) whose handler walks the interrupted native stack into a
 * preallocated buffer, and walks from made-up registers.  Not used by sessions.
 *
 * Includes: unwind.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "unwind.h"

#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid
#endif

#define TEST_SAMPLES 8192

typedef struct {
    int32_t depth;
    uint16_t flags;
    int64_t ns;
    uint64_t *pcs;
} test_sample;

static test_sample *samples;
static uint64_t *pc_store;
static int max_depth, test_signo, saferead_here, timer_on;
static _Atomic int n_taken;
static timer_t timer;
static struct sigaction old_action;

static void on_signal(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)si;
    int saved = errno;
    int i = atomic_fetch_add(&n_taken, 1);
    if (i < TEST_SAMPLES) {
        test_sample *s = &samples[i];
        uint16_t flags = 0;
        int64_t t0 = ddp_now_ns();
        s->depth = uw_unwind(uc, s->pcs, max_depth, atomic_load(&ddp_read_mode_now), &flags);
        s->ns = ddp_now_ns() - t0;
        s->flags = flags;
    }
    errno = saved;
}

int ddp_unwind_refresh(void) { return uw_refresh(); }

int ddp_unwind_row(uint64_t pc, int32_t *cfa_reg, int32_t *cfa_off, int32_t *fp_off, int32_t *flags)
{
    const uw_row *r = uw_lookup((uintptr_t)pc);
    if (!r)
        return -1;
    *cfa_reg = r->cfa_reg, *cfa_off = r->cfa_off, *fp_off = r->fp_off, *flags = r->flags;
    return 0;
}

int ddp_test_unwind_start(int signo, int64_t interval_ns, int depth)
{
    if (samples || depth < 1 || depth > 4096)
        return DDP_EINVAL;
    if (uw_refresh() < 0)
        return DDP_ENOMEM;
    samples = calloc(TEST_SAMPLES, sizeof *samples);
    pc_store = calloc((size_t)TEST_SAMPLES * (size_t)depth, sizeof *pc_store);
    if (!samples || !pc_store) {
        free(samples), free(pc_store);
        samples = NULL, pc_store = NULL;
        return DDP_ENOMEM;
    }
    for (int i = 0; i < TEST_SAMPLES; i++)
        samples[i].pcs = pc_store + (size_t)i * (size_t)depth;
    max_depth = depth, test_signo = signo;
    atomic_store(&n_taken, 0);
    ddp_saferead_set_pid(getpid());
    saferead_here = ddp_saferead_install() == 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(signo, &sa, &old_action) != 0)
        return DDP_ESIGNAL;
    if (interval_ns > 0) { /* a CPU timer on the calling thread */
        struct sigevent sev;
        memset(&sev, 0, sizeof sev);
        sev.sigev_notify = SIGEV_THREAD_ID;
        sev.sigev_signo = signo;
        sev.sigev_notify_thread_id = (int)syscall(SYS_gettid);
        if (timer_create(CLOCK_THREAD_CPUTIME_ID, &sev, &timer) != 0)
            return DDP_ETIMER;
        struct itimerspec its = { { interval_ns / 1000000000, interval_ns % 1000000000 },
                                  { interval_ns / 1000000000, interval_ns % 1000000000 } };
        timer_settime(timer, 0, &its, NULL);
        timer_on = 1;
    }
    return DDP_OK;
}

int ddp_test_unwind_signal(int32_t tid) { return (int)syscall(SYS_tgkill, getpid(), tid, test_signo); }

int ddp_test_unwind_stop(void)
{
    if (!samples)
        return DDP_ENOTRUNNING;
    if (timer_on)
        timer_delete(timer);
    timer_on = 0;
    sigaction(test_signo, &old_action, NULL);
    if (saferead_here)
        ddp_saferead_uninstall();
    saferead_here = 0;
    return atomic_load(&n_taken) < TEST_SAMPLES ? atomic_load(&n_taken) : TEST_SAMPLES;
}

/* Sample i of the last run: its depth (pcs copied, leaf first), -1 when there is none. */
int ddp_test_unwind_get(int i, uint64_t *pcs, int cap, int32_t *flags, int64_t *ns)
{
    int n = atomic_load(&n_taken);
    if (!samples || i < 0 || i >= n || i >= TEST_SAMPLES)
        return -1;
    int d = samples[i].depth < cap ? samples[i].depth : cap;
    memcpy(pcs, samples[i].pcs, (size_t)d * sizeof *pcs);
    *flags = samples[i].flags;
    *ns = samples[i].ns;
    return d;
}

void ddp_test_unwind_free(void)
{
    free(samples), free(pc_store);
    samples = NULL, pc_store = NULL;
}

int ddp_test_unwind_regs(uint64_t pc, uint64_t sp, uint64_t fp, uint64_t *pcs, int max, int32_t *flags)
{
    ddp_saferead_set_pid(getpid());
    int here = ddp_saferead_install() == 1;
    uint16_t f = 0;
    int d = uw_unwind_regs(pc, sp, fp, pcs, max, atomic_load(&ddp_read_mode_now), &f);
    if (here)
        ddp_saferead_uninstall();
    *flags = f;
    return d;
}
