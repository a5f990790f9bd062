"""The Profile model: interned frames, stacks, threads and label sets, plus aggregated samples.

A Profile is immutable once built.  Samples are stored column-wise (numpy) and are
already aggregated: rows with the same (event, stack, thread, labels, time tick) were
merged and their values added (pprof semantics).  Memory therefore grows with unique
stacks x time ticks (at most ``MAX_TICKS`` ticks per profile), not with raw samples.

Stacks are tuples of frame indexes, root first.  Every event has exactly two values
(count, quantity) as declared in native/events.h; ``values[:, 1]`` is the primary
quantity in the event's unit (nanoseconds or bytes).

Only ``events`` is imported from the package: it is the leaf table everything shares.

Size: over 600 lines as one module because it is one data model: the interned types
(Frame, LabelSet, Thread, Metadata), the Profile and the ProfileBuilder share the column
layout, the interning and the aggregation rules (``aggregate_columns``, ``tick_for``,
``CSRStacks``); the builder writes exactly what the Profile reads, so they change together.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import platform
import socket
import threading
from dataclasses import dataclass, field
import bisect
import collections.abc as _abc
from typing import Iterable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from .events import EventType, FrameKind, ValueType

__all__ = [
    "Frame",
    "LabelSet",
    "Thread",
    "Metadata",
    "Sample",
    "Profile",
    "ProfileBuilder",
    "ValueType",
    "MAX_TICKS",
    "MIN_TICK_NS",
]

MAX_TICKS = 256  # time resolution of a profile: at most this many ticks over its duration
MIN_TICK_NS = 1_000_000  # 1 ms; ticks are MIN_TICK_NS * 2**k so coarsening is exact
MAX_LABEL_KEY = 64  # characters; longer keys/values are truncated with an ellipsis
MAX_LABEL_VALUE = 256


@dataclass(frozen=True, slots=True)
class Frame:
    """One stack frame: a function (or pseudo-frame) at a line.

    ``name`` is the qualified name (``Class.method``); pseudo-frames use a bracketed
    name (``[GC]``, ``[truncated]``) and their own ``kind``.
    """

    name: str
    filename: str = ""
    line: int = 0
    first_line: int = 0
    kind: FrameKind = FrameKind.PYTHON

    @property
    def function_key(self) -> tuple:
        """Identity of the function, line excluded (used by top tables and folding)."""
        return (self.name, self.filename, self.first_line, self.kind)

    def label(self, with_line: bool = True) -> str:
        """Human form ``qualname (file:line)``; pseudo-frames are just their name."""
        if self.kind is not FrameKind.PYTHON or not self.filename:
            return self.name
        return f"{self.name} ({self.filename}:{self.line if with_line else self.first_line})"


def _clip(text: str, limit: int) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class LabelSet:
    """An interned, sorted set of ``key=value`` string labels with a 64-bit hash.

    Sorting and hashing happen once, at creation; equal sets are the same object
    (``LabelSet.of`` interns), so aggregation compares ids, never sorts per sample.
    Over-long keys/values are truncated (``MAX_LABEL_KEY``/``MAX_LABEL_VALUE``).
    """

    __slots__ = ("items", "hash64", "__weakref__")
    _interned: dict[tuple, "LabelSet"] = {}
    _lock = threading.Lock()

    items: tuple[tuple[str, str], ...]
    hash64: int

    def __new__(cls, *args, **kwargs):  # pragma: no cover - guard
        raise TypeError("use LabelSet.of(...) to create label sets")

    @classmethod
    def of(cls, labels: "LabelSet | Mapping[str, object] | Iterable[tuple[str, object]] | None" = None) -> "LabelSet":
        """The interned LabelSet for ``labels`` (a mapping, pairs, a LabelSet, or None)."""
        if isinstance(labels, LabelSet):
            return labels
        # (a dict first: typing's isinstance is ~1 us, and the drain makes a set per new task)
        pairs = labels.items() if type(labels) is dict or isinstance(labels, _abc.Mapping) else (labels or ())
        items = tuple(
            sorted({_clip(k, MAX_LABEL_KEY): _clip(v, MAX_LABEL_VALUE) for k, v in pairs}.items())
        )
        return cls._intern(items)

    @classmethod
    def _intern(cls, items: tuple) -> "LabelSet":
        """The one LabelSet of ``items`` (clipped, sorted by key, keys unique)."""
        found = cls._interned.get(items)
        if found is not None:
            return found
        with cls._lock:
            found = cls._interned.get(items)
            if found is None:
                found = object.__new__(cls)
                found.items = items
                # (only ever a dict key: Python's own tuple hash, not a digest; the drain
                # makes a set per new asyncio task, where a blake2b cost a third of it)
                found.hash64 = hash(items) & 0xFFFF_FFFF_FFFF_FFFF
                cls._interned[items] = found
            return found

    def plus(self, key: str, value: object) -> "LabelSet":
        """This set with one label added (or replaced): ``merged({key: value})`` without
        rebuilding the rest (the drain adds a task's name, or a wall sample's state, to
        every new task's set)."""
        key, value = _clip(key, MAX_LABEL_KEY), _clip(value, MAX_LABEL_VALUE)
        items = [kv for kv in self.items if kv[0] != key]
        bisect.insort(items, (key, value))
        return LabelSet._intern(tuple(items))

    def __hash__(self) -> int:
        return self.hash64

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, LabelSet) and self.items == other.items)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def get(self, key: str, default=None):
        for k, v in self.items:
            if k == key:
                return v
        return default

    def as_dict(self) -> dict[str, str]:
        return dict(self.items)

    def merged(self, extra: "Mapping[str, object] | LabelSet | None") -> "LabelSet":
        """A new interned set with ``extra``'s labels added (they win on equal keys)."""
        if not extra:
            return self
        base = dict(self.items)
        # (extra's labels unclipped here: of() clips every key and value, later ones winning)
        base.update(extra.items if isinstance(extra, LabelSet) else
                    extra.items() if type(extra) is dict or isinstance(extra, _abc.Mapping) else extra)
        return LabelSet.of(base)

    def __repr__(self) -> str:
        return "LabelSet(" + ", ".join(f"{k}={v!r}" for k, v in self.items) + ")"


