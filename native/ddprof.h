/* ddprof.h — the whole native API of ddprof_nb.
 *
 * Everything between the cdef markers is also the cffi cdef (build_native.py reads it),
 * so it holds only prototypes and plain structs, no macros beyond integer constants.
 * Errors: functions return 0 on success and a negative DDP_E* code on failure;
 * ddp_strerror() names it.  ddprof_nb/engines/native/binding.py turns codes into exceptions.
 */
#ifndef DDPROF_H
#define DDPROF_H
#include <stdint.h>
#include "events.h"

/* cdef-begin */
#define DDP_OK 0
#define DDP_EINVAL -1        /* bad argument */
#define DDP_EBUSY -2         /* a profiler is already running in this process */
#define DDP_ENOTRUNNING -3   /* stop/drain without start */
#define DDP_EUNSUPPORTED -4  /* this Python/OS is not supported by the native engine */
#define DDP_ESIGNAL -5       /* someone else owns the signal we need */
#define DDP_ENOMEM -6        /* could not allocate buffers at start */
#define DDP_ETIMER -7        /* timer_create failed */
#define DDP_ESYS -8          /* another system call failed (errno in ddp_last_errno) */

/* The event/frame table as compiled: lets Python check its parse of events.h. */
int ddp_event_count(void);
const char *ddp_event_name(int event);          /* NULL when out of range */
const char *ddp_event_value_type(int event, int index);  /* index 0..3: count type/unit, quantity type/unit */
int ddp_event_leaf_kind(int event);            /* -1 when out of range */
int ddp_frame_kind_count(void);
const char *ddp_frame_kind_name(int kind);     /* NULL when out of range */

const char *ddp_strerror(int code);
int ddp_last_errno(void);
/* PY_VERSION_HEX of the headers this module was compiled against. */
uint32_t ddp_compiled_python_version(void);

/* ---- native sampler (session.c and the core files of core.h) --------------------------- */
#define DDP_STATE_UNKNOWN 0  /* wall-sample thread states (ddp_record.state) */
#define DDP_STATE_CPU 1      /* running or runnable */
#define DDP_STATE_OFFCPU 2   /* blocked (sleep, I/O, lock, ...) */
#define DDP_STATE_GIL 3      /* blocked waiting for the GIL */

#define DDP_REC_TRUNCATED 1  /* deeper than max_depth: the root-most frames were cut */
#define DDP_REC_GC 2         /* the interpreter's GC was collecting on this thread */
#define DDP_REC_INVALID 4    /* torn/inconsistent read: skip it (it is counted as dropped) */
#define DDP_REC_MASKED 8     /* CPU read from the clock of a thread that blocks SIGPROF: its frames are only its
                               entry point's (where inside it ran is unknown) */

#define DDP_READ_GUARDED 0   /* direct loads, a SIGSEGV/SIGBUS handler recovers faults */
#define DDP_READ_SYSCALL 1   /* process_vm_readv: EFAULT instead of a fault */

/* A native frame in a record (native_frames on): after the Python frames, leaf first, as
 * {code = DDP_NATIVE_CODE, fp = its pc}; DDP_NATIVE_CUT ends a walk that stopped early.
 * (A code object's address is never odd.)  A Python frame that began an eval loop's run
 * (the interpreter's entry frame) has DDP_FRAME_ENTRY in firstlineno: each native eval-loop
 * frame runs the Python frames up to and including the next such one. */
#define DDP_NATIVE_CODE 1
#define DDP_NATIVE_CUT 3
#define DDP_FRAME_ENTRY 1073741824

/* One frame as captured: enough to resolve later, with the GIL, through safe reads. */
typedef struct {
    uint64_t code;         /* PyCodeObject address at sample time (never trusted later) */
    uint64_t fp;           /* fingerprint: hash of qualname and filename contents, firstlineno, size */
    int32_t lasti;         /* instruction index in code units, -1 when unknown */
    int32_t firstlineno;   /* co_firstlineno at sample time */
} ddp_frame;

