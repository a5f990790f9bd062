"""The Profile: an immutable, aggregated profile, and its algebra as methods.

Each method is one call into the module that implements it (``selection``, ``calltree``,
``top``); those modules read a Profile's fields and make new ones with ``replace``, so
they never import this one.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Mapping, Sequence

import numpy as np

from ..events import EventType
from . import calltree, selection, top as _top
from .data import FIELDS, MIN_TICK_NS, CSRStacks, Frame, LabelSet, Metadata, Sample, Thread

__all__ = ["Profile"]

class Profile:
    """An immutable, aggregated profile.  Build one with ``ProfileBuilder``.

    Tables: ``frames`` (Frame), ``stacks`` (tuples of frame indexes, root first),
    ``threads`` (Thread), ``labelsets`` (LabelSet).  Columns, one row per unique
    (event, stack, thread, labels, tick): ``event`` uint8, ``stack``/``thread``/
    ``labels`` int32 indexes, ``time_ns`` int64 tick start, ``values`` int64 (n, 2).
    Transforms (``filter``, ``inverted``, ``top``…) return new Profiles, made with ``replace``.
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
            flat = np.fromiter(itertools.chain.from_iterable(self.stacks), dtype=np.int32, count=int(offsets[-1]))
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

    # -- the algebra (each returns a new Profile; files are written by ddprof_nb.save) -----
    def filter(self, **criteria) -> "Profile":
        """A view: see ``selection.filter`` for the criteria (events, threads, labels,
        time_range, focus, ignore, hide)."""
        return selection.filter(self, **criteria)

    def top(self, event=None, n: int | None = 20, by: str = "function", sort: str = "self",
            before: "Profile | None" = None, normalize: bool = True):
        """Top rows of ``event`` (name, filename, line, kind, self, total, their counts, and a
        diff's change against ``before``), grouped by function, line or file; see ``top.top``."""
        return _top.top(self, event, n=n, by=by, sort=sort, before=before, normalize=normalize)

    def sandwich(self, function, event=None) -> "tuple[Profile, Profile]":
        """``(callers, callees)`` of ``function`` (a name or a Frame), merged over all its
        call sites; see ``calltree.sandwich``."""
        return calltree.sandwich(self, function, event)

    def inverted(self) -> "Profile":
        """The bottom-up profile (stacks reversed: roots are leaves, self time first)."""
        return calltree.inverted(self)

    def merge_function(self, pattern: str) -> "Profile":
        """The frames matching ``pattern`` removed; their time goes to their caller."""
        return calltree.merge_function(self, pattern)

    def drop_function(self, pattern: str) -> "Profile":
        """Without the samples whose stack holds a frame matching ``pattern``."""
        return calltree.drop_function(self, pattern)

    def collapse_recursion(self, pattern: str | None = None, *, direct_only: bool = False) -> "Profile":
        """Recursion (direct and indirect) collapsed: each function once per stack; see
        ``calltree.collapse_recursion``."""
        return calltree.collapse_recursion(self, pattern, direct_only=direct_only)

    def collapse_module(self, pattern: str) -> "Profile":
        """Consecutive frames of the files matching ``pattern`` (a package, a file) as one frame."""
        return calltree.collapse_module(self, pattern)
