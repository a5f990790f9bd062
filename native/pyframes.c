/* pyframes.c — everything that knows CPython's internal layout (3.11 to 3.15).
 *
 * Compiled against the running interpreter's internal headers (Py_BUILD_CORE), so the
 * struct layouts are the real ones for the version this module is built for; the binding
 * refuses to load a module whose compiled PY_VERSION_HEX differs from the interpreter's.
 * On 3.13+ the interpreter also publishes its offsets (_PyRuntime.debug_offsets): every
 * offset and size this file relies on is compared with the running interpreter's published
 * value before anything is read (ddp_py_layout_problem); a mismatch refuses the engine with
 * the field named, it never reads with a wrong layout.
 *
 * Every read of interpreter memory goes through ddp_safe_read into a local copy (but those
 * of a code object as it is freed, which is certainly intact: READ_LIVE; and those of
 * another process's memory, ddp_remote_read, at the end of this file), and fields are
 * used from the copy: the walker never follows a pointer it has not copied, and validates
 * what it copied (types, bounds, owner, cycles).  Fields per version:
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
#define Py_BUILD_CORE 1
#define _GNU_SOURCE
#include <Python.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

#if DDP_PY_SUPPORTED
/* alloc.c (built without the internal headers) assumes a two-word GC pre-header. */
_Static_assert(sizeof(PyGC_Head) == 2 * sizeof(void *), "alloc.c's GC_HEAD_SIZE is wrong for this version");
#endif

#define CODE_HDR offsetof(PyCodeObject, co_code_adaptive)
#define FRAME_HDR offsetof(_PyInterpreterFrame, localsplus)
#define STR_HASH_BYTES 256
#define MAX_CHAIN 100000 /* frames or thread states walked before calling it a cycle */

/* Whose memory a walk reads, with that process's type and interpreter addresses: this
 * process (pid 0: the sampler's safe reads), or another process running the same CPython
 * version (process_vm_readv on its pid: ddp_remote_*). */
typedef struct {
    int pid;
    uintptr_t code_type, unicode_type, bytes_type, interp, gil;
} py_space;
static py_space here;

int64_t ddp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- bloom filter of sampled code pointers (lock-free, signal-safe) ------------------- */
#define BLOOM_BITS (1u << 20)
static _Atomic uint64_t bloom[BLOOM_BITS / 64];

static inline uint32_t bloom_hash(uintptr_t p)
{
    uint64_t x = (uint64_t)p * 0x9E3779B97F4A7C15ULL;
    return (uint32_t)(x >> 44); /* 20 bits */
}
void ddp_bloom_set(uintptr_t code)
{
    uint32_t h = bloom_hash(code);
    uint64_t bit = 1ULL << (h & 63);
    if (!(atomic_load_explicit(&bloom[h >> 6], memory_order_relaxed) & bit))
        atomic_fetch_or_explicit(&bloom[h >> 6], bit, memory_order_relaxed);
}
int ddp_bloom_test(uintptr_t code)
{
    uint32_t h = bloom_hash(code);
    return (atomic_load_explicit(&bloom[h >> 6], memory_order_relaxed) >> (h & 63)) & 1;
}
void ddp_bloom_clear(void)
{
    for (size_t i = 0; i < BLOOM_BITS / 64; i++)
        atomic_store_explicit(&bloom[i], 0, memory_order_relaxed);
}

/* ---- code the drain has resolved: its "known" filter -------------------------------------
 * A sample that names code outside it makes the drain come soon (drain.c, DDP_WAKE_CODE):
 * code can die, and where its death goes unrecorded (graveyard full, no code watcher free,
 * the 3.11 dealloc wrapper taken out by another tool) only a look while it lives names
 * it.  Samples of known code wait for the drain's interval.  A false positive (two pointers, one bit) only
 * delays that code's first drain to the interval.  It outlives sessions, as the process's
 * code cache does (engines/native/codes.py clears both together), so a notebook's next cell running
 * code resolved before does not bring the drain early. */
