"""The one importer of ``ddprof_nb._native``: loading, error codes, raw records.

``import ddprof_nb`` never fails because of the native module: ``unavailable_reason()``
says why it cannot be used (missing build, another Python's build, a table mismatch).
Every native call that can fail goes through ``check()``, which turns a ``DDP_E*`` code
into ``ProfilerBusyError`` / ``EngineUnavailableError`` / ``NotRunningError`` /
``ProfilerError`` with ``ddp_strerror``'s text and errno.

Records are drained into one caller-owned cffi buffer; their headers are read with a
numpy structured dtype (``np.frombuffer``) and turned into ProfileBuilder columns with
numpy: Python code runs per distinct stack, thread and label set of a batch (a stack is
found by the hash the sampler stored with it, its bytes compared once per batch), not per
record.  Allocation and lock/park records keep a per-record path (their consumers need it).  ``RecordConverter`` turns them into
ProfileBuilder rows; ``Resolver`` turns captured code pointers into Frames safely.
"""

from __future__ import annotations

import os
import platform
import struct
import sys
import sysconfig
import threading
from dataclasses import dataclass

import numpy as np

from . import labeling as _labeling
from .errors import EngineUnavailableError, NotRunningError, ProfilerBusyError, ProfilerError
from .model import MAX_TICKS, MIN_TICK_NS, Frame
from .events import EventType, FrameKind

__all__ = ["unavailable_reason", "lib", "ffi", "check", "Session", "Resolver", "RecordConverter", "STATE_LABELS"]

ffi = None
lib = None
_reason: str | None = None

# CPython versions whose internal layout native/pyframes.c reads (GIL builds only).  On
# 3.13+ the running interpreter's published offsets (_PyRuntime.debug_offsets) are also
# compared with the compiled ones at load: any difference refuses the engine.
SUPPORTED = ((3, 11), (3, 12), (3, 13), (3, 14), (3, 15))

# Wall samples carry the thread's state as a label ``state=<value>``:
#   cpu     running or runnable (its CPU clock advanced, or the kernel says "running")
#   off-cpu blocked in a system call or sleeping (I/O, sleep, lock, select...)
#   gil     blocked on the interpreter's GIL (a futex inside the GIL structure)
STATE_LABELS = {1: "cpu", 2: "off-cpu", 3: "gil"}
_WALL = EventType.WALL.value  # (an enum member's attribute costs ~0.5 us per look-up)


def _version_hex_tuple(v: int) -> tuple[int, int, int]:
    return (v >> 24) & 0xFF, (v >> 16) & 0xFF, (v >> 8) & 0xFF


def _check_tables(lib_, ffi_) -> str | None:
    """None when the compiled events.h table equals ddprof_nb.events' parse of it."""
    if lib_.ddp_event_count() != len(EventType):
        return f"native module has {lib_.ddp_event_count()} event types, events.h has {len(EventType)}"
    for ev in EventType:
        name = lib_.ddp_event_name(ev.value)
        if name == ffi_.NULL or ffi_.string(name).decode() != ev.label:
            return f"event {ev.value} is named differently in the native module"
        (ct, cu), (qt, qu) = ev.value_types
        for i, want in enumerate((ct, cu, qt, qu)):
            got = lib_.ddp_event_value_type(ev.value, i)
            if got == ffi_.NULL or ffi_.string(got).decode() != want:
                return f"event {ev.label}: value type {i} differs in the native module"
        if lib_.ddp_event_leaf_kind(ev.value) != ev.leaf_kind.value:
            return f"event {ev.label}: leaf frame kind differs in the native module"
    if lib_.ddp_frame_kind_count() != len(FrameKind):
        return "the native module's frame-kind table differs from events.h"
    for fk in FrameKind:
        name = lib_.ddp_frame_kind_name(fk.value)
        if name == ffi_.NULL or ffi_.string(name).decode() != fk.label:
            return f"frame kind {fk.value} differs in the native module"
    return None


def _layout_problem(lib_, ffi_) -> str | None:
    """None when the interpreter's published offsets (3.13+) equal the compiled ones."""
    if not hasattr(lib_, "ddp_py_layout_problem"):
        return "the native module predates the layout check; reinstall ddprof_nb"
    msg = ffi_.new("char[]", 512)
    if lib_.ddp_py_layout_problem(msg, 512) == 0:
        return None
    return ffi_.string(msg).decode("utf-8", "replace") or "unknown layout problem"


