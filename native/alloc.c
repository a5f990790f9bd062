/* alloc.c — allocation sampling (ALLOC) and the live-heap table (LIVE).
 *
 * Hook.  PyMem_SetAllocator on the MEM and OBJ domains: every call goes straight to the
 * allocator that was installed before us (PyMem_GetAllocator), and we only *look* at the
 * result, so blocks carry no header of ours: memory allocated while profiling and freed
 * after stop (or the reverse) goes to the very same underlying allocator.  Both domains
 * require the GIL (CPython's PyMem docs), so the live table and the countdowns are
 * protected by it (type notes, read by the drain without the GIL, have their own lock);
 * the RAW domain (no GIL) is not hooked.  Own-GIL subinterpreters (3.12+) would break
 * that assumption: they are not supported (documented).
 *
 * Sampling.  A Poisson process over allocated bytes with mean gap R (config.alloc_rate),
 * as ddtrace's heap profiler and Go's runtime do: one countdown (per hook slot, under the
 * GIL) over all threads' bytes runs down an exponentially distributed number of bytes; the
 * allocation that takes it below zero is sampled and a fresh gap is drawn from its end (memoryless,
 * so no carry-over is needed, and whichever thread allocates the probability is the same).
 * An allocation of size s is then sampled with probability
 * p = 1 - exp(-s/R), and the Horvitz-Thompson weights count = 1/p, bytes = s/p are
 * unbiased estimates of the allocations and bytes it stands for.  count is rounded
 * stochastically to an int64 (unbiased); bytes is rounded to the nearest byte.
 * Fast path (perf: callgrind, benchmarks/bench_alloc.py --callgrind; 3 instructions per
 * malloc, 7 per free, +1.48% instructions on the churn benchmark, where a bare pass-through
 * layer costs +1.20%): malloc/calloc/realloc subtract n from the slot's countdown at a
 * constant address (one read-modify-write: the countdown fires below zero, so the sign flag
 * of the subtraction is the test) and branch on its sign (a thread-local countdown also
 * needed the GOT load of the TLS offset before its load); free tests one byte of the live
 * filter; then a tail jump to the previous allocator, whose function sits at a constant
 * address because each (domain, slot) layer has its own generated functions, with ctx passed
 * on untouched (the layer installs the previous allocator's ctx as its own).
 * No stack frame, no atomics, no session test, no table lookup: a start sets the slot's
 * countdown.  A layer left under someone else's allocator keeps its own slot's countdown,
 * which its slow path parks at COUNTDOWN_IDLE, so it never counts bytes the active layer
 * above it counted.
 * Everything else (the countdown crossing zero, a pending type read, a filter hit) lives
 * in cold, non-inlined functions: a pending type read forces that by parking the real
 * countdown (smp.saved) and zeroing the slot's countdown.  Bytes are counted before the
 * previous allocator runs, so a failed allocation that does not fire still counts its
 * bytes (negligible: MemoryError paths).
 *
 * Recording.  ddp_emit_own(ALLOC, count, bytes, id) records the calling thread's own
 * Python stack; `id` (a per-session sequence number) lets LIVE refer back to it.  The
 * profiler's own threads are excluded there (their slots are marked excluded at start).
 *
 * Live heap.  Sampled pointers go into a bounded open-addressing table (linear probing,
 * backward-shift deletion); every free/realloc first tests one byte of a 64 KiB filter over
 * 256-byte granules, (ptr >> 8) mod 2^16 (the count of live samples there, saturating and
 * then sticky), and probes the table only when it is non-zero.  Granules that coarse keep a
 * 4 KiB pymalloc pool on 16 adjacent bytes (few cache lines for a churning workload); a
 * neighbour of a live sample costs one table probe.  Full table: the sample still counts as
 * ALLOC, not as LIVE, and it is counted (live_overflow).  At stop, under the GIL, the table
 * is frozen into a list of (id, size, type) that Python turns into LIVE rows.
 *
 * Type leaf.  OBJ-domain blocks usually start with an object, after the GC pre-header
 * (sizeof(PyGC_Head)) for GC types and two more words for managed dict/weakref
 * (_PyType_PreHeaderSize, 3.11-3.13).  The object is not initialised yet when the
 * allocator returns, so the type is read later: at the next allocation (a few tries) or,
 * for pointers still live, at stop.  A candidate is accepted only when its
 * refcount is plausible (freed objects have 0, pymalloc's free-list link is a pointer),
 * its type pointer is a type object (its metatype has Py_TPFLAGS_TYPE_SUBCLASS) whose
 * pre-header size equals the candidate offset and whose basic size fits the block.
 * Type objects are read through process_vm_readv (never faults).  No type when the
 * block is freed before that, for MEM-domain blocks (raw buffers), and when the
 * candidate does not validate: the stack then ends at the allocating Python frame.
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
#include "engine.h"

#define N_SLOTS 4            /* hook layers per domain (a stale pass-through may stay) */
#define LIVE_CAP (1u << 15)  /* live table cells (power of two) */
#define LIVE_MAX (LIVE_CAP / 4 * 3)
#define PENDING_TRIES 3      /* next allocations on which a pending type read is retried */
#define FILTER_SIZE (1u << 16) /* prefilter buckets: (ptr >> FILTER_SHIFT) mod FILTER_SIZE */
#define FILTER_SHIFT 8       /* 256-byte granules: a 4 KiB pymalloc pool is 16 adjacent bytes */
#define FILTER_STICKY 255    /* a saturated bucket stays set until the filter is cleared */
#define GC_HEAD_SIZE (2 * sizeof(void *)) /* sizeof(PyGC_Head), 3.11-3.13 GIL builds */
#define TYPE_NAME_CAP 48
#define COUNTDOWN_IDLE (INT64_MAX / 2) /* a slot with no session: never reaches 0 again */