/* A fixed-size record; `depth` ddp_frame entries (leaf first) follow it in the buffer.
 * Shared by every event (CPU, WALL now; ALLOC/LOCK/PARK later: `aux` carries their
 * type or lock address).  ts_ns is CLOCK_MONOTONIC. */
typedef struct {
    uint8_t event;         /* ddp_event_type: convert with EventType.from_id, never cast */
    uint8_t state;         /* DDP_STATE_* (wall); DDP_STATE_CPU for CPU samples */
    uint16_t flags;        /* DDP_REC_* */
    uint16_t depth;        /* frames that follow, leaf first */
    uint16_t reserved;
    int32_t tid;           /* OS thread id */
    uint32_t interp;       /* CPU: the subinterpreter its top frames ran in, as its id + 1; 0: the thread's own */
    uint64_t label_id;     /* the thread's label-set id (ddprof_nb.labels) when sampled */
    int64_t ts_ns;         /* a merged WALL record: its last sample's time (all lie in one time bucket) */
    int64_t count;         /* value 0 of the event (samples; > 1 for a merged WALL record) */
    int64_t value;         /* value 1 of the event (ns for CPU/WALL; summed when merged) */
    uint64_t aux;
    uint64_t stack_hash;   /* hash of flags & (TRUNCATED|GC), depth and the frames' bytes: equal stacks hash equal */
} ddp_record;

typedef struct {
    int64_t interval_ns;         /* CPU period per thread and wall period */
    int32_t max_depth;           /* 1..4096 frames per sample */
    uint32_t events;             /* bit mask of (1 << DDP_EVENT_*) */
    int32_t ring_records;        /* buffer capacity in records (rounded to a power of 2); 0 = default */
    int32_t wall_threads_per_tick; /* 0 = default (64) */
    int32_t read_mode;           /* DDP_READ_GUARDED (default) or DDP_READ_SYSCALL */
    int32_t n_exclude;
    int32_t exclude_tids[8];     /* threads never sampled (the profiler's own Python threads) */
    /* WALL merging: consecutive identical samples of a thread (stack, state, labels) that fall
     * in one time bucket become one record (count and value summed).  Buckets follow the
     * Profile's own time ticks (model.tick_for: merge_tick_ns * 2**k, at most merge_max_ticks
     * over the elapsed time), which only coarsen as a profile grows: merging is exact.
     * merge_tick_ns 0 = off (one record per sample). */
    int64_t merge_tick_ns;
    int32_t merge_max_ticks;
    int32_t drain_early;         /* 1: ddp_drain_wait returns once the ring is a quarter full */
    int32_t merge_shadow;        /* tests: also write every WALL sample unmerged, aux = 1 (merged ones: aux 0) */
    int32_t drain_new_code;      /* 1: ddp_drain_wait returns DDP_WAKE_CODE for samples of code not ddp_known_add'ed */
    /* ---- lock/park (waits.c) ---- */
    int64_t wait_threshold_ns;   /* waits shorter are recorded with p = d/T, weight T; 0 = 100 us */
    int32_t wait_max_rate;       /* lock/park records per second (token bucket); 0 = DEFAULT_MAX_RATE (waits.c) */
    int32_t wait_reserved;
    /* ---- end lock/park ---- */
    /* ---- allocations (alloc.c) ---- */
    int64_t alloc_rate;          /* ALLOC: mean bytes between samples (Poisson); 0 = 512 KiB */
    int32_t native_alloc;        /* ALLOC: 1 = also C allocations of extension modules (nalloc.c) */
    int32_t native_reserved;
    /* ---- end allocations ---- */
    int32_t agg_keys;            /* keys per native aggregate (agg.c); 0 = default (65536) */
    int32_t cpu_timer_scale;     /* tests: the CPU timers' period is interval_ns times this (0 = 1): late timers */
    int32_t native_frames;       /* 1: samples a thread takes of itself (CPU, alloc, lock/park) carry its native frames */
    int32_t native_threads;      /* 1: CPU and C allocation samples of threads that run no Python too (osthreads.c) */
} ddp_config;

