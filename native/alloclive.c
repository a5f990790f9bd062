/* alloclive.c — the sampled PyMem blocks not freed yet, for LIVE at stop.
 *
 * A bounded open-addressing table (linear probing, backward-shift deletion), and before it
 * a byte filter over 256-byte granules that every free of a hooked domain tests: coarse
 * granules keep a pymalloc pool on a few adjacent bytes (few cache lines for a churning
 * workload), and a neighbour of a live sample costs one table probe.  Full table: the
 * sample still counts as ALLOC, not as LIVE (the hooks count it).  At stop the table is
 * frozen into a list of (id, size, type) that Python turns into LIVE rows.  All of it runs
 * with the GIL, but for the blocks of subinterpreters with a GIL of their own: they go in a
 * small table of their own under a mutex (their threads run beside the main interpreter's
 * GIL), and the filter, which both tables' blocks set, is updated atomically.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <Python.h>
#include "ddp_internal.h"
#include "alloc.h"
#include "alloclive.h"
#include "alloctype.h"

#define LIVE_CAP (1u << 15)  /* table cells (power of two) */
#define LIVE_MAX (LIVE_CAP / 4 * 3)
#define SUB_CAP (1u << 12)   /* subinterpreters' table cells */
#define SUB_MAX (SUB_CAP / 4 * 3)
#define FILTER_STICKY 255    /* a saturated bucket stays set until the filter is cleared */

uint8_t ddp_live_filter[DDP_LIVE_FILTER_SIZE];
static ddp_live_entry *live; /* LIVE_CAP cells, allocated once (libc malloc, never PyMem) */
static uint32_t live_n;
static int live_is_open;     /* between a session's start and its freeze */
static ddp_alloc_info *frozen; /* the live list at stop */
static int frozen_n;
static pthread_mutex_t sub_lock = PTHREAD_MUTEX_INITIALIZER;
static ddp_live_entry *sub;  /* SUB_CAP cells (libc malloc), under sub_lock */
static uint32_t sub_n;
static int sub_is_open;      /* live_is_open, as the subinterpreters see it (under sub_lock) */

static inline uint8_t *filter_cell(uintptr_t p)
{
    return &ddp_live_filter[(p >> DDP_LIVE_FILTER_SHIFT) & (DDP_LIVE_FILTER_SIZE - 1)];
}

/* Atomic: a subinterpreter's thread may update the same byte at the same time (a lost update
 * could clear a byte that a live block still needs).  Only sampled blocks come here. */
static inline void filter_add(uintptr_t p)
{
    uint8_t *c = filter_cell(p);
    uint8_t v = __atomic_load_n(c, __ATOMIC_RELAXED);
    while (v != FILTER_STICKY && !__atomic_compare_exchange_n(c, &v, (uint8_t)(v + 1), 1, __ATOMIC_RELAXED,
                                                               __ATOMIC_RELAXED))
        ;
}

static inline void filter_sub(uintptr_t p)
{
    uint8_t *c = filter_cell(p);
    uint8_t v = __atomic_load_n(c, __ATOMIC_RELAXED);
    /* saturated: its true count is unknown, so it stays set */
    while (v != FILTER_STICKY && v && !__atomic_compare_exchange_n(c, &v, (uint8_t)(v - 1), 1, __ATOMIC_RELAXED,
                                                                    __ATOMIC_RELAXED))
        ;
}

static void filter_clear(void)
{
    memset(ddp_live_filter, 0, sizeof ddp_live_filter);
}

static inline uint32_t ptr_hash(uintptr_t p)
{
    uint64_t x = (uint64_t)p * 0x9E3779B97F4A7C15ULL;
    return (uint32_t)(x >> 40) & (LIVE_CAP - 1);
}

int ddp_live_open(void)
{
    if (!live) {
        live = calloc(LIVE_CAP, sizeof *live);
        if (!live)
            return DDP_ENOMEM;
    }
    pthread_mutex_lock(&sub_lock);
    if (!sub)
        sub = calloc(SUB_CAP, sizeof *sub);
    if (sub)
        memset(sub, 0, SUB_CAP * sizeof *sub);
    sub_n = 0;
    sub_is_open = sub != NULL;
    memset(live, 0, LIVE_CAP * sizeof *live);
    filter_clear();
    pthread_mutex_unlock(&sub_lock);
    live_n = 0;
    free(frozen);
    frozen = NULL;
    frozen_n = 0;
    live_is_open = 1;
    return DDP_OK;
}

/* ---- one table (the main interpreter's, or the subinterpreters') -------------------------- */
static ddp_live_entry *table_find(ddp_live_entry *t, uint32_t cap, uint32_t n, uintptr_t p)
{
    if (!n)
        return NULL;
    for (uint32_t h = ptr_hash(p) & (cap - 1), i = 0; i < cap; i++, h = (h + 1) & (cap - 1)) {
        if (t[h].ptr == p)
            return &t[h];
        if (!t[h].ptr)
            return NULL;
    }
    return NULL;
}