def _load() -> None:
    global ffi, lib, _reason
    ffi = lib = None  # a refusal must never leave an earlier load usable
    _reason = None
    if not sys.platform.startswith("linux"):
        _reason = f"the native engine needs Linux (this is {sys.platform})"
        return
    if platform.python_implementation() != "CPython":
        _reason = f"the native engine needs CPython (this is {platform.python_implementation()})"
        return
    if sys.version_info[:2] not in SUPPORTED:
        lo, hi = SUPPORTED[0], SUPPORTED[-1]
        _reason = (
            f"the native engine supports CPython {lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}, not {platform.python_version()}; "
            "use engine='python'"
        )
        return
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        _reason = (
            f"the native engine does not support free-threaded CPython ({platform.python_version()} "
            "built with --disable-gil); use engine='python'"
        )
        return
    try:
        from . import _native  # noqa: PLC0415 - the one place it is imported
    except Exception as exc:  # noqa: BLE001 - missing, or built for something else
        _reason = f"the native module could not be loaded ({type(exc).__name__}: {exc}); reinstall ddprof_nb with a C compiler"
        return
    compiled = _version_hex_tuple(_native.lib.ddp_compiled_python_version())
    running = tuple(sys.version_info[:3])
    if compiled != running:
        _reason = (
            "the native module was compiled against CPython "
            f"{'.'.join(map(str, compiled))} but this is CPython {'.'.join(map(str, running))}: "
            "it reads interpreter internals, so it refuses other versions' layouts; reinstall ddprof_nb"
        )
        return
    mismatch = _check_tables(_native.lib, _native.ffi)
    if mismatch:
        _reason = f"native module out of date ({mismatch}); reinstall ddprof_nb"
        return
    layout = _layout_problem(_native.lib, _native.ffi)
    if layout:
        _reason = (
            f"the native engine refuses CPython {platform.python_version()}: {layout}; "
            "it never reads interpreter memory with a layout it cannot confirm (use engine='python')"
        )
        return
    ffi, lib = _native.ffi, _native.lib


_load()


def unavailable_reason() -> str | None:
    """Why the native engine cannot run here, or None."""
    return _reason


def _require():
    if lib is None:
        raise EngineUnavailableError(_reason or "the native engine is unavailable")
    return lib


_HINTS = {
    -5: (
        "SIGPROF already has a handler (another profiler or library installed it); ddprof_nb "
        "will not replace it. Stop that profiler, or use engine='python'"
    ),
}


def check(rc: int, what: str) -> int:
    """Return ``rc`` when >= 0; otherwise raise the exception its DDP_E* code stands for."""
    if rc >= 0:
        return rc
    text = ffi.string(lib.ddp_strerror(rc)).decode()
    msg = f"{what}: {text}"
    if rc in _HINTS:
        msg += f" ({_HINTS[rc]})"
    err = lib.ddp_last_errno()
    if rc in (lib.DDP_ESYS, lib.DDP_ETIMER) and err:
        msg += f" [errno {err}: {os.strerror(err)}]"
    if rc == lib.DDP_EBUSY:
        raise ProfilerBusyError(msg)
    if rc == lib.DDP_EUNSUPPORTED:
        raise EngineUnavailableError(msg)
    if rc == lib.DDP_ENOTRUNNING:
        raise NotRunningError(msg)
    raise ProfilerError(msg)


# -- records -------------------------------------------------------------------------------
# ddp_record's header fields: (name, numpy format, struct code), in offset order
_HDR_FIELDS = (("event", "u1", "B"), ("state", "u1", "B"), ("flags", "<u2", "H"), ("depth", "<u2", "H"),
               ("tid", "<i4", "i"), ("label_id", "<u8", "Q"), ("ts_ns", "<i8", "q"), ("count", "<i8", "q"),
               ("value", "<i8", "q"), ("aux", "<u8", "Q"), ("stack_hash", "<u8", "Q"))


def _record_dtype(record_size: int) -> np.dtype:
    fields = [f[0] for f in _HDR_FIELDS]
    offsets = [ffi.offsetof("ddp_record", f) for f in fields]
    return np.dtype({"names": fields, "formats": [f[1] for f in _HDR_FIELDS], "offsets": offsets,
                     "itemsize": record_size})


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


FRAME_SIZE = 24  # sizeof(ddp_frame), checked in Session.start


