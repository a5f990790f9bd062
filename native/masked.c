/* masked.c — threads that block SIGPROF, whose CPU timers' signals never come.
 *
 * numexpr's pool blocks every signal in its threads (so that Ctrl-C reaches the main thread),
 * as some C++ and Rust pools do: a timer on such a thread's clock expires, its signal waits
 * pending for good, and its CPU had no sample.  osthreads.c reads each native thread's mask
 * here as it arms it, and records a masked thread's CPU from its clock each tick under its
 * entry point's frames: those come from a walk from outside while the thread waits (pc and
 * sp of its syscall), the only walk such a thread allows.  An idle pool is caught waiting as
 * the session starts, before the cell's work wakes it: a pool that then runs without pause is
 * never caught again, so masked threads are walked then, on the starting thread, and their
 * entry points kept for the sampler thread to take (it starts after).
 *
 * Includes: core.h, unwind.h.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core.h"
#include "unwind.h"

#define STASH_MAX 64
#define STASH_OUTER 4   /* outermost frames kept of each: its entry point */
#define LOOK_MAX 256    /* threads looked at as a session starts, at most */

static struct {
    int32_t tid;
    int n;
    uint64_t outer[STASH_OUTER]; /* leaf first */
} stash[STASH_MAX];
static int n_stash;

static int64_t clock_of(clockid_t c)
{
    struct timespec ts;
    return clock_gettime(c, &ts) == 0 ? (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec : -1;
}

int masks_sigprof(int32_t tid)
{
    char buf[4096];
    if (task_file_read(tid, "status", buf, sizeof buf) <= 0)
        return 0;
    const char *line = strstr(buf, "\nSigBlk:");
    return line && (strtoull(line + 8, NULL, 16) >> (SIGPROF - 1)) & 1;
}

int walk_waiting(int32_t tid, clockid_t clock, int mode, uint64_t *pcs, int max)
{
    char buf[256];
    uint64_t sp, pc;
    uint16_t flags = 0;
    int64_t cpu = clock_of(clock);
    if (cpu < 0 || task_syscall_line(tid, buf, sizeof buf) <= 0 || !task_syscall_regs(buf, &sp, &pc))
        return 0; /* running, or gone */
    int n = uw_unwind_regs(pc, sp, 0, pcs, max, mode, &flags);
    /* (its clock moved: it ran meanwhile, and those registers no longer describe its stack) */
    return n > 0 && !(flags & UW_TRUNCATED) && clock_of(clock) == cpu ? n : 0;
}

void masked_look_at_start(void)
{
    n_stash = 0;
    int fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    int mode = atomic_load(&ddp_read_mode_now), looked = 0;
    int32_t self = my_tid();
    char buf[4096];
    long got;
    while (n_stash < STASH_MAX && looked < LOOK_MAX && (got = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0)
        for (long off = 0; off < got && n_stash < STASH_MAX && looked < LOOK_MAX;) {
            struct dirent64 *d = (struct dirent64 *)(buf + off);
            off += d->d_reclen;
            int32_t tid = d->d_name[0] >= '1' && d->d_name[0] <= '9' ? (int32_t)atoi(d->d_name) : 0;
            if (tid <= 0 || tid == self)
                continue;
            looked++;
            uint64_t pcs[MASKED_WALK];
            int n = masks_sigprof(tid) ? walk_waiting(tid, (clockid_t)((~(unsigned)tid << 3) | 6), mode, pcs,
                                                      MASKED_WALK) : 0;
            if (n <= 0)
                continue;
            int k = n < STASH_OUTER ? n : STASH_OUTER;
            stash[n_stash].tid = tid, stash[n_stash].n = k;
            memcpy(stash[n_stash].outer, pcs + n - k, sizeof *pcs * (size_t)k);
            n_stash++;
        }
    close(fd);
}

int masked_entry_at_start(int32_t tid, uint64_t *pcs)
{
    for (int i = 0; i < n_stash; i++)
        if (stash[i].tid == tid) {
            stash[i].tid = 0; /* taken once: a tid reused later is another thread */
            memcpy(pcs, stash[i].outer, sizeof *pcs * (size_t)stash[i].n);
            return stash[i].n;
        }
    return 0;
}

void masked_after_fork(void) { n_stash = 0; /* the parent's threads */ }