#define KNOWN_BITS (1u << 18)
static _Atomic uint64_t known[KNOWN_BITS / 64];
static _Atomic uint32_t known_count;
_Atomic int ddp_new_code_seen;

static inline uint32_t known_hash(uintptr_t code, uint64_t fp)
{
    /* the pointer and the fingerprint: a new code object at a dead one's address (the next
     * notebook cell's, often) is new to the drain, unless it is the same function again */
    uint64_t x = ((uint64_t)code ^ (fp * 0x9E3779B97F4A7C15ULL)) * 0xC2B2AE3D27D4EB4FULL;
    return (uint32_t)(x >> 46); /* 18 bits */
}
static inline void note_if_new_code(uintptr_t code, uint64_t fp)
{
    uint32_t h = known_hash(code, fp);
    if (!((atomic_load_explicit(&known[h >> 6], memory_order_relaxed) >> (h & 63)) & 1)
        && !atomic_load_explicit(&ddp_new_code_seen, memory_order_relaxed))
        atomic_store_explicit(&ddp_new_code_seen, 1, memory_order_relaxed);
}
void ddp_known_clear(void)
{
    for (size_t i = 0; i < KNOWN_BITS / 64; i++)
        atomic_store_explicit(&known[i], 0, memory_order_relaxed);
    atomic_store(&known_count, 0);
}
int ddp_known_add(const uint64_t *codes, const uint64_t *fps, int n)
{
    if (!codes || !fps || n < 0)
        return DDP_EINVAL;
    if (atomic_load(&known_count) > KNOWN_BITS / 8) /* filling up: false positives grow, start over */
        ddp_known_clear();
    for (int i = 0; i < n; i++) {
        uint32_t h = known_hash((uintptr_t)codes[i], fps[i]);
        atomic_fetch_or_explicit(&known[h >> 6], 1ULL << (h & 63), memory_order_relaxed);
    }
    atomic_fetch_add(&known_count, (uint32_t)n);
    return 0;
}

/* ---- strings ------------------------------------------------------------------------- */
/* READ_LIVE: plain copies, for objects the caller knows alive (a dying code object, read
 * with the GIL before it is freed: it and what it references are intact).  A resolution then
 * costs copies, not the ~12 process_vm_readv calls (~13 us) of a safe one. */
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

typedef struct {
    int kind;          /* 1, 2, 4 */
    Py_ssize_t length; /* code points */
    uintptr_t data;
} str_ref;

/* Locate a str's characters through safe reads (every compact kind and legacy strings). */
static int str_locate(const py_space *sp, uintptr_t s, int mode, str_ref *out)
{
    PyASCIIObject a;
    if (py_read(sp, &a, s, sizeof a, mode) != 0)
        return -1;
    if ((uintptr_t)a.ob_base.ob_type != sp->unicode_type)
        return -1;
    if (a.length < 0 || a.length > (1 << 24))
        return -1;
    int kind = a.state.kind;
    if (kind != 1 && kind != 2 && kind != 4)
        return -1;
    out->kind = kind;
    out->length = a.length;
    if (a.state.compact) {
        out->data = s + (a.state.ascii ? sizeof(PyASCIIObject) : sizeof(PyCompactUnicodeObject));
    } else {
        PyUnicodeObject u;
        if (py_read(sp, &u, s, sizeof u, mode) != 0 || !u.data.any)
            return -1;
        out->data = (uintptr_t)u.data.any;
    }
    return 0;
}

static inline uint64_t fnv1a(const unsigned char *p, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001B3ULL;
    }
    return h;
}

