"""The explorer's top table as text: its columns and each row's cells (the rows are
``top.top``'s)."""

from __future__ import annotations

from ..events import EventType
from ..render.format import format_signed, format_value, value_label, value_unit
from ..model.top import Row

__all__ = ["columns", "cells"]

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
