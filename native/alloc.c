/* alloc.c — engine: allocation samples (ALLOC) of the PyMem MEM and OBJ domains, with the GIL.
 *
 * Each hook layer calls straight through to the allocator installed before it and only looks
 * at the result: blocks carry no header of ours, so a block allocated while profiling and
 * freed after stop (or the reverse) goes to the same allocator.  Both domains require the
 * GIL, which protects the countdowns and the live table (alloclive.c); the RAW domain (no
 * GIL) is not hooked.  A subinterpreter with its own GIL (3.12+) runs these hooks beside the
 * main interpreter's threads: its allocations are sampled on countdowns of their threads' own,
 * recorded with that interpreter's frames and tracked in a live table of their own
 * (subinterp_sample), so the sampling state and the main interpreter's table stay its alone.
 *
 * Sampling is a Poisson process over bytes (allocsample.c): one countdown per thread and hook
 * slot, so the fast path is a generation check, a subtraction in thread-local storage, a sign
 * test and a tail call to the previous allocator; all else is cold and out of line.  A sample
 * records the allocating thread's Python stack (ddp_emit_own); its id lets LIVE refer to it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <Python.h>
#include "ddp_internal.h"
#include "alloc.h"
#include "alloclive.h"
#include "alloctype.h"
#include "engine.h"

#define N_SLOTS 4            /* hook layers per domain (a stale pass-through may stay) */
#define PENDING_TRIES 3      /* next allocations on which a pending type read is retried */
#define COUNTDOWN_IDLE (INT64_MAX / 2) /* a slot with no session: never reaches 0 again */

enum { DOM_MEM = 0, DOM_OBJ = 1 };

/* Layer (d, k) is domain d's hook of slot k: its functions are generated per (d, k) (below),
 * so they reach their previous allocator and their countdown tc.remaining[k] at constant
 * (thread-local) addresses and need no ctx.  The MEM and OBJ layers of one slot share it. */
typedef struct {
    PyMemAllocatorEx prev;   /* what we chain to */
    PyMemAllocatorEx self;   /* what we installed */
    int domain, slot;
    int in_use;              /* installed in the chain (now or left as a pass-through) */
} layer_t;

static layer_t layers[2][N_SLOTS];
static layer_t *top[2];      /* the layers installed by the current session */
static _Atomic int active_slot = -1; /* the slot of the running session, -1 = none */

static struct {
    _Atomic uint64_t sampled, emit_failed, live_overflow, typed, untyped, reentered, sample_ns, type_ns;
    _Atomic uint64_t subinterp_sampled; /* allocations sampled in a subinterpreter */
    int left_installed;
    int unlinked;            /* a domain's hook was taken out of the chain by someone else during the session */
    int reclaimed;           /* layers found out of every chain at start and reused */
} ast;

/* Sampling state, one per process, protected by the GIL like the live table (both hooked
 * domains require it: the main interpreter's hooked calls never run concurrently).  A pending
 * type read (the last sampled OBJ block) is retried at the sampling thread's next allocation,
 * or before any thread's next sample replaces it. */
static struct {
    int busy;                /* re-entry guard (an allocation made by the slow path itself) */
    uintptr_t pending;
    uint64_t pending_id, pending_size;
    int pending_tries;
} smp;

/* Per thread: slot k's countdown, valid while its generation is the slot's (slot_gen[k], bumped
 * by each session on slot k; a thread's first allocation after that draws a fresh gap).  One
 * countdown per thread, not one over all threads' bytes: threads of subinterpreters with their
 * own GIL (3.12+) allocate at the same time as the main interpreter's, and a countdown they
 * shared would be sampled on whichever thread found it below zero, not on the one whose bytes
 * crossed it (two subinterpreter threads allocating hard inflated the main interpreter's
 * estimates 1.5-2x).  The Poisson process is memoryless, so each allocation is still sampled
 * with probability 1 - exp(-s/R), whichever thread makes it.  Initial-exec TLS: a fixed offset
 * from the thread pointer, no call. */