enum { DOM_MEM = 0, DOM_OBJ = 1 };

/* Layer (d, k) is domain d's hook of slot k: its functions are generated per (d, k) (below),
 * so they reach their previous allocator and their countdown smp.remaining[k] at constant
 * addresses and need no ctx.  The MEM and OBJ layers of one slot share the countdown. */
typedef struct {
    PyMemAllocatorEx prev;   /* what we chain to */
    PyMemAllocatorEx self;   /* what we installed */
    int domain, slot;
    int in_use;              /* installed in the chain (now or left as a pass-through) */
} layer_t;

typedef struct {
    uintptr_t ptr;           /* 0 = empty */
    uint64_t size;
    uint64_t id;
    uintptr_t type;          /* validated type object, 0 = unknown */
    int32_t domain;
    int32_t pad;
} live_t;

static layer_t layers[2][N_SLOTS];
static layer_t *top[2];      /* the layers installed by the current session */
static _Atomic int active_slot = -1; /* the slot of the running session, -1 = none */

static live_t *live;         /* LIVE_CAP cells, allocated once (libc malloc, never PyMem) */
static uint32_t live_n;
/* Live entries per prefilter bucket, saturating (FILTER_STICKY): every free tests its byte
 * and probes the 1.3 MB table only when it is set (a probe per free cost ~8%). */
static uint8_t filter[FILTER_SIZE];
static ddp_alloc_info *frozen; /* the live list at stop */
static int frozen_n;

static struct {
    _Atomic uint64_t sampled, emit_failed, live_overflow, typed, untyped, reentered, sample_ns, type_ns;
    int left_installed;
    int unlinked;            /* a domain's hook was taken out of the chain by someone else during the session */
    int reclaimed;           /* layers found out of every chain at start and reused */
} ast;

/* Sampling state, one per process, protected by the GIL like the live table (both hooked
 * domains require it, so hooked calls never run concurrently).  One countdown per slot over
 * the interleaved byte stream of all threads: the Poisson process is memoryless, so every
 * allocation is still sampled with probability 1 - exp(-s/R) whichever thread makes it, and
 * the fast path subtracts from a constant address (no TLS look-up: 0.28% fewer instructions
 * on the churn benchmark than a thread-local countdown).  A start sets the slot's countdown;
 * a pending type read (the last sampled OBJ block) is retried at the next allocation of any
 * thread: another thread can only run after a GIL hand-off, by which time the allocating
 * thread has initialised the object's header. */
static struct {
    int64_t remaining[N_SLOTS]; /* bytes to the next sample; forced to 0 while a type read is pending */
    int busy;                /* re-entry guard (an allocation made by the slow path itself) */
    int64_t saved;           /* the real countdown while parked (remaining then counts down from 0) */
    int parked;
    uintptr_t pending;
    uint64_t rng, pending_id, pending_size;
    int pending_tries;
} smp;

