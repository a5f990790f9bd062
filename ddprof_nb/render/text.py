"""Plain-text views of a Profile: the top table, the one-line status, the history list.

The one text top table: ``%ddprof top``, the text/plain part of the magics' output and
of the explorer, and ``python -m ddprof_nb report`` all print ``top_table``.  Pure
functions of the model; nothing here imports IPython.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from ..model import top as _top
from ..events import EventType, FrameKind
from ..model import Profile
from .format import format_bytes, format_count, format_duration, format_value, value_label, value_unit
from .notes import sorted_notes, warning_count

__all__ = [
    "top_table", "text_summary", "status_line", "summary_parts", "event_summary", "event_samples",
    "count_text", "notes_text", "history_table", "diff_table", "sample_counts",
]


def _fmt(value: float, event: EventType, value_index: int = 1) -> str:
    """A value of ``event`` in its unit (value 0 is always a count)."""
    return format_value(value, value_unit(event, value_index))


def sample_counts(profile: Profile) -> dict[EventType, int]:
    """Samples per event, for the events whose number of samples is known."""
    counts = {e: event_samples(profile, e) for e in profile.events}
    return {e: n for e, n in counts.items() if n is not None}


def _location(filename: str, line: int, kind: FrameKind) -> str:
    if kind is not FrameKind.PYTHON or not filename:
        return ""
    if filename.startswith("Cell In["):
        return f"{filename}:{line}" if line else filename
    return f"{_short_path(filename)}:{line}"


def _short_path(path: str, keep: int = 3) -> str:
    """The last ``keep`` parts of a path (site-packages paths are long)."""
    parts = path.replace("\\", "/").split("/")
    return path if len(parts) <= keep else "…/" + "/".join(parts[-keep:])


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def top_table(profile: Profile, event=None, n: int = 10, by: str = "function", value_index: int = 1,
              width: int = 100, rows: Sequence | None = None) -> str:
    """The top ``n`` functions (or lines) of one event as a fixed-width text table.

    Columns: self, self %, total, total %, function, location.  The header names the
    event, its total and its sample count.  An event with no samples says so.
    ``rows``: ``top.top``'s rows when the caller has them already.
    """
    if event is None:
        if not profile.events:
            return "(no samples)"
        event = profile.events[0]
    e = EventType.parse(event)
    total = profile.total(e, value_index)
    head = (f"{e.display_name}: top {n} {'lines' if by == 'line' else 'functions'} "
            f"(total {_fmt(total, e, value_index)}, {count_text(profile, e)})")
    rows = list(_top.top(profile, e, n=n, by=by, sort=_top.SELF[value_index]) if rows is None else rows)[:n]
    if not rows or total <= 0:
        return head + "\n  (no samples)"
    cols = [("self", "self%", "total", "total%", "function", "location")]
    for r in rows:
        self_v, total_v = r.values(value_index)
        cols.append((
            _fmt(self_v, e, value_index),
            f"{100 * self_v / total:.1f}%",
            _fmt(total_v, e, value_index),
            f"{100 * total_v / total:.1f}%",
            r.name,
            _location(r.filename, r.line, r.kind),
        ))
    w = [max(len(c[i]) for c in cols) for i in range(4)]
    fixed = sum(w) + 4 * 2 + 2
    name_w = max(12, min(max(len(c[4]) for c in cols), max(20, (width - fixed) // 2)))
    lines = [head]
    for c in cols:
        lines.append(
            f"{c[0]:>{w[0]}}  {c[1]:>{w[1]}}  {c[2]:>{w[2]}}  {c[3]:>{w[3]}}  "
            f"{_clip(c[4], name_w):<{name_w}}  {c[5]}".rstrip()
        )
    return "\n".join(lines)


def event_samples(profile: Profile, event: EventType) -> int | None:
    """How many samples hold ``event``: its count value where that counts samples (cpu,
    wall), else what the engine recorded in ``extra["samples_<event>"]``; None when unknown
    (a count of objects or waits is an estimate, not a number of samples)."""
    if event.value_types[0].type.endswith("samples"):
        return profile.total(event, 0)
    try:
        return int(dict(profile.metadata.extra)[f"samples_{event.label}"])
    except (KeyError, ValueError):
        return None


def count_text(profile: Profile, event: EventType) -> str:
    """``48 samples``; when the samples are unknown, the count named for what it counts
    (``6,030,333 objects``, ``12 waits``): never objects called samples."""
    n = event_samples(profile, event)
    if n is not None:
        return f"{n:,} sample{'s' if n != 1 else ''}"
    return f"{format_count(profile.total(event, 0))} {value_label(event, 0)}"


def event_summary(profile: Profile, event: EventType) -> str:
    """``cpu 1.23 s / 48 samples``: the event's total in its unit, then ``count_text``."""
    return f"{event.label} {_fmt(profile.total(event, 1), event)} / {count_text(profile, event)}"


