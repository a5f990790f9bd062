/* pygraveyard.c — code that dies before the drain names it.  Samples keep code pointers;
 * code freed in between (a module's <module> code once its import ends, exec'd strings) is
 * resolved just before it is freed, if samples may name it (the bloom filter), and kept
 * here for the drain.  3.12+: a code watcher says when code dies; 3.11 has none, so
 * PyCode_Type's tp_dealloc is wrapped.  Deaths are recorded from session start to release,
 * so code dying after stop, before the final drain, keeps its name too. */
#include "pyinternals.h"
#include <pthread.h>

typedef struct gy_entry {
    struct gy_entry *next;
    ddp_code_info info;
    char *q, *f;
    uint8_t *lt;
} gy_entry;

static pthread_mutex_t gy_lock = PTHREAD_MUTEX_INITIALIZER;
static gy_entry *gy_head, *gy_tail;
int ddp_graveyard_len; /* entries; written under gy_lock, read by the drain without it (ddprof.h) */
_Atomic uint64_t ddp_graveyard_overflow;
/* Its entries' bytes, at most GY_MAX_BYTES (an entry holds only what its code needs).  Over
 * it, or out of memory, a death is counted as not kept (noted). */
#define GY_MAX_BYTES (64u << 20)
static _Atomic size_t gy_bytes;
static size_t gy_entry_bytes(const gy_entry *e)
{
    return sizeof *e + (size_t)e->info.qualname_len + (size_t)e->info.filename_len + (size_t)e->info.linetable_len;
}
static _Atomic int gy_armed; /* deaths are recorded (set with the GIL: watcher start/stop) */

/* With the GIL, while `co` is still intact: if samples may point at it, resolve it now and
 * keep the result for the drain.  Code never sampled costs the two tests. */
static void bury_if_sampled(PyCodeObject *co)
{
    if (!atomic_load_explicit(&gy_armed, memory_order_relaxed) || !ddp_bloom_test((uintptr_t)co))
        return;
    if (atomic_load_explicit(&gy_bytes, memory_order_relaxed) >= GY_MAX_BYTES) {
        atomic_fetch_add(&ddp_graveyard_overflow, 1);
        return;
    }
    gy_entry *e = calloc(1, sizeof *e);
    if (!e) {
        atomic_fetch_add(&ddp_graveyard_overflow, 1);
        return;
    }
    int qcap = 256, fcap = 1024, lcap = 4096;
    for (int attempt = 0; attempt < 2; attempt++) {
        e->q = malloc(qcap);
        e->f = malloc(fcap);
        e->lt = malloc(lcap);
        int rc = DDP_ENOMEM;
        if (e->q && e->f && e->lt)
            rc = ddp_py_resolve_in(&ddp_py_here, (uintptr_t)co, 0, READ_LIVE, &e->info, e->q, qcap, e->f, fcap,
                                   e->lt, lcap);
        if (rc == 1 && attempt == 0) {
            free(e->q), free(e->f), free(e->lt);
            qcap = e->info.qualname_len + 1, fcap = e->info.filename_len + 1, lcap = e->info.linetable_len + 1;
            continue;
        }
        if (rc != 0) {
            free(e->q), free(e->f), free(e->lt), free(e);
            if (rc == DDP_ENOMEM)
                atomic_fetch_add(&ddp_graveyard_overflow, 1);
            return;
        }
        break;
    }
    /* the buffers down to what they hold (+1: a zero length stays a live block) */
    char *q = realloc(e->q, (size_t)e->info.qualname_len + 1), *f = realloc(e->f, (size_t)e->info.filename_len + 1);
    uint8_t *lt = realloc(e->lt, (size_t)e->info.linetable_len + 1);
    e->q = q ? q : e->q, e->f = f ? f : e->f, e->lt = lt ? lt : e->lt;
    e->info.death_ns = ddp_now_ns();
    atomic_fetch_add(&gy_bytes, gy_entry_bytes(e));
    pthread_mutex_lock(&gy_lock);
    if (gy_tail)
        gy_tail->next = e;
    else
        gy_head = e;
    gy_tail = e;
    __atomic_store_n(&ddp_graveyard_len, ddp_graveyard_len + 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&gy_lock);
}

#if PY_VERSION_HEX >= 0x030C0000
static int watcher_id = -1;

static int on_code_event(PyCodeEvent event, PyCodeObject *co)
{
    if (event == PY_CODE_EVENT_DESTROY)
        bury_if_sampled(co);
    return 0;
}

static int deaths_hook(void)
{
    if (watcher_id < 0) {
        watcher_id = PyCode_AddWatcher(on_code_event);
        if (watcher_id < 0) {
            PyErr_Clear();
            return -1;
        }
    }
    return 0;
}

static void deaths_unhook(void)
{
    if (watcher_id >= 0) {
        if (PyCode_ClearWatcher(watcher_id) < 0)
            PyErr_Clear();
        watcher_id = -1;
    }
}
#else
/* 3.11: PyCode_Type.tp_dealloc, wrapped.  Other tools may wrap the slot too, so the wrapper
 * always calls what the slot held when it was installed, and is taken out at stop only while
 * the slot still holds it: under another tool's wrapper it stays in, a pass-through (one
 * flag test) until that tool puts it back on top.  It is never installed twice: a second
 * copy in the chain would call itself through the other tool's wrapper, forever. */
static destructor dealloc_next; /* the slot's value before ours */
static int dealloc_wrapped;     /* ours is in the slot's chain (GIL) */

