/* alloctype.c — which Python type a sampled OBJ-domain block holds: its leaf in the profile.
 *
 * The block usually starts with an object, after the GC pre-header (sizeof(PyGC_Head)) for
 * GC types and two more words for managed dict/weakref (_PyType_PreHeaderSize, 3.11-3.13).
 * The object is not initialised yet when the allocator returns, so the hooks ask later (the
 * next allocations, or stop).  A candidate is accepted only when its refcount is plausible
 * (freed objects have 0, pymalloc's free-list link is a pointer), its type pointer is a type
 * object (its metatype has Py_TPFLAGS_TYPE_SUBCLASS) whose pre-header size equals the
 * candidate offset and whose basic size fits the block.  Type objects are read through
 * process_vm_readv (never faults).
 */
#define _GNU_SOURCE
#include <string.h>
#include <Python.h>
#include "ddp_internal.h"
#include "alloctype.h"

#define GC_HEAD_SIZE (2 * sizeof(void *)) /* sizeof(PyGC_Head), 3.11-3.13 GIL builds (pylayout.c checks) */

/* Static types of the interpreter: no read needed. */
static const struct {
    PyTypeObject *type;
} known_types[] = {
    { &PyBytes_Type }, { &PyUnicode_Type }, { &PyTuple_Type }, { &PyList_Type }, { &PyDict_Type },
    { &PyLong_Type }, { &PyFloat_Type }, { &PySet_Type }, { &PyFrozenSet_Type }, { &PyByteArray_Type },
    { &PyComplex_Type }, { &PyFunction_Type }, { &PyMethod_Type }, { &PyCFunction_Type },
    { &PyMemoryView_Type }, { &PySlice_Type }, { &PyCell_Type }, { &PyCode_Type }, { &PyType_Type },
};

int ddp_alloc_type_name(uintptr_t type, char *dst)
{
    for (size_t i = 0; i < sizeof known_types / sizeof known_types[0]; i++)
        if ((uintptr_t)known_types[i].type == type) { /* no snprintf: a cold libc path on every typed sample */
            const char *name = known_types[i].type->tp_name;
            size_t len = strnlen(name, DDP_TYPE_NAME_CAP - 1);
            memcpy(dst, name, len);
            dst[len] = 0;
            return 0;
        }
    uintptr_t name = 0;
    if (ddp_safe_read(&name, type + offsetof(PyTypeObject, tp_name), sizeof name, DDP_READ_SYSCALL) != 0 || !name)
        return -1;
    /* read up to the end of the page first: a short name may sit at a page's end */
    size_t room = 4096 - (name & 4095);
    size_t n = room < DDP_TYPE_NAME_CAP - 1 ? room : DDP_TYPE_NAME_CAP - 1;
    char buf[DDP_TYPE_NAME_CAP];
    if (ddp_safe_read(buf, name, n, DDP_READ_SYSCALL) != 0)
        return -1;
    if (n < DDP_TYPE_NAME_CAP - 1 && !memchr(buf, 0, n) &&
        ddp_safe_read(buf + n, name + n, DDP_TYPE_NAME_CAP - 1 - n, DDP_READ_SYSCALL) != 0)
        return -1;
    buf[DDP_TYPE_NAME_CAP - 1] = 0;
    size_t len = strnlen(buf, DDP_TYPE_NAME_CAP - 1);
    if (!len)
        return -1;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)buf[i] < 0x20)
            return -1;
    memcpy(dst, buf, len + 1);
    return 0;
}

uintptr_t ddp_alloc_block_type(uintptr_t p, uint64_t size, int safe)
{
    static const size_t offs[] = { 0, GC_HEAD_SIZE, GC_HEAD_SIZE + 2 * sizeof(void *) };
    uintptr_t head[(GC_HEAD_SIZE + 2 * sizeof(void *) + 2 * sizeof(void *)) / sizeof(uintptr_t)];
    size_t want = size < sizeof head ? (size_t)size : sizeof head;
    if (want < 2 * sizeof(void *))
        return 0;
    /* A plain copy on the sampling path: the block is allocated (callers check the live table,
     * which every free of the session updates, under the GIL); only its contents are untrusted. */
    if (!safe)
        memcpy(head, (const void *)p, want);
    else if (ddp_safe_read(head, p, want, DDP_READ_SYSCALL) != 0)
        return 0;
    for (size_t k = 0; k < sizeof offs / sizeof offs[0]; k++) {
        size_t off = offs[k];
        if (off + 2 * sizeof(void *) > want)
            break;
        int64_t refcnt = (int64_t)head[off / sizeof(uintptr_t)];
        uintptr_t type = head[off / sizeof(uintptr_t) + 1];
        if (refcnt <= 0 || refcnt > (int64_t)UINT32_MAX || !type || (type & 7))
            continue;
        int known = 0;
        for (size_t i = 0; i < sizeof known_types / sizeof known_types[0]; i++)
            if ((uintptr_t)known_types[i].type == type)
                known = 1;
        PyTypeObject t;
        if (known) {
            t = *(const PyTypeObject *)type; /* a static type of the interpreter */
        } else {
            if (ddp_safe_read(&t, type, sizeof t, DDP_READ_SYSCALL) != 0)
                continue;
            unsigned long mflags = 0;
            uintptr_t meta = (uintptr_t)t.ob_base.ob_base.ob_type;
            if (!meta || ddp_safe_read(&mflags, meta + offsetof(PyTypeObject, tp_flags), sizeof mflags,
                                       DDP_READ_SYSCALL) != 0 ||
                !(mflags & Py_TPFLAGS_TYPE_SUBCLASS))
                continue;
        }
        size_t pre = ((t.tp_flags & Py_TPFLAGS_HAVE_GC) ? GC_HEAD_SIZE : 0);
#if PY_VERSION_HEX >= 0x030C0000
        if (t.tp_flags & Py_TPFLAGS_PREHEADER)
#else
        if (t.tp_flags & Py_TPFLAGS_MANAGED_DICT)
#endif
            pre += 2 * sizeof(void *);
        if (pre != off || t.tp_basicsize <= 0 || (uint64_t)t.tp_basicsize + off > size)
            continue;
        return type;
    }
    return 0;
}
