/* aiostep.c — the asyncio task stepper's per-step work in C (ddprof_nb/aio/stepper.py).
 *
 * Two extension types, published as attributes of ddprof_nb._native by ddp_aio_types()
 * (cffi cannot declare Python types, so the module gets them at first use):
 *
 *   SlotBase  the base of labeling._Slot: a thread's published label id and the task
 *             sampler's per-thread timing words, as C int64 members, so a step reads and
 *             writes them without attribute look-ups while Python sees plain attributes.
 *   StepBase  the base of aio.stepper._TaskCoro: a task's coroutine plus its step
 *             timing words, and `send` (also the am_send slot, which the C Task's step
 *             calls through PyIter_Send).
 *
 * StepBase.send does what the Python stepper (_PyTaskCoro.send) does, step for step: the
 * two must stay equal, and tests run both.  Why C: a Python send frame per step, and the
 * StopIteration every finished task raises through it, cost as much as a short task's own
 * life.  What stays Python: the rare paths
 * (a task's first step, a drawn short suspension, label mirrors without a fast view,
 * throw), called back from here.
 *
 *   StepState the state a step reads, handed over once by StepBase._bind(state): the
 *             task sampler's tracker (None: not profiling, only forward), whether steps
 *             are timed, whether label mirrors want a push, and the Python helpers and
 *             tables it calls back (labeling's slots table, _new_slot and _push,
 *             the task sampler's short-suspension draw, the first step).  Python
 *             writes the flags into it (it is their one place, read by both steppers);
 *             the helpers are required keywords of its constructor and checked there,
 *             so a renamed Python private fails when the state is built, not at a step.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define Py_T_LONGLONG T_LONGLONG
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_READONLY READONLY
#define Py_T_BOOL T_BOOL
#endif
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include "ddprof.h"

typedef struct {
    PyObject_HEAD
    int64_t id, batch, tick, left, rate, shorts;
    PyObject *view; /* the one native mirror of `id`, or None */
} SlotObject;

typedef struct {
    PyObject_HEAD
    PyObject *coro, *task;
    int64_t lid, q, t0, e, r, w, end; /* as _PyTaskCoro's attributes of the same names */
} StepObject;

typedef struct {
    PyObject_HEAD
    PyObject *tracker;            /* the task sampler's tracker, or None: not profiling */
    char timing, mirrored;        /* steps timed (wall/park sampled); label mirrors want _push */
    PyObject *slots;              /* labeling._slots: thread ident -> slot (a dict) */
    PyObject *new_slot, *push;    /* labeling._new_slot(ident), labeling._push(slot, id) */
    PyObject *short_suspension;   /* the task sampler's draw (proxy, slot, e, resumed, left) -> left */
    PyObject *first_step;         /* first_step(proxy) -> the task's label id */
} StateObject;

static PyTypeObject *slot_type, *step_type, *state_type;
static StateObject *state;        /* set by StepBase._bind; NULL: only forward */

static inline int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.monotonic_ns(): what the ticks compare against */
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- StepState -------------------------------------------------------------------------------- */
static PyObject *state_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *v[5] = {NULL, NULL, NULL, NULL, NULL};
    static char *names[] = {"slots", "new_slot", "push", "short_suspension", "first_step", NULL};
    /* all keyword-only; optional to the parser only so that a missing one is named here */
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOOO", names, &v[0], &v[1], &v[2], &v[3], &v[4]))
        return NULL;
    for (int i = 0; i < 5; i++) {
        if (v[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "StepState: missing required keyword '%s'", names[i]);
            return NULL;
        }
        if (i == 0 ? !PyDict_Check(v[i]) : !PyCallable_Check(v[i])) {
            PyErr_Format(PyExc_TypeError, "StepState: '%s' must be %s, not %.100s", names[i],
                         i == 0 ? "a dict" : "callable", Py_TYPE(v[i])->tp_name);
            return NULL;
        }
    }
    StateObject *st = (StateObject *)type->tp_alloc(type, 0);
    if (st == NULL)
        return NULL;
    st->tracker = Py_NewRef(Py_None);
    st->slots = Py_NewRef(v[0]);
    st->new_slot = Py_NewRef(v[1]);
    st->push = Py_NewRef(v[2]);
    st->short_suspension = Py_NewRef(v[3]);
    st->first_step = Py_NewRef(v[4]);
    return (PyObject *)st;
}

