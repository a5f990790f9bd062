/* nalloc.c — engine: ALLOC/LIVE of C extensions' allocations, without the GIL.
 *
 * Most of a data notebook's memory is allocated in C (numpy data, compression buffers, C++
 * containers), where PyMem never sees it.  So the malloc family, anonymous mmap/munmap/
 * mremap and PyTraceMalloc_Track/Untrack are hooked in the GOT of every loaded object but
 * the interpreter's own (gotpatch.c), and sampled with allocsample.c's scheme, one countdown
 * per thread.  Counted once: the interpreter's own object is never hooked (PyMem ends in its
 * malloc), and an object that calls PyTraceMalloc_Track keeps only its free hooked.  Sampled
 * blocks live in one table keyed by address, as another library may free them, and mappings
 * also by page range, as munmap may take any part of one.  A sample whose block is freed
 * before its record leaves the ring loses its id (nalloc_settle), so such samples merge.  On a
 * thread that runs no Python a sample is recorded only with native_threads on (ddp_emit_native:
 * its native stack; the thread named by allocthreads.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <Python.h>
#include "ddp_internal.h"
#include "alloc.h"
#include "engine.h"
#include "gotpatch.h"

#define NPY_TRACE_DOMAIN 389047u    /* numpy's data buffers */
#define KHASH_TRACE_DOMAIN 424242u  /* pandas' hash tables (khash) */
#define NLIVE_CAP (1u << 14)  /* live table cells (power of two) */
#define NLIVE_MAX (NLIVE_CAP / 4 * 3)
#define NFILTER_SIZE (1u << 16)
#define NFILTER_SHIFT 12      /* 4 KiB granules: sampled C blocks are mostly large */
#define NFILTER_STICKY 255
#define NMAPS_MAX 1024        /* sampled mappings tracked by range (more: sampled, not tracked for LIVE) */
#define NFREED_CAP (1u << 12) /* recently freed samples, by id: a record waits in the ring a tick at most */
#define NID_MASK ((UINT64_C(1) << DDP_ALLOC_KIND_SHIFT) - 1)

enum { SRC_NUMPY, SRC_PANDAS, SRC_TRACED, SRC_MALLOC, SRC_CALLOC, SRC_REALLOC, SRC_POSIX_MEMALIGN, SRC_ALIGNED_ALLOC,
       SRC_MEMALIGN, SRC_MMAP };
static const char *const src_name[] = { "numpy", "pandas hashtable", NULL, "malloc", "calloc", "realloc", "posix_memalign",
                                        "aligned_alloc", "memalign", "mmap" };

typedef struct {
    uintptr_t ptr;           /* 0 = empty */
    uint64_t size, id;
    uint64_t sampled_size;   /* size when sampled (a mapping shrinks when partly unmapped) */
    uint32_t src, domain;
} nlive_t;

static pthread_mutex_t patch_lock = PTHREAD_MUTEX_INITIALIZER; /* the GOT passes and restores */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static nlive_t *nlive;       /* NLIVE_CAP cells, allocated once */
static uint32_t nlive_n;
static _Atomic uint8_t nfilter[NFILTER_SIZE];
/* The aux of samples whose block is gone, direct-mapped by id (an overwritten cell only
 * leaves that sample's record unmerged): read by nalloc_settle without a lock. */
static _Atomic uint64_t nfreed[NFREED_CAP];
static struct { uintptr_t lo, hi; } nmaps[NMAPS_MAX]; /* sampled mappings' page ranges */
static _Atomic int nmaps_n;  /* written under live_lock; read without it as "any mapping sampled?" */
static uintptr_t page_mask;  /* page size - 1 */
static _Atomic int n_on;
static int n_native_threads; /* the session samples threads that run no Python (their own stacks) */
/* Threads inside the emit (any thread, no GIL): stop waits for them, and the session's buffers
 * are freed only once none is left (engine.h's emitting), as for the wait wrappers. */
static _Atomic int n_emitting;
static _Atomic uint64_t n_gen;
static int n_atfork_done;

static struct {
    _Atomic uint64_t sampled, emit_failed, not_python, native_thread, live_overflow, maps_trimmed;
    uint64_t passes;
    uint64_t maps_measured, maps_mapped_bytes, maps_resident_bytes, maps_measure_ns, maps_unmeasured; /* at stop */
    int32_t tracking_objects;
} ns;

