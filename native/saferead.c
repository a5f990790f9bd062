/* saferead.c — reads of memory that may have been freed or unmapped, without crashing.
 *
 * Two ways, both async-signal-safe:
 * - GUARDED (default): plain loads under a per-thread guard.  Our SIGSEGV/SIGBUS handler
 *   siglongjmps back to the guard when the faulting thread has one armed (the idea of
 *   async-profiler's safeAccess / echion's sigsetjmp page copies); any other fault is
 *   passed to the handler that was installed before ours, exactly as if we were absent.
 *   Cost: a load.
 * - SYSCALL: process_vm_readv(getpid()) returns EFAULT for a bad address.  A syscall per
 *   read, so it is the fallback: when someone replaces our fault handler while we sample
 *   (checked every sample and every wall tick) the session switches to it for good.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
#include "ddp_internal.h"

DDP_TLS ddp_guard *volatile ddp_tls_guard;
_Atomic int ddp_read_mode_now = DDP_READ_GUARDED;
_Atomic int ddp_segv_replaced;
_Atomic uint64_t ddp_fault_count;

static struct sigaction old_segv, old_bus;
static int installed;
static int my_pid;

void ddp_saferead_set_pid(int pid) { my_pid = pid; }

/* Addresses no heap or stack object can have (NULL page, non-canonical): refuse early. */
static inline int plausible(uintptr_t src, size_t n)
{
    return src >= 4096 && src + n >= src && src + n <= 0x800000000000ULL;
}

/* Sanitizer builds: the guarded copy reads memory that may be freed or unmapped on
 * purpose (a fault is recovered by the guard), so it must not be instrumented, and a
 * volatile byte loop keeps the compiler from turning it back into an (intercepted) memcpy. */
#if defined(__SANITIZE_ADDRESS__)
__attribute__((no_sanitize_address, no_sanitize("undefined")))
static void raw_copy(void *dst, const void *src, size_t n)
{
    const volatile unsigned char *s = src;
    unsigned char *d = dst;
    for (size_t i = 0; i < n; i++)
        d[i] = s[i];
}
#else
#define raw_copy memcpy
#endif

void ddp_guarded_copy(void *dst, uintptr_t src, size_t n)
{
    ddp_guard *g = ddp_tls_guard;
    g->lo = src;
    g->hi = src + n;
    DDP_BARRIER();
    raw_copy(dst, (const void *)src, n);  /* a fault here longjmps to the armed guard */
    DDP_BARRIER();
    g->lo = g->hi = 0;
}

int ddp_safe_read(void *dst, uintptr_t src, size_t n, int mode)
{
    if (!plausible(src, n))
        return -1;
    if (mode == DDP_READ_GUARDED && ddp_tls_guard) {
        ddp_guarded_copy(dst, src, n);
        return 0;
    }
    struct iovec local = { dst, n }, remote = { (void *)src, n };
    ssize_t got = process_vm_readv(my_pid ? my_pid : getpid(), &local, 1, &remote, 1, 0);
    return got == (ssize_t)n ? 0 : -1;
}

/* Another process's memory (a dump or a sampling from outside, ddp_remote_* in pyremote.c):
 * process_vm_readv on its pid, which needs ptrace rights over it.  -1 on any failure, errno
 * kept for the caller to name (EPERM: no rights; ESRCH: it exited; EFAULT: not mapped). */
int ddp_remote_read(int pid, void *dst, uintptr_t src, size_t n)
{
    if (!plausible(src, n)) {
        errno = EFAULT;
        return -1;
    }
    struct iovec local = { dst, n }, remote = { (void *)src, n };
    ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got == (ssize_t)n)
        return 0;
    if (got >= 0)
        errno = EFAULT; /* a partial read: the range ends in an unmapped page */
    return -1;
}

static int is_ours(int sig);

