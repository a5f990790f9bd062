/* agg.c — records aggregated in native code, so that no sample waits for the GIL.
 *
 * Producers (the SIGPROF handler, the wall thread, the allocation and wait hooks) write
 * records into the ring (ring.c), which is small and async-signal-safe.  Records leave the
 * ring here, in ordinary threads and without the GIL: the wall thread moves them at every
 * tick, the drain and stop move the rest.  Each record is added into an aggregate keyed by
 * everything the Profile keeps of it: event, thread state, flags, thread, label set, frames,
 * aux (an ALLOC record's id, a wait's kind) and the Profile's time tick at its time (the
 * caller's bucket; ticks only coarsen as a profile grows, so records merged in one bucket
 * share one final tick).  The Python drain, which needs the GIL, then converts one record
 * per distinct key and tick instead of one per sample: beside dozens of threads that want
 * the GIL it gets it a few times a second, and this is what keeps up with them.
 *
 * An aggregate is a byte arena of entries (a ddp_record header and its frames, in the
 * order first seen) and an open-addressing index of arena offsets.  Its size is fixed when
 * it is made.  One thread at a time uses an aggregate (the caller's lock).
 *
 * Full (more distinct keys before the drain came than it holds): a record of a new key is
 * then folded into the last entry of its thread and event, count and value added, so every
 * thread's totals stay exact and only the split of its time between stacks is thinned
 * (counted).  A last eighth of keys and bytes is kept for the first entry of a thread and
 * event that has none yet; past that, records wait in the ring.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "ddp_internal.h"

#define LAST_SLOTS 4096      /* (thread, event) -> its last entry, direct-mapped */

struct ddp_agg {
    uint32_t *index;        /* arena offset / 8 + 1 per slot, 0 empty; `slots` (a power of two) */
    uint32_t *filled;       /* the slot of each key, in the order added: a reset clears just those */
    uint32_t slots, keys, max_keys;
    char *arena;
    size_t arena_bytes, used;
    size_t read;            /* arena offset of the next entry ddp_agg_take copies out */
    uint32_t last[LAST_SLOTS]; /* arena offset / 8 + 1 of a thread's and event's last entry */
    uint64_t folded;        /* records folded into their thread's last entry (full) */
};

static inline uint32_t last_slot(const ddp_record *r) { return ((uint32_t)r->tid * 2654435761u ^ r->event) & (LAST_SLOTS - 1); }

static size_t entry_bytes(const ddp_record *r) { return sizeof(ddp_record) + (size_t)r->depth * sizeof(ddp_frame); }

static uint64_t key_hash(const ddp_record *r, int64_t bucket)
{
    uint64_t h = r->stack_hash ^ ((uint64_t)r->event << 56) ^ ((uint64_t)r->state << 48) ^ ((uint64_t)r->flags << 32) ^
                 (uint32_t)r->tid;
    h ^= (r->label_id ^ ((uint64_t)r->interp << 40)) * 0x9E3779B97F4A7C15ULL;
    h ^= (uint64_t)bucket * 0xC2B2AE3D27D4EB4FULL;
    h ^= r->aux * 0x165667B19E3779F9ULL;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 32;
    return h;
}

/* The bucket an entry was filed under is not stored: two records share a bucket when the
 * entry's time and the record's map to the same one (the caller's bucket function). */
static int same_key(const ddp_record *a, const ddp_record *b)
{
    return a->event == b->event && a->state == b->state && a->flags == b->flags && a->depth == b->depth &&
           a->tid == b->tid && a->label_id == b->label_id && a->interp == b->interp && a->aux == b->aux && a->stack_hash == b->stack_hash &&
           !memcmp(a + 1, b + 1, (size_t)a->depth * sizeof(ddp_frame));
}

ddp_agg *ddp_agg_new(uint32_t max_keys, size_t arena_bytes)
{
    if (max_keys > DDP_AGG_MAX_KEYS)
        return NULL; /* (the index's doubling would wrap to 0 and never end) */
    ddp_agg *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    uint32_t slots = 64;
    while (slots < (max_keys + max_keys / 8 + 1) * 2u)
        slots <<= 1;
    a->slots = slots;
    a->max_keys = max_keys;
    a->arena_bytes = arena_bytes;
    a->index = calloc(slots, sizeof *a->index);
    a->filled = malloc(((size_t)max_keys + max_keys / 8 + 1) * sizeof *a->filled);
    /* mmap'ed: pages are committed where entries are written, not up front */
    a->arena = mmap(NULL, arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!a->index || !a->filled || a->arena == MAP_FAILED || arena_bytes / 8 >= UINT32_MAX) {
        if (a->arena != MAP_FAILED && a->arena)
            munmap(a->arena, arena_bytes);
        free(a->index);
        free(a->filled);
        free(a);
        return NULL;
    }
    return a;
}

void ddp_agg_free(ddp_agg *a)
{
    if (!a)
        return;
    munmap(a->arena, a->arena_bytes);
    free(a->index);
    free(a->filled);
    free(a);
}

void ddp_agg_reset(ddp_agg *a)
{
    /* A drain of an allocation-heavy session resets an aggregate of a few dozen keys a few
     * times a second: clearing those slots (and their entries' last slots) touches a few
     * cache lines where clearing the whole index wrote 1 MiB and evicted the caches. */
    if (a->keys && a->keys <= a->slots / 64) {
        for (uint32_t k = 0; k < a->keys; k++)
            a->index[a->filled[k]] = 0;
        for (size_t off = 0; off < a->used; off += entry_bytes((const ddp_record *)(a->arena + off)))
            a->last[last_slot((const ddp_record *)(a->arena + off))] = 0;
    } else if (a->keys) {
        memset(a->index, 0, a->slots * sizeof *a->index);
        memset(a->last, 0, sizeof a->last);
    }
    a->keys = 0;
    a->used = a->read = 0;
}

