"""Folded stacks: the "collapsed" text format of FlameGraph (flamegraph.pl, inferno,
speedscope and most flame-graph tools read it).

One file per event type, named ``<event>.folded`` (``cpu.folded``, ``wall.folded``,
``alloc.folded``, ``live.folded``, ``lock.folded``, ``park.folded``).  Each line is one
stack, root first, and its total in the event's primary unit (nanoseconds or bytes)::

    <module> (nb.py:3);work (nb.py:10);[GC] 25000000

* A Python frame is written ``qualname (file:line)``; a frame without a file name is its
  name alone; a pseudo-frame (kind != python) is its bracketed name (``[GC]``; a name
  without brackets gets them).
* The format has no escape syntax other tools understand, so characters that would
  corrupt it are REPLACED (lossy, by design): ``;`` becomes ``,`` and line breaks
  (every character ``str.splitlines`` splits on) become a space.  The value is after
  the last space, so spaces inside names are safe.
* Lines are sorted by stack text; stacks with equal text are summed; stacks whose total
  is zero are left out.  Threads, labels, time, counts, first lines and metadata are not
  stored: reading a folded file gives one thread ("all threads"), count 0, time 0.
* Reading infers frame kinds: ``name (file:line)`` is a Python frame; a bracketed name
  is the kind whose label it spells (``[gc]``, ``[GC]``, ``[truncated]``...), else the
  event's leaf kind for a leaf (``alloc_type`` for alloc/live, ``lock``, ``blocker``),
  else native; anything else is a Python frame without a file.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path

from ..events import EventType, FrameKind
from ..model import Frame, Metadata, Profile, ProfileBuilder
from .files import MAX_TEXT_BYTES, finish_profile, read_source, write_atomic

__all__ = ["write", "read", "dumps", "loads", "file_name", "event_from_filename", "frame_text"]

_SUFFIX = ".folded"
_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>.+):(?P<line>-?\d{1,18})\)$", re.S)
_VALUE = re.compile(r"^[-+]?\d{1,19}$")
_KIND_BY_LABEL = {k.label: k for k in FrameKind} | {k.label.replace("_", " "): k for k in FrameKind}
_INT64 = 1 << 63


def file_name(event) -> str:
    """The file name for one event's folded stacks (``cpu.folded``)."""
    return EventType.parse(event).label + _SUFFIX


def event_from_filename(path) -> EventType | None:
    """The event a folded file's name declares (``cpu.folded``, ``run1.cpu.folded``), or None."""
    base = os.path.basename(os.fspath(path)).lower()
    if not base.endswith(_SUFFIX):
        return None
    label = base[: -len(_SUFFIX)].rsplit(".", 1)[-1]
    try:
        return EventType.parse(label)
    except ValueError:
        return None


def _clean(text: str) -> str:
    return _BREAKS.sub(" ", text.replace(";", ","))


def frame_text(frame: Frame) -> str:
    """How ``frame`` is written in a folded line (already sanitised)."""
    if frame.kind is FrameKind.PYTHON:
        text = frame.label(with_line=True)
    else:
        name = frame.name
        text = name if name.startswith("[") and name.endswith("]") else f"[{name}]"
    return _clean(text)


def dumps(profile: Profile, event) -> str:
    """The folded text of one event of ``profile`` (empty when the event is absent)."""
    e = EventType.parse(event)
    rows = profile.event == e.value
    totals: dict[int, int] = defaultdict(int)
    for s, q in zip(profile.stack[rows].tolist(), profile.values[rows, 1].tolist()):
        totals[s] += q
    texts: dict[int, str] = {}
    by_text: dict[str, int] = defaultdict(int)
    for s, q in totals.items():
        line = ";".join(texts.get(f) or texts.setdefault(f, frame_text(profile.frames[f])) for f in profile.stacks[s])
        by_text[line] += q
    return "".join(f"{line} {q}\n" for line, q in sorted(by_text.items()) if q)


def write(profile: Profile, dest, *, event=None) -> list[Path]:
    """Write folded stacks; returns the paths written.

    ``event=None``: ``dest`` is a directory (created if missing) that receives one
    ``<event>.folded`` file per event present.  ``event`` given: ``dest`` is the file
    (or binary file object) for that event alone; ``ValueError`` if the profile has no
    samples of it.  Files get mode 0600 and are replaced atomically.
    """
    if event is not None:
        e = EventType.parse(event)
        if e not in profile.events:
            present = ", ".join(x.label for x in profile.events) or "none"
            raise ValueError(f"{dest}: the profile has no {e.label} samples (events present: {present})")
        write_atomic(dest, dumps(profile, e))
        return [] if hasattr(dest, "write") else [Path(os.fspath(dest))]
    directory = Path(os.fspath(dest))
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    written = []
    for e in profile.events:
        path = directory / file_name(e)
        write_atomic(path, dumps(profile, e))
        written.append(path)
    return written


# ----------------------------------------------------------------------------- reading


def _metadata() -> Metadata:
    return Metadata(engine="", python_version="", pid=0, host="", extra={"source_format": "folded"})


