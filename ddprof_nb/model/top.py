"""Top rows: each function (line, or file) of one event with its self and total, in the
event's quantity (time, bytes) and in its count (samples, objects), and, against an
earlier profile, the change of its total.  The one row type and the one diff that every
table reads: the text and HTML reports, the interactive report and the explorer."""

from __future__ import annotations

import os
from typing import NamedTuple, Sequence

import numpy as np

from ..events import EventType, FrameKind
from .data import CSRStacks, Frame
from .selection import memo, sorted_unique

__all__ = ["GROUPS", "SELF", "SORT_KEYS", "Row", "top", "top_values", "by_file"]

GROUPS = ("function", "line", "file")


class Row(NamedTuple):
    """One function (line, file): self and total in the event's quantity (time, bytes) and
    in its count (samples, objects), and in a diff the change of the total."""

    name: str
    filename: str
    line: int  # the line for by="line", the function's first line for by="function", 0 for a file
    kind: FrameKind
    self: int  # where it is the leaf
    total: int  # where it is anywhere in the stack (once per stack, however it recurses)
    self_n: int
    total_n: int
    change: float = 0.0  # total minus the earlier profile's (scaled to this total when normalized)

    @property
    def key(self) -> tuple:
        return (self.name, self.filename, self.line, self.kind)

    def values(self, value_index: int = 1) -> tuple[int, int]:
        """(self, total) in the quantity (1) or the count (0): the profile's value columns."""
        return (self.self, self.total) if value_index == 1 else (self.self_n, self.total_n)


def _where(r: Row) -> tuple:
    return (r.name, r.filename, r.line, r.kind.value)


# total orders (ties end at the row's key): the first n rows are the same however they were made
SORT_KEYS = {
    "self": lambda r: (-r.self, -r.total, _where(r)),
    "total": lambda r: (-r.total, -r.self, _where(r)),
    "self_n": lambda r: (-r.self_n, -r.total_n, _where(r)),
    "total_n": lambda r: (-r.total_n, -r.self_n, _where(r)),
    "change": lambda r: (-abs(r.change), _where(r)),
    "name": lambda r: (r.name.lower(), _where(r)),
}
_BY_NUMBER = ("self", "total", "self_n", "total_n")
SELF = ("self_n", "self")  # the sort by self of a value column: SELF[value_index]


def top_values(profile: Profile, event, by: str = "function", value_index: int = 1):
    """``top``'s numbers as arrays, for callers that need a few rows of many: a
    representative frame per function (or line), and its self and total (int64 arrays,
    zero where absent)."""
    if by not in ("function", "line"):
        raise ValueError(f"top(by={by!r}): expected 'function' or 'line'")
    e = EventType.parse(event)
    rows = profile.event == e.value
    weights = np.zeros(len(profile.stacks), dtype=np.int64)
    np.add.at(weights, profile.stack[rows], profile.values[rows, value_index])
    # which frames group together, and which (stack, key) pairs exist, depend on the
    # tables only: computed once per table, then each call is two scatter-adds
    frame_key, reps = memo((profile.frames,), ("top-keys", by), lambda: _frame_keys(profile.frames, by))
    nkeys = len(reps)
    leaf_stack, leaf_key, pair_stack, pair_key = memo(
        (profile.stacks, profile.frames), ("top-pairs", by), lambda: _top_pairs(profile, frame_key, nkeys))
    self_v = np.zeros(nkeys, dtype=np.int64)
    total_v = np.zeros(nkeys, dtype=np.int64)
    np.add.at(self_v, leaf_key, weights[leaf_stack])
    np.add.at(total_v, pair_key, weights[pair_stack])
    return reps, self_v, total_v


def _frame_keys(frames: Sequence[Frame], by: str) -> tuple[np.ndarray, list[Frame]]:
    """Key index per frame (its function, or its line) and a representative frame per key."""
    keys: dict[tuple, int] = {}
    frame_key = np.empty(len(frames), dtype=np.int64)
    reps: list[Frame] = []
    for i, f in enumerate(frames):
        k = f.function_key if by == "function" else (f.name, f.filename, f.line, f.kind)
        idx = keys.get(k)
        if idx is None:
            idx = keys[k] = len(reps)
            reps.append(f)
        frame_key[i] = idx
    return frame_key, reps


