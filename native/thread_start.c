/* thread_start.c — threads as they start: their first stack, and their CPU clock as they exit.
 *
 * The registry finds threads by a scan each tick, and a CPU timer is checked by the kernel only
 * at clock ticks its thread runs for: a thread that lives a few milliseconds is often never
 * scanned and never signalled, and its CPU was lost (500 threads of 2 ms each: 0.2 % of their
 * CPU in the profile).  So, in CPU sessions, threading's profile hook (called by every new
 * threading.Thread before its own code) is ours for the session: on the new thread, with the
 * GIL, it takes a slot, records where the thread's own code begins (the first event whose
 * leaf frame is not threading's bootstrap: the target's first call, or its return), and sets
 * a thread-specific value whose destructor reads the thread's CPU clock as the thread ends.
 * Then it gives the thread the profile function it would have had (another tool's hook, or
 * none) and passes it the event.  When that thread exits, its clock's CPU that no sample
 * carried goes to the start stack (cpu.c): every such thread's CPU is in the profile, under
 * its entry function.  The hook is a builtin, so no frame of ours is under the walk.
 * Threads started by _thread directly (not threading) are found by the scan alone.  Part of the
 * CPU engine, which turns the hook on at its start and off at its stop.
 *
 * Includes: core.h, Python.h.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <Python.h>
#include "core.h"

#define START_EVENTS 8 /* events the hook waits for the thread's own code, at most */

static PyObject *hook;          /* our hook, a builtin; made once, never freed */
static PyObject *prev_hook;     /* threading's hook before ours (another tool's), or NULL */
static int hook_on;             /* under the GIL */
static uintptr_t boot_code[3];  /* Thread.run, Thread._bootstrap_inner, Thread._bootstrap */
static pthread_key_t exit_key;
static int exit_key_made;
static _Atomic int exits_inside;
static _Atomic int exits_on;    /* exits read into slots: from the hook's start to the CPU totals */
static DDP_TLS int start_events;

int thread_exits_inside(void) { return atomic_load(&exits_inside); }

/* As the thread ends (after its Python thread state is gone): its CPU clock, into its slot. */
static void on_thread_exit(void *value)
{
    uintptr_t v = (uintptr_t)value;
    atomic_fetch_add(&exits_inside, 1);
    slot_t *slots = sess_slots;
    int idx = (int)(uint32_t)v - 1;
    if (atomic_load_explicit(&ddp_session_active, memory_order_acquire) && atomic_load(&exits_on) && slots &&
        idx >= 0 && idx < MAX_SLOTS &&
        (uint32_t)(v >> 32) == atomic_load(&sess_gen) && atomic_load(&slots[idx].tid) == my_tid()) {
        struct timespec ts;
        if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0) {
            int64_t ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
            atomic_store(&slots[idx].exit_cpu_ns, ns > 0 ? ns : 1);
        }
    }
    atomic_fetch_sub(&exits_inside, 1);
}

static int is_boot_code(uint64_t code)
{
    return code == boot_code[0] || code == boot_code[1] || code == boot_code[2];
}

/* On the new thread: 1 when done with it (its start recorded, or nothing to do), 0 to wait for
 * the next event (the leaf is still threading's bootstrap). */
static int note_start(void)
{
    int32_t tid = my_tid();
    int idx = slot_get_or_create(tid);
    if (idx < 0)
        return 1;
    slot_t *s = &sess_slots[idx];
    if (atomic_load(&s->excluded) || atomic_load(&s->start_ready))
        return 1;
    if (start_events++ == 0)
        pthread_setspecific(exit_key, (void *)(((uintptr_t)atomic_load(&sess_gen) << 32) | (uint32_t)(idx + 1)));
    if (!s->start_rec && !(s->start_rec = malloc(sess_rec_size)))
        return 1;
    ddp_record *rec = s->start_rec;
    memset(rec, 0, sizeof *rec);
    rec->event = DDP_EVENT_CPU;
    rec->state = DDP_STATE_CPU;
    rec->tid = tid;
    rec->label_id = label_of(s);
    rec->count = 1;
    int mode = atomic_load(&ddp_read_mode_now);
    if (walk_into(rec, ddp_py_current_tstate(), mode) < 0)
        return start_events >= START_EVENTS;
    if ((rec->depth == 0 || is_boot_code(((ddp_frame *)(rec + 1))[0].code)) && start_events < START_EVENTS)
        return 0;
    atomic_store_explicit(&s->start_ready, 1, memory_order_release);
    return 1;
}

