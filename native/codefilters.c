/* codefilters.c — two bit filters over code pointers, lock-free and signal-safe: code that
 * samples named (so its death is worth recording) and code the drain has already resolved
 * (so a sample of anything else wakes it early). */
#include "ddp_internal.h"

/* ---- bloom filter of sampled code pointers (lock-free, signal-safe) ------------------- */
#define BLOOM_BITS (1u << 20)
static _Atomic uint64_t bloom[BLOOM_BITS / 64];

static inline uint32_t bloom_hash(uintptr_t p)
{
    uint64_t x = (uint64_t)p * 0x9E3779B97F4A7C15ULL;
    return (uint32_t)(x >> 44); /* 20 bits */
}
void ddp_bloom_set(uintptr_t code)
{
    uint32_t h = bloom_hash(code);
    uint64_t bit = 1ULL << (h & 63);
    if (!(atomic_load_explicit(&bloom[h >> 6], memory_order_relaxed) & bit))
        atomic_fetch_or_explicit(&bloom[h >> 6], bit, memory_order_relaxed);
}
int ddp_bloom_test(uintptr_t code)
{
    uint32_t h = bloom_hash(code);
    return (atomic_load_explicit(&bloom[h >> 6], memory_order_relaxed) >> (h & 63)) & 1;
}
void ddp_bloom_clear(void)
{
    for (size_t i = 0; i < BLOOM_BITS / 64; i++)
        atomic_store_explicit(&bloom[i], 0, memory_order_relaxed);
}

/* ---- code the drain has resolved: its "known" filter -------------------------------------
 * A sample that names code outside it makes the drain come soon (drain.c, DDP_WAKE_CODE):
 * code can die, and where its death goes unrecorded (graveyard full, no code watcher free,
 * the 3.11 dealloc wrapper taken out by another tool) only a look while it lives names
 * it.  Samples of known code wait for the drain's interval.  A false positive (two pointers, one bit) only
 * delays that code's first drain to the interval.  It outlives sessions, as the process's
 * code cache does (engines/native/codes.py clears both together), so a notebook's next cell running
 * code resolved before does not bring the drain early. */
#define KNOWN_BITS (1u << 18)
static _Atomic uint64_t known[KNOWN_BITS / 64];
static _Atomic uint32_t known_count;
_Atomic int ddp_new_code_seen;

static inline uint32_t known_hash(uintptr_t code, uint64_t fp)
{
    /* the pointer and the fingerprint: a new code object at a dead one's address (the next
     * notebook cell's, often) is new to the drain, unless it is the same function again */
    uint64_t x = ((uint64_t)code ^ (fp * 0x9E3779B97F4A7C15ULL)) * 0xC2B2AE3D27D4EB4FULL;
    return (uint32_t)(x >> 46); /* 18 bits */
}
void ddp_known_note(uintptr_t code, uint64_t fp)
{
    uint32_t h = known_hash(code, fp);
    if (!((atomic_load_explicit(&known[h >> 6], memory_order_relaxed) >> (h & 63)) & 1)
        && !atomic_load_explicit(&ddp_new_code_seen, memory_order_relaxed))
        atomic_store_explicit(&ddp_new_code_seen, 1, memory_order_relaxed);
}
void ddp_known_clear(void)
{
    for (size_t i = 0; i < KNOWN_BITS / 64; i++)
        atomic_store_explicit(&known[i], 0, memory_order_relaxed);
    atomic_store(&known_count, 0);
}
int ddp_known_add(const uint64_t *codes, const uint64_t *fps, int n)
{
    if (!codes || !fps || n < 0)
        return DDP_EINVAL;
    if (atomic_load(&known_count) > KNOWN_BITS / 8) /* filling up: false positives grow, start over */
        ddp_known_clear();
    for (int i = 0; i < n; i++) {
        uint32_t h = known_hash((uintptr_t)codes[i], fps[i]);
        atomic_fetch_or_explicit(&known[h >> 6], 1ULL << (h & 63), memory_order_relaxed);
    }
    atomic_fetch_add(&known_count, (uint32_t)n);
    return 0;
}