/* Hash of a str's contents: kind, length and its first STR_HASH_BYTES bytes. */
static int str_hash(const py_space *sp, uintptr_t s, int mode, uint64_t *h)
{
    str_ref r;
    unsigned char buf[STR_HASH_BYTES];
    if (str_locate(sp, s, mode, &r) != 0)
        return -1;
    size_t n = (size_t)r.length * (size_t)r.kind;
    if (n > sizeof buf)
        n = sizeof buf;
    if (n && py_read(sp, buf, r.data, n, mode) != 0)
        return -1;
    uint64_t x = 0xCBF29CE484222325ULL ^ ((uint64_t)r.kind << 56) ^ (uint64_t)r.length;
    *h = fnv1a(buf, n, x * 0x100000001B3ULL);
    return 0;
}

/* Fingerprint of a code object whose header was copied into `co`: ties a captured code
 * pointer to the contents of its qualname and filename (so a recycled address with
 * another function's code can never match) plus firstlineno and code size. */
static int code_fp(const py_space *sp, const PyCodeObject *co, int mode, uint64_t *fp, uintptr_t *fname_memo, uint64_t *fhash_memo)
{
    uint64_t hq, hf;
    if (str_hash(sp, (uintptr_t)co->co_qualname, mode, &hq) != 0)
        return -1;
    if (fname_memo && *fname_memo == (uintptr_t)co->co_filename) {
        hf = *fhash_memo;
    } else {
        if (str_hash(sp, (uintptr_t)co->co_filename, mode, &hf) != 0)
            return -1;
        if (fname_memo) {
            *fname_memo = (uintptr_t)co->co_filename;
            *fhash_memo = hf;
        }
    }
    uint64_t x = hq * 0x9E3779B97F4A7C15ULL;
    x ^= (hf + 0x632BE59BD9B4E019ULL) * 0xC2B2AE3D27D4EB4FULL;
    x ^= ((uint64_t)(uint32_t)co->co_firstlineno << 32) | (uint32_t)Py_SIZE(co);
    *fp = x ? x : 1;
    return 0;
}

/* ---- the frame walk ------------------------------------------------------------------- */
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
        *frame = (uintptr_t)cf.current_frame;
    }
#endif
    return 0;
}

static int walk(const py_space *sp, uintptr_t tstate, long expect_tid, int mode, ddp_frame *out, int max,
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
            if (code_fp(sp, co, mode, &fp, &fname_memo, &fhash_memo) != 0)
                return -1;
            memo[memo_n % MEMO].code = cptr;
            memo[memo_n % MEMO].fp = fp;
            memo_n++;
        }
        if (!sp->pid)
            note_if_new_code(cptr, fp);
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
    return walk(&here, tstate, expect_tid, mode, out, max, flags);
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

int ddp_py_holds_gil(uintptr_t tstate, int mode) { return holds_gil(&here, tstate, mode); }

int ddp_py_gc_on_thread(uintptr_t tstate, int mode)
{
    const py_space *sp = &here;
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
    *lo = here.gil;
    *hi = here.gil ? here.gil + sizeof(struct _gil_runtime_state) : 0;
}

/* ---- thread list ---------------------------------------------------------------------- */
static int scan_threads(const py_space *sp, int mode, ddp_thread_cb cb, void *ctx)
{
    if (!sp->interp)
        return -1;
    uintptr_t t = 0;
    if (py_read(sp, &t, sp->interp + offsetof(PyInterpreterState, threads.head), sizeof t, mode) != 0)
        return -1;
    uintptr_t seen_first = t;
    /* Direct loads: the three fields the scan needs, not the whole thread state (hundreds of
     * bytes a thread, every wall tick: ~half the scan's time in a perf profile of the wall
     * thread).  Through syscalls one read of the whole state costs less than three. */
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
        if ((uintptr_t)ts.interp != sp->interp)
            return -1; /* freed or recycled under us: the caller retries next tick */
        if (ts.native_thread_id)
            cb(t, (long)ts.native_thread_id, ctx);
        t = (uintptr_t)ts.next;
        if (t == seen_first)
            return -1;
    }
    return 0;
}

