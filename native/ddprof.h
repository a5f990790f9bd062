/* ddprof.h — the whole native API of ddprof_nb.
 *
 * Everything between the cdef markers is also the cffi cdef (build_native.py reads it),
 * so it holds only prototypes and plain structs, no macros beyond integer constants.
 * Errors: functions return 0 on success and a negative DDP_E* code on failure;
 * ddp_strerror() names it.  ddprof_nb/_binding.py turns codes into exceptions.
 */
#ifndef DDPROF_H
#define DDPROF_H
#include <stdint.h>
#include "events.h"

/* cdef-begin */
#define DDP_OK 0
#define DDP_EINVAL -1        /* bad argument */
#define DDP_EBUSY -2         /* a profiler is already running in this process */
#define DDP_ENOTRUNNING -3   /* stop/drain without start */
#define DDP_EUNSUPPORTED -4  /* this Python/OS is not supported by the native engine */
#define DDP_ESIGNAL -5       /* someone else owns the signal we need */
#define DDP_ENOMEM -6        /* could not allocate buffers at start */
#define DDP_ETIMER -7        /* timer_create failed */
#define DDP_ESYS -8          /* another system call failed (errno in ddp_last_errno) */

/* The event/frame table as compiled: lets Python check its parse of events.h. */
int ddp_event_count(void);
const char *ddp_event_name(int event);          /* NULL when out of range */
const char *ddp_event_value_type(int event, int index);  /* index 0..3: count type/unit, quantity type/unit */
int ddp_event_leaf_kind(int event);            /* -1 when out of range */
int ddp_frame_kind_count(void);
const char *ddp_frame_kind_name(int kind);     /* NULL when out of range */

const char *ddp_strerror(int code);
int ddp_last_errno(void);
/* PY_VERSION_HEX of the headers this module was compiled against. */
uint32_t ddp_compiled_python_version(void);
/* cdef-end */

#endif /* DDPROF_H */
