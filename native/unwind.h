/* unwind.h — native stacks from a signal handler: per-library unwind rules and the walk.
 *
 * ehframe.c turns one loaded object's .eh_frame into a sorted table of rows (a pc range
 * -> how to find its caller), as async-profiler's DWARF parser does, when the object is
 * loaded; unwind.c keeps the tables of the loaded objects in an immutable snapshot that
 * the walk only looks up (binary searches, guarded reads): no loader call, no lock, no
 * malloc on the sampled thread.  x86-64 Linux.
 *
 * Includes: ddp_internal.h.
 */
#ifndef DDP_UNWIND_H
#define DDP_UNWIND_H
#include <stdint.h>
#include <ucontext.h>
#include "ddp_internal.h"

#pragma GCC visibility push(hidden)

/* How the caller's frame is found from a pc inside a row's range (x86-64: the return
 * address is always at CFA - 8, and a caller's rsp is the CFA). */
enum { UW_CFA_NONE, UW_CFA_RSP, UW_CFA_RBP };
#define UW_FP_SAME INT16_MIN   /* rbp is the caller's (not saved) */
#define UW_ROW_SIGNAL 1        /* a signal trampoline: the interrupted registers are in the ucontext at rsp */
#define UW_ROW_END 2           /* the outermost frame (return address undefined): a complete stack */

typedef struct {
    uint32_t loc;      /* first pc of the row, as an offset from its table's lo */
    int32_t cfa_off;   /* CFA = register + cfa_off */
    int16_t fp_off;    /* the caller's rbp is saved at CFA + fp_off, or UW_FP_SAME */
    uint8_t cfa_reg;   /* UW_CFA_*; NONE: no rule known here (an expression, a gap between functions) */
    uint8_t flags;     /* UW_ROW_* */
} uw_row;

/* The rows of one object's executable range [lo, hi), sorted by loc; NULL/0 on failure. */
typedef struct {
    uw_row *rows;
    uint32_t n;
} uw_table;
/* Parse the .eh_frame that the .eh_frame_hdr at `hdr` points to; every read stays inside
 * [seg_lo, seg_hi) (the loaded segment holding them).  Off the hot path: it mallocs. */
uw_table eh_build(uintptr_t hdr, uintptr_t seg_lo, uintptr_t seg_hi, uintptr_t lo, uintptr_t hi);

#define UW_TRUNCATED 1         /* the walk stopped before the outermost frame */

/* Walk the native stack of the interrupted context `uc` (the calling thread's own, from
 * its signal handler) into pcs, leaf first; returns the depth (>= 1).  A caller's pc is its
 * return address - 1: inside the call instruction, so it resolves to the calling function.  Sets UW_TRUNCATED in
 * *flags when it could not reach the outermost frame (no rule, a bad read, max reached).
 * Async-signal-safe; a faulting read ends the walk, keeping what was found. */
int uw_unwind(const ucontext_t *uc, uint64_t *pcs, int max, int mode, uint16_t *flags);
int uw_unwind_regs(uint64_t pc, uint64_t sp, uint64_t fp, uint64_t *pcs, int max, int mode, uint16_t *flags);
/* From a signal handler: the interrupted stack of the calling thread, as uw_unwind's. */
int uw_unwind_own(uint64_t *pcs, int max, int mode, uint16_t *flags);

/* The calling thread's own native frames (from its SIGPROF handler: the interrupted ones;
 * from a hook: below the profiler's frames) as ddp_frames (DDP_NATIVE_CODE, then
 * DDP_NATIVE_CUT if the walk stopped early or room ran out); returns how many, <= room. */
int uw_append_own(ddp_frame *out, int room, int mode);

/* A blocked thread's native frames from outside (its syscall's pc and sp, read from /proc by
 * the wall thread; no rbp: frames that need one end the walk), encoded as uw_append_own's. */
int uw_append_regs(uint64_t pc, uint64_t sp, ddp_frame *out, int room, int mode);

/* Off the hot path: tables for the objects loaded now (new ones parsed, unloaded ones
 * retired); cheap when nothing was loaded or unloaded since the last call.  Returns the
 * number of objects with tables, or -1 without memory. */
int uw_refresh(void);
/* The row that applies at pc in the current tables (NULL: none); tests and tools. */
const uw_row *uw_lookup(uintptr_t pc);
/* Free retired tables: only when no walk can be running (no session, or handlers drained). */
void uw_collect(void);

#pragma GCC visibility pop
#endif /* DDP_UNWIND_H */
