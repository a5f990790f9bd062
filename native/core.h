/* core.h — what the sampler core's files share: the session, its thread slots and stats.
 *
 * The core, from the bottom up: the shared state (state.c); the thread registry (threads.c),
 * labels, /proc reads (taskstate.c); records, the drain, the engine table driven
 * (enginectl.c); its own engines, CPU (cpu.c with thread_start.c and osthreads.c) and wall
 * (wall.c), with parked.c for the waits engine; the wall thread (sampler_thread.c); the
 * session (session.c) and bench.c on top.  A file calls only files below it; the registry
 * tells engines of its threads through the table.  Only the core includes this header; the
 * other engines (alloc.c, waits.c, nalloc.c) see it through engine.h alone.  Every name
 * declared here is hidden: it binds inside the module and can never be interposed by, or
 * interpose on, another library's symbol.
 */
#ifndef DDP_CORE_H
#define DDP_CORE_H
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "ddp_internal.h"
#include "engine.h"

#pragma GCC visibility push(hidden)

#define MAX_SLOTS 4096

enum { ST_IDLE, ST_STARTING, ST_RUNNING, ST_STOPPED };

/* A thread's slot.  The registry (threads.c) owns who the thread is and what its CPU clock
 * said (tid, active, tstate, excluded, cpu_first/base/seen_ns, cpu_left, absent, seen_gen,
 * dead, recycled); the engines that sample it keep their per-thread fields beside them (CPU:
 * the timer, cpu_carry/sampled/acct_ns/counted, start_rec, exit_*; wall: wlast, w*, last_*;
 * parked.c: park*), so a sample finds all it needs in one place. */
typedef struct ddp_slot {
    _Atomic int32_t tid;
    _Atomic int32_t active;       /* sampled: has a thread state, not excluded, present */
    _Atomic uintptr_t tstate;
    /* cached label word, (epoch << 32) | (index + 1), valid while epoch is the table's
     * (label_of): one word, as the CPU handler and the wall thread both refresh it */
    _Atomic uint64_t lw_cache;
    _Atomic int32_t excluded;
    int64_t cpu_carry;            /* CPU weight of a torn sample, added to the next (handler only) */
    _Atomic int64_t cpu_sampled;  /* CPU weight its samples carried (handler), for the delivery check */
    _Atomic int64_t cpu_acct_ns;  /* its CPU clock when its CPU was last accounted (handler; timer_arm); 0 unknown */
    _Atomic int32_t in_subinterp; /* its last CPU sample ran in another interpreter's thread state (handler) */
    /* below: owned by the sampler thread (or by start/stop when it is not running) */
    int has_timer;
    int timer_failed;
    timer_t timer;
    clockid_t clock;
    int64_t last_wall_ns;
    int64_t last_cpu_ns;
    int64_t cpu_first_ns;         /* its CPU clock when first sampled this session (-1: unread) */
    int64_t cpu_base_ns;          /* what its clock read when the session began for it: 0 for a thread
                                   * born during the session, else cpu_first_ns */
    int64_t cpu_seen_ns;          /* its clock at the latest read: what it used if it exits unseen */
    int cpu_counted;              /* had a CPU timer: its clock's total calibrates its samples */
    int cpu_left;                 /* left Python once: what it used then is with the exited threads */
    int absent;
    uint32_t seen_gen;
    ddp_record *wlast;            /* last WALL sample (rec_size bytes, malloc'ed on first use) */
    int wfresh;                   /* wlast was taken at last_wall_ns/last_cpu_ns: reusable if not run since */
    int wpend;                    /* wlast not yet written: merged samples accumulate in its count/value */
    int64_t wpend_bucket;
    uintptr_t wlast_tstate;
    ddp_record *park;             /* blocked in a wait when the session started: that wait's record */
    int park_on;                  /* park holds a wait not over yet ... */
    int64_t park_cpu, park_checked; /* ... as its CPU clock, unmoved at the last check, says */
    int dead;                     /* its thread exited: the slot goes back to the pool once flushed */
    int64_t cpu_used_stop;        /* at stop: CPU its clock says it used since first seen (timer threads) */
    int recycled;                 /* in the pool */
    /* set on the thread itself (thread_start.c): where it started, and its CPU clock as it exited */
    ddp_record *start_rec;        /* its stack as its own code began (rec_size bytes, kept like wlast) */
    _Atomic int32_t start_ready;  /* start_rec written: its unsampled CPU goes there */
    _Atomic int64_t exit_cpu_ns;  /* its clock in its last moments (a TSD destructor); 0 unknown */
    int exit_done;                /* its CPU is with the exited threads' */
} slot_t;

