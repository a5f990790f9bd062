/* enginectl.c — the engine table driven: which engines started, and every call into them.
 *
 * The session starts and stops engines, the wall thread ticks them, the registry tells them
 * of its threads: all through here, so no file of the core names an engine, and the registry
 * (below the engines it notifies) never calls one.  Engines nest around the wall thread:
 * those with_gil start before it and stop after it, the others start after it and stop
 * before it.
 *
 * Includes: core.h, unwind.h.
 */
#include "core.h"
#include "unwind.h"

#define MAX_ENGINES 8

/* 1: engine i started this session (set before the wall thread may tick it) */
static _Atomic int engine_on[MAX_ENGINES];

#define EACH(i) for (int i = 0; i < MAX_ENGINES && ddp_engines[i]; i++)
#define EACH_ON(i, field) EACH(i) if (ddp_engines[i]->field && atomic_load(&engine_on[i]))

uint32_t engines_events(void)
{
    uint32_t events = 0;
    EACH(i) events |= ddp_engines[i]->events;
    return events;
}

void engines_reset(void)
{
    for (int i = 0; i < MAX_ENGINES; i++)
        atomic_store(&engine_on[i], 0);
}

/* Start the engines of one kind (with_gil) that the session wants.  One that needs the GIL
 * and fails fails the session (those started before it are stopped); one without it that
 * fails stays off. */
int engines_start(int with_gil)
{
    EACH(i) {
        const ddp_engine *e = ddp_engines[i];
        if (e->with_gil != with_gil || !(sess_cfg.events & e->events))
            continue;
        int rc = e->start(&sess_cfg);
        if (rc == DDP_OK) {
            atomic_store(&engine_on[i], 1);
        } else if (with_gil) {
            for (int k = i - 1; k >= 0; k--)
                if (ddp_engines[k]->with_gil && atomic_load(&engine_on[k]))
                    ddp_engines[k]->stop();
            return rc;
        }
    }
    return DDP_OK;
}

/* Every engine of one kind, last first: each restores only what it changed. */
void engines_stop(int with_gil)
{
    int n = 0;
    while (n < MAX_ENGINES && ddp_engines[n])
        n++;
    for (int i = n - 1; i >= 0; i--)
        if (ddp_engines[i]->with_gil == with_gil)
            ddp_engines[i]->stop();
}

void engines_tick(int64_t now, int final)
{
    if ((sess_cfg.native_frames || sess_cfg.native_threads) && !final)
        uw_refresh(); /* objects loaded or unloaded since: their tables (cheap when none was) */
    EACH_ON(i, tick) ddp_engines[i]->tick(now, final);
}

int engines_emitting(void)
{
    EACH(i) if (ddp_engines[i]->emitting && ddp_engines[i]->emitting()) return 1;
    return 0;
}

int engines_fast_ticks(void)
{
    EACH(i) if (ddp_engines[i]->fast_ticks && atomic_load(&engine_on[i])) return 1;
    return 0;
}

int engines_final_scan(void)
{
    EACH(i) if (ddp_engines[i]->final_scan && atomic_load(&engine_on[i])) return 1;
    return 0;
}

void engines_after_fork(void)
{
    EACH(i) if (ddp_engines[i]->after_fork) ddp_engines[i]->after_fork();
}

void engines_thread_joined(slot_t *s, int64_t now) { EACH_ON(i, thread_joined) ddp_engines[i]->thread_joined(s, now); }
void engines_thread_seen(slot_t *s) { EACH_ON(i, thread_seen) ddp_engines[i]->thread_seen(s); }
void engines_thread_left(slot_t *s) { EACH_ON(i, thread_left) ddp_engines[i]->thread_left(s); }
void engines_thread_ended_unseen(slot_t *s) { EACH_ON(i, thread_ended_unseen) ddp_engines[i]->thread_ended_unseen(s); }

void engines_thread_clock(slot_t *s, int64_t cpu_now, int64_t cpu_prev)
{
    EACH_ON(i, thread_clock) ddp_engines[i]->thread_clock(s, cpu_now, cpu_prev);
}
