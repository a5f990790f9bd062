/* gotpatch.c — loader-safe patching of GOT slots (used by waits.c and nalloc.c).
 *
 * A set (gp_set) names functions to redirect (hooks: name, wrapper, the real function) and
 * keeps what it patched, so that it can put every slot back.
 *
 * Safety rules:
 *  - a slot is patched only when it resolves (by its symbol version) to the very function
 *    this module calls, and either already holds it or still holds the object's own lazy
 *    PLT stub; a slot holding anything else (another hook, an interposer) is left alone and
 *    counted (slots_foreign);
 *  - restoring puts every slot back to its exact original value with a compare-and-swap,
 *    and only in objects still loaded; a slot someone re-patched meanwhile is left and counted;
 *  - our own object, the loader, libc, libpthread, libdl and the vDSO are never patched.
 *
 * Loader locks.  dl_iterate_phdr holds the loader's write lock while it calls us, and dlsym
 * takes the loader's main lock, which dlopen holds while it waits for the write lock: a
 * dlsym inside the callback deadlocks against any dlopen on another thread.  So a pass runs
 * in three steps: collect the (symbol, version) pairs the unscanned objects import (inside
 * the iteration, loads only), resolve them (outside it), patch (inside a second iteration:
 * an object on the list cannot be unmapped under us, dlclose unmaps after unlisting).
 * Restoring also runs inside an iteration, so it only ever writes into mapped objects; a fork
 * child, which must not iterate (see below), reads each slot with a syscall first instead.
 * Objects loaded later are found by the user's periodic call of gp_pass when
 * gp_loaded_since says the loader's load counter moved: dlopen itself is not wrapped,
 * because glibc's dlopen resolves relative names and $ORIGIN against its caller's address,
 * which a wrapper would change for every caller.
 *
 * One lock (gp_lock) for every set's slot writes and iterations: waits.c and nalloc.c may
 * patch the same GOT page at once, and one's mprotect(PROT_READ) would fault the other's
 * store.  It is never held across dlsym, dlvsym, dladdr or dlopen (the loader's main lock):
 * fork waits for it in a prepare handler, and glibc before 2.36 runs prepare handlers under
 * its at-fork lock, which a dlopen'ed constructor calling pthread_atfork waits for while
 * holding the loader's main lock.  Inside gp_lock only dl_iterate_phdr's own lock is taken,
 * which nobody holds while waiting for anything, so fork always gets gp_lock.  The child
 * may not call dl_iterate_phdr (glibc resets only the main loader lock at fork, and another
 * thread may have held the other), so its restore reads each slot with process_vm_readv:
 * a slot of an object unloaded since the last pass is skipped, never written.
 *
 * Objects still being loaded (see pass_once) never stop a pass: another thread that loads
 * and unloads libraries nonstop would otherwise defer every pass of a whole session.
 *
 * Slots the loader writes again.  Lazy binding stores the resolved function into a slot
 * after looking it up: a thread inside that lookup when the slot's stub is hooked puts the
 * plain function back over the hook.  A library unloaded and loaded again at the same
 * address looks like the object scanned before, with fresh slots.  Each pass's collect
 * therefore checks the patched slots of objects already scanned: one holding what the loader
 * writes there (the stub, the function, the original value) is forgotten and its object
 * scanned again; one holding anything else is someone else's and stays theirs.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>
#include <Python.h>
#include "gotpatch.h"

#ifndef GP_NO_ARCH

typedef struct {
    int hook;                   /* index in hooks[] */
    char ver[32];               /* "" when unversioned */
    void *target;               /* what the loader resolves it to */
    void *definition;           /* the definition after ours in the search order (see patch_one) */
    int resolved;
} want_t;

enum { SCAN_COLLECT, SCAN_PATCH, SCAN_LIST, SCAN_RESTORE };

typedef struct {
    gp_set *s;
    int mode;
    uintptr_t self_base, libpython_base;
    want_t *wants;
    int nwants;
    unsigned long long settled_adds; /* SCAN_PATCH: every object loaded by this count is complete */
    int unsettled;              /* SCAN_PATCH: objects were added since settled_adds (maybe half loaded) */
    /* SCAN_LIST */
    uint64_t *addr, *val;
    int32_t *kind;
    int cap, n;
    int wants_over;             /* (symbol, version) pairs that found no room in wants */
} scan_ctx;