typedef struct {
    uint64_t samples[8];         /* records written, per event */
    uint64_t dropped_full[8];    /* buffer full, per event */
    uint64_t dropped_torn[8];    /* inconsistent or faulting reads, per event */
    uint64_t timer_failures;     /* threads whose CPU timer could not be created */
    uint64_t threads_seen;
    uint64_t threads_overflow;   /* threads beyond the slot table: not sampled */
    uint64_t stale_signals;
    uint64_t faults;             /* recovered faulting reads */
    uint64_t handler_ns;         /* total time spent in the SIGPROF handler */
    uint64_t handler_calls;
    uint64_t wall_ticks;
    uint64_t wall_ns;            /* total time of the wall sampler's ticks */
    uint64_t graveyard_overflow;
    uint64_t wall_records;       /* WALL records written (<= WALL samples: merging) */
    uint64_t wall_unchanged;     /* WALL samples of threads that had not run since their last one (no stack walk) */
    int32_t read_mode;           /* current DDP_READ_*; SYSCALL after a degradation */
    int32_t segv_replaced;       /* 1: someone replaced our SIGSEGV/SIGBUS handler */
    int64_t start_mono_ns;
    int64_t stop_mono_ns;
    int32_t timer_errno;         /* errno of the first CPU-timer failure (EAGAIN: RLIMIT_SIGPENDING) */
    int32_t reserved;
    int64_t cpu_used_ns;         /* at stop: CPU the threads with a CPU timer used since first seen ... */
    int64_t cpu_sampled_ns;      /* ... and the CPU weight their samples carried */
    int32_t prof_replaced;       /* 1: another tool's SIGPROF handler replaced ours; CPU sampling stopped then */
    int32_t parked_at_start;     /* threads found blocked in a wait when the session started */
    uint64_t leaked_bytes;       /* session buffers kept (not freed) because a producer was still inside */
    uint64_t carried_full[8];    /* samples whose weight went to their thread's next sample: buffers full */
    uint64_t agg_in;             /* records aggregated in native code ... */
    uint64_t agg_out;            /* ... and the aggregated records the drain read */
    uint64_t agg_full;           /* times records waited in the ring for a full aggregate */
    uint64_t agg_bytes;          /* the aggregates' fixed size (keys and arena, both of them) */
    uint64_t agg_folded;         /* records folded into their thread's last record: the aggregate was full */
    uint64_t agg_coarsened;      /* aggregated records merged at drain time, under a coarser time tick */
    uint64_t cpu_kicks;          /* CPU samples the sampler thread took of a running thread: its timer's was late */
    uint64_t cpu_at_start;       /* exited threads no CPU sample caught: their clock's CPU is on their start stack */
    int64_t cpu_at_start_ns;     /* ... that CPU */
    uint64_t cpu_exits_dropped;  /* exited threads whose CPU could not be kept (no memory): not in the totals */
} ddp_stats;

typedef struct {
    int32_t firstlineno;
    int32_t qualname_len;        /* bytes of UTF-8 (may be more than the buffer: retry) */
    int32_t filename_len;
    int32_t linetable_len;
    uint64_t code;
    uint64_t fp;
    int64_t death_ns;            /* graveyard entries: when the code object died */
} ddp_code_info;

int ddp_start(const ddp_config *cfg);      /* needs no GIL held by the caller (takes it) */
int ddp_stop(void);                        /* stops timers, handler, sampler thread; records stay drainable */
void ddp_release(void);                    /* frees buffers after the final drain; clears the code watcher */
int ddp_running(void);
int ddp_record_size(void);                 /* bytes per record incl. frames; 0 when no session */
/* After ddp_stop, before ddp_release: per thread with a CPU timer then, the CPU its clock says
 * it used since first seen and the CPU its samples carried.  Returns how many (may exceed cap). */
