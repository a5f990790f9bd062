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
#include <pthread.h>
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
static pthread_mutex_t refresh_lock = PTHREAD_MUTEX_INITIALIZER; /* refreshes and collects, one at a time */
/* A fork waits for a refresh under way (the sampler thread refreshes each tick): a child
 * that inherited the lock held could never build tables, and one forked inside
 * dl_iterate_phdr would inherit the loader's list lock held, which glibc does not reset.
 * Inside the lock only dl_iterate_phdr's own lock and malloc's are taken, which nobody
 * holds while waiting for something else: the fork always gets it. */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void refresh_atfork_prepare(void) { pthread_mutex_lock(&refresh_lock); }
static void refresh_atfork_parent(void) { pthread_mutex_unlock(&refresh_lock); }
static void refresh_atfork_child(void) { pthread_mutex_init(&refresh_lock, NULL); }
static void register_atfork(void) { pthread_atfork(refresh_atfork_prepare, refresh_atfork_parent, refresh_atfork_child); }
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
    pthread_mutex_lock(&refresh_lock);
    while (graveyard) {
        retired *r = graveyard;
        graveyard = r->next;
        free(r->p);
        free(r);
    }
    pthread_mutex_unlock(&refresh_lock);
}

static int counters_cb(struct dl_phdr_info *info, size_t size, void *ctx)
{
    unsigned long long *c = ctx;
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs)
        c[0] = info->dlpi_adds, c[1] = info->dlpi_subs;
    return 1; /* the counters are the same in every entry: one is enough */
}

uint64_t ddp_loader_generation(void)
{
    /* under refresh_lock, as every iteration here: a fork landing inside dl_iterate_phdr would
     * leave the child the loader's list lock held for good (a forked child hung under ASan) */
    unsigned long long c[2] = { 0, 0 };
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&refresh_lock);
    dl_iterate_phdr(counters_cb, c);
    pthread_mutex_unlock(&refresh_lock);
    return (uint64_t)(c[0] + c[1]);
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
    if (lo >= hi)
        return 0;
    /* (an object without unwind tables is kept too, without rows: its code is known code) */
    uintptr_t hdr = eh ? info->dlpi_addr + eh->p_vaddr : 0;
    for (int i = 0; hdr && i < info->dlpi_phnum; i++) { /* the loaded segment the header (and .eh_frame) lie in */
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && hdr >= a && hdr < a + ph->p_filesz)
            seg_lo = a, seg_hi = a + ph->p_filesz;
    }
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
        l->t = seg_hi ? eh_build(hdr, seg_lo, seg_hi, lo, hi) : (uw_table){ NULL, 0 };
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

static int refresh(void);

int uw_refresh(void)
{
    pthread_once(&atfork_once, register_atfork); /* (outside the lock: pthread_atfork takes glibc's at-fork lock) */
    pthread_mutex_lock(&refresh_lock);
    int n = refresh();
    pthread_mutex_unlock(&refresh_lock);
    return n;
}

static int refresh(void)
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

/* A return address: in a known object, right after a call instruction (call rel32, or an
 * indirect call FF /2 of 2, 3, 4, 6 or 7 bytes), at a pc with an unwind rule. */
static int is_return_address(const uw_snap *snap, uint64_t v, int mode)
{
    const uw_lib *l = find_lib(snap, (uintptr_t)(v - 1));
    if (!l || v - 7 < l->lo)
        return 0;
    const uw_row *row = find_row(l, (uintptr_t)(v - 1));
    if (!row || row->cfa_reg == UW_CFA_NONE)
        return 0;
    uint8_t b[7];
    if (ddp_safe_read(b, v - 7, 7, mode))
        return 0;
    if (b[2] == 0xE8)
        return 1;
    static const int at[] = { 5, 4, 3, 1, 0 }; /* FF modrm at v-2, v-3, v-4, v-6, v-7 */
    for (int i = 0; i < 5; i++)
        if (b[at[i]] == 0xFF && ((b[at[i] + 1] >> 3) & 7) == 2)
            return 1;
    return 0;
}