static uintptr_t self_base_cache, libpython_base_cache;
static pthread_once_t bases_once = PTHREAD_ONCE_INIT;

static pthread_mutex_t gp_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void gp_atfork_prepare(void) { pthread_mutex_lock(&gp_lock); }
static void gp_atfork_parent(void) { pthread_mutex_unlock(&gp_lock); }
static void gp_atfork_child(void) { pthread_mutex_init(&gp_lock, NULL); }
/* (registered outside every lock: pthread_atfork takes glibc's at-fork lock) */
static void register_atfork(void) { pthread_atfork(gp_atfork_prepare, gp_atfork_parent, gp_atfork_child); }
static void lock_slots(void) { pthread_mutex_lock(&gp_lock); }
static void unlock_slots(void) { pthread_mutex_unlock(&gp_lock); }

/* Room for one more entry in a grown array (under gp_lock, so a fork never sees it half
 * moved).  0 when memory ran out: the caller counts what it leaves out. */
static int grow(void **arr, int *cap, int n, size_t size)
{
    if (n < *cap)
        return 1;
    int ncap = *cap ? *cap * 2 : 64;
    void *p = realloc(*arr, (size_t)ncap * size);
    if (!p)
        return 0;
    *arr = p;
    *cap = ncap;
    return 1;
}

static uintptr_t fix(uintptr_t base, uintptr_t p) { return p < base ? p + base : p; }

static void mark_present(gp_set *s, uintptr_t base, uintptr_t dyn)
{
    for (int i = 0; i < s->npatches; i++)
        if (s->patches[i].obj_base == base && s->patches[i].obj_dyn == dyn)
            s->patches[i].seen = s->pass_no;
    for (int i = 0; i < s->ndone; i++)
        if (s->done[i].base == base && s->done[i].dyn == dyn)
            s->done[i].seen = s->pass_no;
}

/* Forget the patches and scans of objects unloaded since (dlclose): a library loaded again,
 * perhaps at the same address, is then scanned afresh, and a restore never writes into it
 * on behalf of the old one. */
static void drop_unloaded(gp_set *s)
{
    int k = 0;
    for (int i = 0; i < s->npatches; i++) {
        if (s->patches[i].rebound)
            continue; /* the loader's value now (check_rebound) */
        if (s->patches[i].seen == s->pass_no)
            s->patches[k++] = s->patches[i];
        else
            s->st.restore_unloaded++;
    }
    s->npatches = k;
    k = 0;
    for (int i = 0; i < s->ndone; i++)
        if (s->done[i].seen == s->pass_no)
            s->done[k++] = s->done[i];
    s->ndone = k;
}

/* Inside the collect, for an object scanned before: its patched slots that the loader wrote
 * again since (see the top of the file) are forgotten, and the object is scanned afresh. */
static void check_rebound(gp_set *s, const gp_obj *o)
{
    int lost = 0;
    for (int i = 0; i < s->npatches; i++) {
        gp_patch *p = &s->patches[i];
        if (p->restored || p->rebound || p->obj_base != o->base || p->obj_dyn != o->dyn)
            continue;
        if (p->slot < o->lo || p->slot + sizeof(uintptr_t) > o->hi)
            continue; /* another object at the same address, laid out otherwise: never read outside it */
        uintptr_t v = __atomic_load_n((uintptr_t *)p->slot, __ATOMIC_SEQ_CST);
        if (v == p->wrapper)
            continue;
        if (v == p->original || v == p->target || (p->jump && v >= o->lo && v < o->hi)) {
            p->rebound = 1;
            s->st.slots_rebound++;
            lost = 1;
        }
    }
    if (!lost)
        return;
    for (int i = 0; i < s->ndone; i++)
        if (s->done[i].base == o->base && s->done[i].dyn == o->dyn) {
            s->done[i] = s->done[--s->ndone];
            break;
        }
}

static int is_done(const gp_set *s, uintptr_t base, uintptr_t dyn)
{
    for (int i = 0; i < s->ndone; i++)
        if (s->done[i].base == base && s->done[i].dyn == dyn)
            return 1;
    return 0;
}

