/* alloclive.c — the sampled PyMem blocks not freed yet, for LIVE at stop.
 *
 * A bounded open-addressing table (linear probing, backward-shift deletion), and before it
 * a byte filter over 256-byte granules that every free of a hooked domain tests: coarse
 * granules keep a pymalloc pool on a few adjacent bytes (few cache lines for a churning
 * workload), and a neighbour of a live sample costs one table probe.  Full table: the
 * sample still counts as ALLOC, not as LIVE (the hooks count it).  At stop the table is
 * frozen into a list of (id, size, type) that Python turns into LIVE rows.  All of it runs
 * with the GIL.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <Python.h>
#include "ddp_internal.h"
#include "alloc.h"
#include "alloclive.h"
#include "alloctype.h"

#define LIVE_CAP (1u << 15)  /* table cells (power of two) */
#define LIVE_MAX (LIVE_CAP / 4 * 3)
#define FILTER_STICKY 255    /* a saturated bucket stays set until the filter is cleared */

uint8_t ddp_live_filter[DDP_LIVE_FILTER_SIZE];
static ddp_live_entry *live; /* LIVE_CAP cells, allocated once (libc malloc, never PyMem) */
static uint32_t live_n;
static int live_is_open;     /* between a session's start and its freeze */
static ddp_alloc_info *frozen; /* the live list at stop */
static int frozen_n;

static inline uint8_t *filter_cell(uintptr_t p)
{
    return &ddp_live_filter[(p >> DDP_LIVE_FILTER_SHIFT) & (DDP_LIVE_FILTER_SIZE - 1)];
}

static inline void filter_add(uintptr_t p)
{
    uint8_t *c = filter_cell(p);
    if (*c != FILTER_STICKY)
        ++*c;
}

static inline void filter_sub(uintptr_t p)
{
    uint8_t *c = filter_cell(p);
    if (*c != FILTER_STICKY) /* saturated: its true count is unknown, so it stays set */
        --*c;
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
    memset(live, 0, LIVE_CAP * sizeof *live);
    filter_clear();
    live_n = 0;
    free(frozen);
    frozen = NULL;
    frozen_n = 0;
    live_is_open = 1;
    return DDP_OK;
}

ddp_live_entry *ddp_live_find(uintptr_t p)
{
    if (!live_n)
        return NULL;
    for (uint32_t h = ptr_hash(p), i = 0; i < LIVE_CAP; i++, h = (h + 1) & (LIVE_CAP - 1)) {
        if (live[h].ptr == p)
            return &live[h];
        if (!live[h].ptr)
            return NULL;
    }
    return NULL;
}

int ddp_live_insert(uintptr_t p, uint64_t size, uint64_t id, int domain)
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
    live[h] = (ddp_live_entry){ .ptr = p, .size = size, .id = id, .type = 0, .domain = domain };
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

void ddp_live_forget(uintptr_t p)
{
    if (!p)
        return;
    ddp_live_entry *e = ddp_live_find(p);
    if (e)
        live_remove_at((uint32_t)(e - live));
}

static void freeze_entries(unsigned skip)
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