@dataclass(frozen=True)
class CodeInfo:
    qualname: str
    filename: str
    firstlineno: int
    linetable: bytes


# Resolutions are kept for the process, not per session: a notebook profiles many cells in
# one kernel, and every cffi call releases the GIL, so a drain that resolved its frames
# anew each session handed the GIL to the profiled thread and back at each call (~40 per
# session of the asyncio benchmark: one context switch each for the profiled thread).
# Keys carry the fingerprint, so a reused address never lends a name (see Resolver).
_CACHE_MAX = 100_000  # entries of each cache; past it a cache starts over
_code_cache: dict[tuple[int, int], "CodeInfo"] = {}  # (code, fingerprint) -> CodeInfo
_frame_cache: dict[tuple[int, int, int], object] = {}  # (code, fingerprint, lasti) -> model.Frame


def _cache_put(cache: dict, key, value) -> None:
    if len(cache) >= _CACHE_MAX:
        cache.clear()
        if cache is _code_cache:  # the C "known" filter says which code this cache holds
            lib.ddp_known_clear()
    cache[key] = value


class Resolver:
    """Captured (code pointer, fingerprint, lasti) -> Frame, with the GIL, never unsafely.

    The native side reads the code object through process_vm_readv (a freed object's
    memory cannot crash us), checks its type and that its fingerprint — a hash of its
    qualname and filename *contents*, firstlineno and size, taken at sample time — still
    matches: a recycled address holding another function can therefore never lend its
    name.  Sampled code objects that die before a drain (a module's ``<module>`` code once
    its import ends, exec'd strings) are resolved as they die, into the graveyard: by a
    code watcher on 3.12+, by a wrapper of ``PyCode_Type``'s dealloc on 3.11.  Residual
    risk: a new code object at the same address with the same qualname, filename,
    firstlineno and size but a different body could give a sample a wrong *line* (never a
    wrong name).
    """

    def __init__(self):
        self._codes = _code_cache
        self._info = ffi.new("ddp_code_info *")
        self._qcap, self._fcap, self._lcap = 512, 2048, 1 << 16
        self._alloc()
        self.unresolved = 0

    def _alloc(self):
        self._q = ffi.new("char[]", self._qcap)
        self._f = ffi.new("char[]", self._fcap)
        self._lt = ffi.new("uint8_t[]", self._lcap)

    def _grow(self):
        i = self._info
        self._qcap = max(self._qcap, i.qualname_len + 1)
        self._fcap = max(self._fcap, i.filename_len + 1)
        self._lcap = max(self._lcap, i.linetable_len + 1)
        self._alloc()

    def _take(self) -> CodeInfo:
        i = self._info
        return CodeInfo(
            ffi.unpack(self._q, i.qualname_len).decode("utf-8", "surrogatepass"),
            ffi.unpack(self._f, i.filename_len).decode("utf-8", "surrogatepass"),
            int(i.firstlineno),
            ffi.unpack(ffi.cast("char *", self._lt), i.linetable_len),
        )

    def absorb_graveyard(self) -> int:
        """Move code objects that died while profiling into the cache."""
        n = 0
        if not lib.ddp_graveyard_len:  # (a variable: no cffi call, no GIL handoff)
            return 0
        while True:
            rc = lib.ddp_graveyard_pop(self._info, self._q, self._qcap, self._f, self._fcap, self._lt, self._lcap)
            if rc == 0:
                return n
            if rc == 2:
                self._grow()
                continue
            _cache_put(self._codes, (int(self._info.code), int(self._info.fp)), self._take())
            n += 1

    def code(self, code: int, fp: int) -> CodeInfo | None:
        key = (code, fp)
        found = self._codes.get(key)
        if found is not None:
            return found
        for _ in range(2):
            rc = lib.ddp_resolve_code(code, fp, self._info, self._q, self._qcap, self._f, self._fcap, self._lt, self._lcap)
            if rc == 1:
                self._grow()
                continue
            if rc == 0:
                found = self._take()
                _cache_put(self._codes, key, found)
                return found
            break
        # It may have died since the last look at the graveyard: look again.
        if self.absorb_graveyard():
            return self._codes.get(key)
        return None

    def line(self, info: CodeInfo, lasti: int) -> int:
        buf = ffi.from_buffer(info.linetable) if info.linetable else ffi.NULL
        return int(lib.ddp_addr2line(buf, len(info.linetable), info.firstlineno, lasti))


