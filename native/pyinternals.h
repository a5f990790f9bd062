/* pyinternals.h — what the files built against CPython's internal headers share (3.11 to 3.15).
 *
 * Only pyframes.c, pycode.c, pylayout.c, pygraveyard.c and pyremote.c include it: the rest of
 * the module sees interpreter state through ddp_internal.h, so version-specific layout stays
 * here.  The struct layouts are the real ones of the version the module is built for (the
 * binding refuses another PY_VERSION_HEX); on 3.13+ pylayout.c also checks them against the
 * interpreter's published _Py_DebugOffsets before anything is read.
 *
 * Every read of interpreter memory is a copy (py_read) whose fields are validated before use.
 * Fields per version:
 *                 3.11                     3.12              3.13            3.14 / 3.15
 *   top frame     tstate->cframe->current_frame  (same)      tstate->current_frame  (same)
 *   code          f_code                   f_code            f_executable    f_executable: a tagged
 *                                                            (may be None)   _PyStackRef (mask
 *                                                                            Py_TAG_BITS = 3)
 *   instruction   prev_instr               prev_instr        instr_ptr       instr_ptr
 *   skip          incomplete frames        + owner == CSTACK same as 3.12    + owner >= INTERPRETER
 *                                            shims                           (3.14: INTERPRETER 3,
 *                                                                            CSTACK 4; 3.15: no
 *                                                                            CSTACK, INTERPRETER 3)
 * The location table (co_linetable) has the same format from 3.11 to 3.15.
 */
#ifndef DDP_PYINTERNALS_H
#define DDP_PYINTERNALS_H
#define Py_BUILD_CORE 1
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <Python.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal/pycore_frame.h"
#if PY_VERSION_HEX >= 0x030E0000
/* 3.14+: struct _PyInterpreterFrame moved to pycore_interpframe_structs.h, f_executable
 * became a _PyStackRef (pycore_stackref.h: Py_TAG_BITS), _Py_DebugOffsets has its own header */
#include "internal/pycore_interpframe_structs.h"
#include "internal/pycore_stackref.h"
#include "internal/pycore_debug_offsets.h"
#endif
#include "internal/pycore_interp.h"
#include "internal/pycore_runtime.h"
#include "ddp_internal.h"

#pragma GCC visibility push(hidden)

/* Free-threaded builds (Py_GIL_DISABLED) and Py_STACKREF_DEBUG builds have other layouts
 * (per-thread bytecode, stack refs as indices): not supported. */
#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x03100000 || defined(Py_GIL_DISABLED) || \
    defined(Py_STACKREF_DEBUG)
#define DDP_PY_SUPPORTED 0
#else
#define DDP_PY_SUPPORTED 1
#endif

#if PY_VERSION_HEX >= 0x030E0000
/* f_executable is a _PyStackRef: a PyObject* whose low Py_TAG_BITS carry a tag.  A code
 * object is referenced with tag 0 (strong) or Py_TAG_REFCNT (deferred/immortal); any other
 * tag (tagged int, invalid) is not a code object and makes the sample invalid. */
#if DDP_PY_SUPPORTED
_Static_assert(Py_TAG_BITS == 3 && Py_TAG_REFCNT == 1, "unexpected _PyStackRef tagging");
#endif
#define FRAME_CODE_BITS(f) ((uintptr_t)(f).f_executable.bits)
#define FRAME_CODE(f) (FRAME_CODE_BITS(f) & ~(uintptr_t)Py_TAG_BITS)
#define FRAME_CODE_TAG_OK(f) ((FRAME_CODE_BITS(f) & (uintptr_t)Py_TAG_BITS) <= (uintptr_t)Py_TAG_REFCNT)
#define FRAME_INSTR(f) ((uintptr_t)(f).instr_ptr)
#elif PY_VERSION_HEX >= 0x030D0000
#define FRAME_CODE(f) ((uintptr_t)(f).f_executable)
#define FRAME_CODE_TAG_OK(f) 1
#define FRAME_INSTR(f) ((uintptr_t)(f).instr_ptr)
#else
#define FRAME_CODE(f) ((uintptr_t)(f).f_code)
#define FRAME_CODE_TAG_OK(f) 1
#define FRAME_INSTR(f) ((uintptr_t)(f).prev_instr)
#endif