/* Per thread: the countdown of session n_gen (initial-exec TLS: a few words). */
static DDP_TLS struct {
    int64_t remaining;
    uint64_t gen, rng;
    int busy;
} nt;

/* ---- the live table (live_lock) -------------------------------------------------------------- */
static inline uint32_t nbucket(uintptr_t p) { return (uint32_t)(p >> NFILTER_SHIFT) & (NFILTER_SIZE - 1); }

static inline int nfilter_hit(uintptr_t p)
{
    return atomic_load_explicit(&nfilter[nbucket(p)], memory_order_relaxed) != 0;
}

static inline uint32_t nhash(uintptr_t p)
{
    uint64_t x = (uint64_t)p * 0x9E3779B97F4A7C15ULL;
    return (uint32_t)(x >> 40) & (NLIVE_CAP - 1);
}

static nlive_t *nfind(uintptr_t p)
{
    for (uint32_t h = nhash(p), i = 0; i < NLIVE_CAP; i++, h = (h + 1) & (NLIVE_CAP - 1)) {
        if (nlive[h].ptr == p)
            return &nlive[h];
        if (!nlive[h].ptr)
            return NULL;
    }
    return NULL;
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void nremove_at(uint32_t i)
{
    _Atomic uint8_t *c = &nfilter[nbucket(nlive[i].ptr)];
    uint8_t v = atomic_load_explicit(c, memory_order_relaxed);
    if (v != NFILTER_STICKY) /* saturated: its true count is unknown, so it stays set */
        atomic_store_explicit(c, (uint8_t)(v - 1), memory_order_relaxed);
    nlive_n--;
    uint32_t j = i;
    for (;;) {
        nlive[i].ptr = 0;
        for (;;) {
            j = (j + 1) & (NLIVE_CAP - 1);
            if (!nlive[j].ptr)
                return;
            uint32_t k = nhash(nlive[j].ptr);
            if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
                continue;
            break;
        }
        nlive[i] = nlive[j];
        i = j;
    }
}

/* Take p's entry out of the table (into *out when given): 1 found.  live_lock held. */
static int ntake_locked(uintptr_t p, nlive_t *out)
{
    nlive_t *e = nlive && nlive_n ? nfind(p) : NULL;
    if (e) {
        if (out)
            *out = *e;
        nremove_at((uint32_t)(e - nlive));
    }
    return e != NULL;
}

static int ntake(uintptr_t p, nlive_t *out)
{
    pthread_mutex_lock(&live_lock);
    int r = ntake_locked(p, out);
    pthread_mutex_unlock(&live_lock);
    return r;
}

static int nput_locked(const nlive_t *v)
{
    int rc = -1;
    if (nlive && nlive_n < NLIVE_MAX) {
        uint32_t h = nhash(v->ptr);
        while (nlive[h].ptr && nlive[h].ptr != v->ptr)
            h = (h + 1) & (NLIVE_CAP - 1);
        if (!nlive[h].ptr) {
            nlive_n++;
            _Atomic uint8_t *c = &nfilter[nbucket(v->ptr)];
            uint8_t f = atomic_load_explicit(c, memory_order_relaxed);
            if (f != NFILTER_STICKY)
                atomic_store_explicit(c, (uint8_t)(f + 1), memory_order_relaxed);
        }
        nlive[h] = *v;
        rc = 0;
    }
    return rc;
}

static int nput(const nlive_t *v)
{
    pthread_mutex_lock(&live_lock);
    int rc = nput_locked(v);
    pthread_mutex_unlock(&live_lock);
    return rc;
}

static inline void nmark_freed(uint64_t aux)
{
    atomic_store_explicit(&nfreed[aux & (NFREED_CAP - 1)], aux, memory_order_relaxed);
}

/* ---- sampled mappings by range (live_lock) ------------------------------------------------------ */
static int nmap_put(const nlive_t *v)
{
    int rc = -1;
    pthread_mutex_lock(&live_lock);
    int n = atomic_load_explicit(&nmaps_n, memory_order_relaxed);
    if (n < NMAPS_MAX && nput_locked(v) == 0) {
        nmaps[n].lo = v->ptr;
        nmaps[n].hi = (v->ptr + v->size + page_mask) & ~page_mask;
        atomic_store_explicit(&nmaps_n, n + 1, memory_order_relaxed);
        rc = 0;
    }
    pthread_mutex_unlock(&live_lock);
    return rc;
}

/* The pages [a, a + len) are being unmapped (or replaced, or moved): every sampled mapping
 * they touch ends, or keeps the larger piece left of it. */
static void nmap_cut(uintptr_t a, size_t len)
{
    if (!atomic_load_explicit(&nmaps_n, memory_order_relaxed) || !len)
        return;
    uintptr_t lo_cut = a & ~page_mask;
    uintptr_t hi_cut = a + len < a ? UINTPTR_MAX : (a + len + page_mask) & ~page_mask;
    pthread_mutex_lock(&live_lock);
    int n = atomic_load_explicit(&nmaps_n, memory_order_relaxed);
    for (int i = 0; i < n; i++) {
        uintptr_t lo = nmaps[i].lo, hi = nmaps[i].hi;
        if (hi <= lo_cut || lo >= hi_cut)
            continue;
        nlive_t e;
        int had = ntake_locked(lo, &e);
        uintptr_t head = lo_cut > lo ? lo_cut - lo : 0, tail = hi > hi_cut ? hi - hi_cut : 0;
        if (had && (head || tail)) { /* partly unmapped: the larger piece left stays sampled */
            uintptr_t end = e.ptr + e.size; /* the bytes asked for end here (within the last page) */
            uintptr_t plo = head >= tail ? lo : hi_cut, phi = head >= tail ? lo_cut : hi;
            e.ptr = plo;
            e.size = (end < phi ? end : phi) > plo ? (end < phi ? end : phi) - plo : 0;
            if (e.size && nput_locked(&e) == 0) {
                nmaps[i].lo = plo;
                nmaps[i].hi = phi;
                atomic_fetch_add_explicit(&ns.maps_trimmed, 1, memory_order_relaxed);
                continue;
            }
        }
        if (had)
            nmark_freed(e.id);
        nmaps[i] = nmaps[--n]; /* gone: the last entry moves here and is looked at next */
        i--;
    }
    atomic_store_explicit(&nmaps_n, n, memory_order_relaxed);
    pthread_mutex_unlock(&live_lock);
}

/* Resident bytes of the pages [lo, lo + len): what a mapping holds, not what it reserved (an
 * allocator's arena reserves far more than it touches; PROT_NONE and never-touched pages count
 * 0).  mincore into a static vector, NRES_VEC pages a call (live_lock held: one caller at a
 * time); a range with holes (pages unmapped behind the hooks' back: ENOMEM) is halved until
 * each piece is wholly mapped or wholly gone, so the calls stay O(holes x log pages). */
#define NRES_VEC (1u << 16)   /* pages per mincore call: 256 MiB of 4 KiB pages */
#define NRES_BUDGET (UINT64_C(1) << 24) /* pages measured per stop (64 GiB: 10-90 ms, ~0.2-1.4 ms per GiB); past it a
                                         * mapping counts its mapped bytes (an upper bound: never hides memory) */
static unsigned char nres_vec[NRES_VEC];

static uint64_t nresident_pages(uintptr_t lo, size_t pages)
{
    if (!pages)
        return 0;
    if (mincore((void *)lo, pages * (page_mask + 1), nres_vec) != 0)
        return errno == ENOMEM && pages > 1
                   ? nresident_pages(lo, pages / 2) + nresident_pages(lo + pages / 2 * (page_mask + 1), pages - pages / 2)
                   : 0;
    uint64_t n = 0;
    for (size_t i = 0; i < pages; i++)
        n += nres_vec[i] & 1;
    return n;
}

static uint64_t nresident(uintptr_t lo, uint64_t len)
{
    uintptr_t a = lo & ~page_mask, end = (lo + len + page_mask) & ~page_mask;
    uint64_t pages = 0;
    for (; a < end; a += (uintptr_t)NRES_VEC * (page_mask + 1)) {
        uintptr_t left = (end - a) / (page_mask + 1);
        pages += nresident_pages(a, left < NRES_VEC ? left : NRES_VEC);
    }
    uint64_t bytes = pages * (page_mask + 1);
    return bytes < len ? bytes : len; /* the last page may hold fewer bytes asked for */
}

static inline void nforget(uintptr_t p)
{
    nlive_t e;
    if (p && nfilter_hit(p) && ntake(p, &e))
        nmark_freed(e.id);
}

/* ---- sampling ------------------------------------------------------------------------------- */
static inline uint64_t nrng(void)
{
    uint64_t x = nt.rng; /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    nt.rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static inline double nuniform01(void) { return ((double)(nrng() >> 11) + 1.0) * (1.0 / 9007199254740992.0); }

static int64_t ndraw_gap(void)
{
    double g = -ddp_alloc_mean_gap() * log(nuniform01());
    return g > 9e18 ? (int64_t)9e18 : (int64_t)g;
}

/* The whole fast path: 1 when an allocation of n bytes needs no sampling work. */
static inline __attribute__((always_inline)) int nskip(size_t n)
{
    return nt.gen == atomic_load_explicit(&n_gen, memory_order_relaxed) && (nt.remaining -= (int64_t)n) >= 0;
}

static void nsample_body(uintptr_t p, size_t n, int src, uint32_t domain)
{
    uint64_t gen = atomic_load(&n_gen);
    if (nt.gen != gen) { /* this thread's first allocation of the session: a fresh gap */
        if (!nt.rng)
            nt.rng = ((uint64_t)ddp_now_ns() ^ ((uint64_t)(uintptr_t)&nt << 16) ^ 0x9E3779B97F4A7C15ULL) | 1;
        nt.gen = gen;
        nt.remaining = ndraw_gap() - (int64_t)n;
        if (nt.remaining >= 0)
            return;
    }
    nt.remaining = ndraw_gap(); /* memoryless: the next gap from this allocation's end */
    if (!p || !atomic_load(&n_on))
        return;
    int64_t count, bytes;
    if (ddp_alloc_weigh(n, nuniform01(), &count, &bytes) != 0)
        return;
    /* the leaf rides in the record (ddprof.h): no type note, and the record can merge once freed */
    uint64_t kind = src_name[src] ? (uint64_t)src + 1 : 0;
    uint64_t id = ddp_alloc_new_id() | kind << DDP_ALLOC_KIND_SHIFT;
    atomic_fetch_add_explicit(&ns.sampled, 1, memory_order_relaxed);
    atomic_fetch_add(&n_emitting, 1); /* before the check: a stop after it waits for us */
    int rc = atomic_load(&n_on) ? ddp_emit_own(DDP_EVENT_ALLOC, count, bytes, id) : DDP_ENOTRUNNING;
    int native = rc == DDP_EINVAL && n_native_threads && ddp_alloc_thread_seen() == 0; /* (runs no Python) */
    if (native)
        rc = ddp_emit_native(DDP_EVENT_ALLOC, count, bytes, id);
    atomic_fetch_sub(&n_emitting, 1);
    if (native && rc == DDP_OK)
        atomic_fetch_add_explicit(&ns.native_thread, 1, memory_order_relaxed);
    if (rc == DDP_EINVAL) {
        atomic_fetch_add_explicit(&ns.not_python, 1, memory_order_relaxed);
        return;
    }
    if (rc != DDP_OK) {
        atomic_fetch_add_explicit(&ns.emit_failed, 1, memory_order_relaxed);
        return;
    }
    if (!kind) { /* a traced domain: its number is in the name */
        char name[48];
        snprintf(name, sizeof name, "traced domain %u", domain);
        ddp_alloc_note(id, n, name);
    }
    nlive_t e = { .ptr = p, .size = n, .id = id, .sampled_size = n, .src = (uint32_t)src, .domain = domain };
    if ((src == SRC_MMAP ? nmap_put(&e) : nput(&e)) != 0)
        atomic_fetch_add_explicit(&ns.live_overflow, 1, memory_order_relaxed);
}

/* This thread's countdown crossed zero (or belongs to another session) at an allocation of
 * n bytes at p (0: it failed).  errno stays the allocator's. */
static __attribute__((cold, noinline)) void nsample(uintptr_t p, size_t n, int src, uint32_t domain)
{
    if (nt.busy)
        return;
    nt.busy = 1;
    int e = errno;
    nsample_body(p, n, src, domain);
    errno = e;
    nt.busy = 0;
}

/* ---- wrappers ------------------------------------------------------------------------------ */
static int n_track(unsigned int domain, uintptr_t ptr, size_t size)
{
    nforget(ptr); /* tracked again (numpy's realloc in place): the old sample ends */
    int r = PyTraceMalloc_Track(domain, ptr, size);
    if (__builtin_expect(!nskip(size), 0))
        nsample(ptr, size, domain == NPY_TRACE_DOMAIN ? SRC_NUMPY : domain == KHASH_TRACE_DOMAIN ? SRC_PANDAS : SRC_TRACED,
                domain);
    return r;
}

static int n_untrack(unsigned int domain, uintptr_t ptr)
{
    nforget(ptr);
    return PyTraceMalloc_Untrack(domain, ptr);
}

static void *n_malloc(size_t n)
{
    void *p = malloc(n);
    if (__builtin_expect(!nskip(n), 0))
        nsample((uintptr_t)p, n, SRC_MALLOC, 0);
    return p;
}

static void *n_calloc(size_t nelem, size_t elsize)
{
    void *p = calloc(nelem, elsize);
    size_t n;
    if (!__builtin_mul_overflow(nelem, elsize, &n) && __builtin_expect(!nskip(n), 0))
        nsample((uintptr_t)p, n, SRC_CALLOC, 0);
    return p;
}

static void *n_realloc(void *old, size_t n)
{
    nlive_t was;
    int had = old && nfilter_hit((uintptr_t)old) && ntake((uintptr_t)old, &was);
    void *p = realloc(old, n);
    if (had && !p && n) {
        int e = errno;
        nput(&was); /* failed: the old block is still allocated (and still sampled) */
        errno = e;
    } else if (had) {
        nmark_freed(was.id); /* moved or resized: the old sample ends (only now: realloc may fail) */
    }
    if (__builtin_expect(!nskip(n), 0))
        nsample((uintptr_t)p, n, SRC_REALLOC, 0);
    return p;
}

static void n_free(void *p)
{
    nforget((uintptr_t)p);
    free(p);
}

static int n_posix_memalign(void **out, size_t align, size_t n)
{
    int rc = posix_memalign(out, align, n);
    if (__builtin_expect(!nskip(n), 0))
        nsample(rc == 0 ? (uintptr_t)*out : 0, n, SRC_POSIX_MEMALIGN, 0);
    return rc;
}

static void *n_aligned_alloc(size_t align, size_t n)
{
    void *p = aligned_alloc(align, n);
    if (__builtin_expect(!nskip(n), 0))
        nsample((uintptr_t)p, n, SRC_ALIGNED_ALLOC, 0);
    return p;
}

static void *n_memalign(size_t align, size_t n)
{
    void *p = memalign(align, n);
    if (__builtin_expect(!nskip(n), 0))
        nsample((uintptr_t)p, n, SRC_MEMALIGN, 0);
    return p;
}

/* Anonymous mappings only: a file mapping's pages are the file's (see the top comment). */
static inline int n_is_alloc_map(int flags) { return (flags & MAP_ANONYMOUS) != 0; }

static void *n_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (flags & MAP_FIXED)
        nmap_cut((uintptr_t)addr, len); /* the mappings it replaces end (even if it fails: never false bytes) */
    void *p = mmap(addr, len, prot, flags, fd, off);
    if (p != MAP_FAILED && n_is_alloc_map(flags) && __builtin_expect(!nskip(len), 0))
        nsample((uintptr_t)p, len, SRC_MMAP, 0);
    return p;
}

#ifdef __GLIBC__ /* glibc exports mmap64 as a symbol of its own (musl: a macro at most) */
static void *n_mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (flags & MAP_FIXED)
        nmap_cut((uintptr_t)addr, len);
    void *p = mmap64(addr, len, prot, flags, fd, off);
    if (p != MAP_FAILED && n_is_alloc_map(flags) && __builtin_expect(!nskip(len), 0))
        nsample((uintptr_t)p, len, SRC_MMAP, 0);
    return p;
}
#endif

