/* alloclive.h — the PyMem hooks' live table (alloclive.c): the sampled blocks not freed yet,
 * frozen at stop into the LIVE list.  Everything here runs with the GIL (both hooked domains
 * require it). */
#ifndef DDP_ALLOCLIVE_H
#define DDP_ALLOCLIVE_H
#include <stdint.h>
#include "ddprof.h"

#pragma GCC visibility push(hidden)

#define DDP_LIVE_FILTER_SIZE (1u << 16) /* prefilter buckets: (ptr >> SHIFT) mod SIZE */
#define DDP_LIVE_FILTER_SHIFT 8         /* 256-byte granules: a 4 KiB pymalloc pool is 16 adjacent bytes */

typedef struct {
    uintptr_t ptr;           /* 0 = empty */
    uint64_t size;
    uint64_t id;
    uintptr_t type;          /* validated type object, 0 = unknown */
    int32_t domain;          /* 0 MEM, 1 OBJ */
    int32_t pad;
} ddp_live_entry;

/* Live entries per prefilter bucket, saturating: every free tests its byte and probes the
 * table only when it is set.  Inline: it is the only live-table work on the free fast path. */
extern uint8_t ddp_live_filter[DDP_LIVE_FILTER_SIZE];
static inline int ddp_live_maybe(uintptr_t p)
{
    return ddp_live_filter[(p >> DDP_LIVE_FILTER_SHIFT) & (DDP_LIVE_FILTER_SIZE - 1)] != 0;
}

int ddp_live_open(void);                       /* a session's empty table; DDP_OK or DDP_ENOMEM */
ddp_live_entry *ddp_live_find(uintptr_t p);    /* NULL when p is no live sample */
int ddp_live_insert(uintptr_t p, uint64_t size, uint64_t id, int domain); /* -1: full */
void ddp_live_forget(uintptr_t p);             /* p freed or resized: its sample ends */
/* The same for a subinterpreter's blocks, from any thread (a table of their own, under a mutex) */
int ddp_live_sub_insert(uintptr_t p, uint64_t size, uint64_t id, int domain); /* -1: full or closed */
void ddp_live_sub_forget(uintptr_t p);
/* At stop: the table (but domains in `skip`, a bit per domain, whose frees went unseen) and
 * the C allocations' live blocks become the LIVE list; the table closes. */
void ddp_live_freeze(unsigned skip);
void ddp_live_after_fork(void);                /* closed and empty (the hooks stay, pass-throughs) */
int ddp_live_frozen_count(void);

#pragma GCC visibility pop
#endif /* DDP_ALLOCLIVE_H */