static const char *sym_version(const gp_obj *o, size_t symidx)
{
    if (!o->versym || !o->verneed)
        return NULL;
    ElfW(Half) v = o->versym[symidx] & 0x7fff;
    if (v < 2)
        return NULL;
    const ElfW(Verneed) *vn = o->verneed;
    for (long i = 0; i < o->verneednum && vn; i++) {
        const ElfW(Vernaux) *va = (const ElfW(Vernaux) *)((const char *)vn + vn->vn_aux);
        for (int j = 0; j < vn->vn_cnt; j++) {
            if (va->vna_other == v)
                return o->strtab + va->vna_name;
            if (!va->vna_next)
                break;
            va = (const ElfW(Vernaux) *)((const char *)va + va->vna_next);
        }
        if (!vn->vn_next)
            break;
        vn = (const ElfW(Verneed) *)((const char *)vn + vn->vn_next);
    }
    return NULL;
}

static want_t *want_find(scan_ctx *c, int hook, const char *ver)
{
    for (int i = 0; i < c->nwants; i++)
        if (c->wants[i].hook == hook && strcmp(c->wants[i].ver, ver) == 0)
            return &c->wants[i];
    return NULL;
}

static const gp_hook *hook_by_name(const gp_set *s, const char *name)
{
    for (int i = 0; i < s->nhooks; i++)
        if (strcmp(s->hooks[i].name, name) == 0)
            return &s->hooks[i];
    return NULL;
}

/* Store val into a GOT slot that still holds `expect`.  The loader made the pages of
 * [align_down(relro_lo), align_down(relro_hi)) read-only (_dl_protect_relro): only such a
 * page is made writable for the store and read-only again after it.  Any other page is
 * writable as it is and its protection is never touched (with 16K/64K pages the RELRO's
 * last page also holds .data, which must stay writable).  0 done, 1 the slot held
 * something else, -1 mprotect refused.
 * A slot that does not hold `expect` is left before any mprotect: it may belong to a copy
 * of the object loaded again at the same address and still being relocated, whose RELRO
 * pages are writable until the loader is done (making one read-only would fault the
 * loader's next relocation there). */
static int in_relro(uintptr_t slot, uintptr_t relro_lo, uintptr_t relro_hi)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t page = slot & ~(pg - 1);
    return relro_lo < relro_hi && page >= (relro_lo & ~(pg - 1)) && page < (relro_hi & ~(pg - 1));
}

