/* wall.c — the wall thread: WALL samples, and the tick that drives the whole session.
 *
 * A pthread (never a Python thread, all async signals blocked) wakes every interval and
 * samples up to N registered threads (round-robin) through safe reads, without the GIL and
 * without signalling them.  Weight = wall time since that thread's previous wall sample, so
 * skipped or torn ticks never lose time.
 *
 * Idle threads (a notebook kernel has 6-10, nearly all blocked) are cheap: a thread whose
 * CPU clock has not moved since its last wall sample has not run, so its frames, state and
 * GC flag cannot have changed (only a thread changes its own frame chain): the last sample
 * is reused without a walk or a /proc read.  Consecutive identical samples of a thread in
 * one time bucket (cfg.merge_tick_ns) are merged into one record, count and value summed;
 * the bucket is the Profile's own time tick at that elapsed time, and ticks only coarsen
 * as the profile grows, so the Profile is the same as with one record per sample.
 *
 * Each tick also checks our signal handlers, rescans the thread registry, runs the started
 * engines' ticks, moves the ring's records into the aggregate and pokes the drain.  Merged
 * WALL records go into the aggregate directly (agg_add_direct), the ring only when it is
 * busy or full.
 *
 * Includes: core.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core.h"

#define IDLE_TICK_NS 50000000LL /* the sampler thread's period when no event needs ticks (lock/park, alloc) */
#define DEFAULT_WALL_PER_TICK 64

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

/* A thread's /proc/self/task/<tid>/syscall, kept open between reads: opening it costs the
 * wall tick ~3x what a pread of an open one does (path walk, proc inode, seq_file buffer; on
 * the tick's cold caches ~20 us against ~5 us, beside a busy thread that is read each tick
 * on a loaded machine).  At most KEPT_FDS are kept; when they are all in use, a file read
 * in the last second stays and the new thread's is opened and closed per read as before
 * (round-robin evictions among more threads than that would cost an open and a close per
 * read and more).  A kept file names its task, not its tid: once the thread exits, reads
 * fail (ESRCH) and the tid's next thread gets a file of its own.  Each file's identity
 * (device, inode) is checked before we close it, so a descriptor number that code of the
 * process closed and reused for something else is never closed by us. */
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

static void kept_close_all(void)
{
    while (nkept)
        kept_close(&kept[nkept - 1]);
}

/* The thread's syscall line into buf (NUL-terminated), its length; <= 0 when unreadable. */
static ssize_t read_syscall_line(int32_t tid, char *buf, size_t cap)
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

/* 1: the thread is runnable (on a CPU or preempted), not blocked: /proc says "running". */
int thread_runnable(int32_t tid)
{
    char buf[16];
    return read_syscall_line(tid, buf, sizeof buf) > 0 && !strncmp(buf, "running", 7);
}

/* Thread state without signalling it: CPU clock progress first, /proc syscall if idle. */
static int thread_state_of(slot_t *s, int64_t dwall, int64_t cpu_now)
{
    int64_t dcpu = (cpu_now >= 0 && s->last_cpu_ns >= 0) ? cpu_now - s->last_cpu_ns : -1;
    if (dcpu >= 0 && dwall > 0 && dcpu * 2 >= dwall)
        return DDP_STATE_CPU;
    char buf[256];
    if (read_syscall_line(atomic_load(&s->tid), buf, sizeof buf) <= 0)
        return DDP_STATE_OFFCPU;
    if (!strncmp(buf, "running", 7))
        return DDP_STATE_CPU;
    char *end;
    long nr = strtol(buf, &end, 10);
    if (nr == SYS_futex && sess_gil_lo) {
        unsigned long long uaddr = strtoull(end, NULL, 16);
        if (uaddr >= sess_gil_lo && uaddr < sess_gil_hi) /* blocked on the GIL's mutex or condition */
            return DDP_STATE_GIL;
    }
    return DDP_STATE_OFFCPU;
}

/* Write a slot's pending WALL record (count samples) to the aggregate, else to the ring; 0
 * when both are full (the record stays pending: later samples of the thread add to it). */
int wall_flush(slot_t *s)
{
    ddp_record *p = s->wlast;
    if (agg_add_direct(p) != 0) {
        size_t ticket;
        ddp_record *rec = ddp_ring_reserve(sess_ring, &ticket);
        if (!rec)
            return 0;
        memcpy(rec, p, sizeof(ddp_record) + (size_t)p->depth * sizeof(ddp_frame));
        ddp_ring_publish(sess_ring, ticket);
    }
    s->wpend = 0;
    atomic_fetch_add_explicit(&sess_stats.samples[DDP_EVENT_WALL], (uint64_t)p->count, memory_order_relaxed);
    atomic_fetch_add_explicit(&sess_stats.wall_records, 1, memory_order_relaxed);
    return 1;
}