int ddp_agg_add(ddp_agg *a, const ddp_record *r, int64_t bucket, int64_t (*bucket_fn)(int64_t ts))
{
    uint32_t mask = a->slots - 1, i = (uint32_t)key_hash(r, bucket) & mask;
    for (;;) {
        uint32_t v = a->index[i];
        if (!v)
            break;
        ddp_record *e = (ddp_record *)(a->arena + (size_t)(v - 1) * 8);
        if (same_key(e, r) && (bucket < 0 ? e->ts_ns == r->ts_ns : bucket_fn(e->ts_ns) == bucket)) {
            e->count += r->count;
            e->value += r->value;
            if (r->ts_ns > e->ts_ns)
                e->ts_ns = r->ts_ns;
            return 0;
        }
        i = (i + 1) & mask;
    }
    size_t need = entry_bytes(r);
    uint32_t ls = last_slot(r), lv = a->last[ls];
    ddp_record *last = lv ? (ddp_record *)(a->arena + (size_t)(lv - 1) * 8) : NULL;
    if (last && (last->tid != r->tid || last->event != r->event))
        last = NULL; /* another thread's: direct-mapped slots collide */
    int full = a->keys >= a->max_keys || a->used + need > a->arena_bytes - a->arena_bytes / 8;
    if (full && last && r->event != DDP_EVENT_ALLOC) { /* (an ALLOC record's id must stay its own) */
        last->count += r->count;
        last->value += r->value;
        if (r->ts_ns > last->ts_ns)
            last->ts_ns = r->ts_ns;
        a->folded++;
        return 0;
    }
    if (full && (a->keys >= a->max_keys + a->max_keys / 8 || a->used + need > a->arena_bytes))
        return -1;
    memcpy(a->arena + a->used, r, need);
    a->index[i] = a->last[ls] = (uint32_t)(a->used / 8) + 1;
    a->used += need; /* (entry sizes are multiples of 8) */
    a->filled[a->keys++] = i;
    return 0;
}

/* Entries of one key whose times share a bucket of a coarser tick become one, before any is
 * read: `bucket_at(e, last)` is entry e's bucket under the tick at `last`, the latest entry's
 * time, or -1 to keep e as it is (a Profile's final tick is at least the tick at its last
 * record's time, a power-of-two multiple of every finer one, aligned at 0: entries merged
 * here share one final tick).  A drain that comes seconds after the records were added then
 * converts one record per key and coarse bucket instead of one per fine bucket.  Merged
 * entries move to the first of them, in place (kept in first-seen order, compacted); the
 * index and last slots are rebuilt.  Returns how many entries were merged away. */
uint32_t ddp_agg_coarsen(ddp_agg *a, int64_t (*bucket_at)(const ddp_record *e, int64_t last))
{
    if (a->read || a->keys < 2)
        return 0;
    int64_t last = INT64_MIN;
    for (size_t off = 0; off < a->used; off += entry_bytes((const ddp_record *)(a->arena + off)))
        if (((const ddp_record *)(a->arena + off))->ts_ns > last)
            last = ((const ddp_record *)(a->arena + off))->ts_ns;
    if (a->keys <= a->slots / 64)
        for (uint32_t k = 0; k < a->keys; k++)
            a->index[a->filled[k]] = 0;
    else
        memset(a->index, 0, a->slots * sizeof *a->index);
    memset(a->last, 0, sizeof a->last);
    uint32_t mask = a->slots - 1, keys = 0, merged = 0;
    size_t w = 0;
    for (size_t off = 0; off < a->used;) {
        ddp_record *r = (ddp_record *)(a->arena + off);
        size_t len = entry_bytes(r);
        int64_t bucket = bucket_at(r, last);
        uint32_t i = (uint32_t)key_hash(r, bucket) & mask;
        ddp_record *into = NULL;
        for (uint32_t v; (v = a->index[i]) != 0; i = (i + 1) & mask) {
            ddp_record *e = (ddp_record *)(a->arena + (size_t)(v - 1) * 8);
            if (bucket >= 0 && same_key(e, r) && bucket_at(e, last) == bucket) {
                into = e;
                break;
            }
        }
        if (into) {
            into->count += r->count;
            into->value += r->value;
            if (r->ts_ns > into->ts_ns)
                into->ts_ns = r->ts_ns; /* (the same coarse bucket: its slot stays right) */
            merged++;
        } else {
            uint32_t ls = last_slot(r);
            if (w != off)
                memmove(a->arena + w, r, len);
            a->index[i] = a->last[ls] = (uint32_t)(w / 8) + 1;
            a->filled[keys++] = i;
            w += len;
        }
        off += len;
    }
    a->used = w;
    a->keys = keys;
    return merged;
}

uint64_t ddp_agg_folded(const ddp_agg *a) { return a->folded; }

int ddp_agg_take(ddp_agg *a, void *buf, int max, size_t stride)
{
    int n = 0;
    while (n < max && a->read < a->used) {
        const ddp_record *e = (const ddp_record *)(a->arena + a->read);
        size_t len = entry_bytes(e);
        memcpy((char *)buf + (size_t)n * stride, e, len);
        a->read += len;
        n++;
    }
    return n;
}

uint32_t ddp_agg_keys(const ddp_agg *a) { return a->keys; }
int ddp_agg_quarter_full(const ddp_agg *a) { return a->keys >= a->max_keys / 4 || a->used >= a->arena_bytes / 4; }