static int write_slot(uintptr_t slot, uintptr_t relro_lo, uintptr_t relro_hi, uintptr_t expect, uintptr_t val)
{
    if (__atomic_load_n((uintptr_t *)slot, __ATOMIC_SEQ_CST) != expect)
        return 1;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t page = slot & ~(pg - 1);
    int ro = in_relro(slot, relro_lo, relro_hi);
    if (ro && mprotect((void *)page, pg, PROT_READ | PROT_WRITE) != 0)
        return -1;
    int ok = __atomic_compare_exchange_n((uintptr_t *)slot, &expect, val, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    if (ro)
        mprotect((void *)page, pg, PROT_READ);
    return ok ? 0 : 1;
}

static void patch_one(gp_obj *o, uintptr_t slot, uintptr_t cur, unsigned type, size_t si, const gp_hook *h,
                      void *wrapper, int kind, scan_ctx *c)
{
    gp_set *s = c->s;
    if (cur == (uintptr_t)wrapper)
        return; /* ours already (an object scanned again) */
    const char *ver = sym_version(o, si);
    want_t *w = want_find(c, (int)(h - s->hooks), ver ? ver : "");
    if (!w || !w->resolved) {
        if (c->wants_over) { /* no room for its (symbol, version): never hooked, and said so */
            s->st.slots_unhooked++;
            return;
        }
        o->incomplete = 1; /* loaded between the passes with a new version: next pass */
        s->pending = 1;
        return;
    }
    /* Patch only slots that resolve (by their symbol version) to the very function this
     * module calls, and hold it or their own lazy PLT stub: anything else is someone else's. */
    int lazy = cur >= o->lo && cur < o->hi && type == GP_R_JUMP_SLOT;
    /* A non-PIE executable that takes a function's address (Debian's python3.x: malloc)
     * holds its canonical PLT entry: dlsym and our own &malloc give that stub, while other
     * objects' call slots are bound straight to the definition the stub jumps to. */
    int canonical = type == GP_R_JUMP_SLOT && w->definition && w->definition != w->target &&
                    cur == (uintptr_t)w->definition;
    if (w->target != h->real || (cur != (uintptr_t)h->real && !lazy && !canonical)) {
        if (c->unsettled) { /* perhaps not relocated yet: judged when the object is complete */
            o->incomplete = 1;
            s->pending = 1;
            return;
        }
        s->st.slots_foreign++;
        s->st.kinds_foreign |= 1u << kind;
        return;
    }
    if (!grow((void **)&s->patches, &s->cap_patches, s->npatches, sizeof *s->patches)) {
        s->st.slots_unhooked++;
        return;
    }
    /* In an object perhaps still being relocated a RELRO page is not touched (the loader
     * would fault on a page made read-only under it); any other slot is written with a
     * compare-and-swap, and a loader's later store over it is found by the next pass. */
    if (c->unsettled && in_relro(slot, o->relro_lo, o->relro_hi)) {
        o->incomplete = 1;
        s->pending = 1;
        return;
    }
    int rc = write_slot(slot, o->relro_lo, o->relro_hi, cur, (uintptr_t)wrapper);
    if (rc < 0) {
        s->st.protect_failed++;
        return;
    }
    if (rc > 0) { /* changed under us (lazy binding resolved it just now): next pass */
        o->incomplete = 1;
        s->pending = 1;
        return;
    }
    if (lazy || c->unsettled)
        s->pending = 1; /* a store of the loader may still land on it: the next pass checks */
    gp_patch *p = &s->patches[s->npatches++];
    memset(p, 0, sizeof *p);
    p->seen = s->pass_no;
    p->slot = slot;
    p->original = cur;
    p->wrapper = (uintptr_t)wrapper;
    p->target = (uintptr_t)w->target;
    p->jump = type == GP_R_JUMP_SLOT;
    p->obj_base = o->base;
    p->obj_dyn = o->dyn;
    p->relro_lo = o->relro_lo;
    p->relro_hi = o->relro_hi;
    p->kind = kind;
    s->st.slots_patched++;
    s->st.kinds_patched |= 1u << kind;
}

/* The imported symbol index of relocation r when it is a JUMP_SLOT or GLOB_DAT, else 0. */
static size_t import_of(const gp_obj *o, const ElfW(Rela) *r, unsigned *type)
{
    *type = (unsigned)ELF64_R_TYPE(r->r_info);
    if (*type != GP_R_JUMP_SLOT && *type != GP_R_GLOB_DAT)
        return 0;
    size_t si = ELF64_R_SYM(r->r_info);
    if (!si || o->symtab[si].st_shndx != SHN_UNDEF)
        return 0; /* defined here: not an import */
    return si;
}

int gp_obj_imports(const gp_obj *o, const char *name)
{
    const ElfW(Rela) *tabs[2] = { o->jmprel, o->rela };
    size_t ns[2] = { o->jmprel_n, o->rela_n };
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; tabs[t] && i < ns[t]; i++) {
            unsigned type;
            size_t si = import_of(o, &tabs[t][i], &type);
            if (si && strcmp(o->strtab + o->symtab[si].st_name, name) == 0)
                return 1;
        }
    return 0;
}

static void visit_rela(gp_obj *o, const ElfW(Rela) *rel, size_t n, scan_ctx *c)
{
    gp_set *s = c->s;
    for (size_t i = 0; i < n; i++) {
        unsigned type;
        size_t si = import_of(o, &rel[i], &type);
        if (!si)
            continue;
        const gp_hook *h = hook_by_name(s, o->strtab + o->symtab[si].st_name);
        if (!h)
            continue;
        int kind = h->kind;
        void *wrapper = s->route ? s->route(o, h, &kind) : h->wrapper;
        if (!wrapper)
            continue;
        uintptr_t slot = o->base + rel[i].r_offset;
        uintptr_t cur = __atomic_load_n((uintptr_t *)slot, __ATOMIC_SEQ_CST);
        if (c->mode == SCAN_LIST) {
            if (c->n < c->cap) {
                c->addr[c->n] = slot;
                c->val[c->n] = cur;
                c->kind[c->n] = kind;
            }
            c->n++;
        } else if (c->mode == SCAN_COLLECT) {
            const char *ver = sym_version(o, si);
            if (!ver)
                ver = "";
            if (cur == (uintptr_t)wrapper || want_find(c, (int)(h - s->hooks), ver))
                continue;
            if (c->nwants >= GP_MAX_WANTS || strlen(ver) >= sizeof c->wants[0].ver) {
                c->wants_over++; /* its slots stay unhooked (patch_one finds no entry): counted there */
            } else {
                want_t *w = &c->wants[c->nwants++];
                memset(w, 0, sizeof *w);
                w->hook = (int)(h - s->hooks);
                strcpy(w->ver, ver);
            }
        } else {
            patch_one(o, slot, cur, type, si, h, wrapper, kind, c);
        }
    }
}

