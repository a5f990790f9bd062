"""Event types and frame kinds, built from the one native table (native/events.h).

The header's X-macro rows are parsed here, so C, cffi and Python can never disagree;
when the native module is loaded, ``engines.native.binding`` also checks the compiled table against
this one.  Conversions from integers or names are total: unknown values raise
``ValueError`` naming the value — never a raw cast.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path
from typing import NamedTuple

__all__ = ["EventType", "FrameKind", "ValueType", "HEADER_PATH"]


def _find_header() -> Path:
    """The installed copy (wheel) or the source tree's copy (editable / checkout)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_events.h", here.parent / "native" / "events.h"):
        if candidate.is_file():
            return candidate
    raise ImportError(
        "ddprof_nb: native/events.h (the event table) is missing from the installation; "
        "reinstall ddprof_nb"
    )


HEADER_PATH = _find_header()

_ROW = re.compile(r"^\s*X\((?P<args>.*)\)\s*\\?\s*$")
_FIELD = re.compile(r'"([^"]*)"|([^,\s]+)')


def _parse_table(text: str, macro: str) -> list[list[str]]:
    """Rows of ``#define <macro>(X)``: each row's comma-separated fields, unquoted."""
    start = text.index(f"#define {macro}(X)")
    rows: list[list[str]] = []
    for line in text[start:].splitlines()[1:]:
        m = _ROW.match(line)
        if not m:
            break
        rows.append([q or bare for q, bare in _FIELD.findall(m.group("args"))])
    if not rows:
        raise ImportError(f"ddprof_nb: no rows for {macro} in {HEADER_PATH}")
    return rows


_TEXT = HEADER_PATH.read_text(encoding="utf-8")
_FRAME_ROWS = _parse_table(_TEXT, "DDP_FRAME_KINDS")
_EVENT_ROWS = _parse_table(_TEXT, "DDP_EVENT_TYPES")


class ValueType(NamedTuple):
    """A pprof sample type: what is measured and its unit (``cpu``/``nanoseconds``)."""

    type: str
    unit: str


class _Lookup:
    """Total conversions shared by both enums."""

    @classmethod
    def from_id(cls, value: int):
        """The member whose native id is ``value``; ``ValueError`` for any other value."""
        for member in cls:  # type: ignore[attr-defined]
            if member.value == value and type(value) is int:
                return member
        raise ValueError(f"unknown {cls.__name__} id {value!r}")

    @classmethod
    def parse(cls, name):
        """The member named ``name`` (``"cpu"``, ``"CPU"``, or a member); ``ValueError`` otherwise."""
        if isinstance(name, cls):
            return name
        if isinstance(name, str):
            key = name.strip().lower()
            for member in cls:  # type: ignore[attr-defined]
                if member.label == key:
                    return member
        valid = ", ".join(m.label for m in cls)  # type: ignore[attr-defined]
        raise ValueError(f"unknown {cls.__name__} {name!r}; expected one of: {valid}")


class FrameKind(_Lookup, enum.Enum):
    """Kinds of frames a stack can hold: real functions and pseudo-frames."""

    _ignore_ = ["row"]
    for row in _FRAME_ROWS:
        vars()[row[0]] = int(row[1])

    @property
    def label(self) -> str:
        """Short lowercase name, as used in files and options (``alloc_type``)."""
        return _FRAME_ROWS_BY_NAME[self.name][2]

    @property
    def description(self) -> str:
        return _FRAME_ROWS_BY_NAME[self.name][3]


class EventType(_Lookup, enum.Enum):
    """The six event types; each carries its pprof sample types and display metadata."""

    _ignore_ = ["row"]
    for row in _EVENT_ROWS:
        vars()[row[0]] = int(row[1])

    @property
    def _row(self) -> list[str]:
        return _EVENT_ROWS_BY_NAME[self.name]

    @property
    def label(self) -> str:
        """Short lowercase name used in options, file names and pprof (``cpu``)."""
        return self._row[2]

    @property
    def display_name(self) -> str:
        return self._row[3]

    @property
    def value_types(self) -> tuple[ValueType, ValueType]:
        """pprof sample types of this event's two values: (count, quantity)."""
        r = self._row
        return ValueType(r[4], r[5]), ValueType(r[6], r[7])

    @property
    def unit(self) -> str:
        """Unit of the primary quantity (``nanoseconds`` or ``bytes``)."""
        return self._row[7]

    @property
    def display_unit(self) -> str:
        return self._row[8]

    @property
    def leaf_kind(self) -> FrameKind:
        """Pseudo-frame kind this event's stacks may end with (PYTHON: none)."""
        return FrameKind[self._row[9]]


_FRAME_ROWS_BY_NAME = {row[0]: row for row in _FRAME_ROWS}
_EVENT_ROWS_BY_NAME = {row[0]: row for row in _EVENT_ROWS}