int ddp_cpu_thread_totals(int32_t *tid, int64_t *used, int64_t *sampled, int cap);
/* After stop: each thread that runs no Python and had a CPU timer: tid, CPU its clock says it
 * used in the session, CPU its samples carried, name (16 bytes each, /proc comm); returns how
 * many (may exceed cap).  Stats: armed at once (max), threads beyond the bound, timer
 * failures, blocked Python threads walked, totals not kept, scans, CPU of exited threads after
 * their last read given to the pool threads gone then, and left unassigned, idle threads that
 * gave their place to running ones (the table full), threads found blocking SIGPROF and the CPU
 * the sampler recorded for them from their clocks; returns how many. */
int ddp_native_threads(int32_t *tid, int64_t *used, int64_t *sampled, char *names, int cap);
int ddp_native_threads_stats(uint64_t *out, int n);
int ddp_drain(void *buf, int max_records); /* copies up to max_records records; returns how many */
/* Block (without the GIL) until there is work for the drain: returns a DDP_WAKE_* mask (0 on
 * timeout), DDP_ENOTRUNNING once the session stops. */
#define DDP_WAKE_RING 1      /* the ring is a quarter full (cfg.drain_early) */
#define DDP_WAKE_THREAD 2    /* a new thread was registered (its name is wanted while it lives) */
#define DDP_WAKE_CODE 4      /* samples name code not resolved yet (cfg.drain_new_code; 0.1 s after the last wake) */
int ddp_drain_wait(int64_t timeout_ns);
/* ddp_drain_wait, then (unless stopped) ddp_drain into buf, in one call: the drain thread
 * takes the GIL once per wake (a cffi call releases it, handing it to the profiled thread). */
int ddp_drain_wait_take(int64_t timeout_ns, void *buf, int max_records, int *taken);
/* The drain resolved these code objects (pointer, fingerprint): their samples need no early wake. */
int ddp_known_add(const uint64_t *codes, const uint64_t *fps, int n);
void ddp_known_clear(void); /* with the process's code cache: what it no longer holds is new again */
int ddp_pending(void);                     /* records in the ring (approximate while producers run) */
int ddp_get_stats(ddp_stats *out);
uint64_t ddp_dropped(int event);           /* full + torn, for one event */
int ddp_set_thread_labels(uint64_t id);    /* the calling thread's label-set id */
int ddp_set_thread_labels_for(int32_t tid, uint64_t id);
/* The calling thread's label word (static storage, valid for the process's life: Python
 * writes it through a memoryview); NULL when 4096 live threads hold one already. */
uint64_t *ddp_label_word(void);
int ddp_exclude_thread(int32_t tid);
/* Resolve a captured code object through safe reads (takes the GIL).  0: resolved;
 * 1: a buffer was too small (info has the sizes); DDP_EINVAL: not that code object any more. */
int ddp_resolve_code(uint64_t code, uint64_t fp, ddp_code_info *info,
                     char *qualname, int qcap, char *filename, int fcap, uint8_t *linetable, int lcap);
/* Entries waiting in the graveyard: a variable, not a call, so the drain can look
 * without a cffi call (each call releases the GIL: a handoff to the profiled thread). */
extern int ddp_graveyard_len;
/* Next code object that died while profiling (3.12+: code watcher; 3.11: PyCode_Type's dealloc, wrapped):
 * 1 popped, 0 empty, 2 buffers too small. */
int ddp_graveyard_pop(ddp_code_info *info, char *qualname, int qcap, char *filename, int fcap,
                      uint8_t *linetable, int lcap);