int ddp_py_scan_threads(int mode, ddp_thread_cb cb, void *ctx) { return scan_threads(&here, mode, cb, ctx); }

uintptr_t ddp_py_current_tstate(void) { return (uintptr_t)PyGILState_GetThisThreadState(); }

/* ---- layout check against the interpreter's published offsets (3.13+) ----------------- */
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

/* 0: the published offsets equal the compiled ones; 1: `msg` names the first difference.
 * `who` publishes them; `minor_only`: the version need only agree on major.minor (another
 * process of another patch release: its offsets are what matters). */
static int dbg_compare(const _Py_DebugOffsets *d, const char *who, int minor_only, char *msg, int cap)
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
    return dbg_compare(&_PyRuntime.debug_offsets, "the running interpreter", 0, msg, cap);
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
    return dbg_compare(&copy, "the running interpreter", 0, msg, cap);
#else
    (void)field;
    return -1;
#endif
}

/* ---- init (with the GIL) -------------------------------------------------------------- */
void ddp_py_types_init(void)
{
    /* Addresses only: needs no GIL (resolution and benchmarks may run outside a session). */
    here.code_type = (uintptr_t)&PyCode_Type;
    here.unicode_type = (uintptr_t)&PyUnicode_Type;
    here.bytes_type = (uintptr_t)&PyBytes_Type;
}

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
    here.interp = (uintptr_t)interp;
#if PY_VERSION_HEX >= 0x030C0000
    here.gil = (uintptr_t)interp->ceval.gil;
#else
    here.gil = (uintptr_t)&_PyRuntime.ceval.gil;
#endif
    return DDP_OK;
#endif
}

/* ---- resolution ----------------------------------------------------------------------- */
/* UTF-8 of a str read through safe reads; returns the full UTF-8 length (may exceed cap). */
static int str_utf8(const py_space *sp, uintptr_t s, int mode, char *dst, int cap, int *len)
{
    str_ref r;
    if (str_locate(sp, s, mode, &r) != 0)
        return -1;
    size_t nbytes = (size_t)r.length * (size_t)r.kind;
    unsigned char *raw = malloc(nbytes ? nbytes : 1);
    if (!raw)
        return -1;
    if (nbytes && py_read(sp, raw, r.data, nbytes, mode) != 0) {
        free(raw);
        return -1;
    }
    int n = 0;
    for (Py_ssize_t i = 0; i < r.length; i++) {
        uint32_t c = r.kind == 1 ? raw[i] : r.kind == 2 ? ((uint16_t *)raw)[i] : ((uint32_t *)raw)[i];
        unsigned char enc[4];
        int k;
        if (c < 0x80) {
            enc[0] = (unsigned char)c;
            k = 1;
        } else if (c < 0x800) {
            enc[0] = 0xC0 | (c >> 6);
            enc[1] = 0x80 | (c & 0x3F);
            k = 2;
        } else if (c < 0x10000) { /* lone surrogates pass through (decode with surrogatepass) */
            enc[0] = 0xE0 | (c >> 12);
            enc[1] = 0x80 | ((c >> 6) & 0x3F);
            enc[2] = 0x80 | (c & 0x3F);
            k = 3;
        } else if (c < 0x110000) {
            enc[0] = 0xF0 | (c >> 18);
            enc[1] = 0x80 | ((c >> 12) & 0x3F);
            enc[2] = 0x80 | ((c >> 6) & 0x3F);
            enc[3] = 0x80 | (c & 0x3F);
            k = 4;
        } else {
            free(raw);
            return -1;
        }
        if (n + k <= cap)
            memcpy(dst + n, enc, k);
        n += k;
    }
    free(raw);
    *len = n;
    return 0;
}

