/* unwind.c — the loaded objects' unwind tables, and the walk that only looks them up.
 *
 * uw_refresh (off the hot path: session start, the wall thread's tick) asks the loader
 * for its load/unload counters and, when they moved, builds the tables of new objects
 * inside dl_iterate_phdr (so none can be unloaded while its .eh_frame is read) and
 * publishes a new sorted snapshot with one atomic store.  A walk reads whichever snapshot
 * it loaded; replaced snapshots and unloaded objects' tables are only freed by uw_collect,
 * when no walk can be running.
 *
 * The walk: per frame, binary search of the object then of its rows; CFA from rsp or rbp,
 * return address at CFA - 8, the caller's rbp where the row says.  Where no row applies
 * (a JIT page, a gap) it follows rbp as a frame pointer if that looks like one.  Every
 * stack read is a safe read under the walk's own guard, so a fault keeps the frames found.
 *
 * Includes: unwind.h.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <link.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include "unwind.h"

typedef struct {
    uintptr_t lo, hi; /* executable range */
    uintptr_t base;   /* load bias: identifies the object with its name */
    uw_table t;
    uint32_t *page;   /* per 4 KiB page of [lo, hi): its first row, so a lookup searches one page */
    char *name;
} uw_lib;

#define PAGE_SHIFT 12

/* The page index of a table: page[k] = the last row starting at or before page k's start. */
static uint32_t *page_index(const uw_table *t, uintptr_t lo, uintptr_t hi)
{
    size_t pages = ((hi - lo) >> PAGE_SHIFT) + 1;
    uint32_t *page = malloc((pages + 1) * sizeof *page);
    if (!page)
        return NULL;
    uint32_t r = 0;
    for (size_t k = 0; k <= pages; k++) {
        uint64_t start = (uint64_t)k << PAGE_SHIFT;
        while (r + 1 < t->n && t->rows[r + 1].loc <= start)
            r++;
        page[k] = r;
    }
    return page;
}

typedef struct {
    int n;
    uw_lib libs[]; /* sorted by lo, disjoint */
} uw_snap;

static _Atomic(uw_snap *) current;
static unsigned long long seen_adds = ~0ULL, seen_subs = ~0ULL;

/* Retired (a replaced snapshot, an unloaded object's rows): freed by uw_collect. */
typedef struct retired {
    struct retired *next;
    void *p;
} retired;
static retired *graveyard;

static void retire(void *p)
{
    retired *r = malloc(sizeof *r);
    if (!r)
        return; /* leaked rather than freed under a walk */
    r->p = p, r->next = graveyard, graveyard = r;
}

void uw_collect(void)
{
    while (graveyard) {
        retired *r = graveyard;
        graveyard = r->next;
        free(r->p);
        free(r);
    }
}

static int counters_cb(struct dl_phdr_info *info, size_t size, void *ctx)
{
    unsigned long long *c = ctx;
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs)
        c[0] = info->dlpi_adds, c[1] = info->dlpi_subs;
    return 1; /* the counters are the same in every entry: one is enough */
}

typedef struct {
    uw_snap *old, *new;
    int cap, oom;
} build_ctx;

static const uw_row *find_row(const uw_lib *l, uintptr_t pc);

static const uw_lib *find_lib(const uw_snap *s, uintptr_t pc)
{
    int lo = 0, hi = s->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const uw_lib *l = &s->libs[mid];
        if (pc < l->lo)
            hi = mid - 1;
        else if (pc >= l->hi)
            lo = mid + 1;
        else
            return l;
    }
    return NULL;
}

