/* records.c — producing records: a thread's frames into a ring record, from any producer.
 *
 * The CPU handler, the wall thread and the engines' hooks (ddp_emit_own, ddp_emit_for) all
 * write a record the same way: reserve a ring cell, fill it, walk the frames into it (under
 * a fault guard or through syscall reads), publish it.  No locks, no malloc: async-signal-safe.
 * Also the time bucket a WALL sample may be merged in (ddp_merge_bucket).
 *
 * Includes: core.h.
 */
#define _GNU_SOURCE
#include <string.h>
#include "core.h"
#include "unwind.h"

/* Stack identity for the consumer (it looks stacks up by this instead of their bytes):
 * every byte of the frames, the depth and the flags that change the stack. */
static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t stack_hash_of(uint16_t flags, int depth, const ddp_frame *f)
{
    const uint64_t k1 = 0x9E3779B97F4A7C15ULL, k2 = 0xC2B2AE3D27D4EB4FULL;
    uint64_t h = k2 ^ ((uint64_t)(flags & (DDP_REC_TRUNCATED | DDP_REC_GC | DDP_REC_MASKED)) << 32) ^ (uint64_t)depth;
    for (int i = 0; i < depth; i++) {
        uint64_t w3 = ((uint64_t)(uint32_t)f[i].lasti << 32) | (uint32_t)f[i].firstlineno;
        h = rotl64(h ^ (f[i].code * k1), 31) * k2;
        h = rotl64(h ^ (f[i].fp * k1), 31) * k2;
        h = rotl64(h ^ (w3 * k1), 31) * k2;
    }
    h ^= h >> 33; /* murmur3's finalizer */
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return h;
}

/* `above`'s frames (a subinterpreter's, which the thread runs now: 0 for none), then
 * `tstate`'s; -1 torn.  (An unreadable `above` leaves the thread's registered frames.)
 * `above` is the calling thread's current one, read by itself: its thread id is not checked
 * (a subinterpreter's thread state made for a call may carry none). */
static int walk_both(uintptr_t above, uintptr_t tstate, long tid, int mode, ddp_frame *frames, uint16_t *f,
                     uint32_t *interp)
{
    /* (found here, under the walk's guard: its reads are plain loads, not syscalls) */
    if (above == WALK_ABOVE_FIND)
        above = ddp_py_subinterp_tstate(tid, mode);
    /* the subinterpreter it runs in: the one above, else its own thread state's (a thread
     * started inside a subinterpreter) */
    *interp = ddp_py_subinterp_number(above ? above : tstate, mode);
    int d = above ? ddp_py_walk(above, 0, mode, frames, sess_cfg.max_depth, f) : 0;
    if (d < 0)
        d = 0, *f = 0;
    if (d >= sess_cfg.max_depth)
        return d;
    int d2 = ddp_py_walk(tstate, tid, mode, frames + d, sess_cfg.max_depth - d, f);
    if (d2 < 0)
        return -1;
    if (ddp_py_gc_on_thread(tstate, mode))
        *f |= DDP_REC_GC;
    return d + d2;
}

/* Walk `tstate`'s frames into rec (depth, flags, stack_hash); 0 ok, -1 torn (flags INVALID). */
int walk_into(ddp_record *rec, uintptr_t tstate, int mode) { return walk_into_running(rec, 0, tstate, mode); }

/* The same, under the frames of `above`: the subinterpreter the thread runs in now. */
int walk_into_running(ddp_record *rec, uintptr_t above, uintptr_t tstate, int mode)
{
    long tid = rec->tid;
    ddp_frame *frames = (ddp_frame *)(rec + 1);
    volatile int depth = -1;
    volatile uint16_t flags = 0;
    volatile uint32_t interp = 0;
    if (mode == DDP_READ_GUARDED) {
        ddp_guard g, *prev = ddp_tls_guard; /* keep an interrupted guard (bench code) intact */
        if (sigsetjmp(g.jb, 0) == 0) {
            DDP_GUARD_ARM(&g);
            uint16_t f = 0;
            uint32_t in = 0;
            depth = walk_both(above, tstate, tid, mode, frames, &f, &in);
            flags = f;
            interp = in;
        } else {
            depth = -1;
        }
        DDP_GUARD_SET(prev);
    } else {
        uint16_t f = 0;
        uint32_t in = 0;
        depth = walk_both(above, tstate, tid, mode, frames, &f, &in);
        flags = f;
        interp = in;
    }
    if (depth < 0) {
        rec->depth = 0;
        rec->flags = DDP_REC_INVALID;
        rec->stack_hash = 0;
        rec->interp = 0;
        return -1;
    }
    rec->interp = interp;
    /* its own stack (a signal handler's or a hook's); with native threads sampled, the
     * native frames say which library a Python thread is inside (osthreads.c) */
    if ((sess_cfg.native_frames || sess_cfg.native_threads) && tid == my_tid())
        depth += uw_append_own(frames + depth, sess_cfg.max_depth - depth, mode);
    rec->depth = (uint16_t)depth;
    rec->flags = flags;
    rec->stack_hash = stack_hash_of(flags, depth, frames);
    return 0;
}