static int state_traverse(StateObject *st, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(st));
    Py_VISIT(st->tracker);
    Py_VISIT(st->slots);
    Py_VISIT(st->new_slot);
    Py_VISIT(st->push);
    Py_VISIT(st->short_suspension);
    Py_VISIT(st->first_step);
    return 0;
}

static int state_clear(StateObject *st)
{
    Py_CLEAR(st->tracker);
    Py_CLEAR(st->slots);
    Py_CLEAR(st->new_slot);
    Py_CLEAR(st->push);
    Py_CLEAR(st->short_suspension);
    Py_CLEAR(st->first_step);
    return 0;
}

static void dealloc_with(PyObject *o, int (*clear)(PyObject *));
static void state_dealloc(PyObject *st) { dealloc_with(st, (int (*)(PyObject *))state_clear); }

static PyMemberDef state_members[] = {
    {"tracker", Py_T_OBJECT_EX, offsetof(StateObject, tracker), 0, "the task sampler's tracker, or None"},
    {"timing", Py_T_BOOL, offsetof(StateObject, timing), 0, "task steps are timed (wall/park sampled)"},
    {"mirrored", Py_T_BOOL, offsetof(StateObject, mirrored), 0, "label mirrors want labeling._push"},
    {"slots", Py_T_OBJECT_EX, offsetof(StateObject, slots), Py_READONLY, "labeling._slots"},
    {"new_slot", Py_T_OBJECT_EX, offsetof(StateObject, new_slot), Py_READONLY, "labeling._new_slot"},
    {"push", Py_T_OBJECT_EX, offsetof(StateObject, push), Py_READONLY, "labeling._push"},
    {"short_suspension", Py_T_OBJECT_EX, offsetof(StateObject, short_suspension), Py_READONLY,
     "the task sampler's draw of a suspension no tick saw"},
    {"first_step", Py_T_OBJECT_EX, offsetof(StateObject, first_step), Py_READONLY, "first_step(proxy) -> label id"},
    {NULL},
};

static PyType_Slot state_slots[] = {
    {Py_tp_new, state_new},
    {Py_tp_traverse, state_traverse},
    {Py_tp_clear, state_clear},
    {Py_tp_dealloc, state_dealloc},
    {Py_tp_members, state_members},
    {Py_tp_doc, "What a task step reads: flags Python writes, helpers it calls back (StepBase._bind)."},
    {0, NULL},
};

static PyType_Spec state_spec = {
    "ddprof_nb._native.StepState", sizeof(StateObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, state_slots,
};

/* ---- SlotBase ---------------------------------------------------------------------------------- */
static PyObject *slot_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    SlotObject *s = (SlotObject *)type->tp_alloc(type, 0);
    if (s) {
        s->rate = 10000000;
        s->view = Py_NewRef(Py_None);
    }
    return (PyObject *)s;
}

static int slot_traverse(SlotObject *s, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(s));
    Py_VISIT(s->view);
    return 0;
}

static int slot_clear(SlotObject *s)
{
    Py_CLEAR(s->view);
    return 0;
}

/* Both types' dealloc: untrack, drop the references (`clear`), free, release the heap type. */
static void dealloc_with(PyObject *o, int (*clear)(PyObject *))
{
    PyTypeObject *tp = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    clear(o);
    tp->tp_free(o);
    Py_DECREF(tp);
}

static void slot_dealloc(PyObject *s) { dealloc_with(s, (int (*)(PyObject *))slot_clear); }

