"""Allocation samples of the native engine: type leaves and LIVE rows (native/alloc.c,
alloctype.c, alloclive.c).

``AllocTracker`` receives the ALLOC records the RecordConverter decodes (``hold_many``), and
adds them to the profile once the native side had its chance to name the allocated
type (a type note arrives at the thread's next allocation, so a row waits at most one
more drain).  It keeps, for every sample whose block may still be allocated, the row
it was recorded with (stack, thread, labels, time, weights), so that at stop each
sampled block still alive becomes a LIVE row with that very stack, thread and labels
and the same Horvitz-Thompson weights.  Memory stays proportional to the live samples:
rows of freed blocks are pruned against the native live table.

Type leaf: a ``[type]`` frame of kind ALLOC_TYPE ends the stack when the type is known.
It is unknown for blocks freed before their object was initialised (read at the
thread's next allocation), for the MEM domain (raw buffers: list/dict storage,
bytearray and buffer data...), and when the block's start does not validate as an
object; such stacks end at the allocating Python frame.
"""

from __future__ import annotations

import functools
import itertools
import struct


from ...events import EventType, FrameKind
from ...model import Frame
from . import binding as _binding

__all__ = ["AllocTracker"]


@functools.cache
def _kind_names() -> dict[int, str]:
    """The C allocators' leaf names by kind (the native module's constants: read once, as
    each cffi call gives the GIL up and a session start waited for it 255 times)."""
    lib, ffi = _binding.lib, _binding.ffi
    names = {}
    for k in range(1, 1 << (64 - lib.DDP_ALLOC_KIND_SHIFT)):
        name = lib.ddp_nalloc_kind_name(k)
        if name != ffi.NULL:
            names[k] = ffi.string(name).decode()
    return names