static int bytes_copy(const py_space *sp, uintptr_t b, int mode, uint8_t *dst, int cap, int *len)
{
    PyBytesObject h;
    if (py_read(sp, &h, b, offsetof(PyBytesObject, ob_sval), mode) != 0)
        return -1;
    if ((uintptr_t)h.ob_base.ob_base.ob_type != sp->bytes_type)
        return -1;
    Py_ssize_t n = Py_SIZE(&h);
    if (n < 0 || n > (1 << 26))
        return -1;
    *len = (int)n;
    if (n <= cap && n && py_read(sp, dst, b + offsetof(PyBytesObject, ob_sval), (size_t)n, mode) != 0)
        return -1;
    return 0;
}

/* Resolve `code` if it is still the code object with fingerprint `fp` (fp 0: any). */
static int resolve(const py_space *sp, uintptr_t code, uint64_t fp, int mode, ddp_code_info *info, char *q, int qcap, char *f, int fcap,
                   uint8_t *lt, int lcap)
{
    char cbuf[sizeof(PyCodeObject)] __attribute__((aligned(16)));
    PyCodeObject *co = (PyCodeObject *)cbuf;
    if (!sp->code_type || py_read(sp, cbuf, code, CODE_HDR, mode) != 0)
        return DDP_EINVAL;
    if ((uintptr_t)co->ob_base.ob_base.ob_type != sp->code_type)
        return DDP_EINVAL;
    uint64_t now_fp;
    if (code_fp(sp, co, mode, &now_fp, NULL, NULL) != 0 || (fp && now_fp != fp))
        return DDP_EINVAL;
    info->code = code;
    info->fp = now_fp;
    info->firstlineno = co->co_firstlineno;
    if (str_utf8(sp, (uintptr_t)co->co_qualname, mode, q, qcap, &info->qualname_len) != 0 ||
        str_utf8(sp, (uintptr_t)co->co_filename, mode, f, fcap, &info->filename_len) != 0 ||
        bytes_copy(sp, (uintptr_t)co->co_linetable, mode, lt, lcap, &info->linetable_len) != 0)
        return DDP_EINVAL;
    if (info->qualname_len > qcap || info->filename_len > fcap || info->linetable_len > lcap)
        return 1;
    /* Re-check: everything copied belonged to the same code object (GIL held, so only a
     * concurrent free on another interpreter could change it; cheap insurance). */
    char cbuf2[sizeof(PyCodeObject)] __attribute__((aligned(16)));
    if (py_read(sp, cbuf2, code, CODE_HDR, mode) != 0 || memcmp(cbuf + sizeof(PyObject), cbuf2 + sizeof(PyObject), CODE_HDR - sizeof(PyObject)) != 0)
        return DDP_EINVAL;
    return 0;
}

int ddp_resolve_code(uint64_t code, uint64_t fp, ddp_code_info *info, char *qualname, int qcap, char *filename,
                     int fcap, uint8_t *linetable, int lcap)
{
    if (!Py_IsInitialized())
        return DDP_EUNSUPPORTED;
    ddp_py_types_init();
    PyGILState_STATE g = PyGILState_Ensure();
    memset(info, 0, sizeof *info);
    int rc = resolve(&here, (uintptr_t)code, fp, DDP_READ_SYSCALL, info, qualname, qcap, filename, fcap, linetable, lcap);
    PyGILState_Release(g);
    return rc;
}

int ddp_fingerprint_of(uint64_t code, uint64_t *fp_out)
{
    char cbuf[sizeof(PyCodeObject)] __attribute__((aligned(16)));
    PyCodeObject *co = (PyCodeObject *)cbuf;
    ddp_py_types_init();
    if (py_read(&here, cbuf, (uintptr_t)code, CODE_HDR, DDP_READ_SYSCALL) != 0 ||
        (uintptr_t)co->ob_base.ob_base.ob_type != (uintptr_t)&PyCode_Type)
        return DDP_EINVAL;
    return code_fp(&here, co, DDP_READ_SYSCALL, fp_out, NULL, NULL) == 0 ? 0 : DDP_EINVAL;
}