/* Test mode: the sample as its own record (aux 1), to check merged records against. */
static void wall_shadow(const ddp_record *src, int64_t dwall, int64_t now)
{
    size_t ticket;
    ddp_record *rec = ddp_ring_reserve(sess_ring, &ticket);
    if (!rec)
        return;
    memcpy(rec, src, sizeof(ddp_record) + (size_t)src->depth * sizeof(ddp_frame));
    rec->count = 1;
    rec->value = dwall;
    rec->ts_ns = now;
    rec->aux = 1;
    ddp_ring_publish(sess_ring, ticket);
}

static int same_sample(const ddp_record *a, const ddp_record *b)
{
    return a->state == b->state && a->flags == b->flags && a->depth == b->depth && a->label_id == b->label_id &&
           a->stack_hash == b->stack_hash && !memcmp(a + 1, b + 1, (size_t)a->depth * sizeof(ddp_frame));
}

/* Pending records whose bucket is over, or whose thread left, are written now. */
static void wall_flush_stale(int64_t now, int all)
{
    int n = atomic_load(&sess_nslots);
    if (n > MAX_SLOTS)
        n = MAX_SLOTS;
    int64_t bucket = bucket_of(now);
    for (int i = 0; i < n; i++) {
        slot_t *s = &sess_slots[i];
        if (s->wpend && (all || bucket < 0 || s->wpend_bucket != bucket || !atomic_load(&s->active) ||
                         atomic_load(&s->excluded)))
            wall_flush(s);
    }
}

/* One WALL sample of slot s into *scratch (swapped with the slot's wlast when kept). */
static void wall_sample(slot_t *s, ddp_record **scratch)
{
    int64_t now = ddp_now_ns();
    int64_t dwall = now - s->last_wall_ns;
    if (dwall <= 0)
        return;
    if (!s->wlast && !(s->wlast = malloc(sess_rec_size)))
        return; /* no memory: its time carries to a later sample */
    int64_t cpu_now = thread_cpu_ns(s);
    cpu_kick_check(s, cpu_now, s->last_cpu_ns);
    uint64_t label = label_of(s);
    uintptr_t tstate = atomic_load_explicit(&s->tstate, memory_order_relaxed);
    ddp_record *last = s->wlast;
    /* Not run since its last sample: same frames, state and GC flag.  Not when that sample said
     * "cpu": a thread whose clock stood still for a whole tick is not running, and a state judged
     * over a short first interval (registered and sampled in one tick, the thread still starting)
     * would otherwise stick to every sample of a long sleep. */
    int unchanged = s->wfresh && cpu_now >= 0 && cpu_now == s->last_cpu_ns && last->label_id == label &&
                    s->wlast_tstate == tstate && last->state != DDP_STATE_CPU;
    ddp_record *rec = last;
    if (unchanged) {
        atomic_fetch_add_explicit(&sess_stats.wall_unchanged, 1, memory_order_relaxed);
    } else {
        rec = *scratch;
        memset(rec, 0, sizeof *rec);
        rec->event = DDP_EVENT_WALL;
        rec->state = (uint8_t)thread_state_of(s, dwall, cpu_now);
        rec->tid = atomic_load_explicit(&s->tid, memory_order_relaxed);
        /* The thread runs on while we read it, so its label is read right before its
         * frames (not before the state above, whose /proc read can take 50 us), and again
         * after them: if it changed (this thread was preempted during the walk, and an
         * asyncio task's step ended meanwhile), label and frames are of different moments
         * (the idle loop under the task's labels): read both again, so they are of one;
         * a thread that changes labels faster than we can walk it (ASan) is a torn read. */
        rec->label_id = label_of(s);
        int torn = walk_into(rec, tstate, atomic_load(&ddp_read_mode_now)) < 0;
        for (int tries = 0; !torn; tries++) {
            uint64_t now_label = label_of(s);
            if (now_label == rec->label_id)
                break;
            if (tries == 2) {
                torn = 1;
                break;
            }
            rec->label_id = now_label;
            torn = walk_into(rec, tstate, atomic_load(&ddp_read_mode_now)) < 0;
        }
        if (torn) {
            atomic_fetch_add_explicit(&sess_stats.dropped_torn[DDP_EVENT_WALL], 1, memory_order_relaxed);
            return; /* a torn read keeps its time for the next sample */
        }
    }
    if (sess_cfg.merge_shadow)
        wall_shadow(rec, dwall, now);
    int64_t bucket = bucket_of(now);
    int fresh = 1; /* after this sample, wlast holds the thread's current stack */
    if (s->wpend && bucket >= 0 && s->wpend_bucket == bucket && (unchanged || same_sample(last, rec))) {
        last->count += 1;
        last->value += dwall;
        last->ts_ns = now;
    } else if (s->wpend && !wall_flush(s)) {
        /* aggregate and ring full: this sample's time goes to the thread's pending record (its stack
         * stands for both), so the thread's wall total stays exact */
        last->count += 1;
        last->value += dwall;
        last->ts_ns = now;
        atomic_fetch_add_explicit(&sess_stats.carried_full[DDP_EVENT_WALL], 1, memory_order_relaxed);
        fresh = unchanged; /* a new stack was walked and not kept: the pending one is not reusable */
    } else {
        if (!unchanged) {
            s->wlast = rec;
            *scratch = last;
            last = rec;
        }
        last->count = 1;
        last->value = dwall;
        last->ts_ns = now;
        s->wpend = 1;
        s->wpend_bucket = bucket;
        if (bucket < 0)
            wall_flush(s); /* merging off */
    }
    s->wfresh = fresh;
    s->wlast_tstate = tstate;
    s->last_wall_ns = now;
    s->last_cpu_ns = cpu_now;
    if (cpu_now >= 0)
        s->cpu_seen_ns = cpu_now;
}