/* The sample ends before the pages go: after, another thread could map and sample them. */
static int n_munmap(void *addr, size_t len)
{
    nmap_cut((uintptr_t)addr, len);
    return munmap(addr, len);
}

/* A move or resize, as realloc: the old range's sample ends, the result is an allocation of
 * new_len (mremap of file mappings is rare enough to be counted with them). */
static void *n_mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
    void *want = NULL;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        want = va_arg(ap, void *);
        va_end(ap);
        nmap_cut((uintptr_t)want, new_len); /* what it maps over ends */
    }
    nmap_cut((uintptr_t)old, old_len ? old_len : 1);
    void *p = (flags & MREMAP_FIXED) ? mremap(old, old_len, new_len, flags, want) : mremap(old, old_len, new_len, flags);
    if (p != MAP_FAILED && __builtin_expect(!nskip(new_len), 0))
        nsample((uintptr_t)p, new_len, SRC_MMAP, 0);
    return p;
}

/* ---- what is hooked where -------------------------------------------------------------------- */
static const gp_hook hooks[] = {
    {"PyTraceMalloc_Track", DDP_NALLOC_TRACK, (void *)n_track, (void *)PyTraceMalloc_Track},
    {"PyTraceMalloc_Untrack", DDP_NALLOC_UNTRACK, (void *)n_untrack, (void *)PyTraceMalloc_Untrack},
    {"malloc", DDP_NALLOC_MALLOC, (void *)n_malloc, (void *)malloc},
    {"calloc", DDP_NALLOC_CALLOC, (void *)n_calloc, (void *)calloc},
    {"realloc", DDP_NALLOC_REALLOC, (void *)n_realloc, (void *)realloc},
    {"free", DDP_NALLOC_FREE, (void *)n_free, (void *)free},
    {"posix_memalign", DDP_NALLOC_POSIX_MEMALIGN, (void *)n_posix_memalign, (void *)posix_memalign},
    {"aligned_alloc", DDP_NALLOC_ALIGNED_ALLOC, (void *)n_aligned_alloc, (void *)aligned_alloc},
    {"memalign", DDP_NALLOC_MEMALIGN, (void *)n_memalign, (void *)memalign},
    {"mmap", DDP_NALLOC_MMAP, (void *)n_mmap, (void *)mmap},
#ifdef __GLIBC__
    {"mmap64", DDP_NALLOC_MMAP64, (void *)n_mmap64, (void *)mmap64},
#endif
    {"munmap", DDP_NALLOC_MUNMAP, (void *)n_munmap, (void *)munmap},
    {"mremap", DDP_NALLOC_MREMAP, (void *)n_mremap, (void *)mremap},
};
#define NHOOKS ((int)(sizeof hooks / sizeof hooks[0]))

