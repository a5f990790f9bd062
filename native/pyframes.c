/* pyframes.c — a thread's Python frames, the interpreter's thread list and its GIL, read
 * from outside the thread without its cooperation (signal handlers, the wall thread).
 *
 * A walk copies each frame and code header it reads (py_read) and uses fields from the
 * copy: it never follows a pointer it has not copied, and it validates what it copied
 * (types, bounds, owner, cycles), as another thread may change or free it meanwhile.  It
 * reads the address space it is given: this process's, or another's (pyremote.c). */
#include "pyinternals.h"

#define MEMO 8

static int top_frame(const py_space *sp, uintptr_t tstate, long expect_tid, int mode, uintptr_t *frame)
{
    PyThreadState ts;
    if (py_read(sp, &ts, tstate, sizeof ts, mode) != 0)
        return -1;
    /* A thread state can be freed and its memory reused by another thread's (C threads
     * cycling PyGILState_Ensure/Release) between the registry's look at it and this walk:
     * then it names another thread, whose stack must not go on this one. */
    if (expect_tid > 0 && (long)ts.native_thread_id != expect_tid)
        return -1;
#if PY_VERSION_HEX >= 0x030D0000
    *frame = (uintptr_t)ts.current_frame;
#else
    *frame = 0;
    if (ts.cframe) { /* NULL while a thread state is being set up */
        _PyCFrame cf;
        if (py_read(sp, &cf, (uintptr_t)ts.cframe, sizeof cf, mode) != 0)
            return -1;
        /* The eval loop pushes its C frame (on the C stack) before it sets that frame's
         * Python frame: caught in between, a thread deep in Python would show an empty (or a
         * stale) stack.  Only the thread state's own root C frame has no previous one. */
        if (!cf.current_frame && cf.previous)
            return -1;
        *frame = (uintptr_t)cf.current_frame;
    }
#endif
    return 0;
}