/* ---- random gaps ------------------------------------------------------------------------- */
static inline uint64_t rng_next(void)
{
    uint64_t x = smp.rng; /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    smp.rng = x;
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


/* ---- known static types: no read needed ------------------------------------------------- */
static const struct {
    PyTypeObject *type;
} known_types[] = {
    { &PyBytes_Type }, { &PyUnicode_Type }, { &PyTuple_Type }, { &PyList_Type }, { &PyDict_Type },
    { &PyLong_Type }, { &PyFloat_Type }, { &PySet_Type }, { &PyFrozenSet_Type }, { &PyByteArray_Type },
    { &PyComplex_Type }, { &PyFunction_Type }, { &PyMethod_Type }, { &PyCFunction_Type },
    { &PyMemoryView_Type }, { &PySlice_Type }, { &PyCell_Type }, { &PyCode_Type }, { &PyType_Type },
};

/* ---- the live table (GIL-protected) ---------------------------------------------------------- */
static inline uint32_t filter_bucket(uintptr_t p) { return (uint32_t)(p >> FILTER_SHIFT) & (FILTER_SIZE - 1); }

/* The only live-table work on the free/realloc fast path. */
static inline int filter_hit(uintptr_t p)
{
    return filter[filter_bucket(p)] != 0;
}

static inline void filter_add(uintptr_t p)
{
    uint8_t *c = &filter[filter_bucket(p)];
    if (*c != FILTER_STICKY)
        ++*c;
}

static inline void filter_sub(uintptr_t p)
{
    uint8_t *c = &filter[filter_bucket(p)];
    if (*c != FILTER_STICKY) /* saturated: its true count is unknown, so it stays set */
        --*c;
}

static void filter_clear(void)
{
    memset(filter, 0, sizeof filter);
}

static inline uint32_t ptr_hash(uintptr_t p)
{
    uint64_t x = (uint64_t)p * 0x9E3779B97F4A7C15ULL;
    return (uint32_t)(x >> 40) & (LIVE_CAP - 1);
}

static live_t *live_find(uintptr_t p)
{
    for (uint32_t h = ptr_hash(p), i = 0; i < LIVE_CAP; i++, h = (h + 1) & (LIVE_CAP - 1)) {
        if (live[h].ptr == p)
            return &live[h];
        if (!live[h].ptr)
            return NULL;
    }
    return NULL;
}

static int live_insert(uintptr_t p, uint64_t size, uint64_t id, int domain)
{
    if (live_n >= LIVE_MAX)
        return -1;
    uint32_t h = ptr_hash(p);
    while (live[h].ptr && live[h].ptr != p)
        h = (h + 1) & (LIVE_CAP - 1);
    if (!live[h].ptr) {
        live_n++;
        filter_add(p);
    }
    live[h] = (live_t){ .ptr = p, .size = size, .id = id, .type = 0, .domain = domain };
    return 0;
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void live_remove_at(uint32_t i)
{
    live_n--;
    filter_sub(live[i].ptr);
    uint32_t j = i;
    for (;;) {
        live[i].ptr = 0;
        for (;;) {
            j = (j + 1) & (LIVE_CAP - 1);
            if (!live[j].ptr)
                return;
            uint32_t k = ptr_hash(live[j].ptr);
            /* move j into i unless its home k lies cyclically in (i, j] */
            if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
                continue;
            break;
        }
        live[i] = live[j];
        i = j;
    }
}

static void live_forget(uintptr_t p)
{
    if (!p || !live_n)
        return;
    live_t *e = live_find(p);
    if (e)
        live_remove_at((uint32_t)(e - live));
}

/* ---- type of an OBJ-domain block ------------------------------------------------------------- */
static int copy_type_name(uintptr_t type, char *dst)
{
    for (size_t i = 0; i < sizeof known_types / sizeof known_types[0]; i++)
        if ((uintptr_t)known_types[i].type == type) { /* no snprintf: a cold libc path on every typed sample */
            const char *name = known_types[i].type->tp_name;
            size_t len = strnlen(name, TYPE_NAME_CAP - 1);
            memcpy(dst, name, len);
            dst[len] = 0;
            return 0;
        }
    uintptr_t name = 0;
    if (ddp_safe_read(&name, type + offsetof(PyTypeObject, tp_name), sizeof name, DDP_READ_SYSCALL) != 0 || !name)
        return -1;
    /* read up to the end of the page first: a short name may sit at a page's end */
    size_t room = 4096 - (name & 4095);
    size_t n = room < TYPE_NAME_CAP - 1 ? room : TYPE_NAME_CAP - 1;
    char buf[TYPE_NAME_CAP];
    if (ddp_safe_read(buf, name, n, DDP_READ_SYSCALL) != 0)
        return -1;
    if (n < TYPE_NAME_CAP - 1 && !memchr(buf, 0, n) &&
        ddp_safe_read(buf + n, name + n, TYPE_NAME_CAP - 1 - n, DDP_READ_SYSCALL) != 0)
        return -1;
    buf[TYPE_NAME_CAP - 1] = 0;
    size_t len = strnlen(buf, TYPE_NAME_CAP - 1);
    if (!len)
        return -1;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)buf[i] < 0x20)
            return -1;
    memcpy(dst, buf, len + 1);
    return 0;
}

