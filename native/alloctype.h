/* alloctype.h — the type leaf of a sampled OBJ-domain block (alloctype.c), for the PyMem hooks. */
#ifndef DDP_ALLOCTYPE_H
#define DDP_ALLOCTYPE_H
#include <stdint.h>

#pragma GCC visibility push(hidden)

#define DDP_TYPE_NAME_CAP 48 /* ddp_alloc_info.type_name */

/* A validated type object for the block at p (a live, initialised object), or 0.  `safe`: the
 * block may have been freed without our seeing it (read through process_vm_readv). */
uintptr_t ddp_alloc_block_type(uintptr_t p, uint64_t size, int safe);
/* The type's tp_name into dst (DDP_TYPE_NAME_CAP bytes); 0, or -1 when it cannot be read. */
int ddp_alloc_type_name(uintptr_t type, char *dst);

#pragma GCC visibility pop
#endif /* DDP_ALLOCTYPE_H */
