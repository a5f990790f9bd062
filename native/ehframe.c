/* ehframe.c — one object's .eh_frame CFI as a compact sorted table of unwind rows.
 *
 * Runs when an object is loaded (never on a sampled thread).  Each FDE's CIE program and
 * its own are interpreted for the three registers a walk needs on x86-64 (CFA, rbp, return
 * address); a rule this table cannot express (a DWARF expression, a CFA in another register)
 * becomes a NONE row, where the walk falls back to frame pointers or stops.  All reads are
 * bounded by the segment holding the data: a malformed .eh_frame ends the parse, not the
 * process.
 *
 * Includes: unwind.h.
 */
#include <stdlib.h>
#include <string.h>
#include "unwind.h"

enum { R_RBP = 6, R_RSP = 7, R_RA = 16 };

typedef struct {
    const uint8_t *p, *end;
    int bad;
} cur_t;

static uint64_t rd(cur_t *c, int n)
{
    if (c->bad || c->end - c->p < n) {
        c->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    memcpy(&v, c->p, (size_t)n); /* little-endian */
    c->p += n;
    return v;
}

static uint64_t uleb(cur_t *c)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        uint8_t b = (uint8_t)rd(c, 1);
        if (c->bad)
            return 0;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    c->bad = 1;
    return 0;
}

static int64_t sleb(cur_t *c)
{
    int64_t v = 0;
    int shift = 0;
    uint8_t b;
    do {
        b = (uint8_t)rd(c, 1);
        if (c->bad || shift >= 64) {
            c->bad = 1;
            return 0;
        }
        v |= (int64_t)(b & 0x7f) << shift;
        shift += 7;
    } while (b & 0x80);
    if (shift < 64 && (b & 0x40))
        v |= -((int64_t)1 << shift);
    return v;
}

/* A DW_EH_PE-encoded pointer; pcrel is relative to the field, datarel to `data_base`. */
static uint64_t enc_ptr(cur_t *c, uint8_t enc, uintptr_t data_base)
{
    if (enc == 0xff)
        return 0;
    uintptr_t field = (uintptr_t)c->p;
    uint64_t v;
    switch (enc & 0x0f) {
    case 0x00: v = rd(c, 8); break;
    case 0x01: v = uleb(c); break;
    case 0x02: v = rd(c, 2); break;
    case 0x03: v = rd(c, 4); break;
    case 0x04: v = rd(c, 8); break;
    case 0x09: v = (uint64_t)sleb(c); break;
    case 0x0a: v = (uint64_t)(int64_t)(int16_t)rd(c, 2); break;
    case 0x0b: v = (uint64_t)(int64_t)(int32_t)rd(c, 4); break;
    case 0x0c: v = rd(c, 8); break;
    default: c->bad = 1; return 0;
    }
    switch (enc & 0x70) {
    case 0x00: break;
    case 0x10: v += field; break;
    case 0x30: v += data_base; break;
    default: c->bad = 1; return 0; /* textrel/funcrel/aligned: not used on x86-64 Linux */
    }
    return v;
}

typedef struct {
    uint64_t caf;
    int64_t daf;
    uint8_t fde_enc, signal;
    const uint8_t *insns, *end;
    int ok;
} cie_t;

typedef struct {
    uint8_t cfa_reg, ra_undef;
    int32_t cfa_off;
    int16_t fp_off;
} state_t;

typedef struct {
    uw_row *rows;
    size_t n, cap;
    uintptr_t lo, hi;
    int oom;
} rows_t;

static void push(rows_t *r, uintptr_t pc, const state_t *s, uint8_t flags)
{
    if (r->oom || pc < r->lo || pc >= r->hi)
        return;
    uint32_t loc = (uint32_t)(pc - r->lo);
    uw_row row = { loc, s->cfa_off, s->fp_off, s->cfa_reg,
                   (uint8_t)(flags | (s->ra_undef ? UW_ROW_END : 0)) };
    if (r->n && r->rows[r->n - 1].loc == loc) { /* several rules at one pc: the last holds */
        r->rows[r->n - 1] = row;
        return;
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 1024;
        uw_row *nr = realloc(r->rows, cap * sizeof *nr);
        if (!nr) {
            r->oom = 1;
            return;
        }
        r->rows = nr, r->cap = cap;
    }
    r->rows[r->n++] = row;
}

