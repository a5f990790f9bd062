"""The explorer's top table: rows of a view (or of a diff), their order and their labels."""

from __future__ import annotations

from .. import aggregate
from ..model import Profile
from ..render.format import format_signed, format_value

__all__ = ["top_rows", "sort_rows", "row_label"]

# a row: (name, filename, line, kind, self, total, change of total)


def top_rows(view: Profile, event, value_index: int, before: Profile | None = None,
             normalize: bool = True) -> list[tuple]:
    """Every function of ``view``; with ``before``, also the change of each total
    (``before`` scaled to ``view``'s total when ``normalize``)."""
    after = aggregate.top(view, event, n=None, value_index=value_index)
    if before is None:
        return [(r.name, r.filename, r.line, r.kind, r.self, r.total, 0.0) for r in after]
    earlier = aggregate.top(before, event, n=None, value_index=value_index)
    tb, ta = before.total(event, value_index), view.total(event, value_index)
    scale = ta / tb if (normalize and tb and ta) else 1.0
    rows: dict[tuple, list] = {}
    for r in after:
        rows[(r.name, r.filename, r.line, r.kind)] = [r.self, r.total, 0.0]
    for r in earlier:
        rows.setdefault((r.name, r.filename, r.line, r.kind), [0, 0, 0.0])[2] = r.total * scale
    return [(*k, s, t, t - b) for k, (s, t, b) in rows.items()]


def sort_rows(rows: list[tuple], how: str) -> list[tuple]:
    """By ``self`` (ties by total), ``total``, ``name`` or the size of the change (``delta``)."""
    keys = {
        "name": lambda r: (r[0].lower(), r[1]),
        "total": lambda r: (-r[5], -r[4]),
        "delta": lambda r: -abs(r[6]),
    }
    return sorted(rows, key=keys.get(how, lambda r: (-r[4], -r[5])))


def row_label(row: tuple, unit: str, total: float, diff: bool) -> str:
    """One line of the table: self, self %, total, total % (and the change), the function."""
    name, filename, line, _kind, s, t, d = row
    loc = f" ({_short_path(filename)}:{line})" if filename else ""
    cells = f"{format_value(s, unit):>9} {100 * s / total:5.1f}% {format_value(t, unit):>9} {100 * t / total:5.1f}%"
    if diff:
        cells += f" {format_signed(d, unit):>10}"
    return f"{cells}  {name}{loc}"


def _short_path(filename: str, parts: int = 2) -> str:
    """The last ``parts`` components of a path: the table's rows stay readable; the
    source view shows the full path."""
    bits = filename.replace("\\", "/").split("/")
    return "/".join(bits[-parts:]) if len(bits) > parts else filename