/* A validated type object for the block (a live, initialised object), or 0.  `safe`: the
 * block may have been freed without our seeing it (read through process_vm_readv). */
static uintptr_t block_type(uintptr_t p, uint64_t size, int safe)
{
    static const size_t offs[] = { 0, GC_HEAD_SIZE, GC_HEAD_SIZE + 2 * sizeof(void *) };
    uintptr_t head[(GC_HEAD_SIZE + 2 * sizeof(void *) + 2 * sizeof(void *)) / sizeof(uintptr_t)];
    size_t want = size < sizeof head ? (size_t)size : sizeof head;
    if (want < 2 * sizeof(void *))
        return 0;
    /* A plain copy on the sampling path: the block is allocated (callers check the live table,
     * which every free of the session updates, under the GIL); only its contents are untrusted. */
    if (!safe)
        memcpy(head, (const void *)p, want);
    else if (ddp_safe_read(head, p, want, DDP_READ_SYSCALL) != 0)
        return 0;
    for (size_t k = 0; k < sizeof offs / sizeof offs[0]; k++) {
        size_t off = offs[k];
        if (off + 2 * sizeof(void *) > want)
            break;
        int64_t refcnt = (int64_t)head[off / sizeof(uintptr_t)];
        uintptr_t type = head[off / sizeof(uintptr_t) + 1];
        if (refcnt <= 0 || refcnt > (int64_t)UINT32_MAX || !type || (type & 7))
            continue;
        int known = 0;
        for (size_t i = 0; i < sizeof known_types / sizeof known_types[0]; i++)
            if ((uintptr_t)known_types[i].type == type)
                known = 1;
        PyTypeObject t;
        if (known) {
            t = *(const PyTypeObject *)type; /* a static type of the interpreter */
        } else {
            if (ddp_safe_read(&t, type, sizeof t, DDP_READ_SYSCALL) != 0)
                continue;
            unsigned long mflags = 0;
            uintptr_t meta = (uintptr_t)t.ob_base.ob_base.ob_type;
            if (!meta || ddp_safe_read(&mflags, meta + offsetof(PyTypeObject, tp_flags), sizeof mflags,
                                       DDP_READ_SYSCALL) != 0 ||
                !(mflags & Py_TPFLAGS_TYPE_SUBCLASS))
                continue;
        }
        size_t pre = ((t.tp_flags & Py_TPFLAGS_HAVE_GC) ? GC_HEAD_SIZE : 0);
#if PY_VERSION_HEX >= 0x030C0000
        if (t.tp_flags & Py_TPFLAGS_PREHEADER)
#else
        if (t.tp_flags & Py_TPFLAGS_MANAGED_DICT)
#endif
            pre += 2 * sizeof(void *);
        if (pre != off || t.tp_basicsize <= 0 || (uint64_t)t.tp_basicsize + off > size)
            continue;
        return type;
    }
    return 0;
}

static void note_push(uint64_t id, uint64_t size, uintptr_t type)
{
    ddp_alloc_info note = { .id = id, .size = size };
    if (copy_type_name(type, note.type_name) != 0)
        return;
    ddp_alloc_note_info(&note);
}