static int parse_cie(const uint8_t *at, const uint8_t *seg_end, cie_t *out)
{
    memset(out, 0, sizeof *out);
    cur_t c = { at, seg_end, 0 };
    uint64_t len = rd(&c, 4);
    if (len == 0xffffffffu || len < 8 || (uint64_t)(seg_end - c.p) < len)
        return -1;
    const uint8_t *end = c.p + len;
    c.end = end;
    if (rd(&c, 4) != 0)
        return -1; /* not a CIE */
    uint8_t version = (uint8_t)rd(&c, 1);
    if (c.bad || c.p >= end)
        return -1;
    const char *aug = (const char *)c.p;
    size_t alen = strnlen(aug, (size_t)(end - c.p));
    if (alen == (size_t)(end - c.p))
        return -1;
    c.p += alen + 1;
    if (version >= 4)
        rd(&c, 2); /* address and segment sizes */
    out->caf = uleb(&c);
    out->daf = sleb(&c);
    uint64_t ra = version == 1 ? rd(&c, 1) : uleb(&c);
    if (ra != R_RA)
        return -1;
    out->fde_enc = 0; /* absptr */
    if (aug[0] == 'z') {
        uint64_t dlen = uleb(&c);
        if (c.bad || dlen > (uint64_t)(end - c.p))
            return -1;
        const uint8_t *dend = c.p + dlen;
        for (const char *a = aug + 1; *a && !c.bad; a++) {
            if (*a == 'R')
                out->fde_enc = (uint8_t)rd(&c, 1);
            else if (*a == 'L')
                rd(&c, 1);
            else if (*a == 'P')
                enc_ptr(&c, (uint8_t)rd(&c, 1) & 0x7f, 0);
            else if (*a == 'S')
                out->signal = 1;
            else if (*a != 'B' && *a != 'G')
                break; /* unknown: the length says where the data ends */
        }
        c.p = dend;
    } else if (aug[0]) {
        return -1; /* an augmentation we cannot skip */
    }
    if (c.bad)
        return -1;
    out->insns = c.p, out->end = end, out->ok = 1;
    return 0;
}

#define STACK_MAX 16

/* Run a CFA program from state *s (the CIE's initial state in *init for DW_CFA_restore),
 * pushing a row at each advance when `r` is given.  0, or -1 at what it cannot follow. */