int ddp_code_watcher_active(void);         /* 1: code deaths are recorded now (session start to release) */
/* Line of instruction `lasti` (code units) from a co_linetable (one format 3.11-3.15); firstlineno when none. */
int ddp_addr2line(const uint8_t *linetable, int len, int firstlineno, int lasti);
/* Test/benchmark helpers. */
int64_t ddp_bench_walk(int read_mode, int iterations, int max_depth, int *depth_out);
int ddp_test_safe_read(uint64_t addr, int read_mode);   /* 0 read ok, -1 fault recovered */
int ddp_test_walk_entering(void); /* a thread state entering the eval loop, walked: -1 (3.11, 3.12) */
int ddp_fingerprint_of(uint64_t code, uint64_t *fp_out); /* the fingerprint a sample would record */
/* The WALL merge bucket (its start, ns since session start) of a sample taken elapsed_ns after start. */
int64_t ddp_merge_bucket(int64_t elapsed_ns, int64_t min_tick_ns, int32_t max_ticks);
/* ---- native frames (unwind.c, unwind_test.c) ----
 * Unwind tables of the loaded objects (built off the hot path; -1 without memory), the
 * row at a pc (-1 none), and the walk on its own: a handler on `signo` walks the
 * interrupted native stack (a CPU timer of the calling thread every interval_ns, or
 * ddp_test_unwind_signal); ddp_test_unwind_regs walks from given registers.  Flags: 1
 * truncated. */
int ddp_unwind_refresh(void);
/* The loader's count of objects loaded plus unloaded so far: it moves with every dlopen and dlclose. */
uint64_t ddp_loader_generation(void);
int ddp_unwind_row(uint64_t pc, int32_t *cfa_reg, int32_t *cfa_off, int32_t *fp_off, int32_t *flags);
int ddp_test_unwind_start(int signo, int64_t interval_ns, int depth);
int ddp_test_unwind_signal(int32_t tid);
int ddp_test_unwind_stop(void);
int ddp_test_unwind_get(int i, uint64_t *pcs, int cap, int32_t *flags, int64_t *ns);
void ddp_test_unwind_free(void);
int ddp_test_unwind_regs(uint64_t pc, uint64_t sp, uint64_t fp, uint64_t *pcs, int max, int32_t *flags);
/* ---- end native frames ---- */
/* ---- interpreter layout (pylayout.c) ----
 * 0: the running interpreter's published offsets (_PyRuntime.debug_offsets, 3.13+) equal
 * the compiled ones (3.11/3.12: always 0); 1: they differ, 2: no frame walker for this
 * build; msg then says why.  The selftest perturbs published value `field` (0 = cookie) in
 * a copy and returns what the check says (-1: no such field / nothing published). */
int ddp_py_layout_problem(char *msg, int cap);
int ddp_py_layout_selftest(int field, char *msg, int cap);
/* Tests (3.11; -1 elsewhere): another tool's pass-through wrapper of PyCode_Type.tp_dealloc.
 * op 1 wrap, 0 unwrap if on top, 2 put back the saved value blindly, 3 its calls so far,
 * 4 the slot holds ours (1), the foreign one (2), something else (0).  Takes the GIL. */
int64_t ddp_test_code_dealloc_foreign(int op);
/* ---- end interpreter layout ---- */

/* ---- lock/park: blocking waits hooked through GOT slots (waits.c) --------------------------
 * LOCK/PARK records carry the libc call in aux (low byte: DDP_WAIT_*, plus the flags below);
 * the event is provisional (sem waits LOCK, the rest PARK): Python picks the final one from
 * the stack (ddprof_nb/engines/native/lockpark.py). */