/* The thread's last sampled OBJ block, once its object is initialised. */
static void pending_try(void)
{
    uintptr_t p = smp.pending;
    /* Another thread may have freed it (objects die anywhere): the live table, which every
     * free of the session updates, says whether the block is still ours to read. */
    live_t *e = live_n ? live_find(p) : NULL;
    if (!e || e->id != smp.pending_id) {
        smp.pending = 0;
        atomic_fetch_add_explicit(&ast.untyped, 1, memory_order_relaxed);
        return;
    }
    int64_t t0 = ddp_now_ns();
    uintptr_t type = block_type(p, smp.pending_size, 0);
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
/* Invariant outside slow_path: smp.pending != 0 <=> the countdown is parked, so the next
 * allocation takes the slow path and retries the type read. */
static inline void park_countdown(int k)
{
    if (!smp.parked) {
        smp.saved = smp.remaining[k];
        smp.remaining[k] = 0;
        smp.parked = 1;
    }
}

static inline void unpark_countdown(int k)
{
    if (smp.parked) {
        smp.remaining[k] += smp.saved; /* what was counted from 0 while parked */
        smp.parked = 0;
    }
}

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
    int e = errno;
    slow_path_body(L, p, n);
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
         * again, until a session on its slot sets the countdown */
        smp.remaining[k] = COUNTDOWN_IDLE;
        return;
    }
    smp.busy = 1;
    if (smp.parked) {
        /* parked for a type read: back to the real countdown (n already subtracted) */
        unpark_countdown(k);
        if (smp.pending)
            pending_try();
        if (smp.remaining[k] >= 0 || !p)
            goto out; /* still pending: parked again at out */
    } else if (!p) {
        smp.remaining[k] += (int64_t)n; /* failed: not an allocation, give its bytes back */
        goto out;
    }
    smp.remaining[k] = draw_gap();
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
    if (live_insert((uintptr_t)p, n, id, L->domain) != 0) {
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
    return (smp.remaining[k] -= (int64_t)n) >= 0;
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
    if (!p) {
        if (counted)
            slow_path(L, NULL, n); /* the countdown fired: keep it consistent */
        return p; /* failed: the old block is still valid (and still sampled if it was) */
    }
    if (old)
        live_forget((uintptr_t)old); /* resized or moved: the old sample ends; the new size is counted anew */
    if (counted || !count_skip(L->slot, n))
        slow_path(L, p, n);
    return p;
}

