/* aiostep.c — the asyncio task stepper's per-step work in C (ddprof_nb/asyncio_support.py).
 *
 * Two extension types, published as attributes of ddprof_nb._native by ddp_aio_types()
 * (cffi cannot declare Python types, so the module gets them at first use):
 *
 *   SlotBase  the base of labeling._Slot: a thread's published label id and the task
 *             sampler's per-thread timing words, as C int64 members, so a step reads and
 *             writes them without attribute look-ups while Python sees plain attributes.
 *   StepBase  the base of asyncio_support._TaskCoro: a task's coroutine plus its step
 *             timing words, and `send` (also the am_send slot, which the C Task's step
 *             calls through PyIter_Send).
 *
 * StepBase.send does what the Python stepper (_PyTaskCoro.send) does, step for step: the
 * two must stay equal, and tests run both.  Why C: a Python send frame per step, and the
 * StopIteration every finished task raises through it, doubled the instructions of a
 * short task's life (bench_asyncio.py --instructions).  What stays Python: the rare paths
 * (a task's first step, a drawn short suspension, label mirrors without a fast view,
 * throw), called back from here.
 *
 * Module state read at each step lives where Python keeps it (one source of truth):
 * asyncio_support's `_tracker` and `_timing`, labeling's `_slots` and `_mirrored`, looked
 * up in the modules' dicts (StepBase._bind hands them over once).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define Py_T_LONGLONG T_LONGLONG
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_READONLY READONLY
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

static PyTypeObject *slot_type, *step_type;
static PyObject *aio_dict, *lab_dict;   /* the two modules' globals */
static PyObject *s_tracker, *s_timing, *s_slots, *s_mirrored, *s_new_slot, *s_push, *s_short, *s_first_step;

static inline int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.monotonic_ns(): what the ticks compare against */
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

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

/* The truth of a module global (missing: false); -1 on error. */
static int is_set(PyObject *dict, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(dict, name);
    if (v == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return PyObject_IsTrue(v);
}

/* Store `lid` as the slot's published id and into its mirrors (labeling._set). */
static int publish(SlotObject *slot, int64_t lid)
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
    int on = is_set(lab_dict, s_mirrored);
    if (on <= 0)
        return on;
    PyObject *push = PyDict_GetItemWithError(lab_dict, s_push);
    if (push == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "ddprof_nb.labeling._push is gone");
        return -1;
    }
    PyObject *r = PyObject_CallFunction(push, "OL", (PyObject *)slot, (long long)lid);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* The calling thread's slot (labeling._slot_here), a new reference. */
