/* taskstate.c — what /proc says a thread is doing: its syscall line, runnable or blocked.
 *
 * Read by the wall thread alone (a WALL sample's state, a lagging CPU timer's check).  Each
 * thread's /proc/self/task/<tid>/syscall is kept open between reads: opening it costs the wall
 * tick ~3x what a pread of an open one does (path walk, proc inode, seq_file buffer; on the
 * tick's cold caches ~20 us against ~5 us, beside a busy thread that is read each tick on a
 * loaded machine).  At most KEPT_FDS are kept; when they are all in use, a file read in the
 * last second stays and the new thread's is opened and closed per read (round-robin evictions
 * among more threads than that would cost an open and a close per read and more).  A kept
 * file names its task, not its tid: once the thread exits, reads fail (ESRCH) and the tid's
 * next thread gets a file of its own.  Each file's identity (device, inode) is checked before
 * we close it, so a descriptor number that code of the process closed and reused for
 * something else is never closed by us.
 *
 * Includes: core.h.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core.h"

#define KEPT_FDS 32
#define KEPT_IDLE_NS 1000000000LL /* a kept file unread this long makes room for another */
typedef struct {
    int32_t tid;
    int fd;
    dev_t dev;
    ino_t ino;
    int64_t used; /* last read (ddp_now_ns) */
} kept_fd;
static kept_fd kept[KEPT_FDS]; /* the sampler thread's (and the fork child's handler) */
static int nkept;

static void kept_close(kept_fd *k)
{
    struct stat st;
    if (fstat(k->fd, &st) == 0 && st.st_dev == k->dev && st.st_ino == k->ino)
        close(k->fd);
    *k = kept[--nkept];
}

void task_files_close(void)
{
    while (nkept)
        kept_close(&kept[nkept - 1]);
}

ssize_t task_file_read(int32_t tid, const char *name, char *buf, size_t cap)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/%s", (int)tid, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    return n;
}

ssize_t task_syscall_line(int32_t tid, char *buf, size_t cap)
{
    int64_t now = ddp_now_ns();
    kept_fd *k = NULL;
    for (int i = 0; i < nkept; i++)
        if (kept[i].tid == tid) {
            k = &kept[i];
            break;
        }
    if (k) {
        ssize_t n = pread(k->fd, buf, cap - 1, 0);
        if (n > 0) {
            k->used = now;
            buf[n] = 0;
            return n;
        }
        kept_close(k); /* its task is gone (ESRCH): the tid may be a new thread's */
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = pread(fd, buf, cap - 1, 0);
    if (n <= 0) {
        close(fd);
        return -1;
    }
    buf[n] = 0;
    if (nkept == KEPT_FDS) {
        int old = 0;
        for (int i = 1; i < nkept; i++)
            if (kept[i].used < kept[old].used)
                old = i;
        if (now - kept[old].used > KEPT_IDLE_NS)
            kept_close(&kept[old]);
    }
    struct stat st;
    if (nkept < KEPT_FDS && fstat(fd, &st) == 0)
        kept[nkept++] = (kept_fd){ tid, fd, st.st_dev, st.st_ino, now };
    else
        close(fd);
    return n;
}

/* A syscall line's user registers: "nr a1 .. a6 sp pc" (in a syscall) or "-1 sp pc" (blocked
 * outside one); 0 for "running" or a line that says neither. */
int task_syscall_regs(const char *line, uint64_t *sp, uint64_t *pc)
{
    const char *tok[9];
    int k = 0;
    for (const char *p = line; *p && k < 9;) {
        while (*p == ' ' || *p == '\n')
            p++;
        if (!*p)
            break;
        tok[k++] = p;
        while (*p && *p != ' ' && *p != '\n')
            p++;
    }
    if (k < 3 || !strncmp(line, "running", 7))
        return 0;
    char *end;
    *sp = strtoull(tok[k - 2], &end, 16);
    if (end == tok[k - 2])
        return 0;
    *pc = strtoull(tok[k - 1], &end, 16);
    return end != tok[k - 1] && *sp && *pc;
}

int thread_runnable(int32_t tid)
{
    char buf[16];
    return task_syscall_line(tid, buf, sizeof buf) > 0 && !strncmp(buf, "running", 7);
}