/* The highest frame-owner value of this version (anything above: a torn read). */
#if PY_VERSION_HEX >= 0x030F0000
#define DDP_OWNER_MAX FRAME_OWNED_BY_INTERPRETER /* 3.15 dropped FRAME_OWNED_BY_CSTACK */
#elif PY_VERSION_HEX >= 0x030E0000
#define DDP_OWNER_MAX FRAME_OWNED_BY_CSTACK /* 3.14: INTERPRETER = 3, CSTACK = 4 */
#else
#define DDP_OWNER_MAX 3
#endif

#define CODE_HDR offsetof(PyCodeObject, co_code_adaptive)
#define FRAME_HDR offsetof(_PyInterpreterFrame, localsplus)
#define MAX_CHAIN 100000 /* frames or thread states walked before calling it a cycle */

/* Whose memory a walk reads, with that process's type and interpreter addresses: this
 * process (pid 0: the sampler's safe reads), or another process running the same CPython
 * version (process_vm_readv on its pid: ddp_remote_*). */
typedef struct {
    int pid;
    uintptr_t code_type, unicode_type, bytes_type, interp, gil;
} py_space;
extern py_space ddp_py_here; /* this process's (pycode.c; the interpreter's fields set by ddp_py_init) */

/* READ_LIVE: plain copies, for objects the caller knows alive (a dying code object, read
 * with the GIL before it is freed: it and what it references are intact): copies cost far
 * less than the syscalls of a safe read. */
#define READ_LIVE 2
static inline int py_read(const py_space *sp, void *dst, uintptr_t src, size_t n, int mode)
{
    if (sp->pid)
        return ddp_remote_read(sp->pid, dst, src, n);
    if (mode == READ_LIVE) {
        if (src < 4096) /* a field left NULL: refuse, as a safe read would */
            return -1;
        memcpy(dst, (const void *)src, n);
        return 0;
    }
    return ddp_safe_read(dst, src, n, mode);
}

/* pycode.c: a code object's fingerprint (its header copied into `co`; the memos, optional,
 * skip hashing a filename met just before), and its names and line table if it still has
 * fingerprint `fp` (0: any).  Resolution returns 0, 1 (a buffer too small: the lengths are
 * in info) or DDP_EINVAL. */
int ddp_py_code_fp(const py_space *sp, const PyCodeObject *co, int mode, uint64_t *fp, uintptr_t *fname_memo,
                   uint64_t *fhash_memo);
int ddp_py_resolve_in(const py_space *sp, uintptr_t code, uint64_t fp, int mode, ddp_code_info *info, char *q,
                      int qcap, char *f, int fcap, uint8_t *lt, int lcap);

/* pyframes.c: the walk and the thread list, in any address space. */
int ddp_py_walk_in(const py_space *sp, uintptr_t tstate, long expect_tid, int mode, ddp_frame *out, int max,
                   uint16_t *flags);
int ddp_py_scan_threads_in(const py_space *sp, int mode, ddp_thread_cb cb, void *ctx);

#if PY_VERSION_HEX >= 0x030D0000 && DDP_PY_SUPPORTED
/* pylayout.c: 0 when `d` publishes the offsets this module was compiled with, else 1 and
 * `msg` names the first difference (`minor_only`: the version need agree on major.minor only). */
int ddp_py_layout_compare(const _Py_DebugOffsets *d, const char *who, int minor_only, char *msg, int cap);
#endif

#pragma GCC visibility pop
#endif /* DDP_PYINTERNALS_H */
