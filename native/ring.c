/* ring.c — preallocated bounded MPMC queue of fixed-size records (D. Vyukov's design).
 *
 * Why this one: producers are signal handlers (any thread, any moment) and the wall
 * sampler thread; a producer never waits — a full ring makes reserve() return NULL and
 * the caller counts a drop.  Each cell carries a sequence number: a producer claims a
 * cell with one CAS on the enqueue position, writes it in place, then publishes it by
 * storing the sequence (release).  The consumer only takes cells whose sequence says
 * "published", so a producer interrupted between claim and publish just makes the
 * consumer stop early and pick the cell up at the next drain.  No locks, no malloc
 * after creation, memory is mmap'ed once.
 *
 * A cell stores its sequence number minus its own index, so the fresh mapping's zero pages
 * already read as Vyukov's initial state (cell i: sequence i) and creation writes nothing
 * (writing every cell faults the whole ring in at each start and evicts the profiled code's
 * caches).  A page first touched by a producer costs that producer a fault, under the GIL's
 * mutex for a GIL wait, so the ring is populated ahead of the producers, off their path:
 * the first cells at creation, then the sampler thread keeps DDP_RING_AHEAD cells ahead of
 * the enqueue position (ddp_ring_prefault, one MADV_POPULATE_WRITE per chunk; without it,
 * Linux < 5.14, producers fault pages in).
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include "ddp_internal.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

struct cell {
    _Atomic size_t seq;
    size_t pad;           /* records start 16-byte aligned */
};

struct ddp_ring {
    _Atomic size_t enq;
    char pad1[56];
    _Atomic size_t deq;
    char pad2[56];
    size_t mask;
    size_t record_size;
    size_t cell_size;
    size_t map_size;
    char *cells;
    size_t populated;     /* cells prefaulted (ddp_ring_prefault's caller only) */
    int populate_failed;
};

static inline struct cell *cell_at(ddp_ring *r, size_t pos)
{
    return (struct cell *)(r->cells + (pos & r->mask) * r->cell_size);
}

/* The cell's sequence number (stored relative to its index: see the header). */
static inline size_t seq_load(ddp_ring *r, struct cell *c, size_t pos)
{
    return atomic_load_explicit(&c->seq, memory_order_acquire) + (pos & r->mask);
}

static inline void seq_store(ddp_ring *r, struct cell *c, size_t pos, size_t seq)
{
    atomic_store_explicit(&c->seq, seq - (pos & r->mask), memory_order_release);
}

ddp_ring *ddp_ring_new(size_t records, size_t record_size)
{
    size_t n = 2;
    while (n < records)
        n <<= 1;
    size_t cell_size = (sizeof(struct cell) + record_size + 15) & ~(size_t)15;
    size_t map_size = sizeof(ddp_ring) + 64 + n * cell_size;
    void *mem = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return NULL;
    ddp_ring *r = mem;
    r->mask = n - 1;
    r->record_size = record_size;
    r->cell_size = cell_size;
    r->map_size = map_size;
    r->cells = (char *)mem + ((sizeof(ddp_ring) + 63) & ~(size_t)63);
    /* every cell's stored sequence is 0 (the mapping's zero pages): cell i is free for pos i */
    atomic_store(&r->enq, 0);
    atomic_store(&r->deq, 0);
    ddp_ring_prefault(r);
    return r;
}

void ddp_ring_prefault(ddp_ring *r)
{
    size_t n = r->mask + 1;
    if (r->populate_failed || r->populated >= n)
        return; /* after one lap every page has been written anyway */
    size_t want = atomic_load_explicit(&r->enq, memory_order_relaxed) + DDP_RING_AHEAD;
    if (want > n)
        want = n;
    if (r->populated + DDP_RING_AHEAD / 2 > want && want < n)
        return; /* in chunks of at least half the lead: one syscall per chunk */
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)(r->cells + r->populated * r->cell_size) & ~(pg - 1);
    uintptr_t hi = (uintptr_t)(r->cells + want * r->cell_size);
    if (hi > lo && madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE) != 0)
        r->populate_failed = 1; /* old kernel: producers fault pages in themselves */
    r->populated = want;
}

void ddp_ring_free(ddp_ring *r)
{
    if (r)
        munmap(r, r->map_size);
}

void *ddp_ring_reserve(ddp_ring *r, size_t *ticket)
{
    size_t pos = atomic_load_explicit(&r->enq, memory_order_relaxed);
    for (;;) {
        struct cell *c = cell_at(r, pos);
        size_t seq = seq_load(r, c, pos);
        intptr_t dif = (intptr_t)seq - (intptr_t)pos;
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&r->enq, &pos, pos + 1, memory_order_relaxed,
                                                      memory_order_relaxed)) {
                *ticket = pos;
                return (char *)c + sizeof(struct cell);
            }
        } else if (dif < 0) {
            return NULL; /* full */
        } else {
            pos = atomic_load_explicit(&r->enq, memory_order_relaxed);
        }
    }
}

void ddp_ring_publish(ddp_ring *r, size_t ticket)
{
    seq_store(r, cell_at(r, ticket), ticket, ticket + 1);
}

int ddp_ring_pop(ddp_ring *r, void *dst)
{
    size_t pos = atomic_load_explicit(&r->deq, memory_order_relaxed);
    for (;;) {
        struct cell *c = cell_at(r, pos);
        size_t seq = seq_load(r, c, pos);
        intptr_t dif = (intptr_t)seq - (intptr_t)(pos + 1);
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&r->deq, &pos, pos + 1, memory_order_relaxed,
                                                      memory_order_relaxed)) {
                /* Copy only the frames in use: records are sized for max_depth. */
                const ddp_record *rec = (const ddp_record *)((char *)c + sizeof(struct cell));
                size_t used = sizeof(ddp_record) + (size_t)rec->depth * sizeof(ddp_frame);
                memcpy(dst, rec, used <= r->record_size ? used : r->record_size);
                seq_store(r, c, pos, pos + r->mask + 1);
                return 1;
            }
        } else if (dif < 0) {
            return 0; /* empty, or the next cell is still being written */
        } else {
            pos = atomic_load_explicit(&r->deq, memory_order_relaxed);
        }
    }
}

size_t ddp_ring_count(ddp_ring *r)
{
    /* enq is read first: a consumer moving deq past it meanwhile only makes this smaller */
    size_t enq = atomic_load_explicit(&r->enq, memory_order_relaxed);
    size_t deq = atomic_load_explicit(&r->deq, memory_order_relaxed);
    return enq > deq ? enq - deq : 0;
}

size_t ddp_ring_capacity(ddp_ring *r) { return r->mask + 1; }
