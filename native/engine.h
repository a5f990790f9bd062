/* engine.h — event engines: what the session asks of them, what the core offers them.
 *
 * An engine produces some event types with hooks of its own.  The session drives every engine
 * only through the table below (engines.c), so the core knows none by name.  Engines outside
 * the core (alloc.c, nalloc.c, waits.c) include ddp_internal.h and this header, never core.h;
 * the core's own (cpu.c, wall.c) sample the registry's threads, so they read its slots
 * (core.h) and hear of its threads through the thread_* fields: the registry, below them,
 * never calls them by name.
 */
#ifndef DDP_ENGINE_H
#define DDP_ENGINE_H
#include <stddef.h>
#include <stdint.h>
#include "ddprof.h"

struct ddp_slot; /* a thread's slot in the registry (core.h) */

typedef struct {
    const char *name;
    uint32_t events;                     /* bit per DDP_EVENT_* it produces */
    /* 1: started with the GIL held, before the session turns active and before the wall
     * thread, and stopped after the wall thread ended; a failed start fails the session.
     * 0: started without the GIL once the wall thread runs (its start may take locks a GIL
     * holder waits on), and stopped first; a failed start leaves the session running without it. */
    int with_gil;
    int fast_ticks;  /* 1: wants a tick every interval (else the wall thread ticks less often) */
    int final_scan;  /* 1: the registry rescans once more before its final tick (threads gone since leave first) */
    int (*start)(const ddp_config *cfg); /* when the session wants one of its events */
    void (*stop)(void);                  /* at every stop, started or not: restore what it changed */
    /* Wall thread, each tick while started (final: once more as it ends); NULL none. */
    void (*tick)(int64_t now, int final);
    int (*emitting)(void);               /* 1: a producer of its is inside ddp_emit_* now; NULL none */
    void (*after_fork)(void);            /* fork child of a process with a session; NULL none */
    /* A record of its events leaving the ring, before an aggregate takes it: it may clear an id
     * no later record needs, so the record merges with its stack's others; NULL none. */
    void (*settle)(ddp_record *r);
    /* The registry's news of its threads, to started engines (wall thread; at start, with the
     * GIL); NULL none.  Joined: sampled from now (new, or back after an absence).  Seen: found
     * by this scan, sampled.  Left: no longer sampled (exited, left Python, excluded).  Ended
     * unseen: a thread the start hook saw ended before any scan found it.  Clock: its CPU clock
     * read now (and at the previous read) by the wall thread's sampling. */
    void (*thread_joined)(struct ddp_slot *s, int64_t now);
    void (*thread_seen)(struct ddp_slot *s);
    void (*thread_left)(struct ddp_slot *s);
    void (*thread_ended_unseen)(struct ddp_slot *s);
    void (*thread_clock)(struct ddp_slot *s, int64_t cpu_now, int64_t cpu_prev);
} ddp_engine;

extern const ddp_engine *const ddp_engines[]; /* NULL-terminated, in start order */

/* Record `event` with the calling thread's own Python stack (from ordinary code, e.g. the
 * allocator hook or a lock-wait wrapper).  DDP_ENOTRUNNING without a session, DDP_EINVAL
 * when the event is not enabled or the caller is not a Python thread, DDP_ENOMEM when the
 * ring is full (counted as dropped). */
int ddp_emit_own(int event, int64_t count, int64_t value, uint64_t aux);
/* The same for another (blocked) Python thread of the session, walked through safe reads. */
int ddp_emit_for(int32_t tid, int event, int64_t count, int64_t value, uint64_t aux, int64_t ts);
/* The same on a thread that runs no Python, when the session samples those (native_threads):
 * its tid and its own native stack; DDP_EINVAL when the event or native_threads is off. */
int ddp_emit_native(int event, int64_t count, int64_t value, uint64_t aux);

/* Threads blocked in a wait when the session started (parked.c), for the waits engine:
 * once, find them (skipping threads in_wait() says a hook already records; event_for(kind)
 * names the event of a DDP_WAIT_* kind, -1 not wanted), then each tick see which woke and
 * record their wait from the session's start (final: every one still blocked, up to now).
 * ddp_parked_tick returns how many records it wrote. */
void ddp_parked_scan(int64_t now, int (*in_wait)(int32_t tid), int (*event_for)(int kind));
int ddp_parked_tick(int64_t now, int final);

#endif /* DDP_ENGINE_H */
