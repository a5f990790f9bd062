"""HTML report: ``write(profile, dest, **options)``.

When the explorer provides ``to_html`` (the interactive plotly report), ``write``
delegates to it.  Otherwise — or with ``static=True`` — it writes a static report: one
flame graph per event drawn with plain HTML and CSS (no script, no network: it opens
offline and survives sanitisers such as GitHub's notebook view) plus a top table.
``render`` returns the same markup, as a whole document or as a fragment for a
notebook output (the magics' text/html fallback).

Every string that comes from a profile (function and file names, labels, thread names,
notes, titles) is HTML-escaped: profiles may be loaded from untrusted files.
"""

from __future__ import annotations

import contextvars
import html as _html
import os
import zlib
from typing import Sequence

import numpy as np

from ..events import EventType, FrameKind
from ..model import Profile

__all__ = ["write", "render", "flame_html", "top_html"]

DEFAULT_MAX_NODES = 1500
DEFAULT_MIN_FRACTION = 0.002  # nodes under 0.2 % of the total are not drawn
ROW_PX = 18

_in_explorer = contextvars.ContextVar("ddprof_nb_html_in_explorer", default=False)


def esc(text: object) -> str:
    return _html.escape(str(text), quote=True)


def _explorer_to_html():
    """The explorer's HTML writer ``(profile, path) -> None``, if the explorer is
    installed and provides one."""
    try:
        from ..explorer import widget
    except Exception:  # noqa: BLE001 - the explorer is optional here; fall back to static
        return None
    fn = getattr(widget, "to_html", None)
    if callable(fn):
        return fn
    explorer = getattr(widget, "Explorer", None)
    if explorer is not None and callable(getattr(explorer, "to_html", None)):
        def via_widget(profile, path):
            explorer(profile).to_html(path)

        return via_widget
    return None


def write(profile: Profile, dest, *, static: bool = False, **options) -> None:
    """Write an HTML report of ``profile`` to ``dest`` (a path or a binary file object).

    A path with no options gets the explorer's interactive report when the explorer is
    available; otherwise — a file object, options, or ``static=True`` — the static
    report of ``render`` (options: ``event``, ``events``, ``title``, ``top``,
    ``max_nodes``, ``min_fraction``, ``value_index``).
    """
    if not static and not options and not hasattr(dest, "write") and not _in_explorer.get():
        to_html = _explorer_to_html()
        if to_html is not None:
            token = _in_explorer.set(True)  # the explorer may call back into this module
            try:
                to_html(profile, os.fspath(dest))
                return
            finally:
                _in_explorer.reset(token)
    text = render(profile, full_document=True, **options)
    try:
        from . import write_atomic
    except ImportError:  # pragma: no cover - exporters package without the helper
        write_atomic = None
    if write_atomic is not None:
        write_atomic(dest, text)
    elif hasattr(dest, "write"):
        dest.write(text.encode("utf-8"))
    else:
        with open(os.fspath(dest), "w", encoding="utf-8") as f:
            f.write(text)


# ----------------------------------------------------------------------------------
# call tree


class _Tree:
    """A call tree of one event: parallel lists, node 0 is the root."""

    __slots__ = ("parent", "frame", "total", "self_", "children", "depth")

    def __init__(self):
        self.parent = [-1]
        self.frame = [-1]  # index into profile.frames (representative frame of a function)
        self.total = [0]
        self.self_ = [0]
        self.children: list[dict[tuple, int]] = [{}]
        self.depth = [0]


def _tree(profile: Profile, event: EventType, value_index: int) -> _Tree:
    rows = profile.event == event.value
    weights = np.zeros(len(profile.stacks), dtype=np.int64)
    if rows.any():
        np.add.at(weights, profile.stack[rows], profile.values[rows, value_index])
    keys = [f.function_key for f in profile.frames]
    t = _Tree()
    for s in np.flatnonzero(weights > 0).tolist():
        w = int(weights[s])
        node = 0
        t.total[0] += w
        for fid in profile.stacks[s]:
            k = keys[fid]
            child = t.children[node].get(k)
            if child is None:
                child = len(t.parent)
                t.children[node][k] = child
                t.parent.append(node)
                t.frame.append(fid)
                t.total.append(0)
                t.self_.append(0)
                t.children.append({})
                t.depth.append(t.depth[node] + 1)
            t.total[child] += w
            node = child
        t.self_[node] += w
    return t


