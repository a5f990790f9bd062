/* alloc.h — what the PyMem hooks (alloc.c) and the C allocation hooks (nalloc.c) share:
 * one sampling scheme (allocsample.c: mean gap, Horvitz-Thompson weights, one sequence of
 * sample ids, the leaves named outright), the C blocks still live at stop (nalloc.c) and the
 * names of the threads that run no Python whose allocations were recorded (allocthreads.c).
 */
#ifndef DDP_ALLOC_H
#define DDP_ALLOC_H
#include <stddef.h>
#include <stdint.h>
#include "ddprof.h"

/* allocsample.c */
void ddp_alloc_scheme_start(double mean_gap); /* a session's: ids from 1, no leaves queued */
void ddp_alloc_scheme_after_fork(void);
double ddp_alloc_mean_gap(void);            /* the session's mean bytes between samples */
int ddp_alloc_weigh(size_t n, double u, int64_t *count, int64_t *bytes); /* HT weights of a sample, u in (0, 1] */
uint64_t ddp_alloc_new_id(void);            /* the next sample id of the session */
void ddp_alloc_note(uint64_t id, uint64_t size, const char *name); /* a sample's leaf, named outright */
void ddp_alloc_note_info(const ddp_alloc_info *note);
uint64_t ddp_alloc_notes_dropped(void);     /* leaves the full queue refused this session */

/* allocthreads.c: threads that run no Python whose C allocations are recorded */
void ddp_alloc_threads_start(void);         /* a session's: none named yet */
int ddp_alloc_thread_seen(void);            /* the calling thread named (once a session); -1 table full */

/* nalloc.c: the sampled C blocks still allocated, for LIVE at stop */
int ddp_nalloc_live_count(void);
int ddp_nalloc_live_take(ddp_alloc_info *out, int max); /* copy them (up to max), empty the table */
int ddp_nalloc_live_ids(uint64_t *out, int max);        /* their ids; returns how many (may exceed max) */

#endif /* DDP_ALLOC_H */