def read(source, *, name: str | None = None, event=None, interval_ns: int | None = None) -> Profile:
    """The Profile in a folded file, or in a directory of ``<event>.folded`` files.

    A single file's event comes from ``event`` or its name (``cpu.folded``); bytes need
    ``event``.  Each line's number is the stack's quantity in the event's unit (what
    ddprof_nb writes), or, with ``interval_ns``, a sample count (what py-spy, perf and
    flamegraph.pl write): count = number, quantity = number x ``interval_ns``.
    ``ValueError`` naming the input (and line) for anything malformed.
    """
    if not isinstance(source, (bytes, bytearray, memoryview)) and os.path.isdir(source):
        return _read_directory(Path(os.fspath(source)), name)
    if event is None:
        label = name or ("" if isinstance(source, (bytes, bytearray, memoryview)) else os.fspath(source))
        event = event_from_filename(label)
        if event is None:
            raise ValueError(
                f"{label or '<bytes>'}: cannot tell which event these folded stacks hold; name the "
                f"file <event>.folded ({', '.join(e.label for e in EventType)}) or pass event=..."
            )
    data, name = read_source(source, name, MAX_TEXT_BYTES)
    meta = _metadata()
    if interval_ns is not None:
        meta = meta.replace(interval_ns=interval_ns,
                            notes=(f"folded values read as sample counts at {interval_ns} ns each",))
    builder = ProfileBuilder(meta)
    _parse_into(builder, data, name, EventType.parse(event), interval_ns)
    return finish_profile(builder, builder.metadata)


def loads(data: bytes | str, *, event, name: str = "<bytes>") -> Profile:
    """The Profile in folded text of one ``event``."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return read(data, name=name, event=event)


def _read_directory(directory: Path, name: str | None) -> Profile:
    label = name or str(directory)
    files: dict[EventType, Path] = {}
    for path in sorted(directory.iterdir()):
        if not path.name.lower().endswith(_SUFFIX):
            continue
        e = event_from_filename(path.name)
        if e is None:
            raise ValueError(f"{path}: not named after an event type "
                             f"({', '.join(file_name(x) for x in EventType)})")
        if e in files:
            raise ValueError(f"{label}: two folded files for {e.label}: {files[e].name} and {path.name}")
        files[e] = path
    if not files:
        raise ValueError(f"{label}: no <event>.folded files in this directory")
    builder = ProfileBuilder(_metadata())
    for e, path in sorted(files.items(), key=lambda kv: kv[0].value):
        data, fname = read_source(path, None, MAX_TEXT_BYTES)
        _parse_into(builder, data, fname, e)
    return finish_profile(builder, builder.metadata)


def _parse_frame(text: str, leaf: bool, event: EventType) -> Frame:
    m = _FRAME.match(text)
    if m:
        return Frame(m["name"], m["file"], int(m["line"]), 0, FrameKind.PYTHON)
    if len(text) >= 2 and text[0] == "[" and text[-1] == "]":
        kind = _KIND_BY_LABEL.get(text[1:-1].strip().lower())
        if kind is None:
            kind = event.leaf_kind if leaf and event.leaf_kind is not FrameKind.PYTHON else FrameKind.NATIVE
        return Frame(text, kind=kind)
    return Frame(text)


def _parse_into(builder: ProfileBuilder, data: bytes, name: str, event: EventType,
                interval_ns: int | None = None) -> None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: not UTF-8 text, so not folded stacks (byte {e.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    thread = builder.thread_id(0, "all threads")
    labels = builder.labels_id(None)
    frame_ids: dict[tuple[str, bool], int] = {}
    totals: dict[int, int] = defaultdict(int)
    for lineno, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        stack, sep, value = line.rpartition(" ")
        if not sep or not _VALUE.match(value):
            raise ValueError(f"{name}:{lineno}: not a folded-stack line "
                             f"(expected 'frame;frame;... <integer>'): {line[:80]!r}")
        v = int(value)
        if not -_INT64 <= v < _INT64:
            raise ValueError(f"{name}:{lineno}: value {value} does not fit in 64 bits")
        parts = stack.split(";") if stack else []
        ids = []
        last = len(parts) - 1
        for i, part in enumerate(parts):
            key = (part, i == last)
            fid = frame_ids.get(key)
            if fid is None:
                fid = frame_ids[key] = builder.frame_id(_parse_frame(part, i == last, event))
            ids.append(fid)
        sid = builder.stack_id(ids)
        totals[sid] += v
        if not -_INT64 <= totals[sid] < _INT64:
            raise ValueError(f"{name}:{lineno}: the total of a stack overflows 64 bits")
    if totals:
        sids = list(totals)
        if interval_ns is None:
            values = [(0, totals[s]) for s in sids]
        else:
            values = [(totals[s], totals[s] * interval_ns) for s in sids]
            if any(not -_INT64 <= q < _INT64 for _, q in values):
                raise ValueError(f"{name}: a sample count x interval_ns={interval_ns} overflows 64 bits")
        builder.add_many(event, sids, thread, labels, [0] * len(sids), values)