/* After rec's Python frames, the native frames of a blocked thread, from outside: unwound
 * from its syscall's pc and sp (the wall thread read them from /proc) through rec's frames. */
int append_native_regs(ddp_record *rec, uint64_t pc, uint64_t sp, int mode)
{
    ddp_frame *frames = (ddp_frame *)(rec + 1);
    int n = uw_append_regs(pc, sp, frames + rec->depth, sess_cfg.max_depth - rec->depth, mode);
    rec->depth += (uint16_t)n;
    rec->stack_hash = stack_hash_of(rec->flags, rec->depth, frames);
    return n;
}

/* rec's frames cut back to its first `depth` (native frames found stale). */
void cut_record(ddp_record *rec, int depth)
{
    rec->depth = (uint16_t)depth;
    rec->stack_hash = stack_hash_of(rec->flags, depth, (ddp_frame *)(rec + 1));
}

/* native_cut: a sample of another thread, taken from outside while it runs, whose native
 * frames no one can see: with native frames on, its stack ends in a cut (shown as such). */
static int produce_ex(slot_t *s, uintptr_t above, uintptr_t tstate, int event, int64_t count, int64_t weight,
                      uint64_t aux, int tstate_kind, int mode, int64_t ts, int native_cut)
{
    size_t ticket;
    ddp_record *rec = ddp_ring_reserve(sess_ring, &ticket);
    if (!rec)
        return PROD_FULL; /* (counted by the caller: dropped, or carried to a later sample) */
    rec->event = (uint8_t)event;
    rec->state = (uint8_t)tstate_kind;
    rec->tid = atomic_load_explicit(&s->tid, memory_order_relaxed);
    rec->label_id = label_of(s);
    rec->ts_ns = ts;
    rec->count = count;
    rec->value = weight;
    rec->aux = aux;
    rec->reserved = 0;
    int torn = walk_into_running(rec, above, tstate, mode) < 0;
    if (!torn && native_cut && sess_cfg.native_frames && rec->depth < sess_cfg.max_depth) {
        ((ddp_frame *)(rec + 1))[rec->depth] = (ddp_frame){ DDP_NATIVE_CUT, 0, -1, 0 };
        cut_record(rec, rec->depth + 1);
    }
    ddp_ring_publish(sess_ring, ticket);
    if (torn) {
        atomic_fetch_add_explicit(&sess_stats.dropped_torn[event], 1, memory_order_relaxed);
        return PROD_TORN;
    }
    atomic_fetch_add_explicit(&sess_stats.samples[event], 1, memory_order_relaxed);
    return PROD_OK;
}

int produce(slot_t *s, int event, int64_t weight, int tstate_kind, int mode, int64_t ts)
{
    return produce_ex(s, 0, atomic_load_explicit(&s->tstate, memory_order_relaxed), event, 1, weight, 0,
                      tstate_kind, mode, ts, 0);
}

int produce_running(slot_t *s, uintptr_t running, int event, int64_t weight, int tstate_kind, int mode, int64_t ts)
{
    uintptr_t tstate = atomic_load_explicit(&s->tstate, memory_order_relaxed);
    return produce_ex(s, running != tstate ? running : 0, tstate, event, 1, weight, 0, tstate_kind, mode, ts, 0);
}

int produce_outside(slot_t *s, int event, int64_t weight, int tstate_kind, int mode, int64_t ts)
{
    return produce_ex(s, 0, atomic_load_explicit(&s->tstate, memory_order_relaxed), event, 1, weight, 0,
                      tstate_kind, mode, ts, 1);
}

/* A record whose native frames are not the calling thread's own Python walk: `tstate`'s
 * Python frames (0: none, a thread that runs no Python), then `pcs` (leaf first; NULL: the
 * calling thread's own, from its signal handler or a hook).  For osthreads.c.  The calling
 * thread's own `tstate` (one the main interpreter does not list: a thread started inside a
 * subinterpreter) is walked as its own CPU samples are, its native frames after. */
int produce_native(int32_t tid, uintptr_t tstate, uint64_t label, int event, int64_t count, int64_t weight,
                   uint64_t aux, int state, const uint64_t *pcs, int n, int mode, int64_t ts)
{
    return produce_native_flagged(tid, tstate, label, event, count, weight, aux, state, pcs, n, mode, ts, 0);
}