int ddp_py_walk_in(const py_space *sp, uintptr_t tstate, long expect_tid, int mode, ddp_frame *out, int max,
                   uint16_t *flags)
{
#if !DDP_PY_SUPPORTED
    return -1;
#else
    uintptr_t fptr, tortoise;
    if (top_frame(sp, tstate, expect_tid, mode, &fptr) != 0)
        return -1;
    tortoise = fptr;
    struct { uintptr_t code; uint64_t fp; } memo[MEMO];
    int memo_n = 0;
    uintptr_t fname_memo = 0;
    uint64_t fhash_memo = 0;
    int depth = 0;
    char fbuf[sizeof(_PyInterpreterFrame)] __attribute__((aligned(16)));
    char cbuf[sizeof(PyCodeObject)] __attribute__((aligned(16)));
    _PyInterpreterFrame *f = (_PyInterpreterFrame *)fbuf;
    PyCodeObject *co = (PyCodeObject *)cbuf;

    for (int steps = 0; fptr; steps++) {
        if (steps > MAX_CHAIN || (fptr & 7))
            return -1;
        if (py_read(sp, fbuf, fptr, FRAME_HDR, mode) != 0)
            return -1;
        uintptr_t next = (uintptr_t)f->previous;
        /* Brent-free cycle check: a tortoise moving at half speed. */
        if (steps & 1) {
            uintptr_t tprev = 0;
            if (py_read(sp, &tprev, tortoise + offsetof(_PyInterpreterFrame, previous), sizeof tprev, mode) != 0)
                return -1;
            tortoise = tprev;
            if (tortoise && tortoise == next)
                return -1;
        }
#if PY_VERSION_HEX >= 0x030E0000
        /* 3.14+: entry frames of the eval loop and the thread's base frame are owned by
         * the interpreter (3.14 also has CSTACK = 4): no Python code, not a frame to show */
        if (f->owner >= FRAME_OWNED_BY_INTERPRETER && f->owner <= DDP_OWNER_MAX) {
            if (depth)
                out[depth - 1].firstlineno |= DDP_FRAME_ENTRY; /* the frame this entry began */
            fptr = next;
            continue;
        }
#elif PY_VERSION_HEX >= 0x030C0000
        if (f->owner == FRAME_OWNED_BY_CSTACK) { /* the C entry shim of 3.12+ */
            if (depth)
                out[depth - 1].firstlineno |= DDP_FRAME_ENTRY; /* the frame this entry began */
            fptr = next;
            continue;
        }
#endif
        if (f->owner < 0 || f->owner > DDP_OWNER_MAX)
            return -1;
        if (!FRAME_CODE_TAG_OK(*f))
            return -1;
        uintptr_t cptr = FRAME_CODE(*f);
        if (!cptr || (cptr & 7))
            return -1;
        if (py_read(sp, cbuf, cptr, CODE_HDR, mode) != 0)
            return -1;
        if ((uintptr_t)co->ob_base.ob_base.ob_type != sp->code_type) {
#if PY_VERSION_HEX >= 0x030D0000
            fptr = next; /* f_executable may be None for some 3.13+ internal frames */
            continue;
#else
            return -1;
#endif
        }
        Py_ssize_t size = Py_SIZE(co);
        if (size <= 0 || size > (1 << 26))
            return -1;
        intptr_t instr = (intptr_t)FRAME_INSTR(*f);
        intptr_t start = (intptr_t)(cptr + CODE_HDR);
        intptr_t lasti = (instr - start) / (intptr_t)sizeof(_Py_CODEUNIT);
        if (f->owner != FRAME_OWNED_BY_GENERATOR && lasti < co->_co_firsttraceable) {
            fptr = next; /* incomplete frame: not started yet */
            continue;
        }
        if (lasti < -1 || lasti >= size)
            return -1;
        if (depth == max) {
            *flags |= DDP_REC_TRUNCATED;
            break;
        }
        /* Before the fingerprint's reads: a code object that dies while (or after) they run
         * finds its bit set, so its death is recorded (a wall sample walks a running thread). */
        if (!sp->pid) /* the code-death filters are this process's */
            ddp_bloom_set(cptr);
        uint64_t fp = 0;
        for (int i = 0; i < memo_n && i < MEMO; i++) /* memo_n counts past MEMO: slots wrap */
            if (memo[i].code == cptr) {
                fp = memo[i].fp;
                break;
            }
        if (!fp) {
            if (ddp_py_code_fp(sp, co, mode, &fp, &fname_memo, &fhash_memo) != 0)
                return -1;
            memo[memo_n % MEMO].code = cptr;
            memo[memo_n % MEMO].fp = fp;
            memo_n++;
        }
        if (!sp->pid)
            ddp_known_note(cptr, fp);
        out[depth].code = cptr;
        out[depth].fp = fp;
        out[depth].lasti = (int32_t)lasti;
        out[depth].firstlineno = co->co_firstlineno;
#if PY_VERSION_HEX < 0x030C0000
        if (f->is_entry) /* 3.11: the frame an eval loop's run began with */
            out[depth].firstlineno |= DDP_FRAME_ENTRY;
#endif
        depth++;
        fptr = next;
    }
    return depth;
#endif
}

int ddp_py_walk(uintptr_t tstate, long expect_tid, int mode, ddp_frame *out, int max, uint16_t *flags)
{
    return ddp_py_walk_in(&ddp_py_here, tstate, expect_tid, mode, out, max, flags);
}

/* ---- GIL and GC --------------------------------------------------------------------- */
static int holds_gil(const py_space *sp, uintptr_t tstate, int mode)
{
    if (!sp->gil)
        return 0;
    struct _gil_runtime_state gil;
    if (py_read(sp, &gil, sp->gil, sizeof gil, mode) != 0)
        return 0;
#if PY_VERSION_HEX >= 0x030D0000
    return gil.locked && (uintptr_t)gil.last_holder == tstate;
#else
    return gil.locked._value && (uintptr_t)gil.last_holder._value == tstate;
#endif
}

int ddp_py_holds_gil(uintptr_t tstate, int mode) { return holds_gil(&ddp_py_here, tstate, mode); }