static void restore_object(gp_set *s, uintptr_t base, uintptr_t dyn, uintptr_t lo, uintptr_t hi)
{
    for (int i = 0; i < s->npatches; i++) {
        gp_patch *p = &s->patches[i];
        if (p->restored || p->rebound || p->obj_base != base || p->obj_dyn != dyn)
            continue;
        if (p->slot < lo || p->slot + sizeof(uintptr_t) > hi)
            continue; /* not inside the object now at that address: counted as unloaded */
        p->restored = 1;
        /* only a slot still holding our wrapper: one someone re-patched since stays theirs */
        int rc = write_slot(p->slot, p->relro_lo, p->relro_hi, p->wrapper, p->original);
        if (rc > 0)
            s->st.restore_mismatch++;
        else if (rc < 0)
            s->st.protect_failed++;
    }
}

/* Called by dl_iterate_phdr with the loader's write lock held: loads and stores only (no
 * dlsym, dladdr, dlopen or anything else that takes a loader lock). */
static int visit_object(struct dl_phdr_info *info, size_t size, void *ctx)
{
    scan_ctx *c = ctx;
    gp_set *s = c->s;
    uintptr_t base = info->dlpi_addr;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    gp_obj o;
    memset(&o, 0, sizeof o);
    o.base = base;
    o.name = name;
    o.lo = UINTPTR_MAX;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC)
            o.dyn = base + ph->p_vaddr;
        else if (ph->p_type == PT_GNU_RELRO) {
            o.relro_lo = base + ph->p_vaddr;
            o.relro_hi = o.relro_lo + ph->p_memsz;
        } else if (ph->p_type == PT_LOAD) {
            uintptr_t lo = base + ph->p_vaddr, hi = lo + ph->p_memsz;
            if (lo < o.lo)
                o.lo = lo;
            if (hi > o.hi)
                o.hi = hi;
        }
    }
    if (!o.dyn)
        return 0;
    if (c->mode == SCAN_RESTORE) {
        restore_object(s, base, o.dyn, o.lo, o.hi);
        return 0;
    }
    if (c->mode == SCAN_PATCH && (size < offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs ||
                                  info->dlpi_adds != c->settled_adds))
        c->unsettled = 1; /* an object was added since: it may still be relocating (patch_one) */
    if (base == c->self_base && base)
        return 0;
    if (strstr(name, "linux-vdso") || strstr(name, "/libc.so") || strstr(name, "/ld-linux") ||
        strstr(name, "libpthread.so") || strstr(name, "/libdl.so"))
        return 0;
    if (c->mode == SCAN_COLLECT) { /* still loaded: its patches and done entry stay (drop_unloaded) */
        mark_present(s, base, o.dyn);
        check_rebound(s, &o);
    }
    if ((c->mode == SCAN_COLLECT || c->mode == SCAN_PATCH) && is_done(s, base, o.dyn))
        return 0;
    size_t pltrelsz = 0, relasz = 0;
    long pltrel = 0;
    uintptr_t jmprel = 0, rela = 0;
    for (const ElfW(Dyn) *d = (const ElfW(Dyn) *)o.dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_JMPREL: jmprel = fix(base, d->d_un.d_ptr); break;
        case DT_PLTRELSZ: pltrelsz = d->d_un.d_val; break;
        case DT_PLTREL: pltrel = (long)d->d_un.d_val; break;
        case DT_RELA: rela = fix(base, d->d_un.d_ptr); break;
        case DT_RELASZ: relasz = d->d_un.d_val; break;
        case DT_SYMTAB: o.symtab = (const ElfW(Sym) *)fix(base, d->d_un.d_ptr); break;
        case DT_STRTAB: o.strtab = (const char *)fix(base, d->d_un.d_ptr); break;
        case DT_VERSYM: o.versym = (const ElfW(Half) *)fix(base, d->d_un.d_ptr); break;
        case DT_VERNEED: o.verneed = (const ElfW(Verneed) *)fix(base, d->d_un.d_ptr); break;
        case DT_VERNEEDNUM: o.verneednum = (long)d->d_un.d_val; break;
        }
    }
    if (!o.symtab || !o.strtab)
        return 0;
    if (jmprel && pltrel == DT_RELA) {
        o.jmprel = (const ElfW(Rela) *)jmprel;
        o.jmprel_n = pltrelsz / sizeof(ElfW(Rela));
    }
    if (rela) { /* GLOB_DAT: -fno-plt builds */
        o.rela = (const ElfW(Rela) *)rela;
        o.rela_n = relasz / sizeof(ElfW(Rela));
    }
    o.is_libpython = base == c->libpython_base;
    if (s->classify && !s->classify(&o))
        return 0;
    if (o.jmprel)
        visit_rela(&o, o.jmprel, o.jmprel_n, c);
    if (o.rela)
        visit_rela(&o, o.rela, o.rela_n, c);
    if (c->mode == SCAN_PATCH && !o.incomplete &&
        grow((void **)&s->done, &s->cap_done, s->ndone, sizeof *s->done)) { /* (else scanned again next pass) */
        s->done[s->ndone].base = base;
        s->done[s->ndone].dyn = o.dyn;
        s->done[s->ndone].seen = s->pass_no;
        s->ndone++;
        s->st.objects++;
    }
    return 0;
}