static void wall_tick(int *cursor, ddp_record **scratch)
{
    wall_flush_stale(ddp_now_ns(), 0);
    int n = atomic_load(&sess_nslots);
    if (n > MAX_SLOTS)
        n = MAX_SLOTS;
    int budget = sess_cfg.wall_threads_per_tick > 0 ? sess_cfg.wall_threads_per_tick : DEFAULT_WALL_PER_TICK;
    int start = n ? *cursor % n : 0;
    for (int k = 0; k < n && budget > 0; k++) {
        int i = (start + k) % n;
        slot_t *s = &sess_slots[i];
        if (!atomic_load(&s->active) || atomic_load(&s->excluded))
            continue;
        budget--;
        wall_sample(s, scratch);
        *cursor = (i + 1) % n;
    }
}

/* At stop: every thread once more, so its wall time runs to the stop and not only to the
 * last tick (a loaded machine spaces ticks out: a run beside two CPU hogs lost 0.2 s of a
 * 1.15 s session this way). */
static void wall_tick_final(ddp_record **scratch)
{
    wall_flush_stale(ddp_now_ns(), 0);
    int n = atomic_load(&sess_nslots);
    if (n > MAX_SLOTS)
        n = MAX_SLOTS;
    for (int i = 0; i < n; i++) {
        slot_t *s = &sess_slots[i];
        if (atomic_load(&s->active) && !atomic_load(&s->excluded))
            wall_sample(s, scratch);
    }
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
    scan_buf *b = malloc(sizeof *b);
    ddp_record *scratch = malloc(sess_rec_size);
    if (!b || !scratch) {
        free(b);
        free(scratch);
        return NULL;
    }
    uint32_t gen = 1; /* 1 was the start-time registration */
    int cursor = 0;
    /* Without CPU or WALL events a tick only notices new threads (a drain wake names them),
     * prefaults the ring and pokes the drain: 20 per second do, and each tick is a thread
     * wake on a possibly busy CPU (lock/park: 35 of 140 context switches a 0.35 s session
     * added to bench_locks' thread pool, 0.9 ms of its 3.8 ms of direct CPU). */
    int64_t period = sess_cfg.interval_ns;
    if (!(sess_cfg.events & ((1u << DDP_EVENT_CPU) | (1u << DDP_EVENT_WALL))) && period < IDLE_TICK_NS)
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
            if (gen & 15)
                ddp_saferead_check_segv();
            else
                ddp_saferead_check();
        }
        cpu_prof_check(); /* one sigaction syscall */
        registry_tick(b, ++gen, t0);
        if (sess_cfg.events & (1u << DDP_EVENT_WALL))
            wall_tick(&cursor, &scratch);
        engines_tick(t0, 0); /* (waits: objects loaded since hooked, threads blocked since the start) */
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
    if (sess_cfg.events & (1u << DDP_EVENT_WALL)) {
        registry_tick(b, ++gen, ddp_now_ns()); /* threads gone since the last tick leave first */
        wall_tick_final(&scratch);
    }
    agg_fill();                        /* room for the last records */
    wall_flush_stale(ddp_now_ns(), 1); /* the session ends: every merged sample written */
    engines_tick(ddp_now_ns(), 1);     /* and the engines' last records (waits since the start) */
    agg_fill();
    for (int i = 0; i < atomic_load(&sess_nslots) && i < MAX_SLOTS; i++)
        if (sess_slots[i].wpend) { /* aggregate and ring stayed full: lost, and said */
            atomic_fetch_add_explicit(&sess_stats.dropped_full[DDP_EVENT_WALL], (uint64_t)sess_slots[i].wlast->count,
                                      memory_order_relaxed);
            sess_slots[i].wpend = 0;
        }
    kept_close_all();
    free(b);
    free(scratch);
    return NULL;
}

int wall_thread_start(void)
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

void wall_thread_stop(void)
{
    if (sampler_started) {
        atomic_store(&wake_stop, 1);
        syscall(SYS_futex, &wake_stop, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, INT_MAX, NULL, NULL, 0);
        pthread_join(sampler_thread, NULL);
        sampler_started = 0;
    }
}

void wall_after_fork(void)
{
    /* POSIX: the child has no sampler thread */
    sampler_started = 0;
    kept_close_all(); /* the parent's copies: no thread reads them here */
}