int ddp_py_gc_on_thread(uintptr_t tstate, int mode)
{
    const py_space *sp = &ddp_py_here;
    /* gc.collecting is interpreter-wide; the collector runs with the GIL held, so the
     * thread holding the GIL is the one collecting (a finalizer that releases the GIL
     * during a collection can misattribute a little; documented). */
    if (!sp->interp)
        return 0;
    int collecting = 0;
    uintptr_t at = sp->interp + offsetof(PyInterpreterState, gc) + offsetof(struct _gc_runtime_state, collecting);
    if (py_read(sp, &collecting, at, sizeof collecting, mode) != 0 || !collecting)
        return 0;
    return ddp_py_holds_gil(tstate, mode);
}

void ddp_py_gil_range(uintptr_t *lo, uintptr_t *hi)
{
    *lo = ddp_py_here.gil;
    *hi = ddp_py_here.gil ? ddp_py_here.gil + sizeof(struct _gil_runtime_state) : 0;
}

/* ---- thread list ---------------------------------------------------------------------- */
static int scan_threads_of(const py_space *sp, uintptr_t interp, int mode, ddp_thread_cb cb, void *ctx)
{
    if (!interp)
        return -1;
    uintptr_t t = 0;
    if (py_read(sp, &t, interp + offsetof(PyInterpreterState, threads.head), sizeof t, mode) != 0)
        return -1;
    uintptr_t seen_first = t;
    /* Direct loads: the three fields the scan needs, not the whole thread state (hundreds of
     * bytes a thread, every wall tick).  Through syscalls one read of the whole state costs
     * less than three. */
    int whole = sp->pid || mode == DDP_READ_SYSCALL;
    for (int n = 0; t; n++) {
        if (n > MAX_CHAIN || (t & 7))
            return -1;
        PyThreadState ts;
        if (whole) {
            if (py_read(sp, &ts, t, sizeof ts, mode) != 0)
                return -1;
        } else if (py_read(sp, &ts.interp, t + offsetof(PyThreadState, interp), sizeof ts.interp, mode) != 0 ||
                   py_read(sp, &ts.next, t + offsetof(PyThreadState, next), sizeof ts.next, mode) != 0 ||
                   py_read(sp, &ts.native_thread_id, t + offsetof(PyThreadState, native_thread_id),
                           sizeof ts.native_thread_id, mode) != 0) {
            return -1;
        }
        if ((uintptr_t)ts.interp != interp)
            return -1; /* freed or recycled under us: the caller retries next tick */
        if (ts.native_thread_id)
            cb(t, (long)ts.native_thread_id, ctx);
        t = (uintptr_t)ts.next;
        if (t == seen_first)
            return -1;
    }
    return 0;
}

int ddp_py_scan_threads_in(const py_space *sp, int mode, ddp_thread_cb cb, void *ctx)
{
    return scan_threads_of(sp, sp->interp, mode, cb, ctx);
}

int ddp_py_scan_threads(int mode, ddp_thread_cb cb, void *ctx)
{
    return ddp_py_scan_threads_in(&ddp_py_here, mode, cb, ctx);
}

/* One thread's state in a list, by its tid (with frames on it, if asked). */
struct tid_find { long tid; int mode; int with_frames; uintptr_t found; };

static void tid_match(uintptr_t t, long tid, void *ctx)
{
    struct tid_find *f = ctx;
    uintptr_t frame = 0;
    if (tid == f->tid && !f->found &&
        (!f->with_frames || (top_frame(&ddp_py_here, t, tid, f->mode, &frame) == 0 && frame)))
        f->found = t;
}

uintptr_t ddp_py_tstate_of(long tid, int mode)
{
    struct tid_find f = { tid, mode, 0, 0 };
    return ddp_py_scan_threads(mode, tid_match, &f) == 0 ? f.found : 0;
}

/* ---- subinterpreters, from outside ---------------------------------------------------- */
#define MAX_INTERPS 64 /* interpreters looked through for one thread (more: its sample stops at the call) */