enum { OBJ_TRACKS = 1 };

static int classify(gp_obj *o)
{
    if (o->is_libpython)
        return 0; /* the PyMem allocators end in its malloc: alloc.c counts those */
    if (gp_obj_imports(o, "PyTraceMalloc_Track"))
        o->flags |= OBJ_TRACKS;
    return 1;
}

static void *route(const gp_obj *o, const gp_hook *h, int *kind)
{
    *kind = h->kind;
    if ((o->flags & OBJ_TRACKS) && h->kind >= DDP_NALLOC_MALLOC && h->kind != DDP_NALLOC_FREE &&
        h->kind != DDP_NALLOC_MUNMAP)
        return NULL; /* its blocks are counted by its Track calls (its frees still end others' samples) */
    return h->wrapper;
}

static gp_set gp = { .hooks = hooks, .nhooks = NHOOKS, .classify = classify, .route = route };

/* Objects that call PyTraceMalloc_Track among the hooked ones (for the notes). */
static int count_tracking(void)
{
    int n = 0;
    for (int i = 0; i < gp.npatches; i++)
        if (gp.patches[i].kind == DDP_NALLOC_TRACK)
            n++;
    return n;
}

/* ---- fork: no prepare handler (fork must never wait for patch_lock, which a pass holds across
 * the loader's main lock: see gotpatch.c); gotpatch.c keeps the patch records whole ---------- */
