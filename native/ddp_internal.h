/* ddp_internal.h — what the native files share beyond the public API (ddprof.h).
 *
 * Only the py*.c files (pyinternals.h) are compiled against CPython's internal headers;
 * the rest sees interpreter state only through the functions declared here, so
 * version-specific layout stays in one place.  The sampler core's own state is in core.h, the event
 * engines' interface in engine.h.
 */
#ifndef DDP_INTERNAL_H
#define DDP_INTERNAL_H
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include <time.h>
#include "ddprof.h"

#define DDP_TLS __thread __attribute__((tls_model("initial-exec")))

/* ---- safe reads (saferead.c) ---------------------------------------------------------
 * GUARDED mode reads with plain loads and relies on the caller having armed a guard
 * (ddp_guard_arm below): a SIGSEGV/SIGBUS on that thread then siglongjmps back to the
 * guard and the whole sample is dropped.  SYSCALL mode uses process_vm_readv on our own
 * pid, which fails with EFAULT instead of faulting, and needs no guard. */
typedef struct {
    sigjmp_buf jb;
    /* the range the guarded copy is reading now: only a fault inside it is recovered (a
     * fault elsewhere in a guarded stretch is a real bug and must crash as usual) */
    volatile uintptr_t lo, hi;
} ddp_guard;

extern DDP_TLS ddp_guard *volatile ddp_tls_guard;
/* Arm/disarm a guard.  The compiler barrier keeps the guarded loads between the two
 * stores (without it, the arming store was seen as dead and dropped). */
#define DDP_BARRIER() __asm__ __volatile__("" ::: "memory")
#define DDP_GUARD_ARM(gp) do { (gp)->lo = (gp)->hi = 0; ddp_tls_guard = (gp); DDP_BARRIER(); } while (0)
#define DDP_GUARD_SET(gp) do { DDP_BARRIER(); ddp_tls_guard = (gp); } while (0)
extern _Atomic int ddp_read_mode_now;     /* DDP_READ_*; only ever moves to SYSCALL during a session */
extern _Atomic int ddp_segv_replaced;
extern _Atomic uint64_t ddp_fault_count;

int ddp_safe_read(void *dst, uintptr_t src, size_t n, int mode);
void ddp_guarded_copy(void *dst, uintptr_t src, size_t n); /* under an armed guard, no plausibility filter */
int ddp_saferead_install(void);            /* 1 installed now, 0 already in place, -1 error */
void ddp_saferead_uninstall(void);
int ddp_saferead_check(void);              /* 1 when our handlers are still in place */
int ddp_saferead_check_segv(void);         /* same, SIGSEGV only (one syscall) */
void ddp_saferead_after_fork_child(void);
void ddp_saferead_set_pid(int pid);
int ddp_remote_read(int pid, void *dst, uintptr_t src, size_t n); /* another process's memory; errno kept */

/* ---- ring (ring.c): Vyukov's bounded MPMC queue of fixed-size records ------------------ */
typedef struct ddp_ring ddp_ring;
ddp_ring *ddp_ring_new(size_t records, size_t record_size);
void ddp_ring_free(ddp_ring *r);
/* Reserve a cell; NULL when full (never waits).  The writer must publish it. */
void *ddp_ring_reserve(ddp_ring *r, size_t *ticket);
void ddp_ring_publish(ddp_ring *r, size_t ticket);
/* Copy the oldest published record into dst; 0 when none is ready. */
int ddp_ring_pop(ddp_ring *r, void *dst);
size_t ddp_ring_count(ddp_ring *r);        /* reserved, not yet popped (racy: a hint) */
size_t ddp_ring_capacity(ddp_ring *r);
#define DDP_RING_AHEAD 256                  /* cells kept prefaulted ahead of the producers */
void ddp_ring_prefault(ddp_ring *r);        /* one thread at a time: ddp_ring_new, then the sampler thread */

/* ---- aggregates (agg.c): records keyed by all a Profile keeps of them, counts summed -- */
typedef struct ddp_agg ddp_agg;
/* At most this many keys per aggregate: its index (2 to 4.5 slots a key, a power of two) stays
 * well inside uint32, and the arena holds far fewer keys anyway. */
