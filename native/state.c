/* state.c — the session's shared state: its phase, configuration, ring, thread slots, stats.
 *
 * Defined here, below every other file of the core, so that each reads what it needs without
 * depending on the file that drives the session (session.c writes most of it, at start and
 * stop; the registry hands out the slots).
 *
 * Includes: core.h.
 */
#include "core.h"

_Atomic int sess_state = ST_IDLE;
_Atomic int ddp_session_active;
ddp_config sess_cfg;
ddp_ring *sess_ring;
size_t sess_rec_size;
slot_t *sess_slots;
_Atomic int32_t sess_nslots;
sess_stats_t sess_stats;
_Atomic uint32_t sess_gen;
int sess_pid;
uintptr_t sess_gil_lo, sess_gil_hi;