static void atfork_child(void)
{
    atomic_store(&n_emitting, 0); /* (the threads inside are the parent's) */
    atomic_store(&n_on, 0);
    atomic_fetch_add(&n_gen, 1);
    pthread_mutex_init(&patch_lock, NULL);
    pthread_mutex_init(&live_lock, NULL); /* another thread may have held it at fork */
    if (gp.npatches)
        gp_restore_all(&gp, 0);
    nlive_n = 0;
    atomic_store(&nmaps_n, 0);
    if (nlive)
        memset(nlive, 0, NLIVE_CAP * sizeof *nlive);
    memset((void *)nfilter, 0, sizeof nfilter);
    memset((void *)nfreed, 0, sizeof nfreed);
}

/* ---- the engine (engine.h) ---------------------------------------------------------------------- */
static int nalloc_start(const ddp_config *cfg)
{
    int want = cfg->native_alloc && (cfg->events & (1u << DDP_EVENT_ALLOC));
    if (!n_atfork_done) { /* (outside patch_lock: pthread_atfork takes glibc's at-fork lock) */
        pthread_atfork(NULL, NULL, atfork_child);
        n_atfork_done = 1;
    }
    pthread_mutex_lock(&patch_lock);
    memset(&ns, 0, sizeof ns);
    memset(&gp.st, 0, sizeof gp.st);
    n_native_threads = cfg->native_threads;
    ddp_alloc_threads_start(); /* (every session: none of the last one's threads is this one's) */
    pthread_mutex_lock(&live_lock); /* the last session's blocks are not this one's */
    if (!nlive && want)
        nlive = calloc(NLIVE_CAP, sizeof *nlive);
    if (nlive)
        memset(nlive, 0, NLIVE_CAP * sizeof *nlive);
    nlive_n = 0;
    atomic_store(&nmaps_n, 0);
    if (!page_mask) {
        long ps = sysconf(_SC_PAGESIZE);
        page_mask = (uintptr_t)(ps > 0 ? ps : 4096) - 1;
    }
    memset((void *)nfilter, 0, sizeof nfilter);
    memset((void *)nfreed, 0, sizeof nfreed); /* ids start again at 1 each session */
    pthread_mutex_unlock(&live_lock);
    int rc = !want ? DDP_OK : !nlive ? DDP_ENOMEM : DDP_EUNSUPPORTED;
#ifndef GP_NO_ARCH
    if (!want || !nlive) {
        pthread_mutex_unlock(&patch_lock);
        return rc;
    }
    atomic_fetch_add(&n_gen, 1); /* every thread draws a fresh gap at its next allocation */
    atomic_store(&n_on, 1);
    gp_pass(&gp);
    ns.passes++;
    ns.tracking_objects = count_tracking();
    rc = DDP_OK;
#endif
    pthread_mutex_unlock(&patch_lock);
    return rc;
}