#define DDP_WAIT_SEM_WAIT 1
#define DDP_WAIT_SEM_TIMEDWAIT 2
#define DDP_WAIT_SEM_CLOCKWAIT 3
#define DDP_WAIT_CLOCK_NANOSLEEP 4
#define DDP_WAIT_NANOSLEEP 5
#define DDP_WAIT_SELECT 6
#define DDP_WAIT_PSELECT 7
#define DDP_WAIT_POLL 8
#define DDP_WAIT_PPOLL 9
#define DDP_WAIT_EPOLL_WAIT 10
#define DDP_WAIT_EPOLL_PWAIT 11
#define DDP_WAIT_RECV 12
#define DDP_WAIT_RECVFROM 13
#define DDP_WAIT_RECVMSG 14
#define DDP_WAIT_ACCEPT 15
#define DDP_WAIT_ACCEPT4 16
#define DDP_WAIT_COND_WAIT 17       /* libpython's only: the GIL */
#define DDP_WAIT_COND_TIMEDWAIT 18
#define DDP_WAIT_SOCK_POLL 19       /* poll() called by _socket: a socket op with a timeout */
#define DDP_WAIT_KIND_MASK 255
#define DDP_WAIT_SAMPLED 256        /* a short wait recorded with p = d/T (value T) */
#define DDP_WAIT_FAILED 512         /* the call returned an error/timeout */
typedef struct {
    uint64_t records, short_skipped, rate_dropped, emit_failed, calls;
    uint64_t objects, slots_patched, slots_foreign, restore_mismatch, restore_unloaded;
    int64_t active_patches, threshold_ns;
    uint64_t protect_failed;     /* slots left alone because mprotect refused */
    uint64_t passes;             /* patch passes: one at start, one per tick that saw objects loaded */
    uint64_t edge_records;       /* waits recorded for their part inside the session (blocked at start, or at stop) */
    uint32_t kinds_patched;      /* bit per DDP_WAIT_* kind with a slot hooked ... */
    uint32_t kinds_foreign;      /* ... and with a slot left alone: it resolves to another library's function */
    uint64_t passes_deferred;    /* passes that met objects still being loaded every try: retried at the next tick */
    uint64_t slots_rebound;      /* hooked slots the loader wrote again (lazy binding, a reload): hooked anew */
    uint64_t slots_unhooked;     /* slots left alone for want of memory or of room for their symbol version */
} ddp_wait_stats;
int ddp_wait_get_stats(ddp_wait_stats *out);
/* Every GOT slot of a hooked symbol in the loaded objects (patched or not): address, value,
 * DDP_WAIT_* kind.  Returns how many exist (may exceed cap). */
int ddp_wait_slots(uint64_t *addr, uint64_t *val, int32_t *kind, int cap);
uint64_t ddp_wait_wrapper(int kind);       /* our wrapper's address for a kind (tests) */
/* The calling thread's hooked waits of a wanted event since the session started (exact
 * ns and count, sampled-out ones included: the ground truth of tests). */
int ddp_wait_thread_totals(int64_t *ns, int64_t *count);
/* Tests: run the recording path for a wait of d_ns of this kind that just ended on the
 * calling thread (DDP_ENOTRUNNING unless a session with lock/park is on). */
int ddp_wait_inject(int kind, int64_t d_ns);
/* ---- end lock/park ---- */

/* ---- allocations: PyMem hooks on the MEM and OBJ domains, live-heap table (alloc.c) --------
 * ALLOC records carry a per-session sample id in aux; LIVE is computed at stop from the
 * sampled blocks still allocated then.  Type names are "" when unknown.
 * A C allocation's leaf rides in aux's top byte (aux >> DDP_ALLOC_KIND_SHIFT, named by
 * ddp_nalloc_kind_name; 0: a Python object or a traced domain, named by a type note).  Its
 * samples whose block was freed before they left the ring keep the kind with id 0: no LIVE
 * can refer to them, so one record of a stack, leaf and time tick adds their weights. */
#define DDP_ALLOC_KIND_SHIFT 56
typedef struct {
    uint64_t id;                 /* the ALLOC record's aux */
    uint64_t size;               /* requested bytes of the sampled block (a mapping: its bytes resident at stop) */
    char type_name[48];          /* tp_name of the object in the block, "" unknown */
    uint64_t sampled_size;       /* its bytes when sampled, when size differs (LIVE scales its weight); else 0 */
} ddp_alloc_info;