/* ... with record flags of its own (DDP_REC_MASKED) */
int produce_native_flagged(int32_t tid, uintptr_t tstate, uint64_t label, int event, int64_t count, int64_t weight,
                           uint64_t aux, int state, const uint64_t *pcs, int n, int mode, int64_t ts, uint16_t flags)
{
    size_t ticket;
    ddp_record *rec = ddp_ring_reserve(sess_ring, &ticket);
    if (!rec)
        return PROD_FULL;
    rec->event = (uint8_t)event;
    rec->state = (uint8_t)state;
    rec->tid = tid;
    rec->label_id = label;
    rec->ts_ns = ts;
    rec->count = count;
    rec->value = weight;
    rec->aux = aux;
    rec->reserved = 0;
    rec->interp = 0;
    ddp_frame *frames = (ddp_frame *)(rec + 1);
    int depth = 0;
    int own_walked = 0;
    if (tstate) {
        int torn = walk_into(rec, tstate, mode) < 0;
        if (torn) {
            ddp_ring_publish(sess_ring, ticket);
            atomic_fetch_add_explicit(&sess_stats.dropped_torn[event], 1, memory_order_relaxed);
            return PROD_TORN;
        }
        depth = rec->depth;
        own_walked = !pcs && tid == my_tid(); /* (walk_into appended the thread's native frames) */
    }
    int room = sess_cfg.max_depth - depth;
    if (pcs) {
        for (int i = 0; i < n && i < room; i++, depth++)
            frames[depth] = (ddp_frame){ DDP_NATIVE_CODE, pcs[i], -1, 0 };
    } else if (!own_walked) {
        depth += uw_append_own(frames + depth, room, mode);
    }
    if (depth == 0 && sess_cfg.max_depth > 0) /* no table knows its code: one truncated frame */
        frames[depth++] = (ddp_frame){ DDP_NATIVE_CUT, 0, -1, 0 };
    rec->depth = (uint16_t)depth;
    rec->flags = (uint16_t)((tstate ? rec->flags : 0) | flags);
    rec->stack_hash = stack_hash_of(rec->flags, depth, frames);
    ddp_ring_publish(sess_ring, ticket);
    if (count)
        atomic_fetch_add_explicit(&sess_stats.samples[event], 1, memory_order_relaxed);
    return PROD_OK;
}

/* Record an event with the CALLING thread's own stack, from ordinary code (the allocator
 * hook, lock/park wrappers) rather than a signal handler.  The caller's frame chain is
 * stable (only this thread changes it), so the same guarded walk as the CPU handler
 * applies; a SIGPROF arriving meanwhile nests safely (the ring is MPMC, guards nest). */
#define SEGV_CHECK_NS 1000000
static _Atomic int64_t own_segv_checked_ns = INT64_MIN / 2;

int ddp_emit_own(int event, int64_t count, int64_t value, uint64_t aux)
{
    if (!atomic_load_explicit(&ddp_session_active, memory_order_acquire))
        return DDP_ENOTRUNNING;
    if (event < 0 || event >= DDP_EVENT_COUNT || !(sess_cfg.events & (1u << event)))
        return DDP_EINVAL;
    uintptr_t tstate = ddp_py_current_tstate();
    if (!tstate)
        return DDP_EINVAL; /* not a Python thread */
    uint32_t gen = atomic_load_explicit(&sess_gen, memory_order_relaxed);
    int idx = tls_slot;
    /* (a cached slot is checked against our tid: an exited thread's slot serves another) */
    if (tls_gen != gen || (idx >= 0 && atomic_load_explicit(&sess_slots[idx].tid, memory_order_relaxed) != my_tid())) {
        idx = slot_get_or_create(my_tid());
        tls_slot = idx;
        tls_gen = gen;
    }
    if (idx < 0)
        return DDP_ENOMEM;
    slot_t *s = &sess_slots[idx];
    if (atomic_load(&s->excluded))
        return DDP_OK;
    int64_t now = ddp_now_ns();
    int mode = atomic_load(&ddp_read_mode_now);
    /* Our SIGSEGV handler still in place?  One sigaction syscall, at most once per
     * SEGV_CHECK_NS here (not per sample: ALLOC samples come ~2000/s): this walk reads the
     * calling thread's own frames, which it alone changes, so a fault needs corrupt state;
     * the wall thread also checks every tick, and a failed check switches to syscall reads
     * for good. */
    if (mode == DDP_READ_GUARDED && now - atomic_load_explicit(&own_segv_checked_ns, memory_order_relaxed) >= SEGV_CHECK_NS) {
        if (!ddp_saferead_check_segv())
            mode = DDP_READ_SYSCALL;
        else
            atomic_store_explicit(&own_segv_checked_ns, now, memory_order_relaxed);
    }
    /* Inside another interpreter, that interpreter's frames go above the thread's own, as in a
     * CPU sample: the registered thread state is the thread's own (its GIL-state one can be the
     * other interpreter's while it runs there, 3.13+). */
    uintptr_t own = atomic_load_explicit(&s->tstate, memory_order_relaxed);
    if (!own) /* not registered yet (its first events): found in the main interpreter's list */
        own = ddp_py_tstate_of(my_tid(), mode);
    if (!own)
        own = tstate;
    uintptr_t running = ddp_py_running_tstate();
    uintptr_t above = running && running != own ? running : 0;
    int r = produce_ex(s, above, own, event, count, value, aux, DDP_STATE_OFFCPU, mode, now, 0);
    if (r == PROD_FULL)
        atomic_fetch_add_explicit(&sess_stats.dropped_full[event], 1, memory_order_relaxed);
    return r == PROD_OK ? DDP_OK : r == PROD_FULL ? DDP_ENOMEM : DDP_ESYS;
}