static void nalloc_tick(int64_t now, int final)
{
    (void)now, (void)final;
    if (!atomic_load(&n_on))
        return;
    pthread_mutex_lock(&patch_lock);
    if (atomic_load(&n_on) && gp_loaded_since(&gp)) {
        gp_pass(&gp);
        ns.passes++;
        ns.tracking_objects = count_tracking();
    }
    pthread_mutex_unlock(&patch_lock);
}

static void nalloc_stop(void)
{
    if (!atomic_load(&n_on))
        return;
    pthread_mutex_lock(&patch_lock);
    atomic_store(&n_on, 0);
    if (gp.npatches || gp.ndone)
        gp_restore_all(&gp, 1);
    pthread_mutex_unlock(&patch_lock);
    for (int spins = 0; atomic_load(&n_emitting) && spins < 10000000; spins++)
        sched_yield(); /* (bounded: a thread frozen inside keeps the buffers, see free_session) */
}

static int nalloc_emitting(void) { return atomic_load(&n_emitting); }

/* Not with the GIL: patching takes loader locks a GIL holder may wait on (as lock/park);
 * started after alloc's PyMem hooks, stopped before alloc freezes LIVE (engine.h's order). */
static void nalloc_settle(ddp_record *r);
const ddp_engine ddp_nalloc_engine = {
    .name = "nalloc",
    .events = 1u << DDP_EVENT_ALLOC,
    .with_gil = 0,
    .start = nalloc_start,
    .stop = nalloc_stop,
    .tick = nalloc_tick,
    .emitting = nalloc_emitting,
    .after_fork = NULL, /* its own pthread_atfork handlers */
    .settle = nalloc_settle,
};