typedef struct {
    _Atomic uint64_t samples[8], dropped_full[8], dropped_torn[8];
    _Atomic uint64_t carried_full[8]; /* samples whose weight went to their thread's next one: buffers full */
    uint64_t agg_in, agg_out;         /* records into the aggregates, aggregated records out */
    uint64_t agg_full;                /* times the active aggregate was full when records waited */
    uint64_t agg_coarsened;           /* aggregated records merged under a coarser tick as the drain took them */
    _Atomic uint64_t timer_failures, threads_seen, threads_overflow, stale_signals;
    _Atomic int32_t timer_errno; /* errno of the first failed timer_create/settime */
    _Atomic uint64_t handler_ns, handler_calls, wall_ticks, wall_ns, wall_records, wall_unchanged;
    _Atomic uint64_t cpu_kicks;          /* CPU samples the sampler thread took (the timer's signal late) */
    uint64_t cpu_at_start, cpu_exits_dropped; /* threads whose CPU went to their start stack; exits not kept */
    int64_t cpu_at_start_ns;
    int64_t start_mono_ns, stop_mono_ns;
    int64_t cpu_used_ns, cpu_sampled_ns; /* at stop, threads with a CPU timer then */
    _Atomic int32_t prof_replaced;       /* another SIGPROF handler replaced ours: CPU sampling stopped */
    int32_t parked_at_start;             /* threads found blocked in a wait at the start */
} sess_stats_t;

/* ---- the session's shared state (state.c; written by session.c) ------------------------ */
extern _Atomic int sess_state;      /* ST_* */
extern ddp_config sess_cfg;
extern ddp_ring *sess_ring;
extern size_t sess_rec_size;        /* a record with room for max_depth frames */
extern slot_t *sess_slots;          /* MAX_SLOTS of them, never moved during a session */
extern _Atomic int32_t sess_nslots; /* slots handed out so far */
extern sess_stats_t sess_stats;
extern _Atomic uint32_t sess_gen;   /* numbers sessions: per-thread slot caches of another are stale */
extern int sess_pid;
extern uintptr_t sess_gil_lo, sess_gil_hi; /* the GIL's address range (a futex there: waiting for it) */

/* ---- what /proc says of a thread (taskstate.c; wall thread) ------------------------------ */
ssize_t task_syscall_line(int32_t tid, char *buf, size_t cap); /* its syscall line, NUL-ended; <= 0 unreadable */
/* /proc/self/task/<tid>/<name> read once into buf, NUL-ended, opened and closed (any thread may call) */
ssize_t task_file_read(int32_t tid, const char *name, char *buf, size_t cap);
int task_syscall_regs(const char *line, uint64_t *sp, uint64_t *pc); /* a blocked thread's sp, pc; 0: none */
int thread_runnable(int32_t tid);       /* on a CPU or preempted, not blocked */
void task_files_close(void);            /* the files kept open between reads */

/* ---- threads (threads.c): the slot registry ------------------------------------------- */
/* The calling thread's tid, cached per thread (a syscall per ALLOC sample otherwise); the
 * fork child's thread gets a new tid, so threads_after_fork forgets it.  tls_slot caches the
 * thread's slot for the session numbered tls_gen (its tid is checked: slots are recycled). */
extern DDP_TLS int32_t tls_tid;
extern DDP_TLS int32_t tls_slot;
extern DDP_TLS uint32_t tls_gen;
static inline int32_t my_tid(void)
{
    int32_t t = tls_tid;
    if (__builtin_expect(!t, 0))
        t = tls_tid = (int32_t)syscall(SYS_gettid);
    return t;
}
int slot_lookup(int32_t tid);           /* lock-free; -1 none */
int slot_get_or_create(int32_t tid);    /* -1 when every slot is taken (counted) */
int64_t thread_cpu_ns(slot_t *s);       /* its thread's CPU clock, -1 unreadable */
int thread_born_in_session(int32_t tid); /* not among the process's threads at the start */
int register_at_start(void);            /* with the GIL: every thread of the interpreter now */
void registry_tick(int64_t now);        /* wall thread: rescan, retire, recycle */
uint32_t registry_scan(void);           /* the latest scan's number: a slot seen by it has seen_gen equal */
void registry_stop(void);               /* session stop: no slot is sampled any more */
extern _Atomic int registry_new_thread; /* a thread to name: a reason to wake the drain */
void threads_reset(void);               /* session start: an empty map, no slot handed out */
void threads_after_fork(void);

/* ---- label words (labels.c) ----------------------------------------------------------- */
uint64_t label_of(slot_t *s);           /* its thread's label id (async-signal-safe) */