/* 64 KiB of stack: an assembly kernel's saved registers and buffers (OpenBLAS's gemm
 * kernels keep ~28 KiB of packed panels below their return address) */
#define SCAN_WORDS 8192

/* The first return address at or above sp into [lo, hi); *cfa is the slot's address + 8. */
static int scan_range(const uw_snap *snap, uint64_t sp, uint64_t lo, uint64_t hi, int mode, uint64_t *cfa,
                      uint64_t *ra)
{
    uint64_t chunk[64];
    for (int base = 0; base < SCAN_WORDS; base += 64) {
        if (ddp_safe_read(chunk, sp + 8 * (uint64_t)base, sizeof chunk, mode))
            return 0;
        for (int i = 0; i < 64; i++)
            if (chunk[i] > lo && chunk[i] <= hi && is_return_address(snap, chunk[i], mode)) {
                *cfa = sp + 8 * (uint64_t)(base + i) + 8;
                *ra = chunk[i];
                return 1;
            }
    }
    return 0;
}

/* A frame without a rule at pc: its return address by scanning the stack.  Stale return
 * addresses of earlier, deeper calls lie in the same stretch (a kernel's uninitialized
 * buffers), so one into pc's own object is taken first: an assembly routine is called by
 * its library's C code (a BLAS driver calling its kernel); then one into any object. */
static int scan_for_return(const uw_snap *snap, uint64_t pc, uint64_t sp, int mode, uint64_t *cfa, uint64_t *ra)
{
    if (!snap || !snap->n)
        return 0;
    const uw_lib *own = find_lib(snap, (uintptr_t)pc);
    if (own && scan_range(snap, sp, own->lo, own->hi, mode, cfa, ra))
        return 1;
    return scan_range(snap, sp, snap->libs[0].lo, snap->libs[snap->n - 1].hi, mode, cfa, ra);
}

/* mcontext's general registers in the ucontext a signal trampoline's rsp points at */
#define UC_GREGS offsetof(ucontext_t, uc_mcontext.gregs)

/* restart: the walk starts on the signal handler's side of a signal frame (the sampling
 * thread's own stack): at the first signal frame, forget the frames found so far. */