static int run(const uint8_t *p, const uint8_t *end, const cie_t *cie, uintptr_t *pc, state_t *s,
               const state_t *init, rows_t *r, uint8_t flags)
{
    cur_t c = { p, end, 0 };
    state_t stack[STACK_MAX];
    int depth = 0;
    while (c.p < c.end && !c.bad) {
        uint8_t op = (uint8_t)rd(&c, 1);
        uint64_t reg, delta = 0;
        int64_t off;
        switch (op & 0xc0) {
        case 0x40: delta = (op & 0x3f) * cie->caf; goto advance;
        case 0x80:
            off = (int64_t)uleb(&c) * cie->daf;
            if ((op & 0x3f) == R_RBP)
                s->fp_off = off >= INT16_MIN + 1 && off <= INT16_MAX ? (int16_t)off : UW_FP_SAME;
            continue;
        case 0xc0:
            if ((op & 0x3f) == R_RBP)
                s->fp_off = init->fp_off;
            continue;
        }
        switch (op) {
        case 0x00: continue;
        case 0x01: {
            uint64_t to = enc_ptr(&c, cie->fde_enc, 0);
            if (r)
                push(r, *pc, s, flags);
            *pc = to;
            continue;
        }
        case 0x02: delta = rd(&c, 1) * cie->caf; goto advance;
        case 0x03: delta = rd(&c, 2) * cie->caf; goto advance;
        case 0x04: delta = rd(&c, 4) * cie->caf; goto advance;
        case 0x05: case 0x11: case 0x2f: case 0x14: case 0x15:
            reg = uleb(&c);
            off = op == 0x05 || op == 0x14 ? (int64_t)uleb(&c) * cie->daf
                : op == 0x2f                ? -(int64_t)uleb(&c) * cie->daf
                                            : sleb(&c) * cie->daf;
            if (reg == R_RBP)
                s->fp_off = (op == 0x14 || op == 0x15 || off < INT16_MIN + 1 || off > INT16_MAX) ? UW_FP_SAME : (int16_t)off;
            continue;
        case 0x06:
            if (uleb(&c) == R_RBP)
                s->fp_off = init->fp_off;
            continue;
        case 0x07:
            reg = uleb(&c);
            if (reg == R_RA)
                s->ra_undef = 1;
            else if (reg == R_RBP)
                s->fp_off = UW_FP_SAME;
            continue;
        case 0x08:
            if (uleb(&c) == R_RBP)
                s->fp_off = UW_FP_SAME;
            continue;
        case 0x09:
            reg = uleb(&c);
            uleb(&c);
            if (reg == R_RBP)
                s->fp_off = UW_FP_SAME;
            continue;
        case 0x0a:
            if (depth == STACK_MAX)
                return -1;
            stack[depth++] = *s;
            continue;
        case 0x0b:
            if (!depth)
                return -1;
            *s = stack[--depth];
            continue;
        case 0x0c: case 0x12:
            reg = uleb(&c);
            off = op == 0x0c ? (int64_t)uleb(&c) : sleb(&c) * cie->daf;
            s->cfa_reg = reg == R_RSP ? UW_CFA_RSP : reg == R_RBP ? UW_CFA_RBP : UW_CFA_NONE;
            s->cfa_off = (int32_t)off;
            continue;
        case 0x0d:
            reg = uleb(&c);
            s->cfa_reg = reg == R_RSP ? UW_CFA_RSP : reg == R_RBP ? UW_CFA_RBP : UW_CFA_NONE;
            continue;
        case 0x0e: s->cfa_off = (int32_t)uleb(&c); continue;
        case 0x13: s->cfa_off = (int32_t)(sleb(&c) * cie->daf); continue;
        case 0x0f: {
            uint64_t n = uleb(&c);
            if (n > (uint64_t)(c.end - c.p))
                return -1;
            c.p += n;
            s->cfa_reg = UW_CFA_NONE;
            continue;
        }
        case 0x10: case 0x16: {
            reg = uleb(&c);
            uint64_t n = uleb(&c);
            if (n > (uint64_t)(c.end - c.p))
                return -1;
            c.p += n;
            if (reg == R_RBP)
                s->fp_off = UW_FP_SAME; /* lost track of the caller's rbp: FP_SAME is a guess */
            continue;
        }
        case 0x2e: uleb(&c); continue;
        default: return -1;
        }
    advance:
        if (r)
            push(r, *pc, s, flags);
        *pc += delta;
    }
    return c.bad ? -1 : 0;
}

static int row_cmp(const void *a, const void *b)
{
    const uw_row *x = a, *y = b;
    return x->loc < y->loc ? -1 : x->loc > y->loc;
}

