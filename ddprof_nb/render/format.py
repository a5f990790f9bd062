"""The one number formatter and the one HTML escape of the product.

Every value a person reads (tables, hover text, titles, status lines, reports) goes
through ``format_value``: three significant digits in the largest unit that keeps the
number at or above 1 (ns/µs/ms/s, B/KiB/MiB/GiB/TiB), no exponent, trailing zeros kept
so a column of numbers has one precision ("3.00 s" beside "3.21 s").  Whole numbers of
the base unit (ns, B, counts) print as integers with thousands separators.
"""

from __future__ import annotations

import html
import math

from ..events import EventType

__all__ = [
    "esc", "format_value", "format_count", "format_duration", "format_bytes", "format_signed", "format_change",
    "value_unit", "value_label",
]

_TIME_UNITS = (("ns", 1.0), ("µs", 1e3), ("ms", 1e6), ("s", 1e9))
_BYTE_UNITS = (("B", 1.0), ("KiB", 1024.0), ("MiB", 1024.0**2), ("GiB", 1024.0**3), ("TiB", 1024.0**4))


def esc(text: object) -> str:
    """HTML-escape ``text`` (quotes too): safe in HTML, SVG attributes and plotly's
    pseudo-HTML labels.  Every string from a profile passes here before it reaches markup."""
    return html.escape(str(text), quote=True)


def _three_digits(x: float) -> str:
    """``x`` (>= 0) with three significant digits and no exponent: 1.23, 12.3, 123, 1,234."""
    if x == 0:
        return "0"
    r = float(f"{x:.3g}")  # round first: 9.996 becomes 10.0 and takes one decimal less
    decimals = max(0, 2 - math.floor(math.log10(r)))
    return f"{r:,.{decimals}f}"


def _scaled(value: float, units: tuple[tuple[str, float], ...], base_limit: int) -> str:
    v = float(value)
    if not math.isfinite(v):
        return f"{v} {units[0][0]}"
    sign = "-" if v < 0 else ""
    a = abs(v)
    if round(a) < base_limit:  # the base unit (ns, B) holds whole numbers: no decimals
        return f"{sign}{a:,.0f} {units[0][0]}"
    for name, size in units[1:-1]:
        # 999.6 µs is 1,000 µs at three digits: it belongs to the next unit
        if float(f"{a / size:.3g}") < 1000:
            return f"{sign}{_three_digits(a / size)} {name}"
    name, size = units[-1]
    top = a / size
    # past the largest unit every digit is shown: 1,234 s, not 1,230 s
    return f"{sign}{_three_digits(top) if top < 999.5 else f'{top:,.0f}'} {name}"


def format_duration(ns: float) -> str:
    """A duration in nanoseconds: ``999 ns``, ``1.50 µs``, ``620 ms``, ``3.00 s``, ``1,234 s``."""
    return _scaled(ns, _TIME_UNITS, 1000)


def format_bytes(n: float) -> str:
    """A size in bytes: ``1,023 B``, ``1.50 KiB``, ``3.00 MiB``.  From 999.5 of a unit on,
    a size takes the next unit (``1000 KiB`` is ``0.977 MiB``), so it never needs four digits."""
    return _scaled(n, _BYTE_UNITS, 1024)


def format_count(n: float) -> str:
    """A count: an integer with thousands separators; a fractional count (a scaled diff)
    with three significant digits."""
    v = float(n)
    if v == int(v):
        return f"{int(v):,}"
    return ("-" if v < 0 else "") + _three_digits(abs(v))


def format_value(value: float, unit: str) -> str:
    """``value`` in a human unit: ``unit`` is ``nanoseconds``, ``bytes`` or a count."""
    if unit == "nanoseconds":
        return format_duration(value)
    if unit == "bytes":
        return format_bytes(value)
    return format_count(value)


def format_signed(value: float, unit: str) -> str:
    """A change with its sign: ``+30.0 ms``, ``−40.0 ms``, ``±0 ns``."""
    return ("+" if value > 0 else "−" if value < 0 else "±") + format_value(abs(value), unit)


def format_change(delta: float, base: float) -> str:
    """A relative change in percent (``+12.5%``), ``new`` when there was nothing before."""
    if base == 0:
        return "new" if delta > 0 else "0%"
    return f"{100.0 * delta / base:+.1f}%"


def value_unit(event: EventType, value_index: int) -> str:
    """The unit of one of the event's two values (``count``, ``nanoseconds`` or ``bytes``)."""
    return event.value_types[value_index].unit


def value_label(event: EventType, value_index: int) -> str:
    """Short name of a value for controls and status lines: what the count counts
    (samples, objects, waits), or the quantity (time, bytes)."""
    vt = event.value_types[value_index]
    if value_index == 0:
        for suffix, name in (("samples", "samples"), ("objects", "objects")):
            if vt.type.endswith(suffix):
                return name
        return "waits"
    return "time" if vt.unit == "nanoseconds" else "bytes"
