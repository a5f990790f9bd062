/* pycode.c — code objects as samples keep them: a fingerprint that ties a code pointer to
 * its contents, and the names and line table the drain resolves it to later. */
#include "pyinternals.h"

#define STR_HASH_BYTES 256

py_space ddp_py_here;

void ddp_py_types_init(void)
{
    /* Addresses only: needs no GIL (resolution and benchmarks may run outside a session). */
    ddp_py_here.code_type = (uintptr_t)&PyCode_Type;
    ddp_py_here.unicode_type = (uintptr_t)&PyUnicode_Type;
    ddp_py_here.bytes_type = (uintptr_t)&PyBytes_Type;
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
int ddp_py_code_fp(const py_space *sp, const PyCodeObject *co, int mode, uint64_t *fp, uintptr_t *fname_memo,
                   uint64_t *fhash_memo)
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
int ddp_py_resolve_in(const py_space *sp, uintptr_t code, uint64_t fp, int mode, ddp_code_info *info, char *q,
                      int qcap, char *f, int fcap, uint8_t *lt, int lcap)
{
    char cbuf[sizeof(PyCodeObject)] __attribute__((aligned(16)));
    PyCodeObject *co = (PyCodeObject *)cbuf;
    if (!sp->code_type || py_read(sp, cbuf, code, CODE_HDR, mode) != 0)
        return DDP_EINVAL;
    if ((uintptr_t)co->ob_base.ob_base.ob_type != sp->code_type)
        return DDP_EINVAL;
    uint64_t now_fp;
    if (ddp_py_code_fp(sp, co, mode, &now_fp, NULL, NULL) != 0 || (fp && now_fp != fp))
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
    int rc = ddp_py_resolve_in(&ddp_py_here, (uintptr_t)code, fp, DDP_READ_SYSCALL, info, qualname, qcap, filename,
                               fcap, linetable, lcap);
    PyGILState_Release(g);
    return rc;
}

int ddp_fingerprint_of(uint64_t code, uint64_t *fp_out)
{
    char cbuf[sizeof(PyCodeObject)] __attribute__((aligned(16)));
    PyCodeObject *co = (PyCodeObject *)cbuf;
    ddp_py_types_init();
    if (py_read(&ddp_py_here, cbuf, (uintptr_t)code, CODE_HDR, DDP_READ_SYSCALL) != 0 ||
        (uintptr_t)co->ob_base.ob_base.ob_type != (uintptr_t)&PyCode_Type)
        return DDP_EINVAL;
    return ddp_py_code_fp(&ddp_py_here, co, DDP_READ_SYSCALL, fp_out, NULL, NULL) == 0 ? 0 : DDP_EINVAL;
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