static int build_cb(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    build_ctx *b = ctx;
    const ElfW(Phdr) *eh = NULL;
    uintptr_t lo = UINTPTR_MAX, hi = 0, seg_lo = 0, seg_hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_GNU_EH_FRAME)
            eh = ph;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            uintptr_t a = info->dlpi_addr + ph->p_vaddr;
            lo = a < lo ? a : lo;
            hi = a + ph->p_memsz > hi ? a + ph->p_memsz : hi;
        }
    }
    if (!eh || lo >= hi)
        return 0;
    uintptr_t hdr = info->dlpi_addr + eh->p_vaddr;
    for (int i = 0; i < info->dlpi_phnum; i++) { /* the loaded segment the header (and .eh_frame) lie in */
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && hdr >= a && hdr < a + ph->p_filesz)
            seg_lo = a, seg_hi = a + ph->p_filesz;
    }
    if (!seg_hi)
        return 0;
    if (b->new->n == b->cap) {
        int cap = b->cap * 2;
        uw_snap *g = realloc(b->new, sizeof *g + (size_t)cap * sizeof(uw_lib));
        if (!g) {
            b->oom = 1;
            return 1;
        }
        b->new = g, b->cap = cap;
    }
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    uw_lib *l = &b->new->libs[b->new->n];
    const uw_lib *was = b->old ? find_lib(b->old, lo) : NULL;
    if (was && was->lo == lo && was->hi == hi && was->base == info->dlpi_addr && !strcmp(was->name, name)) {
        *l = *was; /* the same object: its rows move to the new snapshot */
    } else {
        l->lo = lo, l->hi = hi, l->base = info->dlpi_addr;
        l->name = strdup(name);
        l->t = eh_build(hdr, seg_lo, seg_hi, lo, hi);
        l->page = l->t.n ? page_index(&l->t, lo, hi) : NULL;
        if (!l->page && l->t.n) {
            free(l->t.rows);
            l->t.rows = NULL, l->t.n = 0;
        }
        if (!l->name) {
            free(l->t.rows), free(l->page);
            b->oom = 1;
            return 1;
        }
    }
    b->new->n++;
    return 0;
}