static DDP_TLS struct {
    int64_t remaining[N_SLOTS]; /* bytes to the next sample; forced to 0 while a type read is pending */
    uint32_t gen[N_SLOTS];
    int64_t saved;           /* the real countdown while parked (remaining then counts down from 0) */
    int parked;
    int busy;                /* in a subinterpreter's sample (smp.busy is the main interpreter's) */
    uint64_t rng;
} tc;
static uint32_t slot_gen[N_SLOTS]; /* written at start, with the GIL; read by every hook */

/* 1: the calling thread runs a subinterpreter, which may hold a GIL of its own (3.12+): the
 * hooks' cold paths must not touch state the main interpreter's GIL protects.  Only cold paths
 * ask (a thread-local read and a compare). */
static inline int outside_main_interpreter(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyThreadState *ts = PyThreadState_GetUnchecked();
#elif PY_VERSION_HEX >= 0x030C0000
    PyThreadState *ts = _PyThreadState_UncheckedGet();
#else
    PyThreadState *ts = NULL; /* 3.11: every interpreter shares the one GIL */
#endif
    return ts && ts->interp != PyInterpreterState_Main();
}

/* ---- random gaps (each thread its own generator) ----------------------------------------- */
static inline uint64_t rng_next(void)
{
    uint64_t x = tc.rng; /* xorshift64* */
    if (!x) /* the thread's first draw; a forked child's threads are new threads */
        x = ((uint64_t)ddp_now_ns() ^ ((uint64_t)(uintptr_t)&tc << 16) ^ ((uint64_t)getpid() << 40)) | 1;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    tc.rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static inline double uniform01(void) /* in (0, 1] */
{
    return ((double)(rng_next() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

/* A gap of G bytes (exponential, mean R) as the countdown floor(G): the allocation that takes
 * it below zero is the one whose bytes reach G. */
static inline int64_t draw_gap(void)
{
    double g = -ddp_alloc_mean_gap() * log(uniform01()); /* >= 0 */
    return g > 9e18 ? (int64_t)9e18 : (int64_t)g;
}


static void note_push(uint64_t id, uint64_t size, uintptr_t type)
{
    ddp_alloc_info note = { .id = id, .size = size };
    if (ddp_alloc_type_name(type, note.type_name) != 0)
        return;
    ddp_alloc_note_info(&note);
}


/* The thread's last sampled OBJ block, once its object is initialised. */
static void pending_try(void)
{
    uintptr_t p = smp.pending;
    /* Another thread may have freed it (objects die anywhere): the live table, which every
     * free of the session updates, says whether the block is still ours to read. */
    ddp_live_entry *e = ddp_live_find(p);
    if (!e || e->id != smp.pending_id) {
        smp.pending = 0;
        atomic_fetch_add_explicit(&ast.untyped, 1, memory_order_relaxed);
        return;
    }
    int64_t t0 = ddp_now_ns();
    uintptr_t type = ddp_alloc_block_type(p, smp.pending_size, 0);
    atomic_fetch_add_explicit(&ast.type_ns, (uint64_t)(ddp_now_ns() - t0), memory_order_relaxed);
    if (!type) {
        if (--smp.pending_tries <= 0) {
            smp.pending = 0;
            atomic_fetch_add_explicit(&ast.untyped, 1, memory_order_relaxed);
        }
        return;
    }
    smp.pending = 0;
    atomic_fetch_add_explicit(&ast.typed, 1, memory_order_relaxed);
    e->type = type;
    note_push(smp.pending_id, smp.pending_size, type);
}

/* ---- the sampled path ------------------------------------------------------------------------- */
/* A thread that left a type read pending parks its countdown at 0, so its next allocation takes
 * the slow path and retries the read. */
static inline void park_countdown(int k)
{
    if (!tc.parked) {
        tc.saved = tc.remaining[k];
        tc.remaining[k] = 0;
        tc.parked = 1;
    }
}

static inline void unpark_countdown(int k)
{
    if (tc.parked) {
        tc.remaining[k] += tc.saved; /* what was counted from 0 while parked */
        tc.parked = 0;
    }
}

static inline uint32_t gen_of(int k) { return __atomic_load_n(&slot_gen[k], __ATOMIC_RELAXED); }

/* 1 when this allocation of n bytes at p (NULL: failed), the thread's first on slot k since the
 * slot's session began, is not sampled: the thread's countdown is drawn afresh (from this
 * allocation, which may already cross it), or idled while the slot has no session. */
static int countdown_renewed(int k, const void *p, size_t n)
{
    tc.gen[k] = gen_of(k);
    tc.parked = 0; /* a type read left pending in an earlier session: that session's */
    if (k != atomic_load_explicit(&active_slot, memory_order_relaxed)) {
        /* a pass-through layer (stale under someone else's allocator): it never counts again
         * on this thread, until a session on its slot renews its generation */
        tc.remaining[k] = COUNTDOWN_IDLE;
        return 1;
    }
    tc.remaining[k] = draw_gap() - (p ? (int64_t)n : 0);
    return tc.remaining[k] >= 0;
}

/* The countdown crossed in a subinterpreter with a GIL of its own, which runs beside the main
 * interpreter's threads: the sample is recorded without touching the state the main
 * interpreter's GIL protects (smp, its live table): the block goes in the subinterpreters' live
 * table (a mutex), its type is not read.  Its stack has that interpreter's frames above the
 * thread's own, and its interp=<id> label (ddp_emit_own); the rest is the thread's own or atomic. */
static _Atomic int sub_emitting; /* subinterpreter threads inside ddp_emit_own: stop waits for them */

static void subinterp_sample(layer_t *L, void *p, size_t n)
{
    int k = L->slot;
    tc.parked = 0;
    tc.remaining[k] = draw_gap();
    if (tc.busy || !p)
        return;
    tc.busy = 1;
    atomic_fetch_add(&sub_emitting, 1); /* before the check: a stop after it waits for us */
    int64_t count, bytes;
    if (k == atomic_load(&active_slot) && ddp_alloc_weigh(n, uniform01(), &count, &bytes) == 0) {
        atomic_fetch_add_explicit(&ast.subinterp_sampled, 1, memory_order_relaxed);
        uint64_t id = ddp_alloc_new_id();
        if (ddp_emit_own(DDP_EVENT_ALLOC, count, bytes, id) != DDP_OK)
            atomic_fetch_add_explicit(&ast.emit_failed, 1, memory_order_relaxed);
        else if (ddp_live_sub_insert((uintptr_t)p, n, id, L->domain) != 0)
            atomic_fetch_add_explicit(&ast.live_overflow, 1, memory_order_relaxed);
    }
    atomic_fetch_sub(&sub_emitting, 1);
    tc.busy = 0;
}

static int alloc_emitting(void) { return atomic_load(&sub_emitting); }

/* Reachability probe (with the GIL): while `probing`, a slow path only notes its layer's slot
 * in probe_mask (reachable_layers). */
static int probing;
static unsigned probe_mask;

static void slow_path_body(layer_t *L, void *p, size_t n);

/* Slot k's countdown fired (or a type read is pending) for an allocation of n bytes at p
 * (NULL: the previous allocator failed), through layer L of slot k.  errno is the caller's
 * allocator's to set: the sampling work (syscalls) must not change it. */
static __attribute__((cold, noinline)) void slow_path(layer_t *L, void *p, size_t n)
{
    if (probing) {
        probe_mask |= 1u << L->slot;
        return;
    }
    int k = L->slot;
    int e = errno;
    if (tc.gen[k] != gen_of(k) && countdown_renewed(k, p, n))
        goto out;
    if (outside_main_interpreter()) {
        subinterp_sample(L, p, n);
        goto out;
    }
    slow_path_body(L, p, n);
out:
    errno = e;
}

static void slow_path_body(layer_t *L, void *p, size_t n)
{
    int k = L->slot;
    if (smp.busy) {
        atomic_fetch_add_explicit(&ast.reentered, 1, memory_order_relaxed);
        return; /* remaining stays < 0: the next allocation comes back here */
    }
    if (k != atomic_load_explicit(&active_slot, memory_order_relaxed)) {
        /* a pass-through layer (stale under someone else's allocator): it never counts
         * again on this thread, until a session on its slot renews its generation */
        tc.remaining[k] = COUNTDOWN_IDLE;
        return;
    }
    smp.busy = 1;
    if (tc.parked) {
        /* parked for a type read: back to the real countdown (n already subtracted) */
        unpark_countdown(k);
        if (smp.pending)
            pending_try();
        if (tc.remaining[k] >= 0 || !p)
            goto out; /* still pending: parked again at out */
    } else if (!p) {
        tc.remaining[k] += (int64_t)n; /* failed: not an allocation, give its bytes back */
        goto out;
    }
    tc.remaining[k] = draw_gap();
    if (smp.pending)
        pending_try(); /* give the previous one a last chance before replacing it */
    int64_t count, bytes;
    if (ddp_alloc_weigh(n, uniform01(), &count, &bytes) != 0)
        goto out; /* n == 0 */
    uint64_t id = ddp_alloc_new_id();
    atomic_fetch_add_explicit(&ast.sampled, 1, memory_order_relaxed);
    int64_t t0 = ddp_now_ns();
    int rc = ddp_emit_own(DDP_EVENT_ALLOC, count, bytes, id);
    atomic_fetch_add_explicit(&ast.sample_ns, (uint64_t)(ddp_now_ns() - t0), memory_order_relaxed);
    if (rc != DDP_OK) {
        atomic_fetch_add_explicit(&ast.emit_failed, 1, memory_order_relaxed);
        goto out;
    }
    if (ddp_live_insert((uintptr_t)p, n, id, L->domain) != 0) {
        atomic_fetch_add_explicit(&ast.live_overflow, 1, memory_order_relaxed);
        goto out; /* untracked: its type cannot be read safely later */
    }
    if (L->domain == DOM_OBJ) {
        smp.pending = (uintptr_t)p;
        smp.pending_id = id;
        smp.pending_size = n;
        smp.pending_tries = PENDING_TRIES;
    }
out:
    if (smp.pending)
        park_countdown(k); /* retry the type read at the next allocation */
    smp.busy = 0;
}

/* The whole per-call fast path: 1 when this allocation of n bytes needs no sampling work.
 * Each slot counts down on its own, so a stale layer of another slot under a foreign
 * allocator never counts the bytes the active layer above it already counted. */
static inline __attribute__((always_inline)) int count_skip(int k, size_t n)
{
    return tc.gen[k] == gen_of(k) && (tc.remaining[k] -= (int64_t)n) >= 0;
}

static __attribute__((cold, noinline)) void *malloc_slow(layer_t *L, size_t n)
{
    void *p = L->prev.malloc(L->prev.ctx, n);
    slow_path(L, p, n);
    return p;
}

static __attribute__((cold, noinline)) void *calloc_slow(layer_t *L, size_t nelem, size_t elsize, size_t n)
{
    void *p = L->prev.calloc(L->prev.ctx, nelem, elsize);
    slow_path(L, p, n);
    return p;
}

/* realloc when the old block may be a live sample (filter hit) or the countdown fired
 * (counted = 1: n was already subtracted by the fast path). */
static __attribute__((cold, noinline)) void *realloc_slow(layer_t *L, void *old, size_t n, int counted)
{
    void *p = L->prev.realloc(L->prev.ctx, old, n);
    if (outside_main_interpreter()) {
        /* its blocks are in the subinterpreters' table; its bytes count on its thread's countdown */
        if (old && p)
            ddp_live_sub_forget((uintptr_t)old);
        if (counted || !count_skip(L->slot, n))
            slow_path(L, p, n);
        return p;
    }
    if (!p) {
        if (counted)
            slow_path(L, NULL, n); /* the countdown fired: keep it consistent */
        return p; /* failed: the old block is still valid (and still sampled if it was) */
    }
    if (old)
        ddp_live_forget((uintptr_t)old); /* resized or moved: the old sample ends; the new size is counted anew */
    if (counted || !count_skip(L->slot, n))
        slow_path(L, p, n);
    return p;
}

static __attribute__((cold, noinline)) void free_slow(layer_t *L, void *p)
{
    if (!outside_main_interpreter())
        ddp_live_forget((uintptr_t)p);
    else
        ddp_live_sub_forget((uintptr_t)p);
    L->prev.free(L->prev.ctx, p);
}

/* The hooks of layer (D, K).  Every branch ends in a tail call (no stack frame); the hot path
 * is a subtraction at a constant address, one predictable branch and the jump to the previous
 * allocator through a constant address, with ctx passed on untouched: the layer installs the
 * previous allocator's ctx as its own (alloc_start).  Frees go to the live table whether or not
 * the layer is active: removing a freed pointer is always right (idempotent), and the filter
 * is empty outside sessions. */
#define DDP_ALLOC_HOOKS(D, K)                                                                         \
    static void *h_malloc_##D##K(void *ctx, size_t n)                                                 \
    {                                                                                                 \
        if (__builtin_expect(count_skip(K, n), 1))                                                    \
            return layers[D][K].prev.malloc(ctx, n);                                                  \
        return malloc_slow(&layers[D][K], n);                                                         \
    }                                                                                                 \
    static void *h_calloc_##D##K(void *ctx, size_t nelem, size_t elsize)                              \
    {                                                                                                 \
        size_t n; /* an overflowing size is no allocation (the allocator fails it): not counted */    \
        if (__builtin_expect(__builtin_mul_overflow(nelem, elsize, &n) || count_skip(K, n), 1))       \
            return layers[D][K].prev.calloc(ctx, nelem, elsize);                                      \
        return calloc_slow(&layers[D][K], nelem, elsize, n);                                          \
    }                                                                                                 \
    static void *h_realloc_##D##K(void *ctx, void *old, size_t n)                                     \
    {                                                                                                 \
        if (__builtin_expect(ddp_live_maybe((uintptr_t)old), 0))                                          \
            return realloc_slow(&layers[D][K], old, n, 0);                                            \
        if (__builtin_expect(count_skip(K, n), 1))                                                    \
            return layers[D][K].prev.realloc(ctx, old, n);                                            \
        return realloc_slow(&layers[D][K], old, n, 1);                                                \
    }                                                                                                 \
    static void h_free_##D##K(void *ctx, void *p)                                                     \
    {                                                                                                 \
        if (__builtin_expect(ddp_live_maybe((uintptr_t)p), 0))                                            \
            return free_slow(&layers[D][K], p);                                                       \
        layers[D][K].prev.free(ctx, p);                                                               \
    }

DDP_ALLOC_HOOKS(0, 0)
DDP_ALLOC_HOOKS(0, 1)
DDP_ALLOC_HOOKS(0, 2)
DDP_ALLOC_HOOKS(0, 3)
DDP_ALLOC_HOOKS(1, 0)
DDP_ALLOC_HOOKS(1, 1)
DDP_ALLOC_HOOKS(1, 2)
DDP_ALLOC_HOOKS(1, 3)
_Static_assert(N_SLOTS == 4, "one DDP_ALLOC_HOOKS line per (domain, slot)");

#define DDP_HOOK_FNS(D, K) { NULL, h_malloc_##D##K, h_calloc_##D##K, h_realloc_##D##K, h_free_##D##K }
static const PyMemAllocatorEx hook_fns[2][N_SLOTS] = {
    { DDP_HOOK_FNS(0, 0), DDP_HOOK_FNS(0, 1), DDP_HOOK_FNS(0, 2), DDP_HOOK_FNS(0, 3) },
    { DDP_HOOK_FNS(1, 0), DDP_HOOK_FNS(1, 1), DDP_HOOK_FNS(1, 2), DDP_HOOK_FNS(1, 3) },
};

/* ---- sessions (the engine table, engine.h: started with the GIL held, stop takes it) ---------- */
static const PyMemAllocatorDomain domains[2] = { PYMEM_DOMAIN_MEM, PYMEM_DOMAIN_OBJ };

static int same_allocator(const PyMemAllocatorEx *a, const PyMemAllocatorEx *b)
{
    return a->ctx == b->ctx && a->malloc == b->malloc && a->calloc == b->calloc && a->realloc == b->realloc &&
           a->free == b->free;
}

/* The slots whose layer a call into domain d's allocator reaches now (a bit per slot), with
 * the GIL: every slot's countdown is forced below zero for a few allocations, and each slow
 * path one reaches notes itself instead of sampling.  A layer someone took out of the chain
 * (tracemalloc.stop() puts back what it saved, which may be older than ours) is then seen to
 * be unreachable: no call can reach it, so its slot may serve again.  The calls span sizes
 * and entry points: an allocator above ours that serves small blocks itself and passes
 * large ones down (as pymalloc does) hid a layer still linked from a 1-byte probe, and
 * reinstalling that layer on top made its calls go round the two for good.  (Sizes up to
 * 32 MiB: mapped, never touched.) */
static const size_t probe_sizes[] = { 1, 513, 4097, 65537, (1u << 20) + 1, 1u << 25 };

static unsigned reachable_layers(int d)
{
    int64_t saved[N_SLOTS];
    uint32_t saved_gen[N_SLOTS];
    memcpy(saved, tc.remaining, sizeof saved);
    memcpy(saved_gen, tc.gen, sizeof saved_gen);
    probing = 1;
    probe_mask = 0;
    for (size_t i = 0; i < sizeof probe_sizes / sizeof *probe_sizes; i++) {
        size_t n = probe_sizes[i];
        void *p[3];
        for (int k = 0; k < N_SLOTS; k++) {
            tc.gen[k] = gen_of(k);
            tc.remaining[k] = 0;
        }
        p[0] = d == DOM_MEM ? PyMem_Malloc(n) : PyObject_Malloc(n);
        p[1] = d == DOM_MEM ? PyMem_Calloc(1, n) : PyObject_Calloc(1, n);
        p[2] = d == DOM_MEM ? PyMem_Realloc(NULL, n) : PyObject_Realloc(NULL, n);
        for (int j = 0; j < 3; j++)
            d == DOM_MEM ? PyMem_Free(p[j]) : PyObject_Free(p[j]);
    }
    probing = 0;
    memcpy(tc.remaining, saved, sizeof saved);
    memcpy(tc.gen, saved_gen, sizeof saved_gen);
    return probe_mask;
}

/* Layers marked in use that no call reaches any more go back to the pool. */
static void reclaim_unreachable(void)
{
    for (int d = 0; d < 2; d++) {
        int any = 0;
        for (int k = 0; k < N_SLOTS; k++)
            any |= layers[d][k].in_use;
        if (!any)
            continue;
        unsigned reach = reachable_layers(d);
        for (int k = 0; k < N_SLOTS; k++)
            if (layers[d][k].in_use && !(reach & (1u << k))) {
                layers[d][k].in_use = 0;
                ast.reclaimed++;
            }
    }
}

/* Slot k can serve a session when each domain's layer k is free or is what is installed now
 * (a pass-through that someone put back on top). */
static int slot_usable(int k, const PyMemAllocatorEx cur[2], int *reused)
{
    *reused = 0;
    for (int d = 0; d < 2; d++) {
        layer_t *L = &layers[d][k];
        if (!L->in_use)
            continue;
        if (!same_allocator(&L->self, &cur[d]))
            return 0; /* left under someone else's allocator */
        (*reused)++;
    }
    return 1;
}

static int alloc_start(const ddp_config *c)
{
    int64_t r = c->alloc_rate ? c->alloc_rate : 512 * 1024;
    if (r < 1 || r > ((int64_t)1 << 40))
        return DDP_EINVAL;
    memset(&ast, 0, sizeof ast);
    reclaim_unreachable();
    PyMemAllocatorEx cur[2];
    for (int d = 0; d < 2; d++)
        PyMem_GetAllocator(domains[d], &cur[d]);
    int k = -1, best = -1;
    for (int j = 0; j < N_SLOTS; j++) { /* prefer a slot whose layers are on top already */
        int reused;
        if (slot_usable(j, cur, &reused) && reused > best) {
            k = j;
            best = reused;
        }
    }
    if (k < 0)
        return DDP_EBUSY; /* too many stale layers under someone else's allocator */
    if (ddp_live_open() != DDP_OK)
        return DDP_ENOMEM;
    ddp_alloc_scheme_start((double)r);
    smp.busy = 0;
    smp.pending = 0;
    /* every thread's next allocation on slot k draws a fresh gap at the new rate */
    __atomic_store_n(&slot_gen[k], slot_gen[k] + 1, __ATOMIC_RELAXED);
    for (int d = 0; d < 2; d++) {
        layer_t *L = &layers[d][k];
        if (!L->in_use) {
            L->prev = cur[d];
            L->domain = d;
            L->slot = k;
            L->self = hook_fns[d][k];
            /* the previous allocator's ctx: the hooks find their layer at constant addresses, so
             * ctx arrives in the register the previous allocator wants it in (one load less a call) */
            L->self.ctx = L->prev.ctx;
            L->in_use = 1;
            PyMem_SetAllocator(domains[d], &L->self);
        }
        top[d] = L;
    }
    atomic_store(&active_slot, k);
    return DDP_OK;
}

/* With the GIL: stop sampling, put the previous allocators back when ours is still on top
 * (otherwise stay as a pass-through under whoever installed over us, or, when someone took
 * ours out of the chain, free the layer), freeze the live list. */
static void stop_gil(void)
{
    int k = atomic_exchange(&active_slot, -1);
    unsigned skip = 0;
    for (int d = 0; d < 2; d++) {
        layer_t *L = top[d];
        if (!L)
            continue;
        PyMemAllocatorEx cur;
        PyMem_GetAllocator(domains[d], &cur);
        if (same_allocator(&cur, &L->self)) {
            PyMem_SetAllocator(domains[d], &L->prev);
            L->in_use = 0;
        } else if (k >= 0 && (reachable_layers(d) & (1u << k))) {
            ast.left_installed = 1;
        } else {
            L->in_use = 0; /* out of every chain: no call can reach it */
            ast.unlinked |= 1 << d;
            skip |= 1u << d;
        }
        top[d] = NULL;
    }
    ddp_live_freeze(skip);
}

static void alloc_stop_locked(void)
{
    if (top[0] || top[1])
        stop_gil();
}

static void alloc_stop(void)
{
    if (!(top[0] || top[1]) || !Py_IsInitialized())
        return;
    PyGILState_STATE g = PyGILState_Ensure();
    alloc_stop_locked();
    PyGILState_Release(g);
}

static void alloc_after_fork(void)
{
    /* The child keeps our hooks (single thread, GIL state unknown): pass through only. */
    atomic_store(&active_slot, -1);
    top[0] = top[1] = NULL;
    smp.busy = 0;
    atomic_store(&sub_emitting, 0); /* (the threads inside are the parent's) */
    smp.pending = 0;
    ddp_live_after_fork();
    ddp_alloc_scheme_after_fork();
}

const ddp_engine ddp_alloc_engine = {
    .name = "alloc",
    .events = 1u << DDP_EVENT_ALLOC,
    .with_gil = 1, /* PyMem_SetAllocator needs it */
    .start = alloc_start,
    .stop = alloc_stop,
    .tick = NULL,
    .emitting = alloc_emitting, /* subinterpreters' samples: without the main interpreter's GIL */
    .after_fork = alloc_after_fork, /* the hooks stay, as pass-throughs */
};

/* ---- the public API (ddprof.h) ------------------------------------------------------------------ */

int ddp_alloc_get_stats(ddp_alloc_stats *out)
{
    if (!out)
        return DDP_EINVAL;
    memset(out, 0, sizeof *out);
    out->sampled = atomic_load(&ast.sampled);
    out->emit_failed = atomic_load(&ast.emit_failed);
    out->live_overflow = atomic_load(&ast.live_overflow);
    out->notes_dropped = ddp_alloc_notes_dropped();
    out->typed = atomic_load(&ast.typed);
    out->untyped = atomic_load(&ast.untyped);
    out->reentered = atomic_load(&ast.reentered);
    out->subinterp_sampled = atomic_load(&ast.subinterp_sampled);
    out->live_at_stop = (uint64_t)ddp_live_frozen_count();
    out->sample_ns = atomic_load(&ast.sample_ns);
    out->type_ns = atomic_load(&ast.type_ns);
    out->left_installed = ast.left_installed;
    out->unlinked = ast.unlinked;
    out->reclaimed = ast.reclaimed;
    int layers_in_use = 0;
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < N_SLOTS; i++)
            layers_in_use += layers[d][i].in_use;
    out->layers_in_use = layers_in_use;
    return DDP_OK;
}

int ddp_alloc_test_get_allocator(int domain, uint64_t *out5)
{
    if (!out5 || domain < 0 || domain > 2 || !Py_IsInitialized())
        return DDP_EINVAL;
    static const PyMemAllocatorDomain all[3] = { PYMEM_DOMAIN_RAW, PYMEM_DOMAIN_MEM, PYMEM_DOMAIN_OBJ };
    PyGILState_STATE g = PyGILState_Ensure();
    PyMemAllocatorEx a;
    PyMem_GetAllocator(all[domain], &a);
    PyGILState_Release(g);
    out5[0] = (uint64_t)(uintptr_t)a.ctx;
    out5[1] = (uint64_t)(uintptr_t)a.malloc;
    out5[2] = (uint64_t)(uintptr_t)a.calloc;
    out5[3] = (uint64_t)(uintptr_t)a.realloc;
    out5[4] = (uint64_t)(uintptr_t)a.free;
    return DDP_OK;
}

/* Test helper: install a pass-through allocator of "someone else" over the current one (1)
 * or remove it again (0), to check that stop never clobbers a foreign allocator. */
static PyMemAllocatorEx foreign_prev[2];
static int foreign_on;
static void *f_malloc(void *ctx, size_t n) { PyMemAllocatorEx *a = ctx; return a->malloc(a->ctx, n); }
static void *f_calloc(void *ctx, size_t n, size_t e) { PyMemAllocatorEx *a = ctx; return a->calloc(a->ctx, n, e); }
static void *f_realloc(void *ctx, void *p, size_t n) { PyMemAllocatorEx *a = ctx; return a->realloc(a->ctx, p, n); }
static void f_free(void *ctx, void *p) { PyMemAllocatorEx *a = ctx; a->free(a->ctx, p); }

/* on == 2: one that serves blocks up to 512 bytes from the allocator under the session's layer
 * (skipping ours, as an allocator serving small blocks itself) and passes larger ones down
 * through ours: the same underlying allocator either way, so any block frees either way. */
static PyMemAllocatorEx foreign_base[2];
static void *f2_malloc(void *ctx, size_t n)
{
    PyMemAllocatorEx *a = n <= 512 ? &foreign_base[(PyMemAllocatorEx *)ctx - foreign_prev] : ctx;
    return a->malloc(a->ctx, n);
}
static void *f2_calloc(void *ctx, size_t n, size_t e)
{
    PyMemAllocatorEx *a = n * e <= 512 ? &foreign_base[(PyMemAllocatorEx *)ctx - foreign_prev] : ctx;
    return a->calloc(a->ctx, n, e);
}
static void *f2_realloc(void *ctx, void *p, size_t n)
{
    PyMemAllocatorEx *a = !p && n <= 512 ? &foreign_base[(PyMemAllocatorEx *)ctx - foreign_prev] : ctx;
    return a->realloc(a->ctx, p, n);
}

int ddp_alloc_test_foreign(int on)
{
    if (!Py_IsInitialized() || (on ? foreign_on : !foreign_on) || on < 0 || on > 2 || (on == 2 && (!top[0] || !top[1])))
        return DDP_EINVAL;
    PyGILState_STATE g = PyGILState_Ensure();
    for (int d = 0; d < 2; d++) {
        if (on) {
            PyMem_GetAllocator(domains[d], &foreign_prev[d]);
            if (on == 2)
                foreign_base[d] = top[d]->prev;
            PyMemAllocatorEx f = { &foreign_prev[d], f_malloc, f_calloc, f_realloc, f_free };
            if (on == 2)
                f.malloc = f2_malloc, f.calloc = f2_calloc, f.realloc = f2_realloc;
            PyMem_SetAllocator(domains[d], &f);
        } else {
            PyMem_SetAllocator(domains[d], &foreign_prev[d]);
        }
    }
    foreign_on = on;
    PyGILState_Release(g);
    return DDP_OK;
}