static void chain(struct sigaction *old, int sig, siginfo_t *si, void *uc)
{
    if (old->sa_flags & SA_SIGINFO) {
        if (old->sa_sigaction) {
            old->sa_sigaction(sig, si, uc);
            return;
        }
    } else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
        old->sa_handler(sig);
        return;
    }
    /* Default action, for an ignored fault too (returning would re-run the faulting
     * instruction forever; the kernel itself forces the default on an ignored fault): put
     * it back and let the faulting instruction fault again. */
    signal(sig, SIG_DFL);
}

static void on_fault(int sig, siginfo_t *si, void *uc)
{
    ddp_guard *g = ddp_tls_guard;
    uintptr_t at = si ? (uintptr_t)si->si_addr : 0;
    if (g && at >= g->lo && at < g->hi) {
        ddp_tls_guard = NULL;
        atomic_fetch_add_explicit(&ddp_fault_count, 1, memory_order_relaxed);
        siglongjmp(g->jb, 1);
    }
    /* Not ours.  The handler we chain to may itself chain back to us (a tool that saved ours
     * while we ran, then had ours put back and saved again: faulthandler enable/disable
     * around our sessions), and each return re-runs the faulting instruction: the same
     * fault over and over on this thread is that loop, and ends in the default action. */
    static DDP_TLS uintptr_t last_at;
    static DDP_TLS int repeats;
    repeats = at == last_at ? repeats + 1 : 1;
    last_at = at;
    if (repeats > 8) {
        signal(sig, SIG_DFL);
        return;
    }
    chain(sig == SIGBUS ? &old_bus : &old_segv, sig, si, uc);
}

int ddp_saferead_install(void)
{
    if (installed)
        return 0; /* never save our own handler as "the previous one" */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    /* NODEFER: after the longjmp the fault signal must not stay blocked. */
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    /* A handler of ours already there was put back by a tool that saved it while we ran
     * (faulthandler.enable() then disable() after our stop): what we chain to is still what
     * we saved before, and saving ours as "the previous one" would make a real fault loop
     * back into us forever. */
    int segv = !is_ours(SIGSEGV), bus = !is_ours(SIGBUS);
    if (segv && sigaction(SIGSEGV, &sa, &old_segv) != 0)
        return -1;
    if (bus && sigaction(SIGBUS, &sa, &old_bus) != 0) {
        if (segv)
            sigaction(SIGSEGV, &old_segv, NULL);
        return -1;
    }
    installed = 1;
    atomic_store(&ddp_segv_replaced, 0);
    return 1;
}

static int is_ours(int sig)
{
    struct sigaction cur;
    if (sigaction(sig, NULL, &cur) != 0)
        return 0;
    return (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_fault;
}

int ddp_saferead_check(void)
{
    if (!installed)
        return 0;
    if (is_ours(SIGSEGV) && is_ours(SIGBUS))
        return 1;
    /* Someone replaced us: from now on every read goes through the syscall. */
    atomic_store(&ddp_read_mode_now, DDP_READ_SYSCALL);
    atomic_store(&ddp_segv_replaced, 1);
    return 0;
}

int ddp_saferead_check_segv(void)
{
    /* The per-sample check of the signal handler: one syscall (SIGBUS, far rarer, is
     * checked every wall tick by ddp_saferead_check). */
    if (!installed)
        return 0;
    if (is_ours(SIGSEGV))
        return 1;
    atomic_store(&ddp_read_mode_now, DDP_READ_SYSCALL);
    atomic_store(&ddp_segv_replaced, 1);
    return 0;
}

void ddp_saferead_uninstall(void)
{
    if (!installed)
        return;
    /* Restore only what is still ours: a handler installed after us stays. */
    if (is_ours(SIGSEGV))
        sigaction(SIGSEGV, &old_segv, NULL);
    if (is_ours(SIGBUS))
        sigaction(SIGBUS, &old_bus, NULL);
    installed = 0;
}

void ddp_saferead_after_fork_child(void)
{
    ddp_saferead_uninstall();
    ddp_tls_guard = NULL;
    my_pid = getpid();
}