#define DDP_AGG_MAX_KEYS (1u << 24)
ddp_agg *ddp_agg_new(uint32_t max_keys, size_t arena_bytes);
void ddp_agg_free(ddp_agg *a);
void ddp_agg_reset(ddp_agg *a);
/* Add r (its time bucket: `bucket`, -1 for none) into a: 0, or -1 when a is full. */
int ddp_agg_add(ddp_agg *a, const ddp_record *r, int64_t bucket, int64_t (*bucket_fn)(int64_t ts));
/* Merge entries of one key in one bucket of the tick at the latest entry's time (before any
 * is read): bucket_at(e, last), -1 keeps e apart; returns how many entries were merged away. */
uint32_t ddp_agg_coarsen(ddp_agg *a, int64_t (*bucket_at)(const ddp_record *e, int64_t last));
/* Copy up to max entries not read yet into buf, one per `stride` bytes; returns how many. */
int ddp_agg_take(ddp_agg *a, void *buf, int max, size_t stride);
uint32_t ddp_agg_keys(const ddp_agg *a);
uint64_t ddp_agg_folded(const ddp_agg *a); /* records folded into their thread's last entry (full), ever */
int ddp_agg_quarter_full(const ddp_agg *a);

/* ---- interpreter access (pyframes.c; code deaths: pygraveyard.c) ---------------------- */
/* Set up with the GIL held: remembers the interpreter, its GIL and type addresses. */
int ddp_py_init(void);
void ddp_py_types_init(void);           /* type addresses only; no GIL needed */
/* Walk the frame chain of the thread state `tstate` into out (leaf first).  Returns the
 * depth, or -1 for a torn/inconsistent chain or (expect_tid > 0) a thread state that is no
 * longer that thread's.  Sets DDP_REC_TRUNCATED in *flags when
 * more frames exist than max.  Must run under an armed guard in GUARDED mode. */
int ddp_py_walk(uintptr_t tstate, long expect_tid, int mode, ddp_frame *out, int max, uint16_t *flags);
/* 1 when the interpreter's GC is collecting and `tstate` holds the GIL. */
int ddp_py_gc_on_thread(uintptr_t tstate, int mode);
/* 1 when `tstate` holds the GIL. */
int ddp_py_holds_gil(uintptr_t tstate, int mode);
/* The GIL structure's address range (a futex inside it = waiting for the GIL). */
void ddp_py_gil_range(uintptr_t *lo, uintptr_t *hi);
/* Racy walk of the interpreter's thread list: cb(tstate, native tid) per entry; -1 torn. */
typedef void (*ddp_thread_cb)(uintptr_t tstate, long tid, void *ctx);
int ddp_py_scan_threads(int mode, ddp_thread_cb cb, void *ctx);
uintptr_t ddp_py_tstate_of(long tid, int mode); /* thread tid's in that list, 0 if none (or torn) */
uintptr_t ddp_py_current_tstate(void);     /* the calling thread's, without the GIL */
uintptr_t ddp_py_running_tstate(void);     /* ... in the interpreter it runs now (3.12+), 0 if none */
uint32_t ddp_py_subinterp_number(uintptr_t tstate, int mode); /* its subinterpreter's id + 1; 0 main or unreadable */
uintptr_t ddp_py_subinterp_tstate(long tid, int mode); /* another interpreter's tstate tid runs in now (3.13+), from outside */
int ddp_py_watcher_start(void);            /* with the GIL: record code deaths (3.12+ watcher, 3.11 dealloc wrapper) */
void ddp_py_watcher_stop(void);            /* with the GIL: stop recording them */
void ddp_py_graveyard_clear(void);
void ddp_py_after_fork_child(void);

/* ---- code filters (codefilters.c) --------------------------------------------------- */
/* Bloom filter of code pointers seen in samples (set by producers, read by the watcher). */
void ddp_bloom_set(uintptr_t code);
int ddp_bloom_test(uintptr_t code);
void ddp_bloom_clear(void);
/* Code the drain has resolved: a sample of other code sets ddp_new_code_seen. */
void ddp_known_note(uintptr_t code, uint64_t fp);
void ddp_known_clear(void);
extern _Atomic int ddp_new_code_seen; /* a sample named code the drain has not resolved */

static inline int64_t ddp_now_ns(void) /* CLOCK_MONOTONIC */
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
extern _Atomic int ddp_session_active;     /* watcher callback and handlers check it */
extern _Atomic uint64_t ddp_graveyard_overflow;
void ddp_set_errno(int e);

#endif /* DDP_INTERNAL_H */
