/* engines.c — the table of event engines the session drives (engine.h), in start order.
 *
 * The only place that names the engines: the core sees them through this table alone.
 * Includes: engine.h.
 */
#include "engine.h"

extern const ddp_engine ddp_wall_engine;  /* wall.c */
extern const ddp_engine ddp_cpu_engine;   /* cpu.c */
extern const ddp_engine ddp_alloc_engine; /* alloc.c */
extern const ddp_engine ddp_waits_engine; /* waits.c */
extern const ddp_engine ddp_nalloc_engine; /* nalloc.c */

/* (with_gil ones start in this order and stop in the reverse: the CPU handler is in place
 * before the allocator hooks, and gone only after them) */
const ddp_engine *const ddp_engines[] = { &ddp_wall_engine, &ddp_cpu_engine, &ddp_alloc_engine, &ddp_waits_engine,
                                          &ddp_nalloc_engine, NULL };