typedef struct {
    uint64_t sampled;            /* allocations sampled */
    uint64_t emit_failed;        /* sampled but not recorded (buffer full, ...) */
    uint64_t live_overflow;      /* recorded but not tracked for LIVE: live table full */
    uint64_t notes_dropped;      /* type notes lost: the drain was too slow */
    uint64_t typed;              /* sampled OBJ blocks whose type was read */
    uint64_t untyped;            /* sampled OBJ blocks whose type could not be read */
    uint64_t reentered;          /* hook re-entered from its own sampled path (skipped) */
    uint64_t live_at_stop;
    int32_t left_installed;      /* 1: another allocator sat on top of ours at stop: ours stays as a pass-through */
    int32_t layers_in_use;
    uint64_t sample_ns;          /* time spent recording samples (stack walk + record) */
    uint64_t type_ns;            /* time spent reading types */
    int32_t unlinked;            /* bit per domain (1 MEM, 2 OBJ): someone took our hook out of the chain during the session */
    int32_t reclaimed;           /* layers found out of every chain (left by earlier sessions) and reused */
    uint64_t subinterp_sampled;  /* allocations sampled in a subinterpreter (not counted in sampled) */
} ddp_alloc_stats;

int ddp_alloc_types_pop(ddp_alloc_info *out, int max);  /* type notes since the last call (takes the GIL) */
int ddp_alloc_live_ids(uint64_t *out, int max);         /* ids of sampled blocks still allocated; returns how many (may exceed max) */
int ddp_alloc_live_list(ddp_alloc_info *out, int max);  /* after ddp_stop: the live samples; returns how many (may exceed max) */
int ddp_alloc_get_stats(ddp_alloc_stats *out);
/* Test helpers: the allocator of a domain (0 RAW, 1 MEM, 2 OBJ) as ctx + 4 function pointers;
 * install (1) / remove (0) a foreign pass-through allocator over MEM and OBJ. */
int ddp_alloc_test_get_allocator(int domain, uint64_t *out5);
int ddp_alloc_test_foreign(int on);       /* 2: one serving small blocks past ours (in a session) */
/* C allocations of extension modules (nalloc.c): GOT hooks of PyTraceMalloc_Track/Untrack and
 * of the C allocator, sampled into ALLOC and LIVE like the PyMem hooks. */
typedef struct {
    uint64_t sampled;            /* C allocations sampled */
    uint64_t emit_failed;        /* sampled but not recorded (buffer full, ...) */
    uint64_t not_python;         /* sampled on a thread that runs no Python, not recorded (native_threads off) */
    uint64_t native_thread;      /* ... recorded there (native_threads on: its native stack, pools.py) */
    uint64_t live_overflow;      /* recorded but not tracked for LIVE: table full */
    uint64_t maps_trimmed;       /* sampled mappings partly unmapped: LIVE keeps the larger piece left */
    uint64_t maps_measured;      /* sampled mappings held at stop: LIVE counts their resident pages */
    uint64_t maps_mapped_bytes;  /* ... the bytes they map */
    uint64_t maps_resident_bytes;/* ... the bytes of theirs resident (mincore) */
    uint64_t maps_measure_ns;    /* ... the time that took */
    uint64_t maps_unmeasured;    /* ... past the measuring budget: LIVE counts their mapped bytes */
    uint64_t objects;            /* objects scanned */
    uint64_t slots_patched;
    uint64_t slots_foreign;      /* slots resolving to another allocator (an interposer): left alone */
    uint64_t restore_mismatch;   /* slots someone re-patched before our restore: left theirs */
    uint64_t protect_failed;
    uint64_t passes;
    uint64_t passes_deferred;    /* passes put off: objects were still being loaded each time */
    uint32_t kinds_patched;      /* bit per DDP_NALLOC_* hook */
    uint32_t kinds_foreign;
    int32_t tracking_objects;    /* objects calling PyTraceMalloc_Track: counted by it, not by malloc */
    int32_t active_patches;
    uint64_t slots_unhooked;     /* slots left alone for want of memory or of room for their symbol version */
} ddp_nalloc_stats;
enum { DDP_NALLOC_TRACK = 0, DDP_NALLOC_UNTRACK, DDP_NALLOC_MALLOC, DDP_NALLOC_CALLOC, DDP_NALLOC_REALLOC,
       DDP_NALLOC_FREE, DDP_NALLOC_POSIX_MEMALIGN, DDP_NALLOC_ALIGNED_ALLOC, DDP_NALLOC_MEMALIGN, DDP_NALLOC_MMAP,
       DDP_NALLOC_MMAP64, DDP_NALLOC_MUNMAP, DDP_NALLOC_MREMAP };