static void code_dealloc_hook(PyObject *o)
{
    bury_if_sampled((PyCodeObject *)o);
    dealloc_next(o);
}

static int deaths_hook(void)
{
    /* The slot holding exactly what ours calls means ours is out of the chain (another
     * tool put back a value saved before ours went in): installing again is safe then. */
    if (!dealloc_wrapped || PyCode_Type.tp_dealloc == dealloc_next) {
        if (!PyCode_Type.tp_dealloc)
            return -1;
        dealloc_next = PyCode_Type.tp_dealloc;
        PyCode_Type.tp_dealloc = code_dealloc_hook;
        dealloc_wrapped = 1;
    }
    return 0;
}

static void deaths_unhook(void)
{
    if (dealloc_wrapped && PyCode_Type.tp_dealloc == code_dealloc_hook) {
        PyCode_Type.tp_dealloc = dealloc_next;
        dealloc_wrapped = 0;
    }
}
#endif

/* Tests: another tool's pass-through wrapper of PyCode_Type.tp_dealloc, as a profiler or
 * debugger would install it (3.11 only; -1 elsewhere).  op 1: wrap the slot, saving its
 * value; 0: unwrap if still on top; 2: put the saved value back whatever the slot holds
 * (a careless tool); 3: the calls it has passed on; 4: the slot holds ours (1), the
 * foreign one (2), another value (0). */
#if PY_VERSION_HEX < 0x030C0000 && DDP_PY_SUPPORTED
static destructor foreign_next;
static _Atomic int64_t foreign_calls;
static void foreign_dealloc(PyObject *o)
{
    atomic_fetch_add_explicit(&foreign_calls, 1, memory_order_relaxed);
    foreign_next(o);
}
#endif

int64_t ddp_test_code_dealloc_foreign(int op)
{
#if PY_VERSION_HEX < 0x030C0000 && DDP_PY_SUPPORTED
    if (!Py_IsInitialized())
        return -1;
    PyGILState_STATE g = PyGILState_Ensure();
    int64_t rc = 0;
    destructor now = PyCode_Type.tp_dealloc;
    if (op == 1 && !foreign_next) {
        foreign_next = now;
        PyCode_Type.tp_dealloc = foreign_dealloc;
    } else if ((op == 0 && now == foreign_dealloc) || (op == 2 && foreign_next)) {
        PyCode_Type.tp_dealloc = foreign_next;
        foreign_next = NULL;
    } else if (op == 3) {
        rc = atomic_load(&foreign_calls);
    } else if (op == 4) {
        rc = now == code_dealloc_hook ? 1 : now == foreign_dealloc ? 2 : 0;
    } else {
        rc = -1;
    }
    PyGILState_Release(g);
    return rc;
#else
    (void)op;
    return -1;
#endif
}

int ddp_py_watcher_start(void)
{
#if DDP_PY_SUPPORTED
    if (deaths_hook() != 0)
        return -1;
    atomic_store(&gy_armed, 1);
    return 0;
#else
    return -1;
#endif
}

void ddp_py_watcher_stop(void)
{
    atomic_store(&gy_armed, 0);
#if DDP_PY_SUPPORTED
    deaths_unhook();
#endif
}

int ddp_code_watcher_active(void) { return atomic_load(&gy_armed); }

int ddp_graveyard_pop(ddp_code_info *info, char *q, int qcap, char *f, int fcap, uint8_t *lt, int lcap)
{
    pthread_mutex_lock(&gy_lock);
    gy_entry *e = gy_head;
    if (!e) {
        pthread_mutex_unlock(&gy_lock);
        return 0;
    }
    *info = e->info;
    if (e->info.qualname_len > qcap || e->info.filename_len > fcap || e->info.linetable_len > lcap) {
        pthread_mutex_unlock(&gy_lock);
        return 2;
    }
    gy_head = e->next;
    if (!gy_head)
        gy_tail = NULL;
    __atomic_store_n(&ddp_graveyard_len, ddp_graveyard_len - 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&gy_lock);
    memcpy(q, e->q, e->info.qualname_len);
    memcpy(f, e->f, e->info.filename_len);
    memcpy(lt, e->lt, e->info.linetable_len);
    atomic_fetch_sub(&gy_bytes, gy_entry_bytes(e));
    free(e->q), free(e->f), free(e->lt), free(e);
    return 1;
}

void ddp_py_graveyard_clear(void)
{
    pthread_mutex_lock(&gy_lock);
    gy_entry *e = gy_head;
    gy_head = gy_tail = NULL;
    __atomic_store_n(&ddp_graveyard_len, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&gy_lock);
    while (e) {
        gy_entry *n = e->next;
        atomic_fetch_sub(&gy_bytes, gy_entry_bytes(e));
        free(e->q), free(e->f), free(e->lt), free(e);
        e = n;
    }
}

void ddp_py_after_fork_child(void)
{
    /* The forking thread held the GIL; locks of other threads are gone: reinit ours.
     * The watcher (3.11: the dealloc wrapper) stays in until the child's next start/release
     * takes it out; disarmed, it records nothing meanwhile. */
    atomic_store(&gy_armed, 0);
    pthread_mutex_init(&gy_lock, NULL);
    gy_head = gy_tail = NULL; /* leak the copies rather than walk a list another thread may have been editing */
    __atomic_store_n(&ddp_graveyard_len, 0, __ATOMIC_RELAXED);
    atomic_store(&gy_bytes, 0);
}