int ddp_addr2line(const uint8_t *lt, int len, int firstlineno, int lasti)
{
    /* co_linetable (3.11-3.15, one format): entries start with a byte 1CCCCLLL: code C, length L+1
     * code units.  Codes: 15 no location; 14 long form (svarint line delta + 3 varints);
     * 13 no column (svarint line delta); 10-12 one-line form (delta C-10, 2 bytes);
     * 0-9 short form (delta 0, 1 byte).  Varints: 6-bit chunks, 0x40 = more. */
    if (lasti < 0)
        return firstlineno;
    int line = firstlineno, addr = 0, i = 0;
    while (i < len) {
        uint8_t b = lt[i++];
        if (!(b & 0x80))
            return firstlineno; /* malformed */
        int code = (b >> 3) & 15, n = (b & 7) + 1, delta = 0, has_line = 1;
        if (code == 15) {
            has_line = 0;
        } else if (code == 14 || code == 13) {
            unsigned int v = 0, shift = 0;
            while (i < len) {
                uint8_t c = lt[i++];
                if (shift > 24)
                    return firstlineno; /* over-long varint: malformed (a shift past 31 bits is undefined) */
                v |= (unsigned)(c & 63) << shift;
                shift += 6;
                if (!(c & 64))
                    break;
            }
            delta = (v & 1) ? -(int)(v >> 1) : (int)(v >> 1);
            if (code == 14) /* skip end line, column, end column varints */
                for (int k = 0; k < 3 && i < len; k++)
                    while (i < len && (lt[i++] & 64))
                        ;
        } else if (code >= 10) {
            delta = code - 10;
            i += 2;
        } else {
            i += 1;
        }
        line += delta;
        if (lasti < addr + n)
            return has_line ? line : firstlineno;
        addr += n;
    }
    return line;
}

/* ---- code deaths: the graveyard --------------------------------------------------------
 * Samples keep code pointers; the drain names them later.  Code that dies in between (a
 * module's <module> code once its import ends, exec'd strings, what pytest compiles and
 * drops) is resolved just before it is freed, if samples may name it (the bloom filter),
 * and kept here for the drain.  3.12+: a code watcher says when code dies.  3.11 has none:
 * PyCode_Type's tp_dealloc is wrapped instead.  Deaths are recorded from session start to
 * release (ddp_py_watcher_start/stop), so code dying after stop, before the final drain,
 * keeps its name too. */
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
/* Its entries' bytes, at most GY_MAX_BYTES (an entry holds what its code needs, ~0.2-2 KiB;
 * a count limit with the resolver's buffers kept whole allowed ~350 MB).  Over it, or out of
 * memory, a death is counted as not kept (noted). */
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
            rc = resolve(&here, (uintptr_t)co, 0, READ_LIVE, &e->info, e->q, qcap, e->f, fcap, e->lt, lcap);
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

/* ---- another process: dump and sampling from outside ------------------------------------
 * The same walker and resolver, reading the target's memory (process_vm_readv): its
 * interpreter is found from its _PyRuntime, whose address the caller got from the target's
 * ELF symbols.  The target must run this module's CPython minor version: 3.13+ have every
 * offset used here compared with the target's published ones first; 3.11/3.12 publish none
 * (the caller checks the version), and every read is validated as in-process ones are. */
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
    if (dbg_compare(&d, "the target process", 1, msg, cap) != 0)
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
        if (scan_threads(&sp, DDP_READ_SYSCALL, add_thread, &l) == 0)
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
    int depth = walk(&sp, (uintptr_t)tstate, (long)tid, DDP_READ_SYSCALL, out, max, flags);
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
    rc = resolve(&sp, (uintptr_t)code, fp, DDP_READ_SYSCALL, info, qualname, qcap, filename, fcap, linetable, lcap);
    return rc == DDP_EINVAL ? remote_failure() : rc;
}