/* threading's profile hook, called as hook(frame, event, arg) on each new thread. */
static PyObject *on_thread_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    PyObject *prev = Py_XNewRef(prev_hook); /* (the thread may outlive our session: the hook stays callable) */
    PyObject *r = NULL;
    int done = 1;
    if (hook_on && atomic_load_explicit(&ddp_session_active, memory_order_acquire))
        done = note_start();
    if (done) {
        start_events = 0;
        PyObject *setprofile = PySys_GetObject("setprofile");
        r = setprofile ? PyObject_CallOneArg(setprofile, prev ? prev : Py_None) : Py_NewRef(Py_None);
        if (!r)
            goto out;
        Py_DECREF(r);
    }
    r = prev ? PyObject_Vectorcall(prev, args, (size_t)nargs, NULL) : Py_NewRef(Py_None);
out:
    Py_XDECREF(prev);
    return r;
}

static PyMethodDef hook_def = { "ddprof_nb_thread_start", (PyCFunction)(void (*)(void))on_thread_event, METH_FASTCALL,
                                "ddprof_nb: where a new thread starts (then the thread's own profile hook)" };

static uintptr_t code_of(PyObject *cls, const char *name)
{
    PyObject *f = PyObject_GetAttrString(cls, name);
    PyObject *code = f ? PyObject_GetAttrString(f, "__code__") : NULL;
    uintptr_t c = code && PyCode_Check(code) ? (uintptr_t)code : 0; /* (kept alive by threading) */
    Py_XDECREF(code);
    Py_XDECREF(f);
    PyErr_Clear();
    return c;
}

int thread_start_hook_on(void)
{
    if (!exit_key_made && pthread_key_create(&exit_key, on_thread_exit) == 0)
        exit_key_made = 1;
    if (!exit_key_made || (!hook && !(hook = PyCFunction_New(&hook_def, NULL)))) {
        PyErr_Clear();
        return -1;
    }
    PyObject *threading = PyImport_ImportModule("threading");
    PyObject *cls = threading ? PyObject_GetAttrString(threading, "Thread") : NULL;
    PyObject *prev = threading ? PyObject_GetAttrString(threading, "_profile_hook") : NULL;
    int rc = -1;
    if (cls && prev && PyObject_SetAttrString(threading, "_profile_hook", hook) == 0) {
        boot_code[0] = code_of(cls, "run");
        boot_code[1] = code_of(cls, "_bootstrap_inner");
        boot_code[2] = code_of(cls, "_bootstrap");
        Py_XDECREF(prev_hook);
        prev_hook = prev != Py_None && prev != hook ? Py_NewRef(prev) : NULL;
        hook_on = 1;
        atomic_store(&exits_on, 1);
        rc = 0;
    }
    Py_XDECREF(prev);
    Py_XDECREF(cls);
    Py_XDECREF(threading);
    PyErr_Clear();
    return rc;
}

void thread_start_hook_off(void)
{
    atomic_store(&exits_on, 0);
    if (!Py_IsInitialized())
        return;
    PyGILState_STATE g = PyGILState_Ensure();
    if (hook_on) {
        hook_on = 0;
        /* threading's hook back, unless another tool replaced ours meanwhile (then theirs stays) */
        PyObject *threading = PyImport_ImportModule("threading");
        PyObject *cur = threading ? PyObject_GetAttrString(threading, "_profile_hook") : NULL;
        if (cur == hook)
            PyObject_SetAttrString(threading, "_profile_hook", prev_hook ? prev_hook : Py_None);
        Py_XDECREF(cur);
        Py_XDECREF(threading);
        PyErr_Clear();
    }
    PyGILState_Release(g);
}