/* ---- the engine table, driven (enginectl.c) ------------------------------------------- */
uint32_t engines_events(void);          /* every event some engine produces */
void engines_reset(void);               /* session start: none started */
int engines_start(int with_gil);        /* those the session wants; a with_gil one failing fails it */
void engines_stop(int with_gil);        /* every one of that kind, last first */
void engines_tick(int64_t now, int final); /* the started engines' ticks (and the unwind tables') */
int engines_emitting(void);             /* a producer of some engine's is inside now */
int engines_fast_ticks(void);           /* a started engine wants a tick every interval */
int engines_final_scan(void);           /* a started engine wants the registry's final rescan */
void engines_after_fork(void);
/* the registry's news, to the started engines (engine.h's thread_* fields) */
void engines_thread_joined(slot_t *s, int64_t now);
void engines_thread_seen(slot_t *s);
void engines_thread_left(slot_t *s);
void engines_thread_ended_unseen(slot_t *s);
void engines_thread_clock(slot_t *s, int64_t cpu_now, int64_t cpu_prev);

/* ---- producing records (records.c) ---------------------------------------------------- */
enum { PROD_OK, PROD_FULL, PROD_TORN };
int walk_into(ddp_record *rec, uintptr_t tstate, int mode); /* 0 ok, -1 torn (flags INVALID) */
int walk_into_running(ddp_record *rec, uintptr_t above, uintptr_t tstate, int mode); /* under a subinterpreter's */
#define WALK_ABOVE_FIND ((uintptr_t)1) /* walk_into_running's `above`: the other interpreter rec's thread is in, if any */
int append_native_regs(ddp_record *rec, uint64_t pc, uint64_t sp, int mode); /* a blocked thread's, from outside; how many */
void cut_record(ddp_record *rec, int depth); /* frames cut back to depth (hash kept right) */
int produce(slot_t *s, int event, int64_t weight, int tstate_kind, int mode, int64_t ts);
/* the calling thread's sample (CPU handler): under the frames of `running`, its tstate now,
 * when that is another interpreter's */
int produce_running(slot_t *s, uintptr_t running, int event, int64_t weight, int tstate_kind, int mode, int64_t ts);
int produce_outside(slot_t *s, int event, int64_t weight, int tstate_kind, int mode, int64_t ts); /* a running thread's, from outside */
int produce_native(int32_t tid, uintptr_t tstate, uint64_t label, int event, int64_t count, int64_t weight,
                   uint64_t aux, int state, const uint64_t *pcs, int n, int mode, int64_t ts); /* osthreads.c's */
int produce_native_flagged(int32_t tid, uintptr_t tstate, uint64_t label, int event, int64_t count, int64_t weight,
                           uint64_t aux, int state, const uint64_t *pcs, int n, int mode, int64_t ts, uint16_t flags);
int64_t bucket_of(int64_t ts);          /* a WALL sample's merge bucket, -1 for none */
/* r's bucket under the tick at last_ts (>= r's own): the Profile's final tick is at least
 * that of its last record, so records merged in it share one final tick too; -1 for none. */
int64_t bucket_under(const ddp_record *r, int64_t last_ts);
void records_reset(void);

/* ---- aggregates and the drain (drain.c) ----------------------------------------------- */
void drain_begin(void);                 /* session start: waits may wait again */
int drain_alloc(void);                  /* the session's aggregates; -1 no memory */
void drain_end(void);                   /* session stop: waiting drains return */
void drain_free(void);
void drain_after_fork(void);
void drain_stats(ddp_stats *out);
void agg_fill(void);                    /* ring -> active aggregate */
int agg_add_direct(const ddp_record *r); /* a record of an ordinary thread -> it; -1: use the ring */
void drain_poke(void);                  /* wake a waiting drain if it has a reason */

/* ---- the CPU engine's helpers (cpu.c is the engine, ddp_cpu_engine) ------------------- */
/* threads as they start (thread_start.c) */
int thread_start_hook_on(void);         /* with the GIL, at start (CPU sessions): threading's hook is ours */
void thread_start_hook_off(void);       /* takes the GIL: threading's hook is back, exits no longer read */
int thread_exits_inside(void);          /* exiting threads writing their clock into a slot now */
/* threads that run no Python (osthreads.c) */
int osthreads_signal(void *value);      /* SIGPROF handler: 1 when the timer is one of its threads' */
void osthreads_tick(int64_t now, int final); /* wall thread: find, arm, retire; final: totals */
void osthreads_after_fork(void);
/* masked.c: threads that block SIGPROF (their timers' signals never come) */
#define MASKED_WALK 128
int masks_sigprof(int32_t tid);
/* a waiting thread's whole stack from outside, leaf first (its clock standing still); 0: it runs */
int walk_waiting(int32_t tid, clockid_t clock, int mode, uint64_t *pcs, int max);
void masked_look_at_start(void); /* on the starting thread: masked threads waiting now, walked */
int masked_entry_at_start(int32_t tid, uint64_t *pcs); /* its entry point's frames found then (once); 0: none */
void masked_after_fork(void);

/* ---- the wall thread (sampler_thread.c) ----------------------------------------------- */
int sampler_thread_start(void);         /* 0 or pthread_create's error */
void sampler_thread_stop(void);         /* wake it, join it: its final tick runs */
void sampler_thread_after_fork(void);

#pragma GCC visibility pop
#endif /* DDP_CORE_H */
