/* pylayout.c — is the interpreter laid out as the headers this module was built with say?
 * 3.13+ publish their offsets (_PyRuntime.debug_offsets): each one the readers use is
 * compared, and a difference refuses the engine with the field named rather than read
 * with a wrong layout.  3.11/3.12 publish none: the exact version match is the guarantee. */
#include "pyinternals.h"

#if DDP_PY_SUPPORTED
/* alloctype.c (built without the internal headers) assumes a two-word GC pre-header. */
_Static_assert(sizeof(PyGC_Head) == 2 * sizeof(void *), "alloctype.c's GC_HEAD_SIZE is wrong for this version");
#endif

#if PY_VERSION_HEX >= 0x030D0000 && DDP_PY_SUPPORTED
typedef struct {
    const char *name;
    size_t at;    /* offset of the published value inside _Py_DebugOffsets */
    size_t base;  /* (size_t)-1, or a published value subtracted from it */
    uint64_t want;
} dbg_check;
#define DBG(f) offsetof(_Py_DebugOffsets, f)
#define NOBASE ((size_t)-1)
#define GIL_OFF(field) offsetof(struct _gil_runtime_state, field)
/* Every offset and size this module uses, with the value of the headers it was built with. */
static const dbg_check dbg_checks[] = {
    { "version", DBG(version), NOBASE, PY_VERSION_HEX },
    { "free_threaded", DBG(free_threaded), NOBASE, 0 },
    { "interpreter_state.size", DBG(interpreter_state.size), NOBASE, sizeof(PyInterpreterState) },
    { "interpreter_state.threads_head", DBG(interpreter_state.threads_head), NOBASE,
      offsetof(PyInterpreterState, threads.head) },
    { "interpreter_state.gc", DBG(interpreter_state.gc), NOBASE, offsetof(PyInterpreterState, gc) },
    { "interpreter_state.ceval_gil", DBG(interpreter_state.ceval_gil), NOBASE, offsetof(PyInterpreterState, ceval.gil) },
    { "interpreter_state.gil_runtime_state_locked", DBG(interpreter_state.gil_runtime_state_locked),
      DBG(interpreter_state.gil_runtime_state), GIL_OFF(locked) },
    { "interpreter_state.gil_runtime_state_holder", DBG(interpreter_state.gil_runtime_state_holder),
      DBG(interpreter_state.gil_runtime_state), GIL_OFF(last_holder) },
    { "thread_state.size", DBG(thread_state.size), NOBASE, sizeof(PyThreadState) },
    { "thread_state.next", DBG(thread_state.next), NOBASE, offsetof(PyThreadState, next) },
    { "thread_state.interp", DBG(thread_state.interp), NOBASE, offsetof(PyThreadState, interp) },
    { "thread_state.current_frame", DBG(thread_state.current_frame), NOBASE, offsetof(PyThreadState, current_frame) },
    { "thread_state.native_thread_id", DBG(thread_state.native_thread_id), NOBASE,
      offsetof(PyThreadState, native_thread_id) },
    { "interpreter_frame.size", DBG(interpreter_frame.size), NOBASE, sizeof(_PyInterpreterFrame) },
    { "interpreter_frame.previous", DBG(interpreter_frame.previous), NOBASE, offsetof(_PyInterpreterFrame, previous) },
    { "interpreter_frame.executable", DBG(interpreter_frame.executable), NOBASE,
      offsetof(_PyInterpreterFrame, f_executable) },
    { "interpreter_frame.instr_ptr", DBG(interpreter_frame.instr_ptr), NOBASE, offsetof(_PyInterpreterFrame, instr_ptr) },
    { "interpreter_frame.localsplus", DBG(interpreter_frame.localsplus), NOBASE,
      offsetof(_PyInterpreterFrame, localsplus) },
    { "interpreter_frame.owner", DBG(interpreter_frame.owner), NOBASE, offsetof(_PyInterpreterFrame, owner) },
#if PY_VERSION_HEX >= 0x030E0000
    { "interpreter_frame.tlbc_index", DBG(interpreter_frame.tlbc_index), NOBASE, 0 }, /* 0: no per-thread bytecode */
    { "code_object.co_tlbc", DBG(code_object.co_tlbc), NOBASE, 0 },
#endif
    { "code_object.size", DBG(code_object.size), NOBASE, sizeof(PyCodeObject) },
    { "code_object.filename", DBG(code_object.filename), NOBASE, offsetof(PyCodeObject, co_filename) },
    { "code_object.qualname", DBG(code_object.qualname), NOBASE, offsetof(PyCodeObject, co_qualname) },
    { "code_object.linetable", DBG(code_object.linetable), NOBASE, offsetof(PyCodeObject, co_linetable) },
    { "code_object.firstlineno", DBG(code_object.firstlineno), NOBASE, offsetof(PyCodeObject, co_firstlineno) },
    { "code_object.co_code_adaptive", DBG(code_object.co_code_adaptive), NOBASE,
      offsetof(PyCodeObject, co_code_adaptive) },
    { "pyobject.ob_type", DBG(pyobject.ob_type), NOBASE, offsetof(PyObject, ob_type) },
    { "bytes_object.ob_size", DBG(bytes_object.ob_size), NOBASE, offsetof(PyBytesObject, ob_base.ob_size) },
    { "bytes_object.ob_sval", DBG(bytes_object.ob_sval), NOBASE, offsetof(PyBytesObject, ob_sval) },
    { "unicode_object.state", DBG(unicode_object.state), NOBASE, offsetof(PyUnicodeObject, _base._base.state) },
    { "unicode_object.length", DBG(unicode_object.length), NOBASE, offsetof(PyUnicodeObject, _base._base.length) },
    { "unicode_object.asciiobject_size", DBG(unicode_object.asciiobject_size), NOBASE, sizeof(PyASCIIObject) },
    { "gc.collecting", DBG(gc.collecting), NOBASE, offsetof(struct _gc_runtime_state, collecting) },
};
#define N_DBG_CHECKS ((int)(sizeof dbg_checks / sizeof dbg_checks[0]))

