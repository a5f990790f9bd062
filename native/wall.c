/* wall.c — the wall engine: WALL samples of every registered thread.
 *
 * Each tick of the wall thread (sampler_thread.c) it samples up to N registered threads
 * (round-robin) through safe reads, without the GIL and without signalling them.  Weight =
 * wall time since that thread's previous wall sample, so skipped or torn ticks never lose time.
 *
 * With native frames, a blocked thread's sample carries the native frames it waits in, unwound
 * from outside (unwind.c) from the sp and pc of its /proc syscall line.  A thread inside another
 * interpreter (3.13+) has that interpreter's frames above its own, found in its thread list.
 *
 * Idle threads (a notebook kernel has 6-10, nearly all blocked) are cheap: a thread whose
 * CPU clock has not moved since its last wall sample has not run, so its frames, state and
 * GC flag cannot have changed (only a thread changes its own frame chain): the last sample
 * is reused without a walk or a /proc read.  Consecutive identical samples of a thread in
 * one time bucket (cfg.merge_tick_ns) are merged into one record, count and value summed;
 * the bucket is the Profile's own time tick at that elapsed time, and ticks only coarsen
 * as the profile grows, so the Profile is the same as with one record per sample.  Merged
 * records go into the aggregate directly (agg_add_direct), the ring only when it is busy or
 * full.
 *
 * An engine of the table (ddp_wall_engine): the registry tells it of threads joining
 * (thread_joined), and the CPU clock it reads per sample goes to the engines that want it
 * (thread_clock: the CPU engine's lagging timers), so it names neither.
 *
 * Includes: core.h.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include "core.h"

#define DEFAULT_WALL_PER_TICK 64

static ddp_record *scratch; /* the record a sample is walked into (the wall thread's) */
static int cursor;          /* round-robin: the slot the next tick starts at */

/* Thread state without signalling it: CPU clock progress first, /proc syscall if idle (whose
 * line also gives a blocked thread's sp and pc: *pc 0 when it does not). */
static int thread_state_of(slot_t *s, int64_t dwall, int64_t cpu_now, uint64_t *sp, uint64_t *pc)
{
    *pc = 0;
    int64_t dcpu = (cpu_now >= 0 && s->last_cpu_ns >= 0) ? cpu_now - s->last_cpu_ns : -1;
    if (dcpu >= 0 && dwall > 0 && dcpu * 2 >= dwall)
        return DDP_STATE_CPU;
    char buf[256];
    if (task_syscall_line(atomic_load(&s->tid), buf, sizeof buf) <= 0)
        return DDP_STATE_OFFCPU;
    if (!strncmp(buf, "running", 7))
        return DDP_STATE_CPU;
    if (!task_syscall_regs(buf, sp, pc))
        *pc = 0;
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
static int wall_flush(slot_t *s)
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
           a->interp == b->interp &&
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
    engines_thread_clock(s, cpu_now, s->last_cpu_ns);
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
    int walk_again = 0;
    if (unchanged) {
        atomic_fetch_add_explicit(&sess_stats.wall_unchanged, 1, memory_order_relaxed);
    } else {
        rec = *scratch;
        memset(rec, 0, sizeof *rec);
        rec->event = DDP_EVENT_WALL;
        uint64_t sp, pc;
        rec->state = (uint8_t)thread_state_of(s, dwall, cpu_now, &sp, &pc);
        rec->tid = atomic_load_explicit(&s->tid, memory_order_relaxed);
        /* The thread runs on while we read it, so its label is read right before its
         * frames (not before the state above, whose /proc read can take 50 us), and again
         * after them: if it changed (this thread was preempted during the walk, and an
         * asyncio task's step ended meanwhile), label and frames are of different moments
         * (the idle loop under the task's labels): read both again, so they are of one;
         * a thread that changes labels faster than we can walk it (ASan) is a torn read. */
        rec->label_id = label_of(s);
        /* inside another interpreter (3.13+): its frames above the thread's own, as in its CPU samples */
        int torn = walk_into_running(rec, WALK_ABOVE_FIND, tstate, atomic_load(&ddp_read_mode_now)) < 0;
        for (int tries = 0; !torn; tries++) {
            uint64_t now_label = label_of(s);
            if (now_label == rec->label_id)
                break;
            if (tries == 2) {
                torn = 1;
                break;
            }
            rec->label_id = now_label;
            torn = walk_into_running(rec, WALK_ABOVE_FIND, tstate, atomic_load(&ddp_read_mode_now)) < 0;
        }
        if (torn) {
            atomic_fetch_add_explicit(&sess_stats.dropped_torn[DDP_EVENT_WALL], 1, memory_order_relaxed);
            return; /* a torn read keeps its time for the next sample */
        }
        /* A blocked thread's native frames, from the registers its syscall line gave (a running
         * one's are known only to its own signal handler: its CPU samples carry them).  Kept only
         * if its clock stood still meanwhile: a thread that ran has left the stack they describe. */
        if (sess_cfg.native_frames && pc) {
            int python_depth = rec->depth;
            /* none before the first tables are built (the session's first ticks): the next
             * sample walks again rather than reuse this one through a long wait */
            walk_again = !append_native_regs(rec, pc, sp, atomic_load(&ddp_read_mode_now));
            if (cpu_now < 0 || thread_cpu_ns(s) != cpu_now)
                cut_record(rec, python_depth);
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
    s->wfresh = fresh && !walk_again;
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

/* ---- the engine ---------------------------------------------------------------------------- */
static int wall_start(const ddp_config *cfg)
{
    (void)cfg;
    cursor = 0;
    if (!scratch && !(scratch = malloc(sess_rec_size)))
        return DDP_ENOMEM;
    return DDP_OK;
}

/* After the wall thread ended: a pending record the aggregate and the ring had no room for
 * at its last tick is lost, and said. */
static void wall_stop(void)
{
    int n = atomic_load(&sess_nslots);
    for (int i = 0; sess_slots && i < n && i < MAX_SLOTS; i++)
        if (sess_slots[i].wpend) {
            atomic_fetch_add_explicit(&sess_stats.dropped_full[DDP_EVENT_WALL], (uint64_t)sess_slots[i].wlast->count,
                                      memory_order_relaxed);
            sess_slots[i].wpend = 0;
        }
    free(scratch);
    scratch = NULL;
}

static void wall_engine_tick(int64_t now, int final)
{
    if (!final) {
        wall_tick(&cursor, &scratch);
        return;
    }
    wall_tick_final(&scratch);
    agg_fill();                   /* room for the last records */
    wall_flush_stale(now, 1);     /* the session ends: every merged sample written */
}

/* A thread sampled from now (new, or back after an absence): what it had pending goes, and
 * its next sample weighs the time from now, its frames walked anew. */
static void wall_thread_joined(slot_t *s, int64_t now)
{
    if (s->wpend)
        wall_flush(s);
    s->wfresh = 0;
    s->last_wall_ns = now;
    s->last_cpu_ns = s->cpu_seen_ns; /* (the registry's read of its clock as it joined) */
}

static void wall_after_fork(void) { scratch = NULL; /* forgotten: the parent's, maybe half freed */ }

const ddp_engine ddp_wall_engine = {
    .name = "wall",
    .events = 1u << DDP_EVENT_WALL,
    .with_gil = 1, /* ready before the wall thread's first tick, its pending records counted after its last */
    .fast_ticks = 1,
    .final_scan = 1, /* threads gone since the last tick leave before the final samples */
    .start = wall_start,
    .stop = wall_stop,
    .tick = wall_engine_tick,
    .after_fork = wall_after_fork,
    .thread_joined = wall_thread_joined,
};