def _color(frame, cell: bool) -> str:
    if frame.kind is not FrameKind.PYTHON:
        return "hsl(0,0%,78%)"
    if cell:
        return "hsl(210,65%,78%)"
    h = zlib.crc32((frame.filename or frame.name).encode("utf-8", "surrogatepass"))
    return f"hsl({12 + h % 40},{60 + (h >> 8) % 25}%,{62 + (h >> 16) % 14}%)"


def _fmt(value: float, event: EventType, value_index: int) -> str:
    from ..summary import format_value

    return format_value(value, event, value_index)


def flame_html(profile: Profile, event=None, *, value_index: int = 1, max_nodes: int = DEFAULT_MAX_NODES,
               min_fraction: float = DEFAULT_MIN_FRACTION) -> str:
    """A static icicle flame graph of one event (callers above callees), as an HTML
    fragment: absolutely positioned divs, widths in percent, a tooltip per node."""
    if event is None:
        if not profile.events:
            return '<div class="ddp-empty">(no samples)</div>'
        event = profile.events[0]
    e = EventType.parse(event)
    t = _tree(profile, e, value_index)
    total = t.total[0]
    if total <= 0:
        return f'<div class="ddp-empty">(no {esc(e.display_name)} samples)</div>'
    threshold = total * min_fraction
    # breadth first, heaviest children first, so the cap drops the thinnest nodes
    order = [0]
    left = {0: 0}
    i = 0
    while i < len(order) and len(order) < max_nodes:
        node = order[i]
        i += 1
        x = left[node]
        for child in sorted(t.children[node].values(), key=lambda c: -t.total[c]):
            if t.total[child] < threshold or len(order) >= max_nodes:
                break
            left[child] = x
            x += t.total[child]
            order.append(child)
    depth = max(t.depth[n] for n in order) + 1
    out = [f'<div class="ddp-flame" style="position:relative;height:{depth * ROW_PX}px;'
           f'min-width:400px;font:11px/16px Menlo,Consolas,monospace;">']
    for n in order:
        w = 100.0 * t.total[n] / total
        x = 100.0 * left[n] / total
        if n == 0:
            label = f"all — {e.display_name} {_fmt(total, e, value_index)}"
            tip = label
            color = "hsl(0,0%,88%)"
        else:
            f = profile.frames[t.frame[n]]
            cell = f.filename.startswith("Cell In[")
            label = f.name
            where = f"{f.filename}:{f.first_line}" if f.filename else f.kind.label
            tip = (f"{f.name}\n{where}\ntotal {_fmt(t.total[n], e, value_index)} ({w:.1f}%)"
                   f"\nself {_fmt(t.self_[n], e, value_index)} ({100.0 * t.self_[n] / total:.1f}%)")
            color = _color(f, cell)
        out.append(
            f'<div class="ddp-node" title="{esc(tip)}" style="position:absolute;box-sizing:border-box;'
            f'left:{x:.4f}%;width:{w:.4f}%;top:{t.depth[n] * ROW_PX}px;height:{ROW_PX - 1}px;'
            f'background:{color};border:1px solid #fff;overflow:hidden;white-space:nowrap;'
            f'text-overflow:ellipsis;padding:0 3px;color:#111;">{esc(label)}</div>'
        )
    out.append("</div>")
    hidden = len(t.parent) - len(order)
    if hidden:
        out.append(f'<div class="ddp-note" style="font-size:11px;color:#666;">{hidden:,} smaller nodes '
                   f'not drawn (under {100 * min_fraction:.1f}% of the total or past {max_nodes:,} nodes)</div>')
    return "".join(out)