EMPTY_LABELS = LabelSet.of()

if hasattr(os, "register_at_fork"):  # a lock held by another thread at fork stays held in the child
    os.register_at_fork(after_in_child=lambda: setattr(LabelSet, "_lock", threading.Lock()))


class Thread(NamedTuple):
    """A profiled thread: the OS thread id (or a synthetic id) and its name."""

    tid: int
    name: str


@dataclass(frozen=True)
class Metadata:
    """Facts about how and where a profile was taken.

    ``start_ns``/``end_ns`` are epoch nanoseconds; sample times are relative to ``start_ns``.
    ``dropped`` counts samples lost per event type (full buffers, torn reads), so a
    profile always says what it does not contain.
    """

    start_ns: int = 0
    end_ns: int = 0
    interval_ns: int = 0
    engine: str = ""
    python_version: str = field(default_factory=lambda: platform.python_version())
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)
    dropped: Mapping[EventType, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    def replace(self, **changes) -> "Metadata":
        return dataclasses.replace(self, **changes)


class Sample(NamedTuple):
    """One aggregated sample, as handed out by ``Profile.samples()``."""

    event: EventType
    stack: tuple[Frame, ...]  # root first
    thread: Thread
    labels: LabelSet
    time_ns: int  # start of its time tick, relative to Metadata.start_ns
    values: tuple[int, int]  # (count, quantity) in the event's value types


def tick_for(duration_ns: int) -> int:
    """The time tick for a profile of this duration: MIN_TICK_NS * 2**k, <= MAX_TICKS ticks."""
    if duration_ns <= MIN_TICK_NS * MAX_TICKS:
        return MIN_TICK_NS
    return MIN_TICK_NS << math.ceil(math.log2(duration_ns / (MIN_TICK_NS * MAX_TICKS)))


def aggregate_columns(
    event: np.ndarray, stack: np.ndarray, thread: np.ndarray, labels: np.ndarray, time: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Merge rows with equal keys (event, stack, thread, labels, time), summing values.

    Returns the six columns, sorted by key.  Keys are packed into one int64 when they
    fit (the usual case), else sorted lexicographically; either way O(n log n) in numpy.
    """
    n = len(event)
    if n == 0:
        return event, stack, thread, labels, time, values
    cols = [np.asarray(c, dtype=np.int64) for c in (event, stack, thread, labels, time)]
    lo = [int(c.min()) for c in cols]
    widths = [max(1, int(int(c.max()) - l).bit_length()) for c, l in zip(cols, lo)]
    if sum(widths) <= 63:
        key = np.zeros(n, dtype=np.int64)
        for c, l, w in zip(cols, lo, widths):
            key = (key << w) | (c - l)
        order = np.argsort(key, kind="stable")
        skey = key[order]
        boundary = np.empty(n, dtype=bool)
        boundary[0] = True
        np.not_equal(skey[1:], skey[:-1], out=boundary[1:])
    else:
        order = np.lexsort(cols[::-1])
        boundary = np.zeros(n, dtype=bool)
        boundary[0] = True
        for c in cols:
            sc = c[order]
            boundary[1:] |= sc[1:] != sc[:-1]
    starts = np.flatnonzero(boundary)
    first = order[starts]
    summed = np.add.reduceat(np.asarray(values, dtype=np.int64)[order], starts, axis=0)
    return (
        np.asarray(event, dtype=np.uint8)[first],
        np.asarray(stack, dtype=np.int32)[first],
        np.asarray(thread, dtype=np.int32)[first],
        np.asarray(labels, dtype=np.int32)[first],
        np.asarray(time, dtype=np.int64)[first],
        summed,
    )


class CSRStacks(Sequence):
    """A stacks table held in CSR form (frame indexes end to end, and offsets); each
    stack is made into its tuple only when asked for.  Transforms that rewrite every
    stack (``aggregate.filter(hide=...)``) build this instead of tens of thousands of
    tuples that the explorer, working on the CSR form, would never look at."""

    __slots__ = ("flat", "offsets")

    def __init__(self, flat: np.ndarray, offsets: np.ndarray):
        self.flat = np.asarray(flat, dtype=np.int32)
        self.offsets = np.asarray(offsets, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self)[i]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("stack index out of range")
        return tuple(self.flat[self.offsets[i]:self.offsets[i + 1]].tolist())

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        vals = self.flat.tolist()
        bounds = self.offsets.tolist()
        return (tuple(vals[a:b]) for a, b in zip(bounds, bounds[1:]))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == tuple(b) for a, b in zip(self, other))

    __hash__ = None

    def __reduce__(self):  # pickles (children, dask workers) as the plain tuple table
        return (tuple, (tuple(self),))


# a Profile's row columns, in the order aggregate_columns and ProfileBuilder give them
COLUMNS = ("event", "stack", "thread", "labels", "time_ns", "values")
FIELDS = ("frames", "stacks", "threads", "labelsets") + COLUMNS + ("metadata", "tick_ns")


def columns(cols: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """The six row columns (as aggregate_columns returns them) by name, for ``Profile.replace``."""
    return dict(zip(COLUMNS, cols, strict=True))


class Profile:
    """An immutable, aggregated profile.  Build one with ``ProfileBuilder``.

    Tables: ``frames`` (Frame), ``stacks`` (tuples of frame indexes, root first),
    ``threads`` (Thread), ``labelsets`` (LabelSet).  Columns, one row per unique
    (event, stack, thread, labels, tick): ``event`` uint8, ``stack``/``thread``/
    ``labels`` int32 indexes, ``time_ns`` int64 tick start, ``values`` int64 (n, 2).
    Transforms (``filter``, ``merge``, ``diff``…) return new Profiles, made with ``replace``.
    Every field is given by name: twelve positional arguments read as a riddle.
    """

    def __init__(
        self,
        *,
        frames: Sequence[Frame],
        stacks: Sequence[tuple[int, ...]],
        threads: Sequence[Thread],
        labelsets: Sequence[LabelSet],
        event: np.ndarray,
        stack: np.ndarray,
        thread: np.ndarray,
        labels: np.ndarray,
        time_ns: np.ndarray,
        values: np.ndarray,
        metadata: Metadata,
        tick_ns: int = MIN_TICK_NS,
    ):
        self.frames = tuple(frames)
        self.stacks = stacks if isinstance(stacks, CSRStacks) else tuple(stacks)
        self.threads = tuple(threads)
        self.labelsets = tuple(labelsets)
        self.event = np.asarray(event, dtype=np.uint8)
        self.stack = np.asarray(stack, dtype=np.int32)
        self.thread = np.asarray(thread, dtype=np.int32)
        self.labels = np.asarray(labels, dtype=np.int32)
        self.time_ns = np.asarray(time_ns, dtype=np.int64)
        self.values = np.asarray(values, dtype=np.int64).reshape(-1, 2)
        self.metadata = metadata
        self.tick_ns = tick_ns
        self._flat: tuple[np.ndarray, np.ndarray] | None = None
        if isinstance(self.stacks, CSRStacks):
            self._flat = (self.stacks.flat, self.stacks.offsets)
        n = len(self.event)
        if not all(len(c) == n for c in (self.stack, self.thread, self.labels, self.time_ns, self.values)):
            raise ValueError("Profile columns must all have the same length")
        for col, table, what in (
            (self.stack, self.stacks, "stack"),
            (self.thread, self.threads, "thread"),
            (self.labels, self.labelsets, "label set"),
        ):
            if n and (int(col.min()) < 0 or int(col.max()) >= len(table)):
                raise ValueError(f"Profile {what} index out of range")
        if n:
            EventType.from_id(int(self.event.max()))  # unknown event ids fail here

    # -- basic facts -----------------------------------------------------------------
    def __len__(self) -> int:
        """Number of aggregated sample rows."""
        return len(self.event)

    def __repr__(self) -> str:
        ev = ", ".join(f"{e.label}={self.total(e):,}{e.display_unit}" for e in self.events)
        return f"<Profile {len(self)} rows, {len(self.stacks)} stacks, {len(self.threads)} threads; {ev}>"

    @property
    def events(self) -> tuple[EventType, ...]:
        """Event types present, in table order."""
        present = set(np.unique(self.event).tolist())
        return tuple(e for e in EventType if e.value in present)

    def total(self, event, value_index: int = 1) -> int:
        """Sum of one value (default: the primary quantity) over all samples of ``event``."""
        e = EventType.parse(event)
        return int(self.values[self.event == e.value, value_index].sum())

    @property
    def dropped(self) -> Mapping[EventType, int]:
        return self.metadata.dropped

    def stack_frames(self, stack_index: int) -> tuple[Frame, ...]:
        return tuple(self.frames[i] for i in self.stacks[stack_index])

    def samples(self) -> Iterator[Sample]:
        """Every aggregated row as a ``Sample`` (convenient, not fast)."""
        for i in range(len(self)):
            yield Sample(
                EventType.from_id(int(self.event[i])),
                self.stack_frames(int(self.stack[i])),
                self.threads[int(self.thread[i])],
                self.labelsets[int(self.labels[i])],
                int(self.time_ns[i]),
                (int(self.values[i, 0]), int(self.values[i, 1])),
            )

    def flat_stacks(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR form of ``stacks``: (frame indexes concatenated, offsets of len(stacks)+1)."""
        if self._flat is None:
            lengths = np.fromiter((len(s) for s in self.stacks), dtype=np.int64, count=len(self.stacks))
            offsets = np.zeros(len(self.stacks) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            flat = np.fromiter(
                (f for s in self.stacks for f in s), dtype=np.int32, count=int(offsets[-1])
            )
            self._flat = (flat, offsets)
        return self._flat

    def replace(self, **changes) -> "Profile":
        """This profile with some fields replaced (tables, columns, ``metadata``, ``tick_ns``);
        the rest is shared, and so is the stacks table's flat form while ``stacks`` stays."""
        unknown = set(changes) - set(FIELDS)
        if unknown:
            raise TypeError(f"Profile has no field(s) {', '.join(sorted(unknown))}")
        out = Profile(**{name: changes[name] if name in changes else getattr(self, name) for name in FIELDS})
        if "stacks" not in changes and out._flat is None:
            out._flat = self._flat
        return out

    def with_metadata(self, **changes) -> "Profile":
        """The same samples with metadata fields replaced."""
        return self.replace(metadata=self.metadata.replace(**changes))

    # -- transforms (implemented in aggregate.py; each returns a new Profile) -----------
    def filter(self, **criteria) -> "Profile":
        """A view: see ``aggregate.filter`` for the criteria (events, threads, labels,
        time_range, focus, ignore, hide)."""
        from . import aggregate

        return aggregate.filter(self, **criteria)

    def top(self, event=None, n: int | None = 20, by: str = "function", sort: str = "self",
            before: "Profile | None" = None, normalize: bool = True):
        """Top rows of ``event`` (name, filename, line, kind, self, total, their counts, and a
        diff's change against ``before``), grouped by function, line or file; see ``top.top``."""
        from . import top

        return top.top(self, event, n=n, by=by, sort=sort, before=before, normalize=normalize)

    # -- call-tree transforms (implemented in transforms.py; each returns a new Profile) --
    def sandwich(self, function, event=None) -> "tuple[Profile, Profile]":
        """``(callers, callees)`` of ``function`` (a name or a Frame), merged over all its
        call sites; see ``transforms.sandwich``."""
        from . import transforms

        return transforms.sandwich(self, function, event)

    def inverted(self) -> "Profile":
        """The bottom-up profile (stacks reversed: roots are leaves, self time first)."""
        from . import transforms

        return transforms.inverted(self)

    def merge_function(self, pattern: str) -> "Profile":
        """The frames matching ``pattern`` removed; their time goes to their caller."""
        from . import transforms

        return transforms.merge_function(self, pattern)

    def drop_function(self, pattern: str) -> "Profile":
        """Without the samples whose stack holds a frame matching ``pattern``."""
        from . import transforms

        return transforms.drop_function(self, pattern)

    def collapse_recursion(self, pattern: str | None = None, *, direct_only: bool = False) -> "Profile":
        """Recursion (direct and indirect) collapsed: each function once per stack; see
        ``transforms.collapse_recursion``."""
        from . import transforms

        return transforms.collapse_recursion(self, pattern, direct_only=direct_only)

    def collapse_module(self, pattern: str) -> "Profile":
        """Consecutive frames of the files matching ``pattern`` (a package, a file) as one frame."""
        from . import transforms

        return transforms.collapse_module(self, pattern)

    def save(self, path, **options) -> None:
        """Write to ``path``; the format follows its name (see ``exporters.save``)."""
        from . import exporters

        exporters.save(self, path, **options)

    def to_html(self, path, **options) -> None:
        """A self-contained HTML report (flame graph + top table) that opens offline."""
        from .exporters import html

        html.write(self, path, **options)


_PENDING_ROWS = 4096  # rows added one by one are held as tuples (~200 bytes each) up to this many


class ProfileBuilder:
    """Accumulates raw samples and interns frames, stacks, threads and labels.

    Ingestion is batched: ``add_many`` takes numpy columns; ``add`` buffers single rows.
    Raw rows are compacted (aggregated) whenever ``compact_every`` accumulate, so the
    builder's memory stays proportional to unique keys.  ``build()`` returns the Profile.
    Not thread-safe: one consumer owns a builder.
    """

    def __init__(self, metadata: Metadata | None = None, compact_every: int = 2_000_000):
        self.metadata = metadata or Metadata()
        self._frames: dict[Frame, int] = {}
        self._stacks: dict[tuple[int, ...], int] = {}
        self._threads: dict[Thread, int] = {}
        self._labelsets: dict[LabelSet, int] = {EMPTY_LABELS: 0}
        self._chunks: list[tuple[np.ndarray, ...]] = []
        self._pending: list[tuple[int, int, int, int, int, int, int]] = []
        self._raw_rows = 0
        self._compact_every = compact_every
        self._tick_ns = MIN_TICK_NS
        self._max_time = 0
        # a live view's running aggregate (ddprof_nb.live): called with every batch of rows as
        # it arrives, in the consumer's thread, as tap(builder, event, stack, thread, labels, time, values)
        self.tap = None

    # -- interning ----------------------------------------------------------------------
    def frame_id(self, frame: Frame) -> int:
        fid = self._frames.get(frame)
        if fid is None:
            fid = self._frames[frame] = len(self._frames)
        return fid

    def stack_id(self, frame_ids: Sequence[int]) -> int:
        """Index of the stack (frame indexes, root first)."""
        key = tuple(frame_ids)
        sid = self._stacks.get(key)
        if sid is None:
            sid = self._stacks[key] = len(self._stacks)
        return sid

    def stack_of(self, frames: Sequence[Frame]) -> int:
        """Index of the stack made of these frames (root first)."""
        return self.stack_id([self.frame_id(f) for f in frames])

    def thread_id(self, tid: int, name: str = "") -> int:
        key = Thread(int(tid), name or f"Thread {tid}")
        idx = self._threads.get(key)
        if idx is None:
            idx = self._threads[key] = len(self._threads)
        return idx

    def rename_thread(self, index: int, name: str) -> None:
        """Give thread ``index`` a name learnt late (its samples keep their thread); a no-op
        when that (tid, name) is already a thread of its own."""
        old = next(k for k, v in self._threads.items() if v == index)
        new = Thread(old.tid, name)
        if new not in self._threads:
            self._threads = {(new if k == old else k): v for k, v in self._threads.items()}

    def labels_id(self, labels: "LabelSet | Mapping[str, object] | None") -> int:
        ls = LabelSet.of(labels)
        idx = self._labelsets.get(ls)
        if idx is None:
            idx = self._labelsets[ls] = len(self._labelsets)
        return idx

    # -- samples ------------------------------------------------------------------------
    def add(self, event, stack_id: int, thread_id: int, labels_id: int, time_ns: int, count: int, quantity: int) -> None:
        """Add one raw sample (time relative to metadata.start_ns)."""
        self._pending.append((EventType.parse(event).value, stack_id, thread_id, labels_id, time_ns, count, quantity))
        if len(self._pending) >= _PENDING_ROWS:
            self._flush_pending()

    def add_rows(self, rows: list[tuple[int, int, int, int, int, int, int]]) -> None:
        """Add raw samples given as (event id, stack id, thread id, labels id, time_ns,
        count, quantity) tuples, event ids already checked (the native drain's small
        batches: cheaper than columns for a few dozen rows)."""
        self._pending.extend(rows)
        if len(self._pending) >= _PENDING_ROWS:
            self._flush_pending()

    def add_many(self, event, stack_ids, thread_ids, labels_ids, times_ns, values) -> None:
        """Add raw samples as columns.  ``event`` is one EventType or an array of ids;
        ``values`` has shape (n, 2)."""
        stack_ids = np.asarray(stack_ids, dtype=np.int32)
        n = len(stack_ids)
        if n == 0:
            return
        if isinstance(event, (EventType, str)):
            ev = np.full(n, EventType.parse(event).value, dtype=np.uint8)
        else:
            ev = np.asarray(event, dtype=np.uint8)
            for v in np.flatnonzero(np.bincount(ev)).tolist():  # (np.unique costs ~10x on small arrays)
                EventType.from_id(int(v))
        t = np.asarray(times_ns, dtype=np.int64)
        vals = np.asarray(values, dtype=np.int64).reshape(n, 2)
        thr = np.broadcast_to(np.asarray(thread_ids, dtype=np.int32), (n,))
        lab = np.broadcast_to(np.asarray(labels_ids, dtype=np.int32), (n,))
        self._max_time = max(self._max_time, int(t.max()))
        self._chunks.append((ev, stack_ids, thr, lab, t, vals))
        self._raw_rows += n
        if self.tap is not None:
            self.tap(self, ev, stack_ids, thr, lab, t, vals)
        if self._raw_rows >= self._compact_every:
            self._compact()

    def flush(self) -> None:
        """Hand the rows added one by one to ``add_many`` now (and so to ``tap``), not when
        ``_PENDING_ROWS`` of them have gathered: a live view reads what was drained so far."""
        self._flush_pending()

    def interned_since(self, n_frames: int, n_stacks: int) -> tuple[list, list, list]:
        """The frames and stacks interned after the first ``n_frames`` / ``n_stacks`` (ids
        are given in order, so these are the ids from there on), and every thread so far."""
        frames = list(itertools.islice(self._frames, n_frames, None)) if len(self._frames) > n_frames else []
        stacks = list(itertools.islice(self._stacks, n_stacks, None)) if len(self._stacks) > n_stacks else []
        return frames, stacks, list(self._threads)

    def _flush_pending(self) -> None:
        if not self._pending:
            return
        arr = np.array(self._pending, dtype=np.int64)
        self._pending = []
        self.add_many(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4], arr[:, 5:7])

    def _compact(self, final_tick: int | None = None) -> None:
        tick = final_tick or max(self._tick_ns, tick_for(self._max_time))
        ev, st, th, lb, t, vals = (np.concatenate(c) for c in zip(*self._chunks))
        t = (t // tick) * tick
        self._chunks = [aggregate_columns(ev, st, th, lb, t, vals)]
        self._raw_rows = len(self._chunks[0][0])
        self._tick_ns = tick

    def build(self, end_ns: int | None = None) -> Profile:
        """The aggregated Profile.  ``end_ns`` (epoch) closes the metadata's time range."""
        self._flush_pending()
        meta = self.metadata
        if end_ns is not None:
            meta = meta.replace(end_ns=end_ns)
        elif not meta.end_ns:
            meta = meta.replace(end_ns=meta.start_ns + self._max_time)
        tick = max(self._tick_ns, tick_for(max(meta.duration_ns, self._max_time)))
        if self._chunks:
            self._compact(final_tick=tick)
            cols = self._chunks[0]
        else:
            cols = (np.zeros(0, np.uint8), np.zeros(0, np.int32), np.zeros(0, np.int32),
                    np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros((0, 2), np.int64))
        return Profile(
            frames=list(self._frames),
            stacks=list(self._stacks),
            threads=list(self._threads),
            labelsets=list(self._labelsets),
            event=cols[0], stack=cols[1], thread=cols[2], labels=cols[3], time_ns=cols[4], values=cols[5],
            metadata=meta,
            tick_ns=tick,
        )