SMALL_BATCH = 128  # records; see RecordConverter.feed


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
        self.base_labels = dict(base_labels or {})
        self.skipped_invalid = 0
        self.unknown_frames = 0
        self._dtype = None
        self.alloc = None  # allocations: an _alloc.AllocTracker when ALLOC is sampled (set by the engine)
        self.waits = None  # lock/park: a lockpark.WaitClassifier when LOCK/PARK are sampled (set by the engine)

    def _frame_id(self, code: int, fp: int, lasti: int) -> int | None:
        key = (code, fp, lasti)
        fid = self._frames.get(key)
        if fid is not None:
            return fid
        frame = _frame_cache.get(key)
        if frame is None:
            info = self.resolver.code(code, fp)
            if info is None:
                return None
            frame = self._Frame(info.qualname, info.filename, self.resolver.line(info, lasti), info.firstlineno)
            _cache_put(_frame_cache, key, frame)
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
        frames = np.frombuffer(raw, dtype=np.dtype([("code", "<u8"), ("fp", "<u8"), ("lasti", "<i4"), ("fl", "<i4")]))
        for code, fp, lasti, _fl in frames.tolist():
            fid = self._frame_id(code, fp, lasti)
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
        sid = self.builder.stack_id(ids)
        if complete:  # an [unknown] may resolve later (graveyard): do not pin it
            self._stacks[key] = sid
        return sid

    def _stack_ids(self, mv, rows: np.ndarray, hdr, record_size: int) -> np.ndarray:
        """Stack ids of records ``rows``: one look-up per distinct stack_hash.  The hash only
        groups: records grouped together are checked to have equal frame bytes (numpy), and a
        group's bytes are compared with the cached stack's, so a collision costs time
        (per-record look-ups for that group), never a wrong stack."""
        hsize = ffi.sizeof("ddp_record")
        keep = lib.DDP_REC_TRUNCATED | lib.DDP_REC_GC
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
        and, for an asyncio task's id, ``task=<name>``.  Every new task brings a new id (a
        few per drain wake), so the rest is built once per (set, state) and the task's name
        added last, one ``plus``."""
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
            if state in STATE_LABELS:
                base = base.plus("state", STATE_LABELS[state])
            self._base_sets[(low, state)] = base
        if low == label_id:
            return base
        name = _labeling.task_name(label_id)
        if name is None or "task" in self.base_labels:  # (the base labels win, as for any label)
            return base
        return base.plus("task", name)

    def feed(self, buf, n: int, record_size: int) -> int:
        """Add ``n`` records from ``buf`` (a cffi buffer); returns the rows added.

        Big batches (the buffer a quarter full, the last drain) go through numpy, one
        look-up per distinct value.  The usual drain holds a few dozen records, where
        numpy's fixed costs (~10 us per call with the caches cold from the profiled code)
        dominated: a drain cost ~1 ms of CPU under the GIL.  A batch of at most
        ``SMALL_BATCH`` records is therefore converted record by record, in Python,
        through the same caches."""
        if n <= 0:
            return 0
        if self._dtype is None or self._dtype.itemsize != record_size:
            self._dtype = _record_dtype(record_size)
            self._records = _header_struct(record_size)
        mv = ffi.buffer(buf, n * record_size)
        if n <= SMALL_BATCH or (self.alloc is not None and self._all_alloc(mv, n, record_size)):
            # ALLOC-only batches (~170 per 100 ms at the default rate) too: on a drain's cold caches
            # numpy's fixed costs exceed the loop's for batches this small
            return self._feed_small(mv, record_size)
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
        if self.alloc is not None:  # allocations: held for the type leaf (_alloc.py)
            is_alloc = events == EventType.ALLOC.value
            if is_alloc.any():
                rows = np.flatnonzero(ok & is_alloc)
                # field, then rows: hdr[rows] would copy whole records (sized for max_depth, ~3 KB each)
                cols = (hdr[f][rows].tolist() for f in ("flags", "depth", "tid", "label_id", "ts_ns", "count", "value", "aux"))
                self._feed_alloc(mv, zip(rows.tolist(), *cols), record_size)
                ok &= ~is_alloc
        special = np.zeros(n, dtype=bool)
        if self.waits is not None:
            special |= (events == EventType.LOCK.value) | (events == EventType.PARK.value)
        rows = np.flatnonzero(ok & ~special)
        added = 0
        if len(rows):
            ev = events[rows]
            wall = EventType.WALL.value  # state is kept for WALL rows only (zeroed here for the others)
            state = np.where(ev == wall, hdr["state"][rows], 0).astype(np.uint64)
            labels = hdr["label_id"][rows]
            if int(labels.max()) < 1 << 56:  # one int64 key per (label set, state)
                lab = self._map((labels << np.uint64(8)) | state, lambda k: self._labels_id(k >> 8, k & 255, wall))
            else:
                lab = np.fromiter((self._labels_id(a, b, wall) for a, b in zip(labels.tolist(), state.tolist())),
                                  dtype=np.int64, count=len(rows))
            self.builder.add_many(
                ev,
                self._stack_ids(mv, rows, hdr, record_size),
                self._map(hdr["tid"][rows], self._thread_id),
                lab,
                np.maximum(hdr["ts_ns"][rows] - self.start_mono_ns, 0),
                np.stack([hdr["count"][rows], hdr["value"][rows]], axis=1),
            )
            added = len(rows)
        if special.any():
            srows = np.flatnonzero(ok & special)
            # field, then rows: hdr[rows] would copy whole records (sized for max_depth, ~3 KB each)
            cols = [hdr[f][srows].tolist() for f in ("event", "state", "flags", "depth", "tid", "label_id", "ts_ns",
                                                    "count", "value", "aux")]
            added += self._feed_special(mv, list(zip(srows.tolist(), *cols)), record_size)
        return added

    def _all_alloc(self, mv, n: int, record_size: int) -> bool:
        """Every record of the batch is ALLOC (their event bytes, read without numpy)."""
        events = memoryview(mv)[self._event_off :: record_size].tobytes()
        return len(events) == n and events.count(EventType.ALLOC.value) == n

    def _feed_small(self, mv, record_size: int) -> int:
        """``feed`` for a small or an ALLOC-only batch, record by record: the same rows, in the
        same order.  ALLOC rows are made here too, in the same loop (an alloc session's drain
        sees ~1,700 of them a second on an allocation-heavy cell, under the GIL)."""
        hsize = ffi.sizeof("ddp_record")
        keep = lib.DDP_REC_TRUNCATED | lib.DDP_REC_GC
        invalid = lib.DDP_REC_INVALID
        wall = EventType.WALL.value
        alloc_ev = EventType.ALLOC.value if self.alloc is not None else -1
        special_ev = {EventType.LOCK.value, EventType.PARK.value} if self.waits is not None else set()
        exclude, start, by_hash, events = self.exclude, self.start_mono_ns, self._by_hash, self._events
        threads, labels = self._threads, self._labels
        rows, allocs, special = [], [], []
        # struct, not hdr.tolist() (3.6k Ir per record); iter_unpack walks the batch in one call.  ALLOC
        # rows are made here, in the same loop, and held as they are: a second pass costs more per record
        for i, (ev, state, flags, depth, tid, label_id, ts, count, value, aux, h) in enumerate(
                self._records.iter_unpack(mv)):
            if flags & invalid:  # torn reads: already counted as dropped in C
                self.skipped_invalid += 1
                continue
            if tid in exclude:
                continue
            if ev not in events:
                EventType.from_id(ev)  # raises: never cast an unknown id
            if ev in special_ev:  # the fields already read, for _feed_special
                special.append((i, ev, state, flags, depth, tid, label_id, ts, count, value, aux))
                continue
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
            if ev == alloc_ev:  # held for its type leaf (_alloc.py), as (sample id, row)
                lb = labels.get((label_id, 0))
                if lb is None:
                    lb = self._labels_id(label_id, 0, ev)
                allocs.append((aux, sid, th, lb, ts - start if ts > start else 0, count, value))
                continue
            rows.append((ev, sid, th, self._labels_id(label_id, state if ev == wall else 0, wall),
                         ts - start if ts > start else 0, count, value))
        self.builder.add_rows(rows)
        added = len(rows)
        if allocs:
            self.alloc.hold_many(allocs)
        if special:
            added += self._feed_special(mv, special, record_size)
        return added

    def _feed_alloc(self, mv, recs, record_size: int) -> None:
        """ALLOC records of a big mixed batch (``feed``'s numpy path), as (index, flags, depth, tid,
        label_id, ts, count, value, aux), to the AllocTracker.  Small and ALLOC-only batches, the
        usual drain of an alloc session, make their ALLOC rows in ``_feed_small``'s loop instead."""
        hsize = ffi.sizeof("ddp_record")
        keep = lib.DDP_REC_TRUNCATED | lib.DDP_REC_GC
        stacks, threads, labels = self._stacks, self._threads, self._labels
        alloc, t0 = EventType.ALLOC.value, self.start_mono_ns
        out = []
        for i, flags, depth, tid, label_id, ts, count, value, aux in recs:
            off = i * record_size + hsize
            fl = flags & keep
            raw = mv[off : off + depth * FRAME_SIZE]
            sid = stacks.get((fl, raw))
            if sid is None:
                sid = self._stack_id(fl, raw)
            th = threads.get(tid)
            if th is None:
                th = self._thread_id(tid)
            lb = labels.get((label_id, 0))
            if lb is None:
                lb = self._labels_id(label_id, 0, alloc)
            out.append((aux, sid, th, lb, ts - t0 if ts > t0 else 0, count, value))
        self.alloc.hold_many(out)

    def _feed_special(self, mv, items, record_size: int) -> int:
        """LOCK/PARK records, one at a time: their consumer reclassifies them.  ``items``: per
        record (row, event, state, flags, depth, tid, label_id, ts_ns, count, value, aux), the
        header fields as the caller already read them: re-reading them here with numpy cost
        ~11 calls per drain, ~150 us with the caches cold (bench_locks, lock/park drain)."""
        hsize = ffi.sizeof("ddp_record")
        keep = lib.DDP_REC_TRUNCATED | lib.DDP_REC_GC
        lock, park, t0 = EventType.LOCK.value, EventType.PARK.value, self.start_mono_ns
        stacks, threads, labels = self._stacks, self._threads, self._labels
        out = []
        for i, ev_id, state, flags, depth, tid, label_id, ts, count, value, aux in items:
            off = i * record_size + hsize
            fl = flags & keep
            raw = mv[off : off + depth * FRAME_SIZE]
            sid = stacks.get((fl, raw))
            if sid is None:
                sid = self._stack_id(fl, raw)
            if self.waits is not None and (ev_id == lock or ev_id == park):
                # lock/park: the final event and the leaf pseudo-frame, from the stack (lockpark.py)
                ev_id, sid = self.waits.classify(aux, sid)
                if ev_id is None:
                    continue
            th = threads.get(tid)
            lb = labels.get((label_id, 0))  # (the state is kept for WALL rows only)
            out.append((int(ev_id), sid, self._thread_id(tid) if th is None else th,
                        self._labels_id(label_id, state, ev_id) if lb is None else lb, max(0, ts - t0), count, value))
        self.builder.add_rows(out)  # (event ids: known LOCK/PARK ids or from self._events)
        return len(out)


