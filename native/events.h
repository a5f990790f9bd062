/* events.h — THE table of event types and frame kinds (single source of truth).
 *
 * C code uses the enums and lookup functions generated from these X-macro lists; the
 * Python package parses this very file (ddprof_nb/events.py) and, when the native
 * module is loaded, checks it against the compiled table.  Adding a row here without
 * all its columns fails to compile; adding one without its Python/pprof/display
 * mappings fails the tests, which loop over every row.
 *
 * Keep each row on one line: the Python parser reads rows line by line.
 */
#ifndef DDP_EVENTS_H
#define DDP_EVENTS_H

/* Frame kinds, as async-profiler's BCI_* frame types but a separate enum from events.
 * X(ID, value, "name", "display label") */
#define DDP_FRAME_KINDS(X) \
    X(PYTHON,     0, "python",     "Python function") \
    X(NATIVE,     1, "native",     "native function") \
    X(GC,         2, "gc",         "garbage collection") \
    X(THREAD,     3, "thread",     "thread root") \
    X(TRUNCATED,  4, "truncated",  "truncated stack") \
    X(ERROR,      5, "error",      "sampling error") \
    X(LOCK,       6, "lock",       "contended lock") \
    X(BLOCKER,    7, "blocker",    "what a parked thread waits on") \
    X(ALLOC_TYPE, 8, "alloc_type", "allocated type") \
    X(UNKNOWN,    9, "unknown",    "unresolved frame")

/* Event types.  Every event has exactly two values: a count and its primary quantity.
 * X(ID, value, "name", "display name", "count type", "count unit", "quantity type",
 *   "quantity unit", "display unit", LEAF_FRAME_KIND)
 * LEAF_FRAME_KIND: the pseudo-frame kind a stack of this event may end with (PYTHON = none). */
#define DDP_EVENT_TYPES(X) \
    X(CPU,   0, "cpu",   "CPU time",        "samples",       "count", "cpu",         "nanoseconds", "ns",    PYTHON) \
    X(WALL,  1, "wall",  "Wall time",       "wall-samples",  "count", "wall",        "nanoseconds", "ns",    PYTHON) \
    X(ALLOC, 2, "alloc", "Allocated",       "alloc-objects", "count", "alloc-space", "bytes",       "bytes", ALLOC_TYPE) \
    X(LIVE,  3, "live",  "Live heap",       "live-objects",  "count", "live-space",  "bytes",       "bytes", ALLOC_TYPE) \
    X(LOCK,  4, "lock",  "Lock wait",       "lock-count",    "count", "lock-wait",   "nanoseconds", "ns",    LOCK) \
    X(PARK,  5, "park",  "Blocked (park)",  "park-count",    "count", "park-time",   "nanoseconds", "ns",    BLOCKER)

#define DDP_X_FRAME_ENUM(ID, V, NAME, LABEL) DDP_FRAME_##ID = V,
typedef enum { DDP_FRAME_KINDS(DDP_X_FRAME_ENUM) DDP_FRAME_KIND_COUNT } ddp_frame_kind;
#undef DDP_X_FRAME_ENUM

#define DDP_X_EVENT_ENUM(ID, V, NAME, DISP, CT, CU, QT, QU, DU, LEAF) DDP_EVENT_##ID = V,
typedef enum { DDP_EVENT_TYPES(DDP_X_EVENT_ENUM) DDP_EVENT_COUNT } ddp_event_type;
#undef DDP_X_EVENT_ENUM

#endif /* DDP_EVENTS_H */