static __attribute__((cold, noinline)) void free_slow(layer_t *L, void *p)
{
    live_forget((uintptr_t)p);
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
        if (__builtin_expect(filter_hit((uintptr_t)old), 0))                                          \
            return realloc_slow(&layers[D][K], old, n, 0);                                            \
        if (__builtin_expect(count_skip(K, n), 1))                                                    \
            return layers[D][K].prev.realloc(ctx, old, n);                                            \
        return realloc_slow(&layers[D][K], old, n, 1);                                                \
    }                                                                                                 \
    static void h_free_##D##K(void *ctx, void *p)                                                     \
    {                                                                                                 \
        if (__builtin_expect(filter_hit((uintptr_t)p), 0))                                            \
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
    memcpy(saved, smp.remaining, sizeof saved);
    probing = 1;
    probe_mask = 0;
    for (size_t i = 0; i < sizeof probe_sizes / sizeof *probe_sizes; i++) {
        size_t n = probe_sizes[i];
        void *p[3];
        for (int k = 0; k < N_SLOTS; k++)
            smp.remaining[k] = 0;
        p[0] = d == DOM_MEM ? PyMem_Malloc(n) : PyObject_Malloc(n);
        p[1] = d == DOM_MEM ? PyMem_Calloc(1, n) : PyObject_Calloc(1, n);
        p[2] = d == DOM_MEM ? PyMem_Realloc(NULL, n) : PyObject_Realloc(NULL, n);
        for (int j = 0; j < 3; j++)
            d == DOM_MEM ? PyMem_Free(p[j]) : PyObject_Free(p[j]);
    }
    probing = 0;
    memcpy(smp.remaining, saved, sizeof saved);
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
    if (!live) {
        live = calloc(LIVE_CAP, sizeof *live);
        if (!live)
            return DDP_ENOMEM;
    }
    memset(live, 0, LIVE_CAP * sizeof *live);
    filter_clear();
    live_n = 0;
    free(frozen);
    frozen = NULL;
    frozen_n = 0;
    ddp_alloc_scheme_start((double)r);
    smp.rng = (smp.rng ^ (uint64_t)ddp_now_ns() ^ ((uint64_t)getpid() << 32)) | 1; /* a forked child differs */
    smp.busy = smp.parked = 0;
    smp.pending = 0;
    smp.remaining[k] = draw_gap(); /* memoryless: a fresh gap at the new rate */
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

/* skip: domains whose hook was unlinked during the session (bit per domain): their entries
 * may name blocks freed without our seeing it, so they are left out, unread. */
static void freeze_live(unsigned skip)
{
    free(frozen);
    frozen = NULL;
    frozen_n = 0;
    int native_n = ddp_nalloc_live_count();
    if ((!live_n || !live) && !native_n)
        return;
    frozen = calloc(live_n + (uint32_t)native_n + 1, sizeof *frozen);
    if (!frozen)
        return;
    frozen_n = ddp_nalloc_live_take(frozen, native_n); /* C allocations: named leaves already */
    if (!live)
        return;
    for (uint32_t i = 0; i < LIVE_CAP; i++) {
        live_t *e = &live[i];
        if (!e->ptr || (skip & (1u << e->domain)))
            continue;
        ddp_alloc_info *o = &frozen[frozen_n++];
        o->id = e->id;
        o->size = e->size;
        o->type_name[0] = 0;
        uintptr_t type = e->type;
        if (!type && e->domain == DOM_OBJ)
            type = block_type(e->ptr, e->size, 1); /* allocated (the object is initialised) unless a free went unseen */
        if (type && copy_type_name(type, o->type_name) != 0)
            o->type_name[0] = 0;
    }
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
    freeze_live(skip);
    /* after the freeze the table is not read again before the next start (which clears it):
     * empty the prefilter so frees through a pass-through layer left installed stay on the
     * fast path */
    live_n = 0;
    filter_clear();
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
    smp.busy = smp.parked = 0;
    smp.pending = 0;
    live_n = 0;
    filter_clear();
    ddp_alloc_scheme_after_fork();
}

const ddp_engine ddp_alloc_engine = {
    .name = "alloc",
    .events = 1u << DDP_EVENT_ALLOC,
    .with_gil = 1, /* PyMem_SetAllocator needs it */
    .start = alloc_start,
    .stop = alloc_stop,
    .tick = NULL,
    .emitting = NULL,
    .after_fork = alloc_after_fork, /* the hooks stay, as pass-throughs */
};

/* ---- the public API (ddprof.h) ------------------------------------------------------------------ */

int ddp_alloc_live_ids(uint64_t *out, int max)
{
    if (!out || max < 0)
        return DDP_EINVAL;
    if (!Py_IsInitialized() || !live)
        return 0;
    PyGILState_STATE g = PyGILState_Ensure();
    int n = 0;
    if (top[0] || top[1]) {
        for (uint32_t i = 0; i < LIVE_CAP; i++)
            if (live[i].ptr) {
                if (n < max)
                    out[n] = live[i].id;
                n++;
            }
        n += ddp_nalloc_live_ids(n < max ? out + n : NULL, n < max ? max - n : 0);
    } else {
        for (int i = 0; i < frozen_n; i++) {
            if (n < max)
                out[n] = frozen[i].id;
            n++;
        }
    }
    PyGILState_Release(g);
    return n; /* may exceed max: call again with a bigger buffer */
}

int ddp_alloc_live_list(ddp_alloc_info *out, int max)
{
    if (!out || max < 0)
        return DDP_EINVAL;
    if (top[0] || top[1])
        return DDP_EBUSY; /* only after stop */
    int n = frozen_n < max ? frozen_n : max;
    if (n > 0) /* frozen is NULL when nothing was tracked: memcpy(NULL, 0) is undefined */
        memcpy(out, frozen, (size_t)n * sizeof *out);
    return frozen_n;
}

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
    out->live_at_stop = (uint64_t)frozen_n;
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
