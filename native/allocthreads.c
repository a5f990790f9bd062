/* allocthreads.c — the threads that run no Python whose C allocations were recorded (nalloc.c
 * with native_threads on): each one's tid and OS name (comm), taken at its first recorded
 * sample of the session, because such a thread (a pool started for one call) is often gone by
 * stop, and the profile names its samples after it.  Its tid is also what tells the Python side
 * that a row's thread ran no Python (engines/native/pools.py).
 *
 * Lock-free and malloc-free: a slot is claimed by one atomic add, filled by its own thread, and
 * read only after stop, once no hook is inside (nalloc.c's emitting count).  A thread beyond
 * the table is refused, so its samples are counted as not recorded rather than left unnamed.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "ddp_internal.h"
#include "alloc.h"

#define ATHREADS_MAX 4096

static struct {
    int32_t tid;
    char comm[16];
} athreads[ATHREADS_MAX];
static _Atomic int athreads_n;  /* slots claimed (may pass ATHREADS_MAX: those claims were refused) */
static _Atomic uint32_t athreads_gen;

/* Per thread: the session it was named in, and whether it got a slot there. */
static DDP_TLS struct {
    uint32_t gen;
    int ok;
} mine;

void ddp_alloc_threads_start(void)
{
    atomic_store(&athreads_n, 0);
    atomic_fetch_add(&athreads_gen, 1); /* every thread is named again at its first sample */
}

int ddp_alloc_thread_seen(void)
{
    uint32_t gen = atomic_load_explicit(&athreads_gen, memory_order_relaxed);
    if (mine.gen == gen)
        return mine.ok ? 0 : -1;
    mine.gen = gen;
    int i = atomic_fetch_add(&athreads_n, 1);
    mine.ok = i < ATHREADS_MAX;
    if (!mine.ok)
        return -1;
    athreads[i].tid = (int32_t)syscall(SYS_gettid);
    memset(athreads[i].comm, 0, sizeof athreads[i].comm);
    prctl(PR_GET_NAME, athreads[i].comm, 0, 0, 0); /* (a syscall: no lock, no allocation) */
    athreads[i].comm[15] = 0;
    return 0;
}

int ddp_alloc_threads(int32_t *tid, char *names, int cap)
{
    if (cap < 0 || (cap && (!tid || !names)))
        return DDP_EINVAL;
    int n = atomic_load(&athreads_n);
    n = n < ATHREADS_MAX ? n : ATHREADS_MAX;
    for (int i = 0; i < n && i < cap; i++) {
        tid[i] = athreads[i].tid;
        memcpy(names + 16 * i, athreads[i].comm, 16);
    }
    return n;
}

int ddp_alloc_threads_refused(void)
{
    int n = atomic_load(&athreads_n);
    return n > ATHREADS_MAX ? n - ATHREADS_MAX : 0;
}