/* Our own object's and libpython's load addresses, in dl_iterate_phdr's convention (outside
 * any iteration: dladdr and dlopen take loader locks). */
static void find_bases(void)
{
    Dl_info di;
    if (dladdr((void *)gp_pass, &di))
        self_base_cache = (uintptr_t)di.dli_fbase;
    if (dladdr((void *)PyEval_SaveThread, &di))
        libpython_base_cache = (uintptr_t)di.dli_fbase;
    /* dl_iterate_phdr reports the executable with dlpi_addr 0 when it is not PIE: dladdr's
     * fbase is then its load address, not 0.  Normalize to dlpi_addr's convention. */
    if (libpython_base_cache) {
        Dl_info dm;
        void *h = dlopen(NULL, RTLD_NOW | RTLD_NOLOAD);
        struct link_map *lm = NULL;
        if (h && dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm) {
            for (; lm; lm = lm->l_next) {
                if (dladdr((void *)lm->l_ld, &dm) && (uintptr_t)dm.dli_fbase == libpython_base_cache) {
                    libpython_base_cache = lm->l_addr;
                    break;
                }
            }
        }
        if (h)
            dlclose(h);
    }
}

static void scan_init(scan_ctx *c, gp_set *s, int mode)
{
    memset(c, 0, sizeof *c);
    c->s = s;
    c->mode = mode;
    pthread_once(&bases_once, find_bases);
    c->self_base = self_base_cache;
    c->libpython_base = libpython_base_cache;
}

static int counters_cb(struct dl_phdr_info *info, size_t size, void *ctx)
{
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs)
        *(unsigned long long *)ctx = info->dlpi_adds;
    return 1; /* the counters are the same in every entry: the first one is enough */
}

static unsigned long long loader_adds(void)
{
    /* under gp_lock, as every iteration: a fork landing inside dl_iterate_phdr would leave the
     * child the loader's list lock held for good, and its first dlopen or dlclose would hang
     * (the sampler thread reads this counter every tick of a lock/park session) */
    unsigned long long adds = 0;
    pthread_once(&atfork_once, register_atfork);
    lock_slots();
    dl_iterate_phdr(counters_cb, &adds);
    unlock_slots();
    return adds;
}

/* Objects half loaded.  dl_iterate_phdr also lists an object that dlopen is still
 * relocating (its RELRO still writable, its GOT half filled).  dlopen holds the loader's main
 * lock from before it lists an object until the object is relocated and protected, and
 * dladdr takes that lock: so once the load counter has been read and a dladdr has returned,
 * every object loaded by that count is complete.  A patching iteration that finds the count
 * unchanged patches everything; one that finds it moved (a load came in between: another
 * thread loading libraries nonstop makes that common) still patches the slots that need no
 * page protection change and leaves the rest to a retry, a few times, then to the next call. */
static void settle(scan_ctx *c)
{
    Dl_info di;
    c->settled_adds = loader_adds();
    dladdr((void *)gp_pass, &di);
    c->unsettled = 0;
}