int ddp_nalloc_live_count(void)
{
    if (!nlive)
        return 0;
    pthread_mutex_lock(&live_lock);
    int n = (int)nlive_n;
    pthread_mutex_unlock(&live_lock);
    return n;
}

/* At stop: the sampled blocks still allocated (up to max), then an empty table, so frees
 * through slots another tool kept pointing at our wrappers find the prefilter clear. */
int ddp_nalloc_live_take(ddp_alloc_info *out, int max)
{
    if (!nlive)
        return 0;
    pthread_mutex_lock(&live_lock);
    int n = 0;
    uint64_t budget = NRES_BUDGET;
    for (uint32_t i = 0; i < NLIVE_CAP && n < max; i++) {
        const nlive_t *e = &nlive[i];
        if (!e->ptr)
            continue;
        ddp_alloc_info *o = &out[n++];
        memset(o, 0, sizeof *o);
        o->id = e->id;
        o->size = e->size;
        uint64_t pages = (e->size + page_mask) / (page_mask + 1);
        if (e->src == SRC_MMAP && pages > budget) {
            ns.maps_unmeasured++;
        } else if (e->src == SRC_MMAP) { /* a mapping: the pages it holds, not the address space */
            budget -= pages;
            int64_t t0 = ddp_now_ns();
            o->size = nresident(e->ptr, e->size);
            ns.maps_measure_ns += (uint64_t)(ddp_now_ns() - t0);
            ns.maps_measured++;
            ns.maps_mapped_bytes += e->size;
            ns.maps_resident_bytes += o->size;
        }
        o->sampled_size = e->sampled_size != o->size ? e->sampled_size : 0;
        if (src_name[e->src])
            snprintf(o->type_name, sizeof o->type_name, "%s", src_name[e->src]);
        else
            snprintf(o->type_name, sizeof o->type_name, "traced domain %u", e->domain);
    }
    memset(nlive, 0, NLIVE_CAP * sizeof *nlive);
    nlive_n = 0;
    atomic_store(&nmaps_n, 0);
    memset((void *)nfilter, 0, sizeof nfilter);
    pthread_mutex_unlock(&live_lock);
    return n;
}