int ddp_nalloc_get_stats(ddp_nalloc_stats *out);
/* After stop: the threads that run no Python whose C allocations were recorded (tid, 16-byte OS
 * name each); returns how many (may exceed cap).  _refused: threads beyond its table. */
int ddp_alloc_threads(int32_t *tid, char *names, int cap);
int ddp_alloc_threads_refused(void);
/* Tests: the hooked functions' GOT slots in loaded objects now (as ddp_wait_slots; the
 * interpreter's own object is not listed), and the wrapper of a DDP_NALLOC_* kind. */
int ddp_nalloc_slots(uint64_t *addr, uint64_t *val, int32_t *kind, int cap);
uint64_t ddp_nalloc_wrapper(int kind);
const char *ddp_nalloc_kind_name(int kind); /* the leaf of an ALLOC aux's kind byte, NULL for none */
/* ---- end allocations ---- */
/* ---- asyncio task stepper (aiostep.c) ----------------------------------------------------------
 * Builds the C types SlotBase and StepBase and sets them as attributes of ddprof_nb._native
 * (cffi declares no Python types): 0, or -1 with the error printed. */
int ddp_aio_types(void);
/* ---- end asyncio task stepper ---- */
/* ---- another process: dump and sampling from outside (pyremote.c) --------------------------
 * The target runs this module's CPython minor version (3.13+: its published offsets are
 * compared with ours at open).  The caller fills pid and the target's symbol addresses (its
 * ELF symbols plus load base); ddp_remote_open fills the rest.  Errors: DDP_EUNSUPPORTED with
 * msg (layout, free-threaded build, no interpreter); DDP_ESYS with ddp_last_errno() (EPERM:
 * no ptrace rights, ESRCH: the process is gone); DDP_EINVAL: memory changed under the read. */
typedef struct {
    int32_t pid;
    int32_t gil_size;            /* bytes of the GIL structure (open) */
    uint64_t runtime;            /* _PyRuntime */
    uint64_t code_type;          /* PyCode_Type */
    uint64_t unicode_type;       /* PyUnicode_Type */
    uint64_t bytes_type;         /* PyBytes_Type */
    uint64_t interp;             /* its main interpreter (open) */
    uint64_t gil;                /* that interpreter's GIL structure (open) */
} ddp_remote;
int ddp_remote_open(ddp_remote *t, char *msg, int cap);
/* The main interpreter's thread states and their native tids; returns how many (may exceed cap). */
int ddp_remote_threads(const ddp_remote *t, uint64_t *tstates, int64_t *tids, int cap);
uint64_t ddp_remote_gil_holder(const ddp_remote *t);  /* the thread state holding the GIL, 0 none */
/* One thread's frames, leaf first: the depth (DDP_REC_TRUNCATED in *flags when deeper than max). */
int ddp_remote_walk(const ddp_remote *t, uint64_t tstate, int64_t tid, ddp_frame *out, int max, uint16_t *flags);
int ddp_remote_resolve(const ddp_remote *t, uint64_t code, uint64_t fp, ddp_code_info *info, char *qualname,
                       int qcap, char *filename, int fcap, uint8_t *linetable, int lcap);
int ddp_remote_peek(int32_t pid, uint64_t addr, void *buf, int n);  /* raw bytes: 0, or DDP_ESYS */
/* ---- end another process ---- */
/* cdef-end */

#endif /* DDPROF_H */