int ddp_emit_for(int32_t tid, int event, int64_t count, int64_t value, uint64_t aux, int64_t ts)
{
    if (!atomic_load_explicit(&ddp_session_active, memory_order_acquire) || !sess_slots || !sess_ring)
        return DDP_ENOTRUNNING;
    if (event < 0 || event >= DDP_EVENT_COUNT || !(sess_cfg.events & (1u << event)))
        return DDP_EINVAL;
    int idx = slot_lookup(tid);
    if (idx < 0)
        return DDP_EINVAL;
    slot_t *s = &sess_slots[idx];
    uintptr_t tstate = atomic_load(&s->tstate);
    if (!tstate || atomic_load(&s->excluded))
        return DDP_EINVAL;
    int mode = atomic_load(&ddp_read_mode_now);
    if (mode == DDP_READ_GUARDED && !ddp_saferead_check_segv())
        mode = DDP_READ_SYSCALL;
    int r = produce_ex(s, 0, tstate, event, count, value, aux, DDP_STATE_OFFCPU, mode, ts, 0);
    if (r == PROD_FULL)
        atomic_fetch_add_explicit(&sess_stats.dropped_full[event], 1, memory_order_relaxed);
    return r == PROD_OK ? DDP_OK : r == PROD_FULL ? DDP_ENOMEM : DDP_ESYS;
}

/* The start (ns since session start) of the time bucket a WALL sample at `elapsed` may be
 * merged in: model.tick_for's rule, min_tick * 2**k with at most max_ticks ticks over the
 * elapsed time.  A profile's final tick is tick_for(its duration) >= this, a power-of-two
 * multiple aligned at 0, so samples merged here share one tick of the final Profile. */
static int64_t merge_tick(int64_t elapsed, int64_t min_tick, int32_t max_ticks)
{
    int64_t tick = min_tick;
    while (tick < INT64_MAX / 2 / max_ticks && elapsed > tick * max_ticks)
        tick <<= 1;
    return tick;
}

int64_t ddp_merge_bucket(int64_t elapsed, int64_t min_tick, int32_t max_ticks)
{
    if (min_tick <= 0 || max_ticks <= 0)
        return -1;
    if (elapsed < 0)
        elapsed = 0;
    int64_t tick = merge_tick(elapsed, min_tick, max_ticks);
    return elapsed / tick * tick;
}

int64_t bucket_of(int64_t ts)
{
    return ddp_merge_bucket(ts - sess_stats.start_mono_ns, sess_cfg.merge_tick_ns, sess_cfg.merge_max_ticks);
}

int64_t bucket_under(const ddp_record *r, int64_t last_ts)
{
    int64_t min_tick = sess_cfg.merge_tick_ns, elapsed = r->ts_ns - sess_stats.start_mono_ns;
    int32_t max_ticks = sess_cfg.merge_max_ticks;
    if (min_tick <= 0 || max_ticks <= 0 || (sess_cfg.merge_shadow && r->aux == 1 && r->event == DDP_EVENT_WALL))
        return -1; /* merging off; the merge test's shadow records stay one per sample */
    if (elapsed < 0)
        elapsed = 0;
    int64_t last = last_ts - sess_stats.start_mono_ns;
    int64_t tick = merge_tick(last > elapsed ? last : elapsed, min_tick, max_ticks);
    return elapsed / tick * tick;
}

void records_reset(void) { atomic_store(&own_segv_checked_ns, INT64_MIN / 2); }