/* 1 when every object was patched in a settled iteration. */
static int pass_once(gp_set *s)
{
    want_t wants[GP_MAX_WANTS];
    scan_ctx c;
    scan_init(&c, s, SCAN_COLLECT);
    c.wants = wants;
    s->seen_adds = loader_adds(); /* before the scan: an object loaded during it is seen next pass */
    lock_slots();
    s->pass_no++;
    dl_iterate_phdr(visit_object, &c);
    drop_unloaded(s);
    unlock_slots();
    if (!c.nwants)
        return 1;
    for (int i = 0; i < c.nwants; i++) { /* outside the iteration: dlsym takes the loader lock */
        const char *name = s->hooks[wants[i].hook].name;
        wants[i].target = wants[i].ver[0] ? dlvsym(RTLD_DEFAULT, name, wants[i].ver) : dlsym(RTLD_DEFAULT, name);
        wants[i].definition = wants[i].ver[0] ? dlvsym(RTLD_NEXT, name, wants[i].ver) : dlsym(RTLD_NEXT, name);
        wants[i].resolved = 1;
    }
    c.mode = SCAN_PATCH;
    for (int tries = 0; tries < 4; tries++) {
        settle(&c); /* (dladdr: outside gp_lock) */
        lock_slots();
        dl_iterate_phdr(visit_object, &c); /* objects patched by an earlier try are done: skipped */
        unlock_slots();
        if (!c.unsettled)
            return 1;
    }
    return 0;
}

void gp_pass(gp_set *s)
{
    pthread_once(&atfork_once, register_atfork);
    s->pending = 0;
    if (!pass_once(s)) {
        s->st.passes_deferred++;
        s->pending = 1;
    }
}

int gp_loaded_since(const gp_set *s) { return s->pending || loader_adds() != s->seen_adds; }

/* The slot's value, read by the kernel: 0 when the address is no longer mapped. */
static int read_mapped(uintptr_t slot, uintptr_t *out)
{
    struct iovec local = { out, sizeof *out }, remote = { (void *)slot, sizeof *out };
    int saved = errno;
    ssize_t n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    errno = saved;
    return n == (ssize_t)sizeof *out;
}

void gp_restore_all(gp_set *s, int check_loaded)
{
    if (check_loaded) {
        scan_ctx c;
        memset(&c, 0, sizeof c);
        c.s = s;
        c.mode = SCAN_RESTORE;
        lock_slots();
        dl_iterate_phdr(visit_object, &c);
        unlock_slots();
        for (int i = 0; i < s->npatches; i++)
            if (!s->patches[i].restored)
                s->st.restore_unloaded++; /* its object is gone: nothing to put back */
    } else { /* a fork child: one thread, no loader call (see the top of the file) */
        for (int i = 0; i < s->npatches; i++) {
            gp_patch *p = &s->patches[i];
            uintptr_t v;
            if (p->restored || p->rebound || !read_mapped(p->slot, &v) || v != p->wrapper)
                continue; /* unloaded since the last pass, or no longer ours */
            write_slot(p->slot, p->relro_lo, p->relro_hi, p->wrapper, p->original);
        }
    }
    s->npatches = 0;
    s->ndone = 0;
    s->pending = 0;
}

int gp_list(gp_set *s, uint64_t *addr, uint64_t *val, int32_t *kind, int cap)
{
    scan_ctx c;
    scan_init(&c, s, SCAN_LIST);
    c.addr = addr;
    c.val = val;
    c.kind = kind;
    c.cap = cap;
    lock_slots();
    dl_iterate_phdr(visit_object, &c);
    unlock_slots();
    return c.n;
}

#else /* no GOT patching on this architecture */
void gp_pass(gp_set *s) { (void)s; }
int gp_loaded_since(const gp_set *s) { (void)s; return 0; }
void gp_restore_all(gp_set *s, int check_loaded) { (void)check_loaded; s->npatches = s->ndone = 0; }
int gp_list(gp_set *s, uint64_t *addr, uint64_t *val, int32_t *kind, int cap)
{
    (void)s; (void)addr; (void)val; (void)kind; (void)cap;
    return 0;
}
int gp_obj_imports(const gp_obj *o, const char *name) { (void)o; (void)name; return 0; }
#endif