# -- sessions ------------------------------------------------------------------------------
READ_MODES = {"guarded": 0, "syscall": 1}


_scratch = {"buf": None, "size": 0}


def _drain_buffer(nbytes: int):
    """The process's drain buffer, kept between sessions (only one runs at a time; a
    session holds its own reference, so a replaced buffer lives on while it is used).
    Never freed on purpose: freeing a malloc'd block of megabytes makes glibc raise its
    mmap threshold (up to 32 MiB), after which every thread arena keeps megabytes of
    freed memory and RSS creeps over start/stop cycles.  Only a larger need replaces it."""
    if _scratch["size"] < nbytes:
        _scratch["buf"], _scratch["size"] = ffi.new("char[]", nbytes), nbytes
    return _scratch["buf"]


class Session:
    """One native sampling session (the C side allows one per process at a time)."""

    BATCH = 1024

    def __init__(self, interval_ns: int, max_depth: int, events, *, ring_records: int = 0, agg_keys: int = 0,
                 wall_threads_per_tick: int = 0, read_mode: str = "guarded", exclude_tids=(),
                 alloc_rate: int = 0, native_alloc: bool = False, wait_threshold_ns: int = 0,
                 wait_max_rate: int = 0, merge_wall: bool = True, drain_early: bool = True, drain_new_code: bool = True,
                 merge_shadow: bool = False):
        """``merge_wall``: identical WALL samples of a thread within one Profile time tick
        become one record (exact; off = one record per sample).  ``drain_early``: ``wait()``
        returns once the buffer is a quarter full; ``drain_new_code``: once samples name code
        no ``drain`` has resolved (0.1 s after the last wake at the earliest).  ``merge_shadow``
        (tests): every WALL sample is also written on its own with aux = 1, to check merged
        records against."""
        _require()
        if ffi.sizeof("ddp_frame") != FRAME_SIZE:
            raise EngineUnavailableError("native module's frame record has an unexpected size; reinstall ddprof_nb")
        if read_mode not in READ_MODES:
            raise ValueError(f"invalid read_mode {read_mode!r}; expected one of {', '.join(READ_MODES)}")
        if len(exclude_tids) > 8:
            raise ValueError("at most 8 excluded threads")
        cfg = ffi.new("ddp_config *")
        cfg.interval_ns = int(interval_ns)
        cfg.max_depth = int(max_depth)
        mask = 0
        for e in events:
            mask |= 1 << EventType.parse(e).value
        cfg.events = mask
        cfg.ring_records = int(ring_records)
        cfg.agg_keys = int(agg_keys)  # keys per native aggregate, 0 = default
        cfg.wall_threads_per_tick = int(wall_threads_per_tick)
        cfg.read_mode = READ_MODES[read_mode]
        cfg.n_exclude = len(exclude_tids)
        for i, t in enumerate(exclude_tids):
            cfg.exclude_tids[i] = int(t)
        cfg.alloc_rate = int(alloc_rate)  # allocations: mean bytes between samples, 0 = default
        cfg.native_alloc = int(bool(native_alloc))  # allocations: also C allocations of extension modules
        cfg.wait_threshold_ns = int(wait_threshold_ns)  # lock/park: short-wait sampling threshold, 0 = default
        cfg.wait_max_rate = int(wait_max_rate)  # lock/park: records per second, 0 = default
        if merge_wall:
            # the Profile's time ticks: merging stays exact
            cfg.merge_tick_ns, cfg.merge_max_ticks = MIN_TICK_NS, MAX_TICKS
        cfg.drain_early = int(bool(drain_early))
        cfg.drain_new_code = int(bool(drain_new_code))
        cfg.merge_shadow = int(bool(merge_shadow))
        self._cfg = cfg
        self.record_size = 0
        self._buf = None  # drain()'s half of the process's drain buffer
        self._wait_buf = None  # wait()'s half: it takes records there without holding _lock
        self._taken = 0  # records wait() took into _wait_buf, not yet fed
        self._waiting = False  # a wait() is in its C call, writing into _wait_buf after _taken
        self._taken_out = ffi.new("int *")
        self._lock = threading.Lock()  # guards the fields above (the C side lets one consumer pop at a time)

    def start(self) -> None:
        # the drain buffer is allocated before start, so the allocation sampler never sees it
        size = ffi.sizeof("ddp_record") + self._cfg.max_depth * FRAME_SIZE
        _drain_buffer(2 * size * self.BATCH)
        check(lib.ddp_start(self._cfg), "cannot start the native sampler")
        self.record_size = lib.ddp_record_size()
        buf = _drain_buffer(2 * self.record_size * self.BATCH)
        self._buf, self._wait_buf = buf, buf + self.record_size * self.BATCH

    def stop(self) -> None:
        check(lib.ddp_stop(), "cannot stop the native sampler")

    def release(self) -> None:
        lib.ddp_release()

    def drain(self, converter: RecordConverter, final: bool = False) -> int:
        """Move the ready records into ``converter``; returns how many were read.  A wake's
        drain stops at the records ``wait`` took if they did not fill a batch (the ring was
        empty then: later ones wait for the next wake); the ``final`` drain empties the ring."""
        with self._lock:
            if self._buf is None:
                return 0
            converter.resolver.absorb_graveyard()
            try:
                return self._feed_ready(converter, final)
            finally:
                if converter.new_codes:  # one cffi call (a GIL handoff) per wake that met new code
                    codes, fps = zip(*converter.new_codes)
                    converter.new_codes.clear()
                    lib.ddp_known_add(ffi.new("uint64_t[]", codes), ffi.new("uint64_t[]", fps), len(codes))

    def _feed_ready(self, converter: RecordConverter, final: bool) -> int:
        total = 0
        if self._taken and not self._waiting:  # (a wait in its C call writes after them: its own drain feeds them)
            total, self._taken = self._taken, 0  # taken by wait(); short of a batch, the ring was empty then
            converter.feed(self._wait_buf, total, self.record_size)
            if total < self.BATCH and not final:
                return total
        while True:
            n = lib.ddp_drain(self._buf, self.BATCH)
            if n < 0:
                check(n, "cannot drain the native sampler")
            if n == 0:
                return total
            converter.feed(self._buf, n, self.record_size)
            total += n
            if n < self.BATCH:
                return total

    def wait(self, timeout_s: float) -> int:
        """Block, without the GIL, until the drain has work (a ``DDP_WAKE_*`` mask; 0 on
        timeout) or the session stops (-1).  Unless stopped, the records ready then are
        taken into the wait buffer in the same C call, for the next ``drain``: every cffi
        call releases the GIL, so a wake that waited, then called ``ddp_drain``, handed the
        GIL to the profiled thread and back once more (a context switch of that thread).
        One thread waits; ``drain`` may run meanwhile from any thread (``_lock`` is not held
        while blocked)."""
        with self._lock:
            if self._buf is None:
                return -1
            if self._waiting:
                raise RuntimeError("another thread is already waiting on this session")
            # records taken earlier but not fed yet (a wake whose drain was skipped at stop): never over them
            held, self._waiting = self._taken, True
        rc = -1
        self._taken_out[0] = 0
        try:
            rc = lib.ddp_drain_wait_take(max(0, int(timeout_s * 1e9)), self._wait_buf + held * self.record_size,
                                         self.BATCH - held, self._taken_out)
        finally:
            with self._lock:
                self._taken, self._waiting = held + max(0, self._taken_out[0]), False
        if rc < 0 and rc != lib.DDP_ENOTRUNNING:
            check(rc, "cannot drain the native sampler")
        return rc if rc >= 0 else -1

    @staticmethod
    def stats() -> dict:
        s = ffi.new("ddp_stats *")
        lib.ddp_get_stats(s)
        out = {name: getattr(s, name) for name in (
            "timer_failures", "threads_seen", "threads_overflow", "stale_signals", "faults", "handler_ns",
            "handler_calls", "wall_ticks", "wall_ns", "wall_records", "wall_unchanged", "graveyard_overflow",
            "read_mode", "segv_replaced",
            "start_mono_ns", "stop_mono_ns", "timer_errno", "cpu_used_ns", "cpu_sampled_ns", "prof_replaced",
            "parked_at_start", "leaked_bytes", "agg_in", "agg_out", "agg_full", "agg_bytes",
            "agg_folded")}
        for name in ("samples", "dropped_full", "dropped_torn", "carried_full"):
            out[name] = {e: int(getattr(s, name)[e.value]) for e in EventType}
        return out


