/* pyremote.c — another process's Python threads, for a dump or sampling from outside: the
 * same walker and resolver, reading the target's memory (process_vm_readv).  Its interpreter
 * is found from its _PyRuntime, whose address the caller got from the target's ELF symbols.
 * The target must run this module's CPython minor version: 3.13+ have every offset used
 * compared with the target's published ones first; 3.11/3.12 publish none (the caller checks
 * the version), and every read is validated as in-process ones are. */
#include "pyinternals.h"
#include <errno.h>


static int remote_space(const ddp_remote *t, py_space *sp)
{
    if (!t || t->pid <= 0 || !t->interp)
        return DDP_EINVAL;
    memset(sp, 0, sizeof *sp);
    sp->pid = t->pid;
    sp->code_type = (uintptr_t)t->code_type;
    sp->unicode_type = (uintptr_t)t->unicode_type;
    sp->bytes_type = (uintptr_t)t->bytes_type;
    sp->interp = (uintptr_t)t->interp;
    sp->gil = (uintptr_t)t->gil;
    return 0;
}

/* A failed remote read: the process's absence or our lack of rights are errors to name
 * (DDP_ESYS, errno kept); anything else is memory that changed under the read. */
static int remote_failure(void)
{
    int e = errno;
    if (e == EPERM || e == ESRCH || e == EACCES) {
        ddp_set_errno(e);
        return DDP_ESYS;
    }
    return DDP_EINVAL;
}

int ddp_remote_peek(int32_t pid, uint64_t addr, void *buf, int n)
{
    if (pid <= 0 || n < 0 || !buf)
        return DDP_EINVAL;
    if (ddp_remote_read(pid, buf, (uintptr_t)addr, (size_t)n) != 0) {
        ddp_set_errno(errno);
        return DDP_ESYS;
    }
    return 0;
}

int ddp_remote_open(ddp_remote *t, char *msg, int cap)
{
    if (cap > 0)
        msg[0] = 0;
#if !DDP_PY_SUPPORTED
    (void)t;
    snprintf(msg, (size_t)cap, "this build of the native module has no frame walker for CPython %s", PY_VERSION);
    return DDP_EUNSUPPORTED;
#else
    if (!t || t->pid <= 0 || !t->runtime)
        return DDP_EINVAL;
    errno = 0;
#if PY_VERSION_HEX >= 0x030D0000
    _Py_DebugOffsets d; /* what the target publishes (the first field of its _PyRuntime) */
    if (ddp_remote_read(t->pid, &d, (uintptr_t)t->runtime + offsetof(_PyRuntimeState, debug_offsets), sizeof d) != 0) {
        ddp_set_errno(errno);
        return DDP_ESYS;
    }
    if (memcmp(d.cookie, _Py_Debug_Cookie, sizeof d.cookie) == 0 && d.free_threaded) {
        snprintf(msg, (size_t)cap, "the target is a free-threaded CPython build: its layout is not supported");
        return DDP_EUNSUPPORTED;
    }
    if (ddp_py_layout_compare(&d, "the target process", 1, msg, cap) != 0)
        return DDP_EUNSUPPORTED;
#endif
    uintptr_t rt = (uintptr_t)t->runtime, interp = 0, gil = 0;
    if (ddp_remote_read(t->pid, &interp, rt + offsetof(_PyRuntimeState, interpreters.head), sizeof interp) != 0) {
        ddp_set_errno(errno);
        return DDP_ESYS;
    }
    if (!interp || (interp & 7)) {
        snprintf(msg, (size_t)cap, "the target has no Python interpreter running (starting up or finalizing)");
        return DDP_EUNSUPPORTED;
    }
#if PY_VERSION_HEX >= 0x030C0000
    if (ddp_remote_read(t->pid, &gil, interp + offsetof(PyInterpreterState, ceval.gil), sizeof gil) != 0) {
        ddp_set_errno(errno);
        return DDP_ESYS;
    }
#else
    gil = rt + offsetof(_PyRuntimeState, ceval.gil);
#endif
    t->interp = interp;
    t->gil = gil;
    t->gil_size = (int32_t)sizeof(struct _gil_runtime_state);
    return 0;
#endif
}

typedef struct {
    uint64_t *tstates;
    int64_t *tids;
    int cap, n;
} thread_list;

static void add_thread(uintptr_t tstate, long tid, void *ctx)
{
    thread_list *l = ctx;
    if (l->n < l->cap) {
        l->tstates[l->n] = tstate;
        l->tids[l->n] = tid;
    }
    l->n++;
}

int ddp_remote_threads(const ddp_remote *t, uint64_t *tstates, int64_t *tids, int cap)
{
    py_space sp;
    int rc = remote_space(t, &sp);
    if (rc != 0)
        return rc;
    /* the list changes while it is read (threads starting and ending): a few tries */
    for (int attempt = 0; attempt < 5; attempt++) {
        thread_list l = { tstates, tids, cap, 0 };
        errno = 0;
        if (ddp_py_scan_threads_in(&sp, DDP_READ_SYSCALL, add_thread, &l) == 0)
            return l.n;
        rc = remote_failure();
        if (rc == DDP_ESYS)
            return rc;
    }
    return DDP_EINVAL;
}

uint64_t ddp_remote_gil_holder(const ddp_remote *t)
{
    py_space sp;
    if (remote_space(t, &sp) != 0 || !sp.gil)
        return 0;
#if DDP_PY_SUPPORTED
    struct _gil_runtime_state gil;
    if (ddp_remote_read(sp.pid, &gil, sp.gil, sizeof gil) != 0)
        return 0;
#if PY_VERSION_HEX >= 0x030D0000
    return gil.locked ? (uint64_t)(uintptr_t)gil.last_holder : 0;
#else
    return gil.locked._value ? (uint64_t)(uintptr_t)gil.last_holder._value : 0;
#endif
#else
    return 0;
#endif
}

int ddp_remote_walk(const ddp_remote *t, uint64_t tstate, int64_t tid, ddp_frame *out, int max, uint16_t *flags)
{
    py_space sp;
    int rc = remote_space(t, &sp);
    if (rc != 0 || !out || max <= 0 || !flags)
        return rc ? rc : DDP_EINVAL;
    errno = 0;
    *flags = 0;
    int depth = ddp_py_walk_in(&sp, (uintptr_t)tstate, (long)tid, DDP_READ_SYSCALL, out, max, flags);
    return depth >= 0 ? depth : remote_failure();
}

int ddp_remote_resolve(const ddp_remote *t, uint64_t code, uint64_t fp, ddp_code_info *info, char *qualname,
                       int qcap, char *filename, int fcap, uint8_t *linetable, int lcap)
{
    py_space sp;
    int rc = remote_space(t, &sp);
    if (rc != 0)
        return rc;
    memset(info, 0, sizeof *info);
    errno = 0;
    rc = ddp_py_resolve_in(&sp, (uintptr_t)code, fp, DDP_READ_SYSCALL, info, qualname, qcap, filename, fcap,
                           linetable, lcap);
    return rc == DDP_EINVAL ? remote_failure() : rc;
}
