"""The data of a profile: interned frames, label sets and threads, metadata, the row columns
and their aggregation, and the interning tables every new Profile's tables come from.

Stacks are tuples of frame indexes, root first.  Every event has exactly two values
(count, quantity) as declared in native/events.h; ``values[:, 1]`` is the primary
quantity in the event's unit (nanoseconds or bytes).  Rows with the same (event, stack,
thread, labels, time tick) are merged and their values added (pprof semantics), so memory
grows with unique stacks x time ticks (at most ``MAX_TICKS`` ticks per profile).

Only ``events`` is imported from the package: it is the leaf table everything shares.
"""

from __future__ import annotations

import bisect
import collections.abc as _abc
import dataclasses
import itertools
import math
import os
import platform
import socket
import threading
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from ..events import EventType, FrameKind

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
    # Frames key the dicts that intern stacks: a 100-deep stack is 100 look-ups, and the
    # generated hash (a tuple of the fields, an enum's among them) cost ~1.5 us each: ~1 s of
    # a cell's stop for an import-heavy session.  Computed once; never pickled (str hashes
    # differ between processes: __reduce__ rebuilds the frame).
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash((self.name, self.filename, self.line, self.first_line, self.kind.value)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        return (Frame, (self.name, self.filename, self.line, self.first_line, self.kind))

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
    stack (``selection.filter(hide=...)``) build this instead of tens of thousands of
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



class Interner:
    """Index tables of frames, stacks, threads and label sets: equal items get one index,
    handed out in order.  ``ProfileBuilder`` is one; the algebra's transforms that
    re-intern stacks use one directly and hand ``tables()`` to ``Profile.replace``."""

    def __init__(self):
        self._frames: dict[Frame, int] = {}
        self._stacks: dict[tuple[int, ...], int] = {}
        self._threads: dict[Thread, int] = {}
        self._labelsets: dict[LabelSet, int] = {EMPTY_LABELS: 0}

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

    def stacks_of(self, profile) -> list[int]:
        """Indexes of every stack of ``profile`` (a Profile), in its order: each of its
        frames looked up once, not once per stack it is in."""
        flat, offsets = profile.flat_stacks()
        lut = np.full(len(profile.frames), -1, dtype=np.int64)
        for i in np.unique(flat).tolist():
            lut[i] = self.frame_id(profile.frames[i])
        ids, bounds = lut[flat].tolist(), offsets.tolist()
        return [self.stack_id(ids[a:b]) for a, b in zip(bounds, bounds[1:])]

    def frame_ids(self, frames: Sequence[Frame]) -> "FrameIds":
        """Stacks of these Frame objects interned by identity (``FrameIds``)."""
        return FrameIds(self, frames)


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

    def interned_since(self, n_frames: int, n_stacks: int) -> tuple[list, list, list]:
        """The frames and stacks interned after the first ``n_frames`` / ``n_stacks`` (ids
        are given in order, so these are the ids from there on), and every thread so far."""
        frames = list(itertools.islice(self._frames, n_frames, None)) if len(self._frames) > n_frames else []
        stacks = list(itertools.islice(self._stacks, n_stacks, None)) if len(self._stacks) > n_stacks else []
        return frames, stacks, list(self._threads)

    def tables(self) -> dict[str, list]:
        """The four tables by name, for ``Profile.replace``."""
        return dict(frames=list(self._frames), stacks=list(self._stacks),
                    threads=list(self._threads), labelsets=list(self._labelsets))


class FrameIds:
    """An Interner's stack look-up for stacks made mostly of one frame table's Frame objects
    (a profile's, sliced or reordered by a transform): each of those is looked up once, then
    found by identity; any other frame by value."""

    def __init__(self, tables: Interner, frames: Sequence[Frame]):
        self._tables = tables
        self._frames = frames  # (kept alive: the identities below stay theirs)
        self._index = {id(f): i for i, f in enumerate(frames)}
        self._ids = [-1] * len(frames)

    def stack_of(self, frames: Sequence[Frame]) -> int:
        index, ids, frame_id = self._index, self._ids, self._tables.frame_id
        out = []
        for f in frames:
            i = index.get(id(f))
            if i is None:
                out.append(frame_id(f))
                continue
            fid = ids[i]
            if fid < 0:
                fid = ids[i] = frame_id(f)
            out.append(fid)
        return self._tables.stack_id(out)