int ddp_nalloc_live_ids(uint64_t *out, int max)
{
    if (!nlive)
        return 0;
    pthread_mutex_lock(&live_lock);
    int n = 0;
    for (uint32_t i = 0; i < NLIVE_CAP; i++)
        if (nlive[i].ptr) {
            if (out && n < max)
                out[n] = nlive[i].id;
            n++;
        }
    pthread_mutex_unlock(&live_lock);
    return n;
}

int ddp_nalloc_get_stats(ddp_nalloc_stats *out)
{
    if (!out)
        return DDP_EINVAL;
    memset(out, 0, sizeof *out);
    out->sampled = atomic_load(&ns.sampled);
    out->emit_failed = atomic_load(&ns.emit_failed);
    out->not_python = atomic_load(&ns.not_python);
    out->native_thread = atomic_load(&ns.native_thread);
    out->live_overflow = atomic_load(&ns.live_overflow);
    out->maps_trimmed = atomic_load(&ns.maps_trimmed);
    out->maps_measured = ns.maps_measured;
    out->maps_mapped_bytes = ns.maps_mapped_bytes;
    out->maps_resident_bytes = ns.maps_resident_bytes;
    out->maps_measure_ns = ns.maps_measure_ns;
    out->maps_unmeasured = ns.maps_unmeasured;
    out->objects = gp.st.objects;
    out->slots_patched = gp.st.slots_patched;
    out->slots_foreign = gp.st.slots_foreign;
    out->restore_mismatch = gp.st.restore_mismatch;
    out->protect_failed = gp.st.protect_failed;
    out->passes = ns.passes;
    out->passes_deferred = gp.st.passes_deferred;
    out->slots_unhooked = gp.st.slots_unhooked;
    out->kinds_patched = gp.st.kinds_patched;
    out->kinds_foreign = gp.st.kinds_foreign;
    out->tracking_objects = ns.tracking_objects;
    out->active_patches = gp.npatches;
    return DDP_OK;
}

int ddp_nalloc_slots(uint64_t *addr, uint64_t *val, int32_t *kind, int cap)
{
    if (cap < 0 || (cap && (!addr || !val || !kind)))
        return DDP_EINVAL;
    pthread_mutex_lock(&patch_lock);
    int n = gp_list(&gp, addr, val, kind, cap);
    pthread_mutex_unlock(&patch_lock);
    return n;
}

uint64_t ddp_nalloc_wrapper(int kind)
{
    for (int i = 0; i < NHOOKS; i++)
        if (hooks[i].kind == kind)
            return (uint64_t)(uintptr_t)hooks[i].wrapper;
    return 0;
}

const char *ddp_nalloc_kind_name(int kind)
{
    return kind >= 1 && kind <= (int)(sizeof src_name / sizeof src_name[0]) ? src_name[kind - 1] : NULL;
}

/* Called by whoever moves records out of the ring (drain.c), any thread, no lock: the
 * freed cell holds exactly this aux only if this very sample's block was freed. */
static void nalloc_settle(ddp_record *r)
{
    uint64_t a = r->aux;
    if ((a >> DDP_ALLOC_KIND_SHIFT) && (a & NID_MASK) &&
        atomic_load_explicit(&nfreed[a & (NFREED_CAP - 1)], memory_order_relaxed) == a)
        r->aux = a & ~NID_MASK;
}
