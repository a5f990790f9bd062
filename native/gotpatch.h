/* gotpatch.h — loader-safe patching of imported functions' GOT slots, shared by the
 * wait hooks (waits.c) and the C allocation hooks (nalloc.c).  See gotpatch.c. */
#ifndef DDP_GOTPATCH_H
#define DDP_GOTPATCH_H

#include <elf.h>
#include <link.h>
#include <stdint.h>

#if defined(__x86_64__)
#define GP_R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define GP_R_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define GP_R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define GP_R_GLOB_DAT R_AARCH64_GLOB_DAT
#else
#define GP_NO_ARCH 1
#endif

#define GP_MAX_WANTS 96    /* distinct (symbol, version) imports of the hooked names in one pass */

typedef struct {
    const char *name;
    int kind;              /* the user's tag (a bit in kinds_patched / kinds_foreign: < 32) */
    void *wrapper;
    void *real;            /* what our own calls go to (our GOT is never patched) */
} gp_hook;

/* A loaded object, as seen inside dl_iterate_phdr. */
typedef struct {
    uintptr_t base;
    const char *name;
    const ElfW(Sym) *symtab;
    const char *strtab;
    const ElfW(Half) *versym;
    const ElfW(Verneed) *verneed;
    long verneednum;
    uintptr_t dyn;              /* with base: the object's identity */
    uintptr_t lo, hi;           /* the object's mapped range (lazy PLT stubs point inside) */
    uintptr_t relro_lo, relro_hi;
    const ElfW(Rela) *jmprel, *rela;
    size_t jmprel_n, rela_n;
    int is_libpython;           /* the object that holds the interpreter (libpython or the executable) */
    int incomplete;             /* an import could not be resolved yet: scan it again later */
    unsigned flags;             /* the user's, set by classify */
} gp_obj;

typedef struct {
    uintptr_t slot, original, wrapper;
    uintptr_t target;            /* what the loader binds the slot to (lazy binding writes it) */
    uintptr_t obj_base, obj_dyn; /* the object it belongs to */
    uintptr_t relro_lo, relro_hi;
    int kind;
    int jump;                    /* a JUMP_SLOT: may hold the object's own lazy PLT stub */
    int seen;                    /* the last scan that found its object loaded */
    int restored;
    int rebound;                 /* the loader wrote the slot since: no longer ours to restore */
} gp_patch;

typedef struct {
    uint64_t objects, slots_patched, slots_foreign, restore_mismatch, restore_unloaded, protect_failed;
    uint64_t passes_deferred;   /* passes that found objects still being loaded every time: retried later */
    uint64_t slots_rebound;     /* hooked slots the loader wrote again (lazy binding in flight, or the
                                 * object unloaded and loaded again at the same address): hooked anew */
    uint64_t slots_unhooked;    /* slots left alone for want of memory or of a (symbol, version) entry */
    uint32_t kinds_patched, kinds_foreign; /* bit per kind: some slot hooked / left as someone else's */
} gp_stats;

typedef struct gp_set {
    const gp_hook *hooks;
    int nhooks;
    /* Called inside dl_iterate_phdr (loads only: no loader function) for every object that
     * may be patched; 0 leaves the object alone.  May set o->flags.  NULL: every object. */
    int (*classify)(gp_obj *o);
    /* The wrapper for hook h's slot in object o (and its kind in *kind), NULL to leave the
     * slot alone.  Same rules as classify.  NULL: h->wrapper, h->kind. */
    void *(*route)(const gp_obj *o, const gp_hook *h, int *kind);
    /* state (under the user's lock, and changed only under gotpatch.c's own lock) */
    gp_patch *patches;          /* grown as needed: a slot is never left unhooked for a fixed limit */
    int npatches, cap_patches;
    struct gp_done { uintptr_t base, dyn; int seen; } *done;
    int ndone, cap_done;
    int pass_no;
    unsigned long long seen_adds; /* the loader's load counter when the last pass began */
    int pending;                /* the last pass left work to retry or to check: the next call runs one */
    gp_stats st;
} gp_set;

/* All with the user's lock held (one per set: passes, restores and lists of a set never overlap),
 * none from inside dl_iterate_phdr.  gotpatch.c serializes the slot writes of every set under
 * one lock of its own, never held across a loader call that takes the loader's main lock, and
 * fork waits for it (its own pthread_atfork): a user's fork handlers need no lock. */
void gp_pass(gp_set *s);                       /* hook every loaded object not scanned yet */
/* 1: a pass is due: objects were loaded since the last pass, or it left slots to retry (an
 * object still being loaded, a slot that changed under it) or to check (a lazy stub it hooked). */
int gp_loaded_since(const gp_set *s);
/* check_loaded 0: a fork child (one thread); a slot is written back only where it is still
 * mapped and holds our wrapper (its object may have been unloaded since the last pass). */
void gp_restore_all(gp_set *s, int check_loaded);
/* The slots of s's hooks in loaded objects now (patched or not): addresses, values, kinds. */
int gp_list(gp_set *s, uint64_t *addr, uint64_t *val, int32_t *kind, int cap);
/* Inside classify: 1 when o imports the function `name`. */
int gp_obj_imports(const gp_obj *o, const char *name);

#endif