static PyMemberDef slot_members[] = {
    {"id", Py_T_LONGLONG, offsetof(SlotObject, id), 0, "published label id"},
    {"batch", Py_T_LONGLONG, offsetof(SlotObject, batch), 0, "when the loop's current batch began"},
    {"tick", Py_T_LONGLONG, offsetof(SlotObject, tick), 0, "when the task sampler last ticked here"},
    {"left", Py_T_LONGLONG, offsetof(SlotObject, left), 0, "suspended ns left to the next short draw"},
    {"rate", Py_T_LONGLONG, offsetof(SlotObject, rate), 0, "suspended ns per short draw"},
    {"shorts", Py_T_LONGLONG, offsetof(SlotObject, shorts), 0, "short draws since the last tick"},
    {"view", Py_T_OBJECT_EX, offsetof(SlotObject, view), 0, "the one native mirror, or None"},
    {NULL},
};

static PyType_Slot slot_slots[] = {
    {Py_tp_new, slot_new},
    {Py_tp_traverse, slot_traverse},
    {Py_tp_clear, slot_clear},
    {Py_tp_dealloc, slot_dealloc},
    {Py_tp_members, slot_members},
    {Py_tp_doc, "A thread's published label id and task-sampling words (ddprof_nb.labeling._Slot)."},
    {0, NULL},
};

