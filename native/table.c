/* table.c — lookups over events.h's X-macro tables; total: out-of-range ids give NULL/-1. */
#include <errno.h>
#include <Python.h>
#include "ddprof.h"

#define ROW_NAME(ID, V, NAME, DISP, CT, CU, QT, QU, DU, LEAF) [V] = NAME,
static const char *const event_names[] = { DDP_EVENT_TYPES(ROW_NAME) };
#undef ROW_NAME
#define ROW_VT(ID, V, NAME, DISP, CT, CU, QT, QU, DU, LEAF) [V] = { CT, CU, QT, QU },
static const char *const event_value_types[][4] = { DDP_EVENT_TYPES(ROW_VT) };
#undef ROW_VT
#define ROW_LEAF(ID, V, NAME, DISP, CT, CU, QT, QU, DU, LEAF) [V] = DDP_FRAME_##LEAF,
static const int event_leaf[] = { DDP_EVENT_TYPES(ROW_LEAF) };
#undef ROW_LEAF
#define ROW_KIND(ID, V, NAME, LABEL) [V] = NAME,
static const char *const frame_kind_names[] = { DDP_FRAME_KINDS(ROW_KIND) };
#undef ROW_KIND

_Static_assert(sizeof(event_names) / sizeof(event_names[0]) == DDP_EVENT_COUNT, "event ids must be 0..n-1");
_Static_assert(sizeof(frame_kind_names) / sizeof(frame_kind_names[0]) == DDP_FRAME_KIND_COUNT, "frame kinds must be 0..n-1");

int ddp_event_count(void) { return DDP_EVENT_COUNT; }
int ddp_frame_kind_count(void) { return DDP_FRAME_KIND_COUNT; }

const char *ddp_event_name(int event)
{
    return (event >= 0 && event < DDP_EVENT_COUNT) ? event_names[event] : NULL;
}

const char *ddp_event_value_type(int event, int index)
{
    if (event < 0 || event >= DDP_EVENT_COUNT || index < 0 || index > 3)
        return NULL;
    return event_value_types[event][index];
}

int ddp_event_leaf_kind(int event)
{
    return (event >= 0 && event < DDP_EVENT_COUNT) ? event_leaf[event] : -1;
}

const char *ddp_frame_kind_name(int kind)
{
    return (kind >= 0 && kind < DDP_FRAME_KIND_COUNT) ? frame_kind_names[kind] : NULL;
}

const char *ddp_strerror(int code)
{
    switch (code) {
    case DDP_OK: return "ok";
    case DDP_EINVAL: return "invalid argument";
    case DDP_EBUSY: return "a profiler is already running in this process";
    case DDP_ENOTRUNNING: return "the profiler is not running";
    case DDP_EUNSUPPORTED: return "this Python or OS is not supported by the native engine";
    case DDP_ESIGNAL: return "another handler owns the profiling signal";
    case DDP_ENOMEM: return "out of memory for sample buffers";
    case DDP_ETIMER: return "could not create a CPU timer";
    case DDP_ESYS: return "a system call failed";
    default: return "unknown error";
    }
}

static int last_errno;
int ddp_last_errno(void) { return last_errno; }
void ddp_set_errno(int e) { last_errno = e; }

uint32_t ddp_compiled_python_version(void) { return PY_VERSION_HEX; }
