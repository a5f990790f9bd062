"""The explorer's top table: rows of a view (or of a diff) grouped by function, line or
file, their order, and their cells as text."""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from .. import aggregate
from ..events import EventType, FrameKind
from ..model import CSRStacks, Frame, Profile
from ..render.format import format_signed, format_value, value_label, value_unit

__all__ = ["Row", "GROUPS", "top_rows", "first_rows", "sort_rows", "columns", "cells", "SORT_KEYS"]

GROUPS = ("function", "line", "file")


class Row(NamedTuple):
    """One function (line, file): self and total in the event's quantity (time, bytes)
    and in its count (samples, objects), and the change of the total in a diff."""

    name: str
    filename: str
    line: int
    kind: FrameKind
    self: int
    total: int
    self_n: int
    total_n: int
    change: float = 0.0

    @property
    def key(self) -> tuple:
        return (self.name, self.filename, self.line, self.kind)


def _by_file(view: Profile) -> Profile:
    """Every frame replaced by its file (pseudo-frames stay): ``top`` by function then
    counts each file once per stack.  Per frame, not per stack entry: the stacks table
    is mapped in numpy (a large profile holds a million entries)."""
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


def _top(view: Profile, event: EventType, group: str) -> dict[tuple, list[int]]:
    if group not in GROUPS:
        raise ValueError(f"group={group!r}: expected one of {', '.join(GROUPS)}")
    if group == "file":
        view, group = _by_file(view), "function"
    out: dict[tuple, list[int]] = {}
    for vi in (1, 0):
        for r in aggregate.top(view, event, n=None, by=group, value_index=vi):
            vals = out.setdefault((r.name, r.filename, r.line, r.kind), [0, 0, 0, 0])
            vals[2 * (1 - vi)], vals[2 * (1 - vi) + 1] = r.self, r.total
    return out


def top_rows(view: Profile, event: EventType, group: str = "function", before: Profile | None = None,
             normalize: bool = True) -> list[Row]:
    """Every function (line, file) of ``view``; with ``before``, also the change of each
    total (``before`` scaled to ``view``'s total when ``normalize``)."""
    after = _top(view, event, group)
    if before is None:
        return [Row(*k, *v) for k, v in after.items()]
    earlier = _top(before, event, group)
    tb, ta = before.total(event, 1), view.total(event, 1)
    scale = ta / tb if (normalize and tb and ta) else 1.0
    rows = []
    for k in after.keys() | earlier.keys():
        v = after.get(k, [0, 0, 0, 0])
        rows.append(Row(*k, *v, v[1] - earlier.get(k, [0, 0, 0, 0])[1] * scale))
    return rows


SORT_KEYS = {
    "self": lambda r: (-r.self, -r.total, r.name),
    "total": lambda r: (-r.total, -r.self, r.name),
    "self_n": lambda r: (-r.self_n, -r.total_n, r.name),
    "total_n": lambda r: (-r.total_n, -r.self_n, r.name),
    "change": lambda r: (-abs(r.change), r.name),
    "name": lambda r: (r.name.lower(), r.filename, r.line),
}


_BY_NUMBER = ("self", "total", "self_n", "total_n")


def first_rows(view: Profile, event: EventType, group: str, how: str, n: int, before: Profile | None = None,
               normalize: bool = True) -> list[Row]:
    """The first ``n`` rows in the order ``how``: what the table shows.

    Sorted by a number and without a diff, rows are made only for the functions whose
    number reaches the ``n``-th largest (ties included, so the order is the one
    ``sort_rows`` gives over every row): a large profile has thousands of functions and
    making a Row of each took most of a table refresh."""
    if before is not None or how not in _BY_NUMBER:
        return sort_rows(top_rows(view, event, group, before, normalize), how)[:n]
    if group not in GROUPS:
        raise ValueError(f"group={group!r}: expected one of {', '.join(GROUPS)}")
    if n <= 0:
        return []
    if group == "file":
        view, group = _by_file(view), "function"
    reps, s1, t1 = aggregate.top_values(view, event, group, 1)
    _, s0, t0 = aggregate.top_values(view, event, group, 0)
    idx = np.flatnonzero((t1 > 0) | (t0 > 0))
    key = {"self": s1, "total": t1, "self_n": s0, "total_n": t0}[how][idx]
    if len(idx) > n:
        idx = idx[key >= np.partition(key, len(key) - n)[len(key) - n]]
    idx = idx[np.lexsort((-t1[idx], -s1[idx]))]  # top_rows' order, for ties sort_rows keeps
    by_function = group == "function"
    rows = [Row(reps[i].name, reps[i].filename, reps[i].first_line if by_function else reps[i].line, reps[i].kind,
                int(s1[i]), int(t1[i]), int(s0[i]), int(t0[i])) for i in idx]
    return sort_rows(rows, how)[:n]


def sort_rows(rows: list[Row], how: str) -> list[Row]:
    """Largest first for the numbers (the change by its size), A-Z for the name."""
    if how not in SORT_KEYS:
        raise ValueError(f"sort={how!r}: expected one of {', '.join(SORT_KEYS)}")
    return sorted(rows, key=SORT_KEYS[how])


def columns(event: EventType, diff: bool, group: str) -> list[dict]:
    """The table's columns: ``key`` (a sort key, or "" for none), ``label``, ``numeric``."""
    q, n = value_label(event, 1), value_label(event, 0)
    cols = [
        dict(key="self", label=f"self {q}", numeric=True), dict(key="", label="self %", numeric=True),
        dict(key="total", label=f"total {q}", numeric=True), dict(key="", label="total %", numeric=True),
        dict(key="self_n", label=f"self {n}", numeric=True), dict(key="total_n", label=f"total {n}", numeric=True),
    ]
    if diff:
        cols.append(dict(key="change", label=f"change of total {q}", numeric=True))
    cols += [dict(key="name", label=group, numeric=False), dict(key="", label="where", numeric=False)]
    return cols


def cells(row: Row, event: EventType, total: float, diff: bool, group: str) -> list[str]:
    """A row's cells as text, in ``columns``' order (full names: the table scrolls)."""
    unit, count_unit = value_unit(event, 1), value_unit(event, 0)
    pct = (lambda v: f"{100 * v / total:.1f}%") if total else (lambda v: "")
    out = [format_value(row.self, unit), pct(row.self), format_value(row.total, unit), pct(row.total),
           format_value(row.self_n, count_unit), format_value(row.total_n, count_unit)]
    if diff:
        out.append(format_signed(row.change, unit))
    if not row.filename:
        where = row.kind.label
    elif group == "file":
        where = row.filename
    else:
        where = f"{row.filename}:{row.line}"
    return out + [row.name, where]