def _top_pairs(profile: Profile, frame_key: np.ndarray, nkeys: int):
    """(stack, leaf key) of each non-empty stack, and every distinct (stack, key) pair
    (so a recursive function counts once per stack), as int32 arrays."""
    flat, offsets = profile.flat_stacks()
    lengths = np.diff(offsets)
    nonempty = np.flatnonzero(lengths > 0)
    leaf_key = frame_key[flat[offsets[nonempty + 1] - 1]] if len(nonempty) else np.zeros(0, np.int64)
    stack_of_pos = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    pair = sorted_unique(stack_of_pos * max(1, nkeys) + frame_key[flat]) if len(flat) else np.zeros(0, np.int64)
    return (nonempty.astype(np.int32), leaf_key.astype(np.int32),
            (pair // max(1, nkeys)).astype(np.int32), (pair % max(1, nkeys)).astype(np.int32))


def by_file(view: Profile) -> Profile:
    """Every frame replaced by its file (pseudo-frames stay): grouped by function, each file
    then counts once per stack.  Per frame, not per stack entry: the stacks table is mapped
    in numpy (a large profile holds a million entries)."""
    frames = list(view.frames)
    index: dict[Frame, int] = {}
    target = np.arange(len(frames), dtype=np.int64)
    for i, f in enumerate(view.frames):
        if f.filename:
            ff = Frame(os.path.basename(f.filename) or f.filename, f.filename, 0, 0, f.kind)
            j = index.get(ff)
            if j is None:
                j = index[ff] = len(frames)
                frames.append(ff)
            target[i] = j
    flat, offsets = view.flat_stacks()
    return view.replace(frames=tuple(frames), stacks=CSRStacks(target[flat], offsets))


def _grouped(view: Profile, by: str) -> tuple[Profile, str]:
    if by not in GROUPS:
        raise ValueError(f"top(by={by!r}): expected one of {', '.join(GROUPS)}")
    return (by_file(view), "function") if by == "file" else (view, by)


def _numbers(view: Profile, event: EventType, by: str):
    """Representative frames and (self, total, self_n, total_n) arrays of every group."""
    view, by = _grouped(view, by)
    reps, s1, t1 = top_values(view, event, by, 1)
    _, s0, t0 = top_values(view, event, by, 0)
    line = (lambda f: f.first_line) if by == "function" else (lambda f: f.line)
    return reps, line, s1, t1, s0, t0


def _row(reps, line, s1, t1, s0, t0, i: int) -> Row:
    f = reps[i]
    return Row(f.name, f.filename, line(f), f.kind, int(s1[i]), int(t1[i]), int(s0[i]), int(t0[i]))


def _all_rows(view: Profile, event: EventType, by: str) -> dict[tuple, Row]:
    nums = _numbers(view, event, by)
    s1, t1, s0, t0 = nums[2:]
    rows = (_row(*nums, i) for i in np.flatnonzero((t1 > 0) | (t0 > 0)).tolist())
    return {r.key: r for r in rows}


def _diff_rows(view: Profile, event: EventType, by: str, before: Profile, normalize: bool) -> list[Row]:
    after, earlier = _all_rows(view, event, by), _all_rows(before, event, by)
    tb, ta = before.total(event, 1), view.total(event, 1)
    scale = ta / tb if (normalize and tb and ta) else 1.0
    rows = []
    for k in after.keys() | earlier.keys():
        r = after.get(k) or Row(*k, 0, 0, 0, 0)
        was = earlier[k].total if k in earlier else 0
        rows.append(r._replace(change=r.total - was * scale))
    return rows


def top(profile: Profile, event=None, n: int | None = 20, by: str = "function", *, sort: str = "self",
        before: Profile | None = None, normalize: bool = True) -> list[Row]:
    """The first ``n`` rows (``None``: all) of one event grouped ``by`` function, line or
    file, in the order ``sort`` (a number largest first, ``change`` by its size, ``name``
    A-Z).  ``event`` defaults to the profile's first.  With ``before``: every row of either
    profile, with ``change`` = its total here minus its total there, ``before`` scaled to
    this profile's total when ``normalize``.

    Sorted by a number without a diff, rows are made only for the groups whose number
    reaches the ``n``-th largest (ties included, so the order is the one over every row):
    a large profile has thousands of functions."""
    if sort not in SORT_KEYS:
        raise ValueError(f"sort={sort!r}: expected one of {', '.join(SORT_KEYS)}")
    if event is None:
        if not profile.events:
            _grouped(profile, by)  # (a bad group is still an error)
            return []
        event = profile.events[0]
    event = EventType.parse(event)
    if n is not None and n <= 0:
        _grouped(profile, by)
        return []
    if before is not None:
        return sorted(_diff_rows(profile, event, by, before, normalize), key=SORT_KEYS[sort])[:n]
    if sort not in _BY_NUMBER or n is None:
        return sorted(_all_rows(profile, event, by).values(), key=SORT_KEYS[sort])[:n]
    nums = _numbers(profile, event, by)
    s1, t1, s0, t0 = nums[2:]
    idx = np.flatnonzero((t1 > 0) | (t0 > 0))
    key = {"self": s1, "total": t1, "self_n": s0, "total_n": t0}[sort][idx]
    if len(idx) > n:
        idx = idx[key >= np.partition(key, len(key) - n)[len(key) - n]]
    return sorted((_row(*nums, i) for i in idx.tolist()), key=SORT_KEYS[sort])[:n]