uw_table eh_build(uintptr_t hdr, uintptr_t seg_lo, uintptr_t seg_hi, uintptr_t lo, uintptr_t hi)
{
    uw_table out = { NULL, 0 };
    if (hdr < seg_lo || hdr + 4 > seg_hi || hi <= lo || hi - lo > UINT32_MAX)
        return out;
    const uint8_t *seg_end = (const uint8_t *)seg_hi;
    cur_t c = { (const uint8_t *)hdr, seg_end, 0 };
    if (rd(&c, 1) != 1)
        return out;
    uint8_t ptr_enc = (uint8_t)rd(&c, 1);
    rd(&c, 2); /* count and table encodings: the table is not needed for a linear walk */
    uintptr_t eh = (uintptr_t)enc_ptr(&c, ptr_enc, hdr);
    if (c.bad || eh < seg_lo || eh >= seg_hi)
        return out;

    rows_t r = { NULL, 0, 0, lo, hi, 0 };
    const uint8_t *cie_at = NULL;
    cie_t cie = { 0 };
    const uint8_t *p = (const uint8_t *)eh;
    while (seg_end - p >= 4 && !r.oom) {
        uint32_t len;
        memcpy(&len, p, 4);
        if (len == 0 || len == 0xffffffffu || (uint64_t)(seg_end - p - 4) < len)
            break; /* terminator, 64-bit DWARF (not emitted for x86-64 .eh_frame), or bad */
        const uint8_t *next = p + 4 + len;
        uint32_t id;
        if (len < 4)
            break;
        memcpy(&id, p + 4, 4);
        if (id != 0) { /* an FDE; its CIE is id bytes before the id field */
            const uint8_t *ca = p + 4 - id;
            if (ca != cie_at) {
                cie_at = ca;
                if ((uintptr_t)ca < seg_lo || (uintptr_t)ca >= seg_hi || parse_cie(ca, seg_end, &cie) != 0)
                    cie.ok = 0;
            }
            if (cie.ok) {
                cur_t f = { p + 8, next, 0 };
                uintptr_t begin = (uintptr_t)enc_ptr(&f, cie.fde_enc, 0);
                uintptr_t range = (uintptr_t)enc_ptr(&f, cie.fde_enc & 0x0f, 0);
                if (!f.bad && cie.fde_enc != 0xff) {
                    int aug_ok = 1;
                    const uint8_t *cie_aug = cie_at + 9;
                    if (*cie_aug == 'z') {
                        uint64_t n = uleb(&f);
                        if (f.bad || n > (uint64_t)(next - f.p))
                            aug_ok = 0;
                        else
                            f.p += n;
                    }
                    state_t init = { UW_CFA_RSP, 0, 8, UW_FP_SAME }, s;
                    uintptr_t pc = begin;
                    uint8_t flags = cie.signal ? UW_ROW_SIGNAL : 0;
                    if (aug_ok && run(cie.insns, cie.end, &cie, &pc, &init, &init, NULL, 0) == 0) {
                        s = init;
                        pc = begin;
                        int rc = run(f.p, next, &cie, &pc, &s, &init, &r, flags);
                        if (rc == 0 || pc > begin) {
                            if (rc != 0)
                                s.cfa_reg = UW_CFA_NONE; /* the rest of the function: unknown */
                            push(&r, pc, &s, flags);
                        }
                        state_t none = { UW_CFA_NONE, 0, 0, UW_FP_SAME };
                        push(&r, begin + range, &none, 0); /* the gap after it, until the next FDE's row */
                    }
                }
            }
        }
        p = next;
    }
    if (r.oom || !r.n) {
        free(r.rows);
        return out;
    }
    /* FDEs are usually in address order; a stable order at equal locs is not needed: an end
     * marker and the next function's first row share a loc, and the real row must win. */
    qsort(r.rows, r.n, sizeof *r.rows, row_cmp);
    size_t w = 0;
    for (size_t i = 0; i < r.n; i++) {
        if (w && r.rows[w - 1].loc == r.rows[i].loc) {
            if (r.rows[i].cfa_reg != UW_CFA_NONE || r.rows[w - 1].cfa_reg == UW_CFA_NONE)
                r.rows[w - 1] = r.rows[i];
            continue;
        }
        r.rows[w++] = r.rows[i];
    }
    uw_row *fit = realloc(r.rows, w * sizeof *fit); /* kept for the process's life: no spare capacity */
    out.rows = fit ? fit : r.rows;
    out.n = (uint32_t)w;
    return out;
}
