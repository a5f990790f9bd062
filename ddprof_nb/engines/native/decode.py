"""Raw native records -> ProfileBuilder rows: one decode pass per batch.

Records are drained into one caller-owned cffi buffer (``session.Session``).  ``feed``
decodes a batch once and dispatches each record by kind: CPU/WALL rows go to the
builder, ALLOC rows are held by the ``alloc.AllocTracker`` for their type leaf, LOCK/PARK
rows are reclassified by the ``lockpark.WaitClassifier`` from their stack.  Python code
runs per distinct stack, thread and label set of a batch, not per record: a stack is
found by the hash the sampler stored with it, its bytes compared once per batch.
"""

from __future__ import annotations

import functools
import struct

import numpy as np

from ... import labeling as _labeling
from ...events import EventType, FrameKind
from ...model import Frame
from .binding import FRAME_SIZE, ffi, lib
from .codes import Resolver, cache_put, frame_cache
from .nativeframes import has_native
from .pools import MASKED

__all__ = ["RecordConverter", "STATE_LABELS", "SMALL_BATCH"]

# Wall samples carry the thread's state as a label ``state=<value>``:
#   cpu     running or runnable (its CPU clock advanced, or the kernel says "running")
#   off-cpu blocked in a system call or sleeping (I/O, sleep, lock, select...)
#   gil     blocked on the interpreter's GIL (a futex inside the GIL structure)
STATE_LABELS = {1: "cpu", 2: "off-cpu", 3: "gil"}
# (an enum member's attribute costs ~0.5 us per look-up)
_WALL, _ALLOC, _LOCK, _PARK = (EventType.WALL.value, EventType.ALLOC.value, EventType.LOCK.value,
                               EventType.PARK.value)

# -- records -------------------------------------------------------------------------------
# ddp_record's header fields: (name, numpy format, struct code), in offset order
_HDR_FIELDS = (("event", "u1", "B"), ("state", "u1", "B"), ("flags", "<u2", "H"), ("depth", "<u2", "H"),
               ("tid", "<i4", "i"), ("interp", "<u4", "I"), ("label_id", "<u8", "Q"), ("ts_ns", "<i8", "q"), ("count", "<i8", "q"),
               ("value", "<i8", "q"), ("aux", "<u8", "Q"), ("stack_hash", "<u8", "Q"))
_FIELDS = tuple(f[0] for f in _HDR_FIELDS)  # in struct order: _dispatch's header tuple
_FRAME_KEY = struct.Struct("<QQi4x")  # a ddp_frame's (code, fingerprint, lasti): RecordConverter._frames' key


@functools.lru_cache(maxsize=8)  # per record size, not per session: a session's first drain paid ~0.1 ms
def _record_dtype(record_size: int) -> np.dtype:
    fields = [f[0] for f in _HDR_FIELDS]
    offsets = [ffi.offsetof("ddp_record", f) for f in fields]
    return np.dtype({"names": fields, "formats": [f[1] for f in _HDR_FIELDS], "offsets": offsets,
                     "itemsize": record_size})


@functools.lru_cache(maxsize=8)
def _header_struct(record_size: int) -> struct.Struct:
    """The record header as a struct, padded to ``record_size`` so that iter_unpack walks a
    batch of records: it gives the tuple hdr.tolist() gives per record, at ~1/2 of its cost
    (numpy's per-field conversion of a structured record is slow)."""
    fmt, pos = "<", 0
    for name, _np, code in _HDR_FIELDS:
        off = ffi.offsetof("ddp_record", name)
        fmt += f"{off - pos}x{code}" if off > pos else code
        pos = off + struct.calcsize("<" + code)
    if record_size > pos:
        fmt += f"{record_size - pos}x"
    return struct.Struct(fmt)


SMALL_BATCH = 128  # records: a batch this small is decoded record by record (RecordConverter.feed)


