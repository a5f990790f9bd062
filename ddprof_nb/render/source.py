"""Per-line values of one function, beside its source text.

Pure: the caller passes the function that reads a file's lines (the explorer reads
them from ``linecache``, where IPython registers notebook cells).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..events import EventType
from ..model import Frame, Profile
from .format import value_unit
from .tree import shared_csr, stack_weights, unique_sorted

__all__ = ["SourceLine", "SourceView", "source_view"]


@dataclass
class SourceLine:
    line: int
    text: str | None  # None when the source is not available
    self: int
    total: int


@dataclass
class SourceView:
    """A function's source lines with per-line self and total values."""

    name: str
    filename: str
    first_line: int
    unit: str
    lines: list[SourceLine]
    total: int  # the function's total (counted once per stack)
    has_source: bool


def _block_end(lines: list[str], first: int) -> int:
    """Last line (1-based) of the def/class starting at ``first``, by indentation."""
    if not 0 < first <= len(lines):
        return first
    head = lines[first - 1]
    indent = len(head) - len(head.lstrip())
    i = first
    # skip decorators and the (maybe multi-line) signature up to the colon line
    while i < len(lines) and not lines[i - 1].rstrip().endswith(":"):
        i += 1
    end = i
    for j in range(i + 1, len(lines) + 1):
        text = lines[j - 1]
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        if len(text) - len(text.lstrip()) <= indent:
            break
        end = j
    return end


def source_view(profile: Profile, event, function, value_index: int = 1, max_lines: int = 400,
                read_lines: Callable[[str], list[str]] | None = None) -> SourceView:
    """Per-line values of one function, with its source from ``read_lines(filename)``
    (no source without it: sampled lines only).

    ``function`` is a Frame or a (name, filename, first_line) tuple.  A line's total
    counts each stack once; its self counts stacks whose leaf is that line.
    """
    e = EventType.parse(event)
    if isinstance(function, Frame):
        name, filename, first = function.name, function.filename, function.first_line
    else:
        name, filename, first = function
    w = stack_weights(profile, e, value_index)
    sel = np.fromiter(
        (f.name == name and f.filename == filename and f.first_line == first for f in profile.frames),
        dtype=bool,
        count=len(profile.frames),
    )
    line_of = np.fromiter((f.line for f in profile.frames), dtype=np.int64, count=len(profile.frames))
    flat, offsets = shared_csr(profile)
    per_self: dict[int, int] = {}
    per_total: dict[int, int] = {}
    func_total = 0
    if len(flat) and sel.any():
        lengths = np.diff(offsets)
        stack_of_pos = np.repeat(np.arange(len(lengths)), lengths)
        hit = sel[flat] & (w[stack_of_pos] != 0)
        hp = np.flatnonzero(hit)
        hs = stack_of_pos[hp]
        hl = line_of[flat[hp]]
        maxl = int(hl.max()) + 1 if len(hl) else 1
        pairs = unique_sorted(hs * maxl + hl)
        ps, pl = pairs // maxl, pairs % maxl
        tot = np.zeros(maxl, dtype=np.int64)
        np.add.at(tot, pl, w[ps])
        func_total = int(w[unique_sorted(hs)].sum())
        leaf_pos = offsets[1:][lengths > 0] - 1
        leaf_stack = np.flatnonzero(lengths > 0)
        lh = sel[flat[leaf_pos]] & (w[leaf_stack] != 0)  # lines of weightless stacks may pass maxl
        slf = np.zeros(maxl, dtype=np.int64)
        np.add.at(slf, line_of[flat[leaf_pos[lh]]], w[leaf_stack[lh]])
        for ln in np.flatnonzero(tot).tolist():
            per_total[ln] = int(tot[ln])
            per_self[ln] = int(slf[ln])
    src = read_lines(filename) if read_lines is not None and filename else []
    sampled = sorted(per_total)
    if src:
        start = max(1, min([first] + sampled)) if first else max(1, min(sampled or [1]))
        head = src[first - 1].lstrip() if 0 < first <= len(src) else ""
        if head.startswith(("def ", "async def ", "class ", "@")):
            end = _block_end(src, first)
        else:
            end = max(sampled or [start]) + 2
        end = max([end] + sampled)
        end = min(end, len(src), start + max_lines - 1)
        lines = [
            SourceLine(i, src[i - 1].rstrip("\n"), per_self.get(i, 0), per_total.get(i, 0))
            for i in range(start, end + 1)
        ]
    else:
        lines = [SourceLine(i, None, per_self[i], per_total[i]) for i in sampled]
    return SourceView(name, filename, first, value_unit(e, value_index), lines, func_total, bool(src))