def wait_stats() -> dict:
    """Lock/park hook counters (native/waits.c): patched slots, records, sampled-out, dropped."""
    s = ffi.new("ddp_wait_stats *")
    lib.ddp_wait_get_stats(s)
    return {name: int(getattr(s, name)) for name in (
        "records", "short_skipped", "rate_dropped", "emit_failed", "calls", "objects", "slots_patched",
        "slots_foreign", "restore_mismatch", "restore_unloaded", "active_patches", "threshold_ns",
        "protect_failed", "passes", "edge_records", "kinds_patched", "kinds_foreign")}


def cpu_thread_totals() -> dict[int, tuple[int, int]]:
    """After a session's stop, before its release: {tid: (CPU its clock says it used, CPU its
    samples carried)} for each thread that had a CPU timer in the session, those that exited
    too (a tid that left Python and came back is summed)."""
    n = lib.ddp_cpu_thread_totals(ffi.NULL, ffi.NULL, ffi.NULL, 0)
    if n <= 0:
        return {}
    tid, used, sampled = ffi.new("int32_t[]", n), ffi.new("int64_t[]", n), ffi.new("int64_t[]", n)
    n = min(n, lib.ddp_cpu_thread_totals(tid, used, sampled, n))
    totals: dict[int, tuple[int, int]] = {}
    for i in range(n):
        u, s = totals.get(tid[i], (0, 0))
        totals[tid[i]] = (u + used[i], s + sampled[i])
    return totals


def after_fork_child() -> None:
    """In a forked child: forget the parent's session (C state is reset by pthread_atfork)."""
    if lib is not None:
        lib.ddp_release()