class RecordConverter:
    """Raw native records -> rows of a ProfileBuilder (stacks interned, root first)."""

    def __init__(self, builder, start_mono_ns: int, exclude_tids=(), thread_names=None, base_labels=None):
        self.builder = builder
        self.start_mono_ns = start_mono_ns
        self.exclude = set(exclude_tids)
        self.resolver = Resolver()
        self.thread_names: dict[int, str] = thread_names if thread_names is not None else {}
        self._Frame = Frame
        self._stacks: dict[tuple[int, bytes], int] = {}
        self._by_hash: dict[int, tuple[int, bytes, int]] = {}  # stack_hash -> (flags, frame bytes, stack id)
        self._frames: dict[tuple[int, int, int], int] = {}
        # (code, fingerprint) resolved since the last drain told the sampler (ddp_known_add)
        self.new_codes: set[tuple[int, int]] = set()
        self._threads: dict[int, int] = {}
        self._named: set[int] = set()  # tids whose thread got its real name
        self._labels: dict[tuple[int, int], int] = {}
        self._base_sets: dict[tuple[int, int], object] = {}  # (label set id, state) -> LabelSet
        self._events = {e.value: e for e in EventType}
        self._records = None  # _header_struct(record_size), set by feed
        self._event_off = ffi.offsetof("ddp_record", "event")
        b = builder
        self._unknown = b.frame_id(Frame("[unknown]", kind=FrameKind.UNKNOWN))
        self._truncated = b.frame_id(Frame("[truncated]", kind=FrameKind.TRUNCATED))
        self._gc = b.frame_id(Frame("[GC]", kind=FrameKind.GC))
        self._nopy = b.frame_id(Frame("[no Python frames]", kind=FrameKind.NATIVE))
        self._masked = b.frame_id(MASKED)
        self.base_labels = dict(base_labels or {})
        self.skipped_invalid = 0
        self.unknown_frames = 0
        self._dtype = None
        self.alloc = None  # allocations: an alloc.AllocTracker when ALLOC is sampled (set by the engine)
        self.waits = None  # lock/park: a lockpark.WaitClassifier when LOCK/PARK are sampled (set by the engine)
        self.native = None  # native frames: a nativeframes.NativeMerger when native=True (set by the engine)

    def _frame_id(self, code: int, fp: int, lasti: int) -> int | None:
        key = (code, fp, lasti)
        fid = self._frames.get(key)
        if fid is not None:
            return fid
        frame = frame_cache.get(key)
        if frame is None:
            info = self.resolver.code(code, fp)
            if info is None:
                return None
            frame = self._Frame(info.qualname, info.filename, self.resolver.line(info, lasti), info.firstlineno)
            cache_put(frame_cache, key, frame)
        fid = self._frames[key] = self.builder.frame_id(frame)
        self.new_codes.add((code, fp))  # resolved: its samples need not wake the drain early (ddp_known_add)
        return fid

    def _stack_id(self, flags: int, raw: bytes) -> int:
        key = (flags, raw)
        sid = self._stacks.get(key)
        if sid is not None:
            return sid
        ids = []
        complete = True
        if self.native is not None and has_native(raw):
            return self._native_stack_id(key, flags, raw)
        # a new stack is mostly known frames (a busy recursive loop makes a new stack nearly
        # every sample): their ids straight from the session's dict, without numpy or a call
        known = self._frames.get
        for fkey in _FRAME_KEY.iter_unpack(raw):  # (not `key`: the stack's key is pinned below)
            fid = known(fkey)
            if fid is None:
                fid = self._frame_id(*fkey)
                if fid is None:
                    complete = False
                    self.unknown_frames += 1
                    fid = self._unknown
            ids.append(fid)
        ids.reverse()  # leaf first -> root first
        if not ids:
            ids.append(self._nopy)
        if flags & lib.DDP_REC_TRUNCATED:
            ids.insert(0, self._truncated)
        if flags & lib.DDP_REC_GC:
            ids.append(self._gc)
        if flags & lib.DDP_REC_MASKED:
            ids.append(self._masked)
        sid = self.builder.stack_id(ids)
        if complete:  # an [unknown] may resolve later (graveyard): do not pin it
            self._stacks[key] = sid
        return sid

    def _native_stack_id(self, key, flags: int, raw) -> int:
        unknown = []

        def python_id(code, fp, lasti):
            fid = self._frames.get((code, fp, lasti))
            if fid is None:
                fid = self._frame_id(code, fp, lasti)
                if fid is None:
                    unknown.append(1)
                    self.unknown_frames += 1
                    fid = self._unknown
            return fid

        ids = self.native.merge(raw, python_id)
        ids.reverse()
        if flags & lib.DDP_REC_TRUNCATED:
            ids.insert(0, self._truncated)
        if flags & lib.DDP_REC_GC:
            ids.append(self._gc)
        if flags & lib.DDP_REC_MASKED:
            ids.append(self._masked)
        sid = self.builder.stack_id(ids)
        if not unknown:
            self._stacks[key] = sid
        return sid

    def _stack_ids(self, mv, rows: np.ndarray, hdr, record_size: int) -> np.ndarray:
        """Stack ids of records ``rows``: one look-up per distinct stack_hash.  The hash only
        groups: records grouped together are checked to have equal frame bytes (numpy), and a
        group's bytes are compared with the cached stack's, so a collision costs time
        (per-record look-ups for that group), never a wrong stack."""
        hsize = ffi.sizeof("ddp_record")
        keep = lib.DDP_REC_TRUNCATED | lib.DDP_REC_GC | lib.DDP_REC_MASKED
        uniq, first, inv, counts = np.unique(hdr["stack_hash"][rows], return_index=True, return_inverse=True,
                                             return_counts=True)
        inv = inv.reshape(-1)
        flags, depths = hdr["flags"], hdr["depth"]
        if (counts > 1).any():
            u8 = np.frombuffer(mv, dtype=np.uint8).reshape(-1, record_size)
            order = rows[np.argsort(inv, kind="stable")]
            starts = np.cumsum(counts) - counts
        sids = np.empty(len(uniq), dtype=np.int64)
        collided = []
        for j, (h, f, c) in enumerate(zip(uniq.tolist(), first.tolist(), counts.tolist())):
            i = int(rows[f])
            fl = int(flags[i]) & keep
            nbytes = int(depths[i]) * FRAME_SIZE
            if c > 1:
                g = order[starts[j] : starts[j] + c]
                block = u8[g, hsize : hsize + nbytes]
                if ((depths[g] != depths[i]).any() or ((flags[g] & keep) != fl).any()
                        or not (block == block[0]).all()):
                    collided.append(j)
                    continue
            off = i * record_size + hsize
            raw = mv[off : off + nbytes]
            cached = self._by_hash.get(h)
            if cached is not None and cached[0] == fl and cached[1] == raw:
                sids[j] = cached[2]
                continue
            if cached is not None:
                collided.append(j)
                continue
            sids[j] = sid = self._stack_id(fl, raw)
            if (fl, raw) in self._stacks:  # complete (no [unknown] that may resolve later): pin it
                self._by_hash[h] = (fl, raw, sid)
        out = sids[inv]
        for j in collided:  # two stacks with one hash: their records one by one, by bytes
            for k in np.flatnonzero(inv == j).tolist():
                i = int(rows[k])
                off = i * record_size + hsize
                out[k] = self._stack_id(int(flags[i]) & keep, mv[off : off + int(depths[i]) * FRAME_SIZE])
        return out

    def _map(self, values: np.ndarray, lookup) -> np.ndarray:
        """lookup(v) for each distinct value, spread back over ``values``."""
        uniq, inv = np.unique(values, return_inverse=True)
        ids = np.fromiter((lookup(v) for v in uniq.tolist()), dtype=np.int64, count=len(uniq))
        return ids[inv.reshape(-1)]

    def _thread_id(self, tid: int) -> int:
        idx = self._threads.get(tid)
        if idx is None:
            name = self.thread_names.get(tid)
            idx = self._threads[tid] = self.builder.thread_id(tid, name or f"Thread {tid}")
            if name:
                self._named.add(tid)
        return idx

    def name_threads(self) -> None:
        """Name the threads first seen before their name was known: a drain woken by a new
        thread can convert its first samples before ``threading`` has its native id."""
        for tid, idx in self._threads.items():
            name = self.thread_names.get(tid)
            if name and tid not in self._named:
                self.builder.rename_thread(idx, name)
                self._named.add(tid)

    def _labels_id(self, label_id: int, state: int, event: int) -> int:
        key = (label_id, state if event == _WALL else 0)
        idx = self._labels.get(key)
        if idx is None:
            idx = self._labels[key] = self.builder.labels_id(self._labelset(*key))
        return idx

    def _labelset(self, label_id: int, state: int):
        """The record's labels: its thread's set, the session's base labels, its wall state
        (the low byte of ``state``), ``interp=<id>`` for a subinterpreter's sample (the bytes
        above: its id + 1) and, for an asyncio task's id, ``task=<name>``.  Every new task
        brings a new id (a few per drain wake), so the rest is built once per (set, state)
        and the task's name added last, one ``plus``."""
        label_id = int(label_id)
        low = label_id & _labeling.LOW_MASK
        base = self._base_sets.get((low, state))
        if base is None:
            try:
                base = _labeling.labelset(low)
            except ValueError:
                base = _labeling.labelset(0)
            if self.base_labels:
                base = base.merged(self.base_labels)
            if (state & 255) in STATE_LABELS:
                base = base.plus("state", STATE_LABELS[state & 255])
            if state >> 8:
                base = base.plus("interp", str((state >> 8) - 1))
            self._base_sets[(low, state)] = base
        if low == label_id:
            return base
        name = _labeling.task_name(label_id)
        if name is None or "task" in self.base_labels:  # (the base labels win, as for any label)
            return base
        return base.plus("task", name)

    def feed(self, buf, n: int, record_size: int) -> int:
        """Add ``n`` records from ``buf`` (a cffi buffer); returns the rows added.

        The usual drain holds a few dozen records: ``_dispatch`` decodes them in one pass
        (numpy's fixed costs, ~10 us per call with the caches cold from the profiled code,
        would dominate: a drain cost ~1 ms of CPU under the GIL).  So does an ALLOC-only
        batch (~170 per 100 ms at the default rate), whatever its size.  A big mixed batch
        (the buffer a quarter full, the last drain) goes through numpy instead, one look-up
        per distinct stack, thread and label set (``_feed_numpy``)."""
        if n <= 0:
            return 0
        if self._dtype is None or self._dtype.itemsize != record_size:
            self._dtype = _record_dtype(record_size)
            self._records = _header_struct(record_size)
        mv = ffi.buffer(buf, n * record_size)
        if n <= SMALL_BATCH or (self.alloc is not None and self._all_alloc(mv, n, record_size)):
            # struct, not hdr.tolist() (3.6k Ir per record): iter_unpack walks the batch in one call
            rows, late = self._dispatch(mv, enumerate(self._records.iter_unpack(mv)), record_size)
            self.builder.add_rows(rows)
            if late:
                self.builder.add_rows(late)
            return len(rows) + len(late)
        return self._feed_numpy(mv, n, record_size)

    def _all_alloc(self, mv, n: int, record_size: int) -> bool:
        """Every record of the batch is ALLOC (their event bytes, read without numpy)."""
        events = memoryview(mv)[self._event_off :: record_size].tobytes()
        return len(events) == n and events.count(_ALLOC) == n

    def _dispatch(self, mv, items, record_size: int) -> tuple[list, list]:
        """The decode loop: each record of ``items`` ((index, header tuple) pairs, in record
        order) checked, its stack, thread and labels found, then dispatched by kind:
        CPU/WALL -> ``rows``; ALLOC -> held by the AllocTracker for its type leaf;
        LOCK/PARK -> reclassified from the stack by the WaitClassifier, into ``late`` (added
        after ``rows`` on both of feed's paths, so they build the same profile)."""
        hsize = ffi.sizeof("ddp_record")
        keep, invalid = lib.DDP_REC_TRUNCATED | lib.DDP_REC_GC | lib.DDP_REC_MASKED, lib.DDP_REC_INVALID
        alloc_ev = _ALLOC if self.alloc is not None else -1
        waits = self.waits
        special_ev = (_LOCK, _PARK) if waits is not None else ()
        exclude, start, by_hash, events = self.exclude, self.start_mono_ns, self._by_hash, self._events
        threads, labels = self._threads, self._labels
        rows, allocs, late = [], [], []
        skipped = 0
        for i, (ev, state, flags, depth, tid, interp, label_id, ts, count, value, aux, h) in items:
            if flags & invalid:  # torn reads: already counted as dropped in C
                skipped += 1
                continue
            if tid in exclude:
                continue
            if ev not in events:
                EventType.from_id(ev)  # raises: never cast an unknown id
            fl = flags & keep
            off = i * record_size + hsize
            raw = mv[off : off + depth * FRAME_SIZE]
            cached = by_hash.get(h)
            if cached is not None and cached[0] == fl and cached[1] == raw:
                sid = cached[2]
            else:
                sid = self._stack_id(fl, raw)
                if cached is None and (fl, raw) in self._stacks:  # complete: pin it (as _stack_ids)
                    by_hash[h] = (fl, raw, sid)
            th = threads.get(tid)
            if th is None:
                th = self._thread_id(tid)
            t = ts - start if ts > start else 0
            if ev == alloc_ev:  # held as (sample id, row) until its type note comes (alloc.py)
                key = interp << 8  # (the state is kept for WALL rows only; a subinterpreter's id for all)
                lb = labels.get((label_id, key))
                if lb is None:
                    lb = self._labels_id(label_id, key, _WALL)
                allocs.append((aux, sid, th, lb, t, count, value))
            elif ev in special_ev:  # the final event and the leaf pseudo-frame, from the stack
                ev, sid = waits.classify(aux, sid)
                if ev is None:
                    continue
                key = interp << 8
                lb = labels.get((label_id, key))
                late.append((int(ev), sid, th, self._labels_id(label_id, key, _WALL) if lb is None else lb,
                             t, count, value))
            else:
                key = (state if ev == _WALL else 0) | interp << 8
                rows.append((ev, sid, th, self._labels_id(label_id, key, _WALL), t, count, value))
        self.skipped_invalid += skipped
        if allocs:
            self.alloc.hold_many(allocs)
        return rows, late

    def _feed_numpy(self, mv, n: int, record_size: int) -> int:
        """``feed`` for a big mixed batch: records checked and classified with numpy, CPU/WALL
        rows made by numpy (``_add_plain``), ALLOC and LOCK/PARK records dispatched by
        ``_dispatch`` (the fields they need read once, as numpy columns)."""
        hdr = np.frombuffer(mv, dtype=self._dtype, count=n)
        ok = (hdr["flags"] & lib.DDP_REC_INVALID) == 0  # torn reads: already counted as dropped in C
        self.skipped_invalid += n - int(np.count_nonzero(ok))
        # Each numpy call costs ~100 us on a drain wake (cold caches after 0.1 s asleep, bench_locks),
        # so few calls: a comparison per excluded tid (one or two), not np.isin; bincount, not np.unique
        tids = hdr["tid"]
        for t in self.exclude:
            ok &= tids != t
        events = hdr["event"]
        for e in np.flatnonzero(np.bincount(events[ok], minlength=1)).tolist():
            if e not in self._events:
                EventType.from_id(e)  # raises: never cast an unknown id
        other = np.zeros(n, dtype=bool)  # the records _dispatch takes
        if self.alloc is not None:
            other |= events == _ALLOC
        if self.waits is not None:
            other |= (events == _LOCK) | (events == _PARK)
        late: list = []
        if other.any():
            sel = np.flatnonzero(ok & other)
            # field, then rows: hdr[rows] would copy whole records (sized for max_depth, ~3 KB each)
            cols = [hdr[f][sel].tolist() for f in _FIELDS]
            rows, late = self._dispatch(mv, zip(sel.tolist(), zip(*cols)), record_size)
            late = rows + late  # (rows: none, every record given is ALLOC, LOCK or PARK)
            ok &= ~other
        added = self._add_plain(mv, hdr, np.flatnonzero(ok), record_size)
        if late:
            self.builder.add_rows(late)
        return added + len(late)

    def _add_plain(self, mv, hdr, rows: np.ndarray, record_size: int) -> int:
        """CPU/WALL records ``rows`` of a big batch -> builder rows, with numpy."""
        if not len(rows):
            return 0
        ev = hdr["event"][rows]
        state = np.where(ev == _WALL, hdr["state"][rows], 0).astype(np.uint64)  # kept for WALL rows only
        interp = hdr["interp"][rows].astype(np.uint64)
        subinterps = bool(interp.any())
        if subinterps:  # (samples of subinterpreters: their id beside the state, as _labelset reads it)
            state |= interp << np.uint64(8)
        labels = hdr["label_id"][rows]
        if int(labels.max()) < 1 << 56 and not subinterps:  # one int64 key per (label set, state)
            lab = self._map((labels << np.uint64(8)) | state, lambda k: self._labels_id(k >> 8, k & 255, _WALL))
        else:
            lab = np.fromiter((self._labels_id(a, b, _WALL) for a, b in zip(labels.tolist(), state.tolist())),
                              dtype=np.int64, count=len(rows))
        self.builder.add_many(
            ev,
            self._stack_ids(mv, rows, hdr, record_size),
            self._map(hdr["tid"][rows], self._thread_id),
            lab,
            np.maximum(hdr["ts_ns"][rows] - self.start_mono_ns, 0),
            np.stack([hdr["count"][rows], hdr["value"][rows]], axis=1),
        )
        return len(rows)