/* The thread state of another interpreter that thread `tid` runs Python in now, 0 if none:
 * what its own thread-local would say (ddp_py_running_tstate), found from outside, where that
 * thread-local cannot be read (and is cleared while the thread waits with the GIL released).
 * From 3.13 each entry into an interpreter (run_string, call, an InterpreterPoolExecutor's
 * task) makes a thread state bound to the entering thread and deletes it on the way out, so
 * the one with this tid and frames on it is where the thread is.  3.12 runs every entry in
 * the interpreter's first thread state, whose tid is its creator's: no answer there (0).
 * Racy like every read from outside: the caller walks the result through safe reads. */
uintptr_t ddp_py_subinterp_tstate(long tid, int mode)
{
#if DDP_PY_SUPPORTED && PY_VERSION_HEX >= 0x030D0000
    /* No other interpreter (nearly always): plain loads say so, the runtime and the main
     * interpreter being static memory of the interpreter's own (3.12+) */
    PyInterpreterState *head = __atomic_load_n(&_PyRuntime.interpreters.head, __ATOMIC_RELAXED);
    PyInterpreterState *main_interp = (PyInterpreterState *)ddp_py_here.interp;
    if (!main_interp || (head == main_interp && !__atomic_load_n(&main_interp->next, __ATOMIC_RELAXED)))
        return 0;
    uintptr_t interp = (uintptr_t)head;
    struct tid_find f = { tid, mode, 1, 0 };
    for (int n = 0; interp && n < MAX_INTERPS; n++) {
        if (interp & 7)
            return 0;
        if (interp != ddp_py_here.interp && scan_threads_of(&ddp_py_here, interp, mode, tid_match, &f) == 0 && f.found)
            return f.found;
        if (py_read(&ddp_py_here, &interp, interp + offsetof(PyInterpreterState, next), sizeof interp, mode) != 0)
            return 0;
    }
#else
    (void)tid, (void)mode;
#endif
    return 0;
}

uintptr_t ddp_py_current_tstate(void) { return (uintptr_t)PyGILState_GetThisThreadState(); }

/* The calling thread's tstate in whichever interpreter it runs now (a subinterpreter's
 * while it runs one; 0 while it runs none): the interpreter's thread-local, read without
 * a lock or a call into the runtime.  3.11 keeps it in the runtime's GIL state: 0. */
uintptr_t ddp_py_running_tstate(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return (uintptr_t)PyThreadState_GetUnchecked();
#elif PY_VERSION_HEX >= 0x030C0000
    return (uintptr_t)_PyThreadState_UncheckedGet();
#else
    return 0;
#endif
}

/* The id of the subinterpreter `tstate` belongs to, + 1 (0: the main interpreter's, or
 * unreadable), through safe reads. */
uint32_t ddp_py_subinterp_number(uintptr_t tstate, int mode)
{
#if !DDP_PY_SUPPORTED
    (void)tstate, (void)mode;
    return 0;
#else
    uintptr_t interp = 0;
    int64_t id = -1;
    if (py_read(&ddp_py_here, &interp, tstate + offsetof(PyThreadState, interp), sizeof interp, mode) != 0 ||
        interp == ddp_py_here.interp ||
        py_read(&ddp_py_here, &id, interp + offsetof(PyInterpreterState, id), sizeof id, mode) != 0 || id < 0 ||
        id >= (int64_t)UINT32_MAX)
        return 0;
    return (uint32_t)id + 1;
#endif
}

/* ---- init (with the GIL) -------------------------------------------------------------- */
int ddp_py_init(void)
{
#if !DDP_PY_SUPPORTED
    return DDP_EUNSUPPORTED;
#else
    /* 3.13+: refuse if the interpreter's published offsets differ from our headers'
     * (the binding already refused with the field named; this is the last guard). */
    char msg[256];
    if (ddp_py_layout_problem(msg, sizeof msg) != 0)
        return DDP_EUNSUPPORTED;
    ddp_py_types_init();
    PyInterpreterState *interp = PyInterpreterState_Get();
    ddp_py_here.interp = (uintptr_t)interp;
#if PY_VERSION_HEX >= 0x030C0000
    ddp_py_here.gil = (uintptr_t)interp->ceval.gil;
#else
    ddp_py_here.gil = (uintptr_t)&_PyRuntime.ceval.gil;
#endif
    return DDP_OK;
#endif
}