static PyType_Spec slot_spec = {
    "ddprof_nb._native.SlotBase", sizeof(SlotObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, slot_slots,
};

/* Store `lid` as the slot's published id and into its mirrors (labeling._set). */
static int publish(StateObject *st, SlotObject *slot, int64_t lid)
{
    slot->id = lid;
    PyObject *view = slot->view;
    if (view != NULL && view != Py_None) {
        if (PyMemoryView_Check(view)) {
            Py_buffer *b = PyMemoryView_GET_BUFFER(view);
            if (b->itemsize == 8 && b->len >= 8 && !b->readonly && b->buf != NULL) {
                /* the native label word, read by the samplers' threads: one aligned store */
                __atomic_store_n((int64_t *)b->buf, lid, __ATOMIC_RELAXED);
                return 0;
            }
        }
        /* anything else: what `view[0] = lid` does */
        PyObject *v = PyLong_FromLongLong(lid), *zero = PyLong_FromLong(0);
        int rc = v && zero ? PyObject_SetItem(view, zero, v) : -1;
        Py_XDECREF(v);
        Py_XDECREF(zero);
        return rc;
    }
    if (!st->mirrored)
        return 0;
    PyObject *r = PyObject_CallFunction(st->push, "OL", (PyObject *)slot, (long long)lid);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* The calling thread's slot (labeling._slot_here), a new reference. */
static SlotObject *slot_here(StateObject *st)
{
    PyObject *ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (ident == NULL)
        return NULL;
    PyObject *slot = PyDict_GetItemWithError(st->slots, ident);
    if (slot != NULL)
        Py_INCREF(slot);
    else if (!PyErr_Occurred())
        slot = PyObject_CallOneArg(st->new_slot, ident);
    Py_DECREF(ident);
    if (slot != NULL && !PyObject_TypeCheck(slot, slot_type)) {
        PyErr_Format(PyExc_TypeError, "a thread's label slot is a %.100s, not a SlotBase", Py_TYPE(slot)->tp_name);
        Py_CLEAR(slot);
    }
    return (SlotObject *)slot;
}

/* ---- StepBase ---------------------------------------------------------------------------------- */
static PyObject *step_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *coro;
    long long t0 = 0;
    static char *names[] = {"coro", "t0", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|L", names, &coro, &t0))
        return NULL;
    StepObject *s = (StepObject *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    s->coro = Py_NewRef(coro);
    s->task = Py_NewRef(Py_None);
    s->t0 = t0;
    s->lid = -1; /* before the first step */
    s->q = -t0;  /* suspended so far = now + q */
    s->e = -t0;  /* the current suspension began at creation, ready */
    s->r = 0;
    s->w = -1;
    s->end = 0;
    return (PyObject *)s;
}

static int step_traverse(StepObject *s, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(s));
    Py_VISIT(s->coro);
    Py_VISIT(s->task);
    return 0;
}

static int step_clear(StepObject *s)
{
    Py_CLEAR(s->coro);
    Py_CLEAR(s->task);
    return 0;
}

static void step_dealloc(PyObject *s) { dealloc_with(s, (int (*)(PyObject *))step_clear); }

/* Call a Python helper returning an int (a label id, a countdown). */
static int call_int(PyObject *fn, PyObject *args, int64_t *out)
{
    if (args == NULL)
        return -1;
    PyObject *r = PyObject_Call(fn, args, NULL);
    Py_DECREF(args);
    if (r == NULL)
        return -1;
    *out = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* The end of a suspension (_PyTaskCoro._resumes). */
static int resumes(StateObject *st, StepObject *self, SlotObject *slot, int64_t resumed)
{
    int64_t e = self->e;
    if (e < 0) { /* a ready suspension ends: not park (the first: _first_step moves it to w) */
        self->r += resumed + e;
    } else if (e > slot->tick) { /* one no tick saw: out of the ticks' account, drawn by length */
        int64_t span = resumed - e;
        self->q -= span;
        int64_t left = slot->left - span;
        if (left > 0) {
            slot->left = left;
        } else {
            if (call_int(st->short_suspension, Py_BuildValue("(OOLLL)", (PyObject *)self, (PyObject *)slot, (long long)e,
                                           (long long)resumed, (long long)left), &left) < 0)
                return -1;
            slot->left = left;
        }
    } else if (slot->batch > e) { /* woken: ready since its batch began */
        self->r += resumed - slot->batch;
    }
    return 0;
}

/* Restore `prev` after a step that raised or returned, keeping the pending exception. */
static void restore_after_error(StateObject *st, SlotObject *slot, int64_t prev)
{
    if (slot->id == prev)
        return;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    if (publish(st, slot, prev) < 0)
        PyErr_WriteUnraisable((PyObject *)slot);
    PyErr_Restore(t, v, tb);
}

/* One step: publish the task's label id, resume the coroutine, restore the previous id;
 * while timing, account the suspension that ends and the step's run time. */
static PySendResult step_send(PyObject *op, PyObject *arg, PyObject **presult)
{
    StepObject *self = (StepObject *)op;
    *presult = NULL;
    if (self->coro == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "task proxy has no coroutine");
        return PYGEN_ERROR;
    }
    if (state == NULL || state->tracker == NULL || state->tracker == Py_None) /* not profiling: only forward */
        return PyIter_Send(self->coro, arg, presult);
    Py_INCREF(state); /* the step may run Python code that binds another state */
    StateObject *st = state;
    int timing = st->timing;
    int64_t resumed = timing ? mono_ns() : 0;
    SlotObject *slot = slot_here(st);
    if (slot == NULL) {
        Py_DECREF(st);
        return PYGEN_ERROR;
    }
    PySendResult res = PYGEN_ERROR;
    if (timing && resumes(st, self, slot, resumed) < 0)
        goto out;
    int64_t prev = slot->id;
    int64_t lid = self->lid;
    if (lid < 0) {
        PyObject *r = PyObject_CallOneArg(st->first_step, (PyObject *)self);
        if (r == NULL)
            goto out;
        lid = PyLong_AsLongLong(r);
        Py_DECREF(r);
        if (lid == -1 && PyErr_Occurred())
            goto out;
    }
    if (lid != prev && publish(st, slot, lid) < 0)
        goto out;
    Py_INCREF(self); /* the step may drop the last other reference to its task's proxy */
    res = PyIter_Send(self->coro, arg, presult);
    if (res != PYGEN_NEXT) { /* the task returned or raised */
        restore_after_error(st, slot, prev);
        if (timing) {
            int64_t end = mono_ns();
            self->q += resumed - end;
            self->e = self->end = end;
        }
    } else {
        lid = slot->id; /* labels() blocks inside the step may have changed it: keep theirs */
        self->lid = lid;
        if (lid != prev && publish(st, slot, prev) < 0) {
            Py_CLEAR(*presult);
            res = PYGEN_ERROR;
        }
        if (timing) {
            int64_t end = mono_ns();
            self->q += resumed - end; /* minus the time this step ran */
            self->e = *presult == Py_None ? -end : end; /* a bare yield: runnable again at once */
        }
    }
    Py_DECREF(self);
out:
    Py_DECREF(slot);
    Py_DECREF(st);
    return res;
}

static PyObject *step_send_method(PyObject *self, PyObject *arg)
{
    PyObject *result;
    PySendResult r = step_send(self, arg, &result);
    if (r == PYGEN_NEXT)
        return result;
    if (r == PYGEN_RETURN) { /* a coroutine's send raises StopIteration(value) */
        if (result == Py_None) {
            PyErr_SetNone(PyExc_StopIteration);
        } else {
            PyObject *e = PyObject_CallOneArg(PyExc_StopIteration, result);
            if (e) {
                PyErr_SetObject(PyExc_StopIteration, e);
                Py_DECREF(e);
            }
        }
        Py_DECREF(result);
    }
    return NULL;
}

/* StepBase._bind(state): the StepState every step reads from now on. */
static PyObject *step_bind(PyObject *cls, PyObject *arg)
{
    if (!PyObject_TypeCheck(arg, state_type)) {
        PyErr_Format(PyExc_TypeError, "StepBase._bind expects a StepState, not %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    Py_XSETREF(state, (StateObject *)Py_NewRef(arg));
    Py_RETURN_NONE;
}

static PyMemberDef step_members[] = {
    {"_coro", Py_T_OBJECT_EX, offsetof(StepObject, coro), Py_READONLY, "the wrapped coroutine"},
    {"_task", Py_T_OBJECT_EX, offsetof(StepObject, task), 0, "its task until the first step (for its name)"},
    {"_lid", Py_T_LONGLONG, offsetof(StepObject, lid), 0, "published id at the last suspension; -1 before the first step"},
    {"_q", Py_T_LONGLONG, offsetof(StepObject, q), 0, "suspended so far = now + _q while suspended"},
    {"_t0", Py_T_LONGLONG, offsetof(StepObject, t0), 0, "creation (0 unless timing)"},
    {"_e", Py_T_LONGLONG, offsetof(StepObject, e), 0, "when the current suspension began, negated when ready"},
    {"_r", Py_T_LONGLONG, offsetof(StepObject, r), 0, "ready time of bare yields, ended suspensions"},
    {"_w", Py_T_LONGLONG, offsetof(StepObject, w), 0, "the wait before the first step (-1: not started)"},
    {"_end", Py_T_LONGLONG, offsetof(StepObject, end), 0, "when its last step ended (0: not ended)"},
    {NULL},
};

static PyMethodDef step_methods[] = {
    {"send", step_send_method, METH_O, "Resume the task's coroutine (one step), under the task's labels."},
    {"_bind", step_bind, METH_O | METH_CLASS, "Hand the stepper the StepState its steps read."},
    {NULL},
};

static PyType_Slot step_slots[] = {
    {Py_tp_new, step_new},
    {Py_tp_traverse, step_traverse},
    {Py_tp_clear, step_clear},
    {Py_tp_dealloc, step_dealloc},
    {Py_tp_members, step_members},
    {Py_tp_methods, step_methods},
    {Py_am_send, step_send},
    {Py_tp_doc, "A task's coroutine with its step timing (ddprof_nb.aio.stepper._TaskCoro)."},
    {0, NULL},
};

static PyType_Spec step_spec = {
    "ddprof_nb._native.StepBase", sizeof(StepObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, step_slots,
};

int ddp_aio_types(void)
{
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = -1;
    PyObject *mod = NULL;
    if (slot_type == NULL && (slot_type = (PyTypeObject *)PyType_FromSpec(&slot_spec)) == NULL)
        goto out;
    if (step_type == NULL && (step_type = (PyTypeObject *)PyType_FromSpec(&step_spec)) == NULL)
        goto out;
    if (state_type == NULL && (state_type = (PyTypeObject *)PyType_FromSpec(&state_spec)) == NULL)
        goto out;
    mod = PyImport_ImportModule("ddprof_nb._native");
    if (mod == NULL || PyObject_SetAttrString(mod, "SlotBase", (PyObject *)slot_type) < 0 ||
        PyObject_SetAttrString(mod, "StepBase", (PyObject *)step_type) < 0 ||
        PyObject_SetAttrString(mod, "StepState", (PyObject *)state_type) < 0)
        goto out;
    rc = 0;
out:
    if (rc < 0)
        PyErr_Print();
    Py_XDECREF(mod);
    PyGILState_Release(g);
    return rc;
}