static int walk(uint64_t pc, uint64_t sp, uint64_t fp, uint64_t *pcs, int max, int mode, uint16_t *flags,
                int restart)
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
            if (restart) {
                restart = 0;
                n = 0;
            }
            continue;
        }
        if (row && row->cfa_reg != UW_CFA_NONE) {
            cfa = (row->cfa_reg == UW_CFA_RSP ? sp : fp) + (int64_t)row->cfa_off;
            if (cfa <= sp || ddp_safe_read(&ra, cfa - 8, 8, mode))
                break;
            if (row->fp_off != UW_FP_SAME && ddp_safe_read(&fp, cfa + row->fp_off, 8, mode))
                break;
            /* A return address into no loaded object (data: seen inside numpy's sort kernels)
             * is this rule misapplied here, or a JIT caller: no frame of it; the stack above
             * is searched as where no rule applies. */
            if (ra >= 4096 && !find_lib(snap, ra - 1) && !scan_for_return(snap, look, cfa, mode, &cfa, &ra))
                break;
        } else {
            /* no rule: rbp as a frame pointer if it leads into code, else a scan of the stack
             * for a return address (hand-written assembly without CFI: BLAS kernels) */
            uint64_t pair[2];
            if (plausible_fp(fp, sp) && ddp_safe_read(pair, fp, 16, mode) == 0 && find_lib(snap, pair[1] - 1)) {
                cfa = fp + 16, fp = pair[0], ra = pair[1];
            } else if (!scan_for_return(snap, look, sp, mode, &cfa, &ra)) {
                break;
            }
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

int uw_unwind_regs(uint64_t pc, uint64_t sp, uint64_t fp, uint64_t *pcs, int max, int mode, uint16_t *flags)
{
    return walk(pc, sp, fp, pcs, max, mode, flags, 0);
}

/* The calling thread's own stack from here: registers read together, so the row at `pc`
 * describes this very rsp.  noinline: this frame is a real one with its own CFI. */
__attribute__((noinline)) static int walk_here(uint64_t *pcs, int max, int mode, uint16_t *flags, int restart)
{
    uint64_t pc, sp, fp;
    __asm__ __volatile__("leaq 0(%%rip), %0\n\tmovq %%rsp, %1\n\tmovq %%rbp, %2" : "=r"(pc), "=r"(sp), "=r"(fp));
    return walk(pc, sp, fp, pcs, max, mode, flags, restart);
}

int uw_unwind_own(uint64_t *pcs, int max, int mode, uint16_t *flags)
{
    return walk_here(pcs, max, mode, flags, 1);
}

/* This module's executable range (its frames are the profiler's, never shown). */
static uintptr_t own_lo, own_hi;

static int in_own(uint64_t pc) { return pc >= own_lo && pc < own_hi; }

#define NATIVE_MAX 256

/* pcs (leaf first) as ddp_frames, the last one DDP_NATIVE_CUT when the walk stopped early
 * or room ran out; returns how many, <= room. */
static int encode(const uint64_t *pcs, int n, int cut, ddp_frame *out, int room)
{
    int w = 0;
    for (; w < n && w < room; w++)
        out[w] = (ddp_frame){ DDP_NATIVE_CODE, pcs[w], -1, 0 };
    if (w < n)
        cut = 1, w--; /* no room for all: the last slot says so */
    if (cut && w >= 0 && w < room)
        out[w++] = (ddp_frame){ DDP_NATIVE_CUT, 0, -1, 0 };
    return w < 0 ? 0 : w;
}

int uw_append_own(ddp_frame *out, int room, int mode)
{
    if (room < 1)
        return 0;
    uw_snap *snap = atomic_load_explicit(&current, memory_order_acquire);
    if (!snap)
        return 0;
    if (!own_hi) {
        const uw_lib *l = find_lib(snap, (uintptr_t)&uw_append_own);
        if (!l)
            return 0;
        own_lo = l->lo, own_hi = l->hi;
    }
    uint64_t pcs[NATIVE_MAX];
    uint16_t flags = 0;
    /* in a signal handler the walk restarts at the interrupted context; in a hook (no signal
     * frame) the profiler's own frames at the leaf are skipped */
    int n = walk_here(pcs, NATIVE_MAX, mode, &flags, 1);
    int i = 0;
    while (i < n && in_own(pcs[i]))
        i++;
    if (i == n && n)
        return 0; /* (no frame outside the profiler: nothing to show) */
    return encode(pcs + i, n - i, (flags & UW_TRUNCATED) != 0, out, room);
}

int uw_append_regs(uint64_t pc, uint64_t sp, ddp_frame *out, int room, int mode)
{
    if (room < 1 || !atomic_load_explicit(&current, memory_order_acquire))
        return 0;
    uint64_t pcs[NATIVE_MAX];
    uint16_t flags = 0;
    int n = walk(pc, sp, 0, pcs, NATIVE_MAX, mode, &flags, 0);
    return encode(pcs, n, (flags & UW_TRUNCATED) != 0, out, room);
}

int uw_unwind(const ucontext_t *uc, uint64_t *pcs, int max, int mode, uint16_t *flags)
{
    const greg_t *r = uc->uc_mcontext.gregs;
    return uw_unwind_regs((uint64_t)r[REG_RIP], (uint64_t)r[REG_RSP], (uint64_t)r[REG_RBP], pcs, max, mode, flags);
}