def top_html(profile: Profile, event=None, n: int = 20, value_index: int = 1) -> str:
    """The top ``n`` functions of one event as an HTML table."""
    if event is None:
        if not profile.events:
            return ""
        event = profile.events[0]
    e = EventType.parse(event)
    total = profile.total(e, value_index) or 1
    rows = profile.top(e, n=n, value_index=value_index)
    cell = 'style="padding:1px 8px;text-align:{};"'
    out = ['<table class="ddp-top" style="border-collapse:collapse;font:12px Menlo,Consolas,monospace;">',
           "<thead><tr>" + "".join(f"<th {cell.format(a)}>{h}</th>" for h, a in (
               ("self", "right"), ("self %", "right"), ("total", "right"), ("total %", "right"),
               ("function", "left"), ("location", "left"))) + "</tr></thead><tbody>"]
    for r in rows:
        where = f"{r.filename}:{r.line}" if r.filename else r.kind.label
        out.append(
            "<tr>"
            f"<td {cell.format('right')}>{esc(_fmt(r.self, e, value_index))}</td>"
            f"<td {cell.format('right')}>{100 * r.self / total:.1f}%</td>"
            f"<td {cell.format('right')}>{esc(_fmt(r.total, e, value_index))}</td>"
            f"<td {cell.format('right')}>{100 * r.total / total:.1f}%</td>"
            f"<td {cell.format('left')}>{esc(r.name)}</td>"
            f"<td {cell.format('left')}>{esc(where)}</td></tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def render(profile: Profile, *, event=None, events: Sequence | None = None, title: str | None = None,
           top: int = 20, max_nodes: int = DEFAULT_MAX_NODES, min_fraction: float = DEFAULT_MIN_FRACTION,
           value_index: int = 1, full_document: bool = True) -> str:
    """The static report as HTML.  ``full_document=False`` gives a fragment for a
    notebook output (first event only unless ``event``/``events`` say otherwise)."""
    from ..summary import status_line

    if event is not None:
        evs = [EventType.parse(event)]
    elif events is not None:
        evs = [EventType.parse(e) for e in events]
    else:
        evs = list(profile.events) if full_document else list(profile.events[:1])
    meta = profile.metadata
    parts = []
    heading = title or "ddprof_nb profile"
    parts.append('<div class="ddp-report" style="font-family:system-ui,sans-serif;">')
    if full_document:
        parts.append(f"<h1 style='font-size:18px'>{esc(heading)}</h1>")
    elif title:
        parts.append(f"<div style='font-weight:600'>{esc(title)}</div>")
    parts.append(f"<div class='ddp-status' style='font-size:12px;color:#444;margin:4px 0;'>"
                 f"{esc(status_line(profile))}</div>")
    if full_document and meta.extra:
        parts.append("<div style='font-size:12px;color:#444'>" + ", ".join(
            f"{esc(k)}={esc(v)}" for k, v in dict(meta.extra).items()) + "</div>")
    labels = sorted({f"{k}={v}" for ls in profile.labelsets for k, v in ls.items if k != "state"})
    if labels:
        parts.append("<div style='font-size:12px;color:#444'>labels: " + esc(", ".join(labels[:50])) + "</div>")
    if not evs:
        parts.append("<p>(no samples)</p>")
    for i, e in enumerate(evs):
        body = (flame_html(profile, e, value_index=value_index, max_nodes=max_nodes, min_fraction=min_fraction)
                + f"<div style='margin-top:6px'>{top_html(profile, e, n=top, value_index=value_index)}</div>")
        summary = f"{esc(e.display_name)} — {esc(_fmt(profile.total(e, value_index), e, value_index))}"
        if full_document:
            parts.append(f"<details{' open' if i == 0 else ''} style='margin:8px 0'><summary style='font-weight:600'>"
                         f"{summary}</summary>{body}</details>")
        else:
            parts.append(f"<div style='font-weight:600;margin-top:6px'>{summary}</div>{body}")
    parts.append("</div>")
    fragment = "".join(parts)
    if not full_document:
        return fragment
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{esc(heading)}</title>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            "<style>body{margin:16px} .ddp-node:hover{filter:brightness(0.9)}</style>"
            f"</head><body>{fragment}</body></html>\n")