static int lib_cmp(const void *a, const void *b)
{
    const uw_lib *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

int uw_refresh(void)
{
    unsigned long long c[2] = { 0, 0 };
    dl_iterate_phdr(counters_cb, c);
    uw_snap *old = atomic_load(&current);
    if (old && c[0] == seen_adds && c[1] == seen_subs)
        return old->n;
    build_ctx b = { old, malloc(sizeof(uw_snap) + 64 * sizeof(uw_lib)), 64, 0 };
    if (!b.new)
        return -1;
    b.new->n = 0;
    dl_iterate_phdr(build_cb, &b);
    if (b.oom) {
        for (int i = 0; i < b.new->n; i++) {
            const uw_lib *was = old ? find_lib(old, b.new->libs[i].lo) : NULL;
            if (!was || was->t.rows != b.new->libs[i].t.rows)
                free(b.new->libs[i].t.rows), free(b.new->libs[i].page), free(b.new->libs[i].name);
        }
        free(b.new);
        return -1;
    }
    qsort(b.new->libs, (size_t)b.new->n, sizeof(uw_lib), lib_cmp);
    /* overlapping ranges cannot both be right: keep the first (walks need disjoint ranges) */
    int w = 0;
    for (int i = 0; i < b.new->n; i++) {
        if (w && b.new->libs[i].lo < b.new->libs[w - 1].hi) {
            retire(b.new->libs[i].t.rows), retire(b.new->libs[i].page), retire(b.new->libs[i].name);
            continue;
        }
        b.new->libs[w++] = b.new->libs[i];
    }
    b.new->n = w;
    atomic_store_explicit(&current, b.new, memory_order_release);
    if (old) { /* what the new snapshot no longer holds goes once no walk can see it */
        for (int i = 0; i < old->n; i++) {
            const uw_lib *now = find_lib(b.new, old->libs[i].lo);
            if (!now || now->t.rows != old->libs[i].t.rows)
                retire(old->libs[i].t.rows), retire(old->libs[i].page), retire(old->libs[i].name);
        }
        retire(old);
    }
    seen_adds = c[0], seen_subs = c[1];
    return b.new->n;
}

const uw_row *uw_lookup(uintptr_t pc)
{
    uw_snap *snap = atomic_load_explicit(&current, memory_order_acquire);
    const uw_lib *l = snap ? find_lib(snap, pc) : NULL;
    return l ? find_row(l, pc) : NULL;
}

static const uw_row *find_row(const uw_lib *l, uintptr_t pc)
{
    if (!l->t.n)
        return NULL;
    uint32_t off = (uint32_t)(pc - l->lo);
    uint32_t k = off >> PAGE_SHIFT; /* the rows of this page: from page[k] to page[k + 1] */
    uint32_t lo = l->page[k], hi = l->page[k + 1] + 1;
    if (hi > l->t.n)
        hi = l->t.n;
    while (hi - lo > 1) { /* the last row with loc <= off */
        uint32_t mid = lo + (hi - lo) / 2;
        if (l->t.rows[mid].loc <= off)
            lo = mid;
        else
            hi = mid;
    }
    return l->t.rows[lo].loc <= off ? &l->t.rows[lo] : NULL;
}

/* A frame pointer worth following: aligned, above the stack pointer, not far above it. */
#define FP_SPAN (8u << 20)
static int plausible_fp(uint64_t fp, uint64_t sp) { return !(fp & 7) && fp >= sp && fp - sp < FP_SPAN; }

/* mcontext's general registers in the ucontext a signal trampoline's rsp points at */
#define UC_GREGS offsetof(ucontext_t, uc_mcontext.gregs)

int uw_unwind_regs(uint64_t pc, uint64_t sp, uint64_t fp, uint64_t *pcs, int max, int mode, uint16_t *flags)
{
    volatile int n = 0;
    if (max < 1)
        return 0;
    uw_snap *snap = atomic_load_explicit(&current, memory_order_acquire);
    ddp_guard g, *prev = ddp_tls_guard;
    int guarded = mode == DDP_READ_GUARDED;
    if (guarded) {
        if (sigsetjmp(g.jb, 0) != 0) { /* a faulting read: keep what was found */
            DDP_GUARD_SET(prev);
            *flags |= UW_TRUNCATED;
            return n;
        }
        DDP_GUARD_ARM(&g);
    }
    int exact = 1; /* pc is where the thread was, not a return address (the leaf, a signal's) */
    int done = 0;
    while (!done) {
        uint64_t look = exact ? pc : pc - 1; /* a call's return address may start the next function */
        pcs[n] = look;                       /* (so symbols are looked up inside the call too) */
        n = n + 1;
        if (n >= max)
            break;
        const uw_lib *l = snap ? find_lib(snap, (uintptr_t)look) : NULL;
        const uw_row *row = l ? find_row(l, (uintptr_t)look) : NULL;
        uint64_t ra, cfa;
        if (row && (row->flags & UW_ROW_END)) {
            done = 2;
            break;
        }
        if (row && (row->flags & UW_ROW_SIGNAL)) { /* the interrupted registers, saved by the kernel */
            uint64_t r[3];
            if (ddp_safe_read(&r[0], sp + UC_GREGS + 8 * REG_RIP, 8, mode) || ddp_safe_read(&r[1], sp + UC_GREGS + 8 * REG_RSP, 8, mode) ||
                ddp_safe_read(&r[2], sp + UC_GREGS + 8 * REG_RBP, 8, mode))
                break;
            pc = r[0], sp = r[1], fp = r[2];
            exact = 1;
            continue;
        }
        if (row && row->cfa_reg != UW_CFA_NONE) {
            cfa = (row->cfa_reg == UW_CFA_RSP ? sp : fp) + (int64_t)row->cfa_off;
            if (cfa <= sp || ddp_safe_read(&ra, cfa - 8, 8, mode))
                break;
            if (row->fp_off != UW_FP_SAME && ddp_safe_read(&fp, cfa + row->fp_off, 8, mode))
                break;
        } else {
            if (!plausible_fp(fp, sp))
                break;
            uint64_t pair[2];
            if (ddp_safe_read(pair, fp, 16, mode))
                break;
            cfa = fp + 16, fp = pair[0], ra = pair[1];
        }
        if (ra < 4096) {
            done = ra == 0 ? 2 : 0; /* a zero return address ends a stack (thread start) */
            break;
        }
        sp = cfa, pc = ra, exact = 0;
    }
    if (guarded)
        DDP_GUARD_SET(prev);
    if (done != 2)
        *flags |= UW_TRUNCATED;
    return n;
}

int uw_unwind(const ucontext_t *uc, uint64_t *pcs, int max, int mode, uint16_t *flags)
{
    const greg_t *r = uc->uc_mcontext.gregs;
    return uw_unwind_regs((uint64_t)r[REG_RIP], (uint64_t)r[REG_RSP], (uint64_t)r[REG_RBP], pcs, max, mode, flags);
}