class AllocTracker:
    """ALLOC rows held until typed; LIVE rows at stop.  Not thread-safe (the drain owns it)."""

    BATCH = 1024

    def __init__(self, builder):
        self.builder = builder
        self._Frame = Frame
        self._rows: dict[int, tuple] = {}     # sample id -> its row (id, stack, thread, labels, t, count, bytes)
        self._types: dict[int, str] = {}      # sample id -> type name (notes not yet used)
        self._held: list[tuple] = []          # ALLOC rows of this drain, waiting for their notes
        self._held_prev: list[tuple] = []     # ... of the previous drain: added next flush, typed or not
        self._type_fids: dict[str, int] = {}
        self._typed: dict[tuple[int, str], int] = {}
        self._inv: list[tuple[int, ...]] = []
        ffi = _binding.ffi
        self._info = ffi.new("ddp_alloc_info[]", self.BATCH)
        self._info_size = ffi.sizeof("ddp_alloc_info")
        name_len = len(ffi.new("ddp_alloc_info *").type_name)
        id_off, name_off = (ffi.offsetof("ddp_alloc_info", f) for f in ("id", "type_name"))
        self._info_struct = struct.Struct(f"<{id_off}xQ{name_off - id_off - 8}x{name_len}s"
                                          f"{self._info_size - name_off - name_len}x")
        self._names: dict[bytes, str] = {}
        # C allocations name their leaf in the sample id's top byte (ddprof.h): no note to wait for
        lib = _binding.lib
        self._kind_shift = lib.DDP_ALLOC_KIND_SHIFT
        self._id_mask = (1 << self._kind_shift) - 1
        self._kinds = _kind_names()
        self._ids_cap = 4096
        self._ids = _binding.ffi.new("uint64_t[]", self._ids_cap)
        self._prune_at = 8192
        self.typed = 0
        self.untyped = 0
        self.live_rows = 0
        self.live_unmatched = 0

    # -- called by RecordConverter.feed ------------------------------------------------------
    def hold_many(self, rows) -> None:
        """One drain's ALLOC records, as (sample id, stack, thread, labels, time, count, bytes)."""
        self._held.extend(rows)

    # -- called by the engine after each drain, and at stop ----------------------------------
    def flush(self, final: bool = False) -> None:
        """Add held ALLOC rows to the builder: typed ones now, the rest after one more drain.

        One tight loop per row (no method call, no per-row numpy): it runs under the GIL for
        every sample, ~170 per 100 ms at the default rate.  A C allocation's row names its
        leaf itself (kind byte); one whose id is 0 stands for samples freed before they
        left the native ring (merged there): nothing of it can be LIVE, so it is not kept."""
        self._absorb_notes()
        pop, remember = self._types.pop, self._rows.__setitem__
        typed_get, typed_stack = self._typed.get, self._typed_stack
        out, keep = [], []  # out: add_rows' tuples (numpy's fixed costs, cold on a drain wake, exceed a few dozen rows')
        add, ev = out.append, EventType.ALLOC.value
        typed = untyped = 0
        shift, id_mask, kinds = self._kind_shift, self._id_mask, self._kinds
        for rows, last_chance in ((self._held_prev, True), (self._held, final)):
            for row in rows:
                aid, sid, th, lb, t, c, v = row
                if aid >> shift:
                    name = kinds.get(aid >> shift)
                    st = typed_get((sid, name))
                    add((ev, typed_stack(sid, name) if st is None else st, th, lb, t, c, v))
                    typed += 1
                    if aid & id_mask:
                        remember(aid, row)
                    continue
                name = pop(aid, None)
                if name is None:
                    if not last_chance:
                        keep.append(row)
                        continue
                    untyped += 1
                    add((ev, sid, th, lb, t, c, v))
                else:
                    typed += 1
                    st = typed_get((sid, name))
                    add((ev, typed_stack(sid, name) if st is None else st, th, lb, t, c, v))
                remember(aid, row)  # the row as held: LIVE at stop takes its stack, thread, labels, weights
        if out:
            self.builder.add_rows(out)
        self.typed += typed
        self.untyped += untyped
        self._held_prev, self._held = keep, []
        if len(self._types) > 100_000:  # notes whose record was dropped: never claimed
            self._types.clear()
        if len(self._rows) >= self._prune_at:
            self._prune()

    def _typed_stack(self, sid: int, name: str | None) -> int:
        if not name:
            return sid
        key = (sid, name)
        out = self._typed.get(key)
        if out is None:
            fid = self._type_fids.get(name)
            if fid is None:
                fid = self._type_fids[name] = self.builder.frame_id(
                    self._Frame(f"[{name}]", kind=FrameKind.ALLOC_TYPE))
            out = self._typed[key] = self.builder.stack_id(list(self._stack_ids_of(sid)) + [fid])
        return out

    def _stack_ids_of(self, sid: int) -> tuple[int, ...]:
        # ProfileBuilder interns stacks as an insertion-ordered dict {frame ids: index}, so
        # index i is the i-th key: extend the inverse with the new keys only.
        stacks = self.builder._stacks
        if sid >= len(self._inv):
            self._inv.extend(itertools.islice(stacks.keys(), len(self._inv), None))
        return self._inv[sid]

    def _absorb_notes(self) -> None:
        lib, ffi = _binding.lib, _binding.ffi
        names = self._names
        while True:
            n = lib.ddp_alloc_types_pop(self._info, self.BATCH)
            if n > 0:  # struct, not numpy (its fixed costs on a drain's cold caches); names decoded once each
                for aid, raw in self._info_struct.iter_unpack(ffi.buffer(self._info, n * self._info_size)):
                    name = names.get(raw)
                    if name is None:
                        name = names[raw] = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
                    self._types[aid] = name
            if n < self.BATCH:
                return

    def _live_ids(self) -> set[int]:
        lib = _binding.lib
        while True:
            n = lib.ddp_alloc_live_ids(self._ids, self._ids_cap)
            if n <= self._ids_cap:
                return set(_binding.ffi.unpack(self._ids, max(n, 0)))
            self._ids_cap = n * 2
            self._ids = _binding.ffi.new("uint64_t[]", self._ids_cap)

    def _prune(self) -> None:
        live = self._live_ids()
        self._rows = {k: v for k, v in self._rows.items() if k in live}
        self._prune_at = max(8192, 2 * len(self._rows))

    # -- at stop ---------------------------------------------------------------------------------
    def add_live(self) -> int:
        """After ddp_stop and the final flush: one LIVE row per sampled block still allocated."""
        lib, ffi = _binding.lib, _binding.ffi
        n = lib.ddp_alloc_live_list(self._info, 0)
        if n <= 0:
            return 0
        buf = ffi.new("ddp_alloc_info[]", n)
        n = min(n, lib.ddp_alloc_live_list(buf, n))
        for i in range(n):
            rec = buf[i]
            row = self._rows.get(int(rec.id))
            if row is None:  # its ALLOC record was dropped, or came from an excluded thread
                self.live_unmatched += 1
                continue
            _id, sid, thread, labels, t, count, value = row
            if rec.sampled_size:  # a mapping: the weight of the bytes it holds resident
                value = round(value * int(rec.size) / int(rec.sampled_size))
            name = ffi.string(rec.type_name).decode("utf-8", "replace") or None
            self.builder.add(EventType.LIVE, self._typed_stack(sid, name), thread, labels, t, count, value)
            self.live_rows += 1
        return self.live_rows

    @staticmethod
    def stats() -> dict:
        s = _binding.ffi.new("ddp_alloc_stats *")
        _binding.lib.ddp_alloc_get_stats(s)
        return {name: int(getattr(s, name)) for name in (
            "sampled", "emit_failed", "live_overflow", "notes_dropped", "typed", "untyped", "reentered",
            "live_at_stop", "left_installed", "layers_in_use", "sample_ns", "type_ns", "unlinked", "reclaimed",
            "subinterp_sampled")}

    @staticmethod
    def native_stats() -> dict:
        """The C allocation hooks' counters (native/nalloc.c)."""
        s = _binding.ffi.new("ddp_nalloc_stats *")
        _binding.lib.ddp_nalloc_get_stats(s)
        return {name: int(getattr(s, name)) for name in (
            "sampled", "emit_failed", "not_python", "native_thread", "live_overflow", "maps_trimmed", "maps_measured",
            "maps_mapped_bytes", "maps_resident_bytes", "maps_measure_ns", "maps_unmeasured", "objects", "slots_patched", "slots_foreign",
            "restore_mismatch", "protect_failed", "passes", "passes_deferred", "kinds_patched", "kinds_foreign", "tracking_objects",
            "active_patches", "slots_unhooked")}
