/* bench.c — test and benchmark helpers of the public API: a timed frame walk, a safe read.
 *
 * Includes: core.h (and Python.h to set up interpreter addresses outside a session).
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdlib.h>
#include <Python.h>
#include "core.h"

int64_t ddp_bench_walk(int read_mode, int iterations, int max_depth, int *depth_out)
{
    uintptr_t tstate = ddp_py_current_tstate();
    if (atomic_load(&sess_state) == ST_IDLE) { /* outside a session: interpreter addresses, with the GIL */
        PyGILState_STATE gs = PyGILState_Ensure();
        ddp_py_init();
        PyGILState_Release(gs);
    }
    if (!tstate || iterations <= 0 || max_depth < 1 || max_depth > 4096)
        return DDP_EINVAL;
    int installed_here = 0;
    if (read_mode == DDP_READ_GUARDED) {
        installed_here = ddp_saferead_install();
        if (installed_here < 0)
            return DDP_ESYS;
    }
    ddp_saferead_set_pid(getpid());
    ddp_frame *frames = malloc(sizeof(ddp_frame) * (size_t)max_depth);
    if (!frames)
        return DDP_ENOMEM;
    int64_t t0 = ddp_now_ns();
    volatile int depth = -1;
    for (int i = 0; i < iterations; i++) {
        uint16_t flags = 0;
        if (read_mode == DDP_READ_GUARDED) {
            ddp_guard g, *prev = ddp_tls_guard;
            ddp_saferead_check_segv(); /* the handler does this per sample too */
            if (sigsetjmp(g.jb, 0) == 0) {
                DDP_GUARD_ARM(&g);
                depth = ddp_py_walk(tstate, 0, read_mode, frames, max_depth, &flags);
                ddp_py_gc_on_thread(tstate, read_mode);
            }
            DDP_GUARD_SET(prev);
        } else {
            depth = ddp_py_walk(tstate, 0, read_mode, frames, max_depth, &flags);
            ddp_py_gc_on_thread(tstate, read_mode);
        }
    }
    int64_t elapsed = ddp_now_ns() - t0;
    free(frames);
    if (installed_here == 1)
        ddp_saferead_uninstall();
    if (depth_out)
        *depth_out = depth;
    return elapsed;
}

/* The walk of a thread state caught entering the eval loop (3.11, 3.12: its C frame pushed,
 * that frame's Python frame not yet set): a copy of the calling thread's state in that state,
 * walked by syscall reads.  Its depth: -1 (torn), never 0 (an empty stack). */
int ddp_test_walk_entering(void)
{
#if PY_VERSION_HEX < 0x030D0000
    PyThreadState *ts = (PyThreadState *)ddp_py_current_tstate();
    if (!ts || !ts->cframe)
        return DDP_EINVAL;
    if (atomic_load(&sess_state) == ST_IDLE) { /* outside a session: interpreter addresses, with the GIL */
        PyGILState_STATE gs = PyGILState_Ensure();
        ddp_py_init();
        PyGILState_Release(gs);
    }
    ddp_saferead_set_pid(getpid());
    PyThreadState copy = *ts;
    _PyCFrame entering = *ts->cframe;
    entering.previous = ts->cframe;
    entering.current_frame = NULL;
    copy.cframe = &entering;
    ddp_frame frames[64];
    uint16_t flags = 0;
    return ddp_py_walk((uintptr_t)&copy, 0, DDP_READ_SYSCALL, frames, 64, &flags);
#else
    return DDP_EUNSUPPORTED;
#endif
}

int ddp_test_safe_read(uint64_t addr, int read_mode)
{
    int installed_here = 0;
    if (read_mode == DDP_READ_GUARDED) {
        installed_here = ddp_saferead_install();
        if (installed_here < 0)
            return DDP_ESYS;
    }
    ddp_saferead_set_pid(getpid());
    volatile int rc = -1;
    char buf[64];
    if (read_mode == DDP_READ_GUARDED) {
        ddp_guard g, *prev = ddp_tls_guard;
        if (sigsetjmp(g.jb, 0) == 0) {
            DDP_GUARD_ARM(&g);
            /* no plausibility filter: exercise the fault path itself */
            ddp_guarded_copy(buf, (uintptr_t)addr, sizeof buf);
            rc = 0;
        } else {
            rc = -1;
        }
        DDP_GUARD_SET(prev);
    } else {
        rc = ddp_safe_read(buf, (uintptr_t)addr, sizeof buf, DDP_READ_SYSCALL);
    }
    if (installed_here == 1)
        ddp_saferead_uninstall();
    return rc;
}