static SlotObject *slot_here(void)
{
    PyObject *slots = PyDict_GetItemWithError(lab_dict, s_slots);
    if (slots == NULL || !PyDict_Check(slots)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "ddprof_nb.labeling._slots is not a dict");
        return NULL;
    }
    PyObject *ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (ident == NULL)
        return NULL;
    PyObject *slot = PyDict_GetItemWithError(slots, ident);
    if (slot != NULL) {
        Py_INCREF(slot);
    } else if (!PyErr_Occurred()) {
        PyObject *make = PyDict_GetItemWithError(lab_dict, s_new_slot);
        slot = make ? PyObject_CallOneArg(make, ident) : NULL;
        if (make == NULL && !PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "ddprof_nb.labeling._new_slot is gone");
    }
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
static int resumes(StepObject *self, SlotObject *slot, int64_t resumed)
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
            PyObject *fn = PyDict_GetItemWithError(aio_dict, s_short);
            if (fn == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_RuntimeError, "ddprof_nb.asyncio_support._short_suspension is gone");
                return -1;
            }
            if (call_int(fn, Py_BuildValue("(OOLLL)", (PyObject *)self, (PyObject *)slot, (long long)e,
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
static void restore_after_error(SlotObject *slot, int64_t prev)
{
    if (slot->id == prev)
        return;
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    if (publish(slot, prev) < 0)
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
    PyObject *tracker = PyDict_GetItemWithError(aio_dict, s_tracker);
    if (tracker == NULL && PyErr_Occurred())
        return PYGEN_ERROR;
    if (tracker == NULL || tracker == Py_None) /* profiling ended: only forward */
        return PyIter_Send(self->coro, arg, presult);
    int timing = is_set(aio_dict, s_timing);
    if (timing < 0)
        return PYGEN_ERROR;
    int64_t resumed = timing ? mono_ns() : 0;
    SlotObject *slot = slot_here();
    if (slot == NULL)
        return PYGEN_ERROR;
    PySendResult res = PYGEN_ERROR;
    if (timing && resumes(self, slot, resumed) < 0)
        goto out;
    int64_t prev = slot->id;
    int64_t lid = self->lid;
    if (lid < 0) {
        PyObject *r = PyObject_CallMethodNoArgs((PyObject *)self, s_first_step);
        if (r == NULL)
            goto out;
        lid = PyLong_AsLongLong(r);
        Py_DECREF(r);
        if (lid == -1 && PyErr_Occurred())
            goto out;
    }
    if (lid != prev && publish(slot, lid) < 0)
        goto out;
    Py_INCREF(self); /* the step may drop the last other reference to its task's proxy */
    res = PyIter_Send(self->coro, arg, presult);
    if (res != PYGEN_NEXT) { /* the task returned or raised */
        restore_after_error(slot, prev);
        if (timing) {
            int64_t end = mono_ns();
            self->q += resumed - end;
            self->e = self->end = end;
        }
    } else {
        lid = slot->id; /* labels() blocks inside the step may have changed it: keep theirs */
        self->lid = lid;
        if (lid != prev && publish(slot, prev) < 0) {
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

/* StepBase._bind(asyncio_support globals, labeling globals): where the state lives. */
static PyObject *step_bind(PyObject *cls, PyObject *args)
{
    PyObject *a, *l;
    if (!PyArg_ParseTuple(args, "O!O!", &PyDict_Type, &a, &PyDict_Type, &l))
        return NULL;
    Py_XSETREF(aio_dict, Py_NewRef(a));
    Py_XSETREF(lab_dict, Py_NewRef(l));
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
    {"_bind", step_bind, METH_VARARGS | METH_CLASS, "Tell the stepper where asyncio_support's and labeling's state lives."},
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
    {Py_tp_doc, "A task's coroutine with its step timing (ddprof_nb.asyncio_support._TaskCoro)."},
    {0, NULL},
};

static PyType_Spec step_spec = {
    "ddprof_nb._native.StepBase", sizeof(StepObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, step_slots,
};

static int intern(PyObject **p, const char *s)
{
    if (*p == NULL)
        *p = PyUnicode_InternFromString(s);
    return *p ? 0 : -1;
}

int ddp_aio_types(void)
{
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = -1;
    PyObject *mod = NULL;
    if (intern(&s_tracker, "_tracker") || intern(&s_timing, "_timing") || intern(&s_slots, "_slots") ||
        intern(&s_mirrored, "_mirrored") || intern(&s_new_slot, "_new_slot") || intern(&s_push, "_push") ||
        intern(&s_short, "_short_suspension") || intern(&s_first_step, "_first_step"))
        goto out;
    if (slot_type == NULL && (slot_type = (PyTypeObject *)PyType_FromSpec(&slot_spec)) == NULL)
        goto out;
    if (step_type == NULL && (step_type = (PyTypeObject *)PyType_FromSpec(&step_spec)) == NULL)
        goto out;
    if (aio_dict == NULL) { /* until _bind: no state to read, so only forward */
        aio_dict = PyDict_New();
        lab_dict = PyDict_New();
        if (!aio_dict || !lab_dict)
            goto out;
    }
    mod = PyImport_ImportModule("ddprof_nb._native");
    if (mod == NULL || PyObject_SetAttrString(mod, "SlotBase", (PyObject *)slot_type) < 0 ||
        PyObject_SetAttrString(mod, "StepBase", (PyObject *)step_type) < 0)
        goto out;
    rc = 0;
out:
    if (rc < 0)
        PyErr_Print();
    Py_XDECREF(mod);
    PyGILState_Release(g);
    return rc;
}