static uint64_t dbg_value(const _Py_DebugOffsets *d, size_t at)
{
    uint64_t v;
    memcpy(&v, (const char *)d + at, sizeof v);
    return v;
}

/* `who` publishes the offsets; `minor_only`: another process of another patch release,
 * whose offsets are what matters. */
int ddp_py_layout_compare(const _Py_DebugOffsets *d, const char *who, int minor_only, char *msg, int cap)
{
    if (memcmp(d->cookie, _Py_Debug_Cookie, sizeof d->cookie) != 0) {
        snprintf(msg, (size_t)cap, "_PyRuntime.debug_offsets lacks its cookie (%s): the interpreter's layout "
                 "cannot be checked", _Py_Debug_Cookie);
        return 1;
    }
    for (int i = 0; i < N_DBG_CHECKS; i++) {
        const dbg_check *c = &dbg_checks[i];
        uint64_t got = dbg_value(d, c->at) - (c->base == NOBASE ? 0 : dbg_value(d, c->base));
        if (minor_only && c->at == DBG(version) ? got >> 16 != c->want >> 16 : got != c->want) {
            snprintf(msg, (size_t)cap, "%s publishes %s = %llu%s, the headers this module "
                     "was compiled with say %llu", who, c->name, (unsigned long long)got,
                     c->base == NOBASE ? "" : " (relative)", (unsigned long long)c->want);
            return 1;
        }
    }
    return 0;
}
#endif

int ddp_py_layout_problem(char *msg, int cap)
{
    if (cap > 0)
        msg[0] = 0;
#if !DDP_PY_SUPPORTED
    snprintf(msg, (size_t)cap, "this build of the native module has no frame walker for CPython %s%s", PY_VERSION,
#ifdef Py_GIL_DISABLED
             " (free-threaded build)"
#else
             ""
#endif
    );
    return 2;
#elif PY_VERSION_HEX >= 0x030D0000
    return ddp_py_layout_compare(&_PyRuntime.debug_offsets, "the running interpreter", 0, msg, cap);
#else
    return 0; /* 3.11/3.12 publish no offsets: the exact version match is the guarantee */
#endif
}

int ddp_py_layout_selftest(int field, char *msg, int cap)
{
    /* Perturb one published value (field 0: the cookie, then each check in turn) in a
     * copy of the running interpreter's offsets, and report what the check says. */
    if (cap > 0)
        msg[0] = 0;
#if PY_VERSION_HEX >= 0x030D0000 && DDP_PY_SUPPORTED
    if (field < 0 || field > N_DBG_CHECKS)
        return -1;
    _Py_DebugOffsets copy = _PyRuntime.debug_offsets;
    if (field == 0) {
        copy.cookie[0] ^= 0x20;
    } else {
        const dbg_check *c = &dbg_checks[field - 1];
        uint64_t v = dbg_value(&copy, c->at) + 8;
        memcpy((char *)&copy + c->at, &v, sizeof v);
    }
    return ddp_py_layout_compare(&copy, "the running interpreter", 0, msg, cap);
#else
    (void)field;
    return -1;
#endif
}