def summary_parts(profile: Profile, wall_s: float | None = None) -> list[str]:
    """The summary line's parts: engine, duration, each event, the count of warnings."""
    meta = profile.metadata
    duration = wall_s * 1e9 if wall_s is not None else meta.duration_ns
    parts = [f"{meta.engine or 'unknown'} engine", format_duration(duration)]
    parts += [event_summary(profile, e) for e in profile.events] or ["no samples"]
    warnings = warning_count(profile)
    parts.append(f"{warnings} warning{'s' if warnings != 1 else ''}" if warnings else "no warnings")
    return parts


def status_line(profile: Profile, name: str | None = None, wall_s: float | None = None) -> str:
    """The one summary line: engine, duration, per event its total and samples, how many
    warnings (the notes themselves: ``notes_text``, or the HTML disclosure)."""
    label = f"ddprof [{name}]" if name else "ddprof"
    return f"{label}: " + " · ".join(summary_parts(profile, wall_s))


def notes_text(profile: Profile) -> str:
    """Every note, warnings first, one per line ("(no notes)" when there are none)."""
    warnings, others = sorted_notes(profile)
    lines = [f"warning: {w}" for w in warnings] + [f"note: {n}" for n in others]
    return "\n".join(lines) or "(no notes)"


def text_summary(profile: Profile, n: int = 10, events: Sequence | None = None, name: str | None = None) -> str:
    """The text view of a profile: the status line and one top table per event."""
    evs = [EventType.parse(e) for e in events] if events else list(profile.events)
    parts = [status_line(profile, name)]
    if not evs:
        parts.append("(no samples)")
    for e in evs:
        parts.append(top_table(profile, e, n=n))
    warnings = sorted_notes(profile)[0]
    if warnings:
        parts.append("\n".join(f"warning: {w}" for w in warnings))
    return "\n\n".join(parts)


def history_table(entries: Iterable, max_count: int, max_bytes: int) -> str:
    """The ``%ddprof list`` table: one row per stored profile, oldest first."""
    entries = list(entries)
    rows = [("name", "events", "duration", "samples", "engine", "size")]
    total = 0
    for en in entries:
        p = en.profile
        total += en.nbytes
        rows.append((
            en.name,
            ",".join(e.label for e in p.events) or "-",
            format_duration(p.metadata.duration_ns),
            f"{sum(sample_counts(p).values()):,}",
            p.metadata.engine or "-",
            format_bytes(en.nbytes),
        ))
    w = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = [f"{len(entries)} of at most {max_count} profiles, {format_bytes(total)} of {format_bytes(max_bytes)}"]
    if entries:
        for r in rows:
            lines.append("  ".join(f"{c:<{w[i]}}" if i in (0, 1, 4) else f"{c:>{w[i]}}" for i, c in enumerate(r)).rstrip())
    return "\n".join(lines)


def diff_table(before: Profile, after: Profile, event=None, n: int = 10, normalize: bool = True) -> str:
    """The functions whose total changed most from ``before`` to ``after`` (text): the
    explorer's diff (``top.top`` with ``before``), ``before`` scaled to ``after``'s total
    when ``normalize`` (a longer run then shows what changed in shape, not in length)."""
    if event is None:
        common = [e for e in after.events if e in before.events]
        if not common:
            return "(the two profiles share no event type)"
        event = common[0]
    e = EventType.parse(event)
    ta, tb = before.total(e), after.total(e)
    rows = _top.top(after, e, n=n, sort="change", before=before, normalize=normalize)
    scale = tb / ta if (normalize and ta and tb) else 1.0
    how = "before scaled to the same total" if scale != 1.0 else "absolute"
    head = (f"{e.display_name}: {_fmt(ta, e, 1)} -> {_fmt(tb, e, 1)} "
            f"({'+' if tb >= ta else '-'}{_fmt(abs(tb - ta), e, 1)}); biggest changes of total ({how})")
    table = [("change", "before", "after", "function", "location")]
    for r in rows:
        table.append((("+" if r.change >= 0 else "-") + _fmt(round(abs(r.change)), e, 1),
                      _fmt(round(r.total - r.change), e, 1), _fmt(r.total, e, 1),
                      r.name, _location(r.filename, r.line, r.kind)))
    w = [max(len(r[i]) for r in table) for i in range(4)]
    lines = [head] + [
        f"{r[0]:>{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]:<{w[3]}}  {r[4]}".rstrip() for r in table
    ]
    return "\n".join(lines)