static int table_insert(ddp_live_entry *t, uint32_t cap, uint32_t max, uint32_t *n, const ddp_live_entry *e)
{
    if (*n >= max)
        return -1;
    uint32_t h = ptr_hash(e->ptr) & (cap - 1);
    while (t[h].ptr && t[h].ptr != e->ptr)
        h = (h + 1) & (cap - 1);
    if (!t[h].ptr) {
        (*n)++;
        filter_add(e->ptr);
    }
    t[h] = *e;
    return 0;
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void table_remove_at(ddp_live_entry *t, uint32_t cap, uint32_t *n, uint32_t i)
{
    (*n)--;
    filter_sub(t[i].ptr);
    uint32_t j = i;
    for (;;) {
        t[i].ptr = 0;
        for (;;) {
            j = (j + 1) & (cap - 1);
            if (!t[j].ptr)
                return;
            uint32_t k = ptr_hash(t[j].ptr) & (cap - 1);
            /* move j into i unless its home k lies cyclically in (i, j] */
            if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
                continue;
            break;
        }
        t[i] = t[j];
        i = j;
    }
}

ddp_live_entry *ddp_live_find(uintptr_t p) { return table_find(live, LIVE_CAP, live_n, p); }

int ddp_live_insert(uintptr_t p, uint64_t size, uint64_t id, int domain)
{
    ddp_live_entry e = { .ptr = p, .size = size, .id = id, .type = 0, .domain = domain };
    return table_insert(live, LIVE_CAP, LIVE_MAX, &live_n, &e);
}

void ddp_live_forget(uintptr_t p)
{
    if (!p)
        return;
    ddp_live_entry *e = ddp_live_find(p);
    if (e)
        table_remove_at(live, LIVE_CAP, &live_n, (uint32_t)(e - live));
}

/* ---- the subinterpreters' blocks (any thread, sub_lock) ----------------------------------- */
int ddp_live_sub_insert(uintptr_t p, uint64_t size, uint64_t id, int domain)
{
    ddp_live_entry e = { .ptr = p, .size = size, .id = id, .type = 0, .domain = domain };
    pthread_mutex_lock(&sub_lock);
    int rc = sub_is_open ? table_insert(sub, SUB_CAP, SUB_MAX, &sub_n, &e) : -1;
    pthread_mutex_unlock(&sub_lock);
    return rc;
}

void ddp_live_sub_forget(uintptr_t p)
{
    if (!p || !__atomic_load_n(&sub_n, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&sub_lock);
    ddp_live_entry *e = table_find(sub, SUB_CAP, sub_n, p);
    if (e)
        table_remove_at(sub, SUB_CAP, &sub_n, (uint32_t)(e - sub));
    pthread_mutex_unlock(&sub_lock);
}

static void freeze_entries(unsigned skip)
{
    free(frozen);
    frozen = NULL;
    frozen_n = 0;
    int native_n = ddp_nalloc_live_count();
    pthread_mutex_lock(&sub_lock); /* closed: a subinterpreter's insert or free waits, then finds it so */
    sub_is_open = 0;
    if ((live_n || sub_n) && (frozen = calloc(live_n + sub_n + (uint32_t)native_n + 1, sizeof *frozen))) {
        /* a subinterpreter's block: its type is not read (the block is its interpreter's, which
         * may free it while we read) */
        for (uint32_t i = 0; sub && i < SUB_CAP; i++)
            if (sub[i].ptr && !(skip & (1u << sub[i].domain)))
                frozen[frozen_n++] = (ddp_alloc_info){ .id = sub[i].id, .size = sub[i].size };
    }
    sub_n = 0;
    pthread_mutex_unlock(&sub_lock);
    if (!frozen && !native_n)
        return;
    if (!frozen && !(frozen = calloc((uint32_t)native_n + 1, sizeof *frozen)))
        return;
    frozen_n += ddp_nalloc_live_take(frozen + frozen_n, native_n); /* C allocations: named leaves already */
    if (!live)
        return;
    for (uint32_t i = 0; i < LIVE_CAP; i++) {
        ddp_live_entry *e = &live[i];
        if (!e->ptr || (skip & (1u << e->domain)))
            continue;
        ddp_alloc_info *o = &frozen[frozen_n++];
        o->id = e->id;
        o->size = e->size;
        o->type_name[0] = 0;
        uintptr_t type = e->type;
        if (!type && e->domain == 1) /* OBJ: allocated (the object is initialised) unless a free went unseen */
            type = ddp_alloc_block_type(e->ptr, e->size, 1);
        if (type && ddp_alloc_type_name(type, o->type_name) != 0)
            o->type_name[0] = 0;
    }
}

void ddp_live_freeze(unsigned skip)
{
    freeze_entries(skip);
    /* the table is not read again before the next open (which clears it): an empty prefilter
     * keeps frees through a pass-through layer left installed on the fast path */
    live_n = 0;
    filter_clear();
    live_is_open = 0;
}

void ddp_live_after_fork(void)
{
    live_n = 0;
    filter_clear();
    live_is_open = 0;
    pthread_mutex_init(&sub_lock, NULL); /* the parent's may have been held by a thread not here */
    sub_n = 0;
    sub_is_open = 0;
}

int ddp_live_frozen_count(void) { return frozen_n; }

/* ---- the public API (ddprof.h) ------------------------------------------------------------------ */

int ddp_alloc_live_ids(uint64_t *out, int max)
{
    if (!out || max < 0)
        return DDP_EINVAL;
    if (!Py_IsInitialized() || !live)
        return 0;
    PyGILState_STATE g = PyGILState_Ensure();
    int n = 0;
    if (live_is_open) {
        for (uint32_t i = 0; i < LIVE_CAP; i++)
            if (live[i].ptr) {
                if (n < max)
                    out[n] = live[i].id;
                n++;
            }
        pthread_mutex_lock(&sub_lock);
        for (uint32_t i = 0; sub && i < SUB_CAP; i++)
            if (sub[i].ptr) {
                if (n < max)
                    out[n] = sub[i].id;
                n++;
            }
        pthread_mutex_unlock(&sub_lock);
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
    if (live_is_open)
        return DDP_EBUSY; /* only after stop */
    int n = frozen_n < max ? frozen_n : max;
    if (n > 0) /* frozen is NULL when nothing was tracked: memcpy(NULL, 0) is undefined */
        memcpy(out, frozen, (size_t)n * sizeof *out);
    return frozen_n;
}
