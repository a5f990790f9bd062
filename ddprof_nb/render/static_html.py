"""Static HTML (no JavaScript, no network): the SVG flame graph, the top table, the
source view and the static report.

What a notebook shows where no widget renders (nbconvert, GitHub's viewer), and the
HTML report written with ``static=True``.  Every string from a profile (function and
file names, labels, thread names, notes, titles) is escaped: profiles may come from
untrusted files.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

from ..model import top as _top
from ..events import EventType
from ..model import Profile
from .colors import TEXT_COLOR
from .flame import FlameData, flame_data
from .format import esc, format_value, value_unit
from .source import SourceView
from .notes import sorted_notes
from .pseudo import PSEUDO_FRAMES
from .text import status_line
from .tree import call_tree

__all__ = ["static_flame_html", "top_table_html", "source_html", "notes_html", "report", "document"]

DEFAULT_MAX_NODES = 1500
DEFAULT_MIN_FRACTION = 0.002  # nodes under 0.2 % of the total are not drawn
_CELL = "padding:1px 8px;text-align:{};"


def source_html(view: SourceView | None) -> str:
    """The source view as an HTML table (everything escaped, theme-neutral colours)."""
    if view is None:
        return "<div style='opacity:.7'>Click a function in the chart or the top table to see its source.</div>"
    peak = max([ln.total for ln in view.lines] or [0]) or 1
    where = f"{esc(view.filename)}:{view.first_line}" if view.filename else "no source file"
    head = (
        f"<div><b>{esc(view.name)}</b> <span style='opacity:.7'>{where}</span>"
        f" — total {esc(format_value(view.total, view.unit))}</div>"
    )
    if not view.filename:  # [GC], a lock or a wait, native code without symbols: no lines
        meaning = PSEUDO_FRAMES.get(view.name)
        return head + ("<div style='opacity:.7'>Not Python source" + (f": {esc(meaning)}" if meaning else
                                                                      " (a pseudo-frame)") + "; no lines to show.</div>")
    if not view.lines:
        return head + "<div style='opacity:.7'>No samples in this function for the current view.</div>"
    note = "" if view.has_source else "<div style='opacity:.7'>Source not available; sampled lines only.</div>"
    rows = []
    for ln in view.lines:
        pct = 100.0 * ln.total / peak
        bg = f"background:linear-gradient(90deg, rgba(232,80,74,0.35) {pct:.1f}%, transparent {pct:.1f}%);"
        rows.append(
            # (line 0: the format kept no line numbers, e.g. folded stacks)
            f"<tr style='{bg if ln.total else ''}'><td style='text-align:right;opacity:.6;padding-right:8px'>{ln.line or '?'}</td>"
            f"<td style='text-align:right;padding-right:8px;white-space:nowrap'>{esc(format_value(ln.self, view.unit)) if ln.self else ''}</td>"
            f"<td style='text-align:right;padding-right:8px;white-space:nowrap'>{esc(format_value(ln.total, view.unit)) if ln.total else ''}</td>"
            f"<td style='white-space:pre;font-family:monospace'>{esc(ln.text) if ln.text is not None else ''}</td></tr>"
        )
    return (
        head + note
        + "<div style='max-height:360px;overflow:auto'><table style='border-collapse:collapse;font-size:12px'>"
        + "<tr style='opacity:.7'><th>line</th><th>self</th><th>total</th><th style='text-align:left'>code</th></tr>"
        + "".join(rows) + "</table></div>"
    )




def notes_html(profile: Profile, extra: Sequence[str] = ()) -> str:
    """The notes behind a disclosure, warnings first (marked), then ``extra`` lines (trusted
    to be plain text; escaped here like the notes); "" when there is nothing to say."""
    warnings, others = sorted_notes(profile)
    if not (warnings or others or extra):
        return ""
    items = ([f"<li style='color:#c0392b'>warning: {esc(w)}</li>" for w in warnings]
             + [f"<li>{esc(n)}</li>" for n in [*others, *extra]])
    count = f"{len(warnings)} warning{'s' if len(warnings) != 1 else ''}, " if warnings else ""
    return (f"<details class='ddp-notes' style='font-size:12px;margin:2px 0'><summary style='cursor:pointer;"
            f"opacity:.8'>{count}{len(others) + len(extra)} notes</summary>"
            f"<ul style='margin:2px 0;padding-left:1.4em;opacity:.85'>{''.join(items)}</ul></details>")


def top_table_html(rows: Iterable, event: EventType, value_index: int = 1, total: int | None = None) -> str:
    """The top table as an escaped HTML table (inline styles: sanitisers drop <style>)."""
    unit = value_unit(event, value_index)
    denom = float(total) if total else 0.0

    def pct(v):
        return f"{100 * v / denom:.1f}%" if denom else ""

    def td(text, align="right", cls="n"):
        return f"<td class='{cls}' style='{_CELL.format(align)}'>{text}</td>"

    body = []
    for r in rows:
        loc = f"{r.filename}:{r.line}" if r.filename else r.kind.label
        self_v, total_v = r.values(value_index)
        body.append(
            "<tr>" + td(esc(format_value(self_v, unit))) + td(pct(self_v)) + td(esc(format_value(total_v, unit)))
            + td(pct(total_v)) + td(esc(r.name), "left", "f") + td(esc(loc), "left", "loc") + "</tr>"
        )
    head = "".join(f"<th style='{_CELL.format(a)}'>{h}</th>" for h, a in (
        ("self", "right"), ("self %", "right"), ("total", "right"), ("total %", "right"),
        ("function", "left"), ("file:line", "left")))
    return ("<table class='ddprof-top' style='border-collapse:collapse;font:12px Menlo,Consolas,monospace;'>"
            f"<thead><tr>{head}</tr></thead><tbody>" + "".join(body) + "</tbody></table>")


def static_flame_html(fd: FlameData, width: int = 1000, row_height: int = 17) -> str:
    """A flame graph as plain SVG inside HTML (no JavaScript; tooltips via <title>).

    Used where no widget frontend runs (nbconvert, GitHub's viewer).  Root at the
    bottom for ``orientation='flame'``.  Every text is escaped.
    """
    n = len(fd.ids)
    if n == 0 or fd.total <= 0:
        return "<div class='ddp-flame ddp-empty'>(no samples)</div>"
    index = {i: k for k, i in enumerate(fd.ids)}
    children: dict[int, list[int]] = {}
    for k, p in enumerate(fd.parents):
        if p:
            children.setdefault(index[p], []).append(k)
    x = [0.0] * n
    depth = [0] * n
    order = [0]
    for k in order:  # breadth-first: parents placed before children
        kids = sorted(children.get(k, []), key=lambda c: -fd.values[c])
        cx = x[k]
        for c in kids:
            x[c] = cx
            depth[c] = depth[k] + 1
            cx += fd.values[c] / fd.total * width
            order.append(c)
    levels = max(depth) + 1
    height = levels * row_height
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='100%' viewBox='0 0 {width} {height}' "
        f"style='max-width:{width}px;font-family:sans-serif;font-size:11px'>"
    ]
    for k in order:
        w = fd.values[k] / fd.total * width
        if w < 0.3:
            continue
        d = depth[k]
        y = (levels - 1 - d) * row_height if fd.orientation == "flame" else d * row_height
        cd = fd.customdata[k]
        tip = f"{cd[0]}\n{cd[1]}\n" + (
            f"self {cd[2]}, total {cd[3]} ({cd[4]})" if not fd.diff else f"before {cd[2]}, after {cd[3]}, change {cd[4]}"
        )
        # customdata strings are already escaped once for plotly; titles take them as they are
        label = fd.labels[k]
        chars = int(w / 6.5)
        text = ""
        if chars >= 3:
            plain = html.unescape(label)
            text = esc(plain if len(plain) <= chars else plain[: max(1, chars - 1)] + "…")
        parts.append(
            f"<g><title>{esc(html.unescape(tip))}</title>"
            f"<rect x='{x[k]:.2f}' y='{y}' width='{max(w - 0.5, 0.3):.2f}' height='{row_height - 1}' "
            f"fill='{fd.colors[k]}' rx='2'/>"
            + (f"<text x='{x[k] + 3:.2f}' y='{y + row_height - 5}' fill='{TEXT_COLOR}'>{text}</text>" if text else "")
            + "</g>"
        )
    parts.append("</svg>")
    return (
        f"<div class='ddprof-static-flame ddp-flame'><div style='font:12px sans-serif;opacity:.8'>{fd.title}</div>"
        + "".join(parts)
        + "</div>"
    )


def flame_section(profile: Profile, event: EventType, value_index: int = 1, *,
                  max_nodes: int = DEFAULT_MAX_NODES, min_fraction: float = DEFAULT_MIN_FRACTION,
                  orientation: str = "icicle") -> str:
    """One event's static flame graph with a note on what was folded away."""
    fd = flame_data(call_tree(profile, event, value_index), min_pct=100.0 * min_fraction, max_nodes=max_nodes,
                    orientation=orientation)
    if fd.total <= 0:
        return f"<div class='ddp-flame ddp-empty'>(no {esc(event.display_name)} samples)</div>"
    out = static_flame_html(fd)
    if fd.folded_nodes:
        out += (f"<div class='ddp-note' style='font-size:11px;opacity:.7'>{fd.folded_nodes:,} smaller nodes "
                f"folded into [other] (under {esc(format_value(fd.threshold, value_unit(event, value_index)))})</div>")
    return out


def report(profile: Profile, *, event=None, events: Sequence | None = None, title: str | None = None,
           top: int = 20, max_nodes: int = DEFAULT_MAX_NODES, min_fraction: float = DEFAULT_MIN_FRACTION,
           value_index: int = 1, full_document: bool = True) -> str:
    """The static report: status line, then per event a flame graph and a top table.

    ``full_document=False`` gives a fragment for a notebook output (first event only
    unless ``event``/``events`` say otherwise)."""
    if event is not None:
        evs = [EventType.parse(event)]
    elif events is not None:
        evs = [EventType.parse(e) for e in events]
    else:
        evs = list(profile.events) if full_document else list(profile.events[:1])
    meta = profile.metadata
    heading = title or "ddprof_nb profile"
    parts = ['<div class="ddp-report" style="font-family:system-ui,sans-serif;">']
    if full_document:
        parts.append(f"<h1 style='font-size:18px'>{esc(heading)}</h1>")
    elif title:
        parts.append(f"<div style='font-weight:600'>{esc(title)}</div>")
    parts.append(f"<div class='ddp-status' style='font-size:12px;opacity:.8;margin:4px 0;white-space:nowrap;"
                 f"overflow:hidden;text-overflow:ellipsis'>{esc(status_line(profile))}</div>")
    facts = [", ".join(f"{k}={v}" for k, v in dict(meta.extra).items())] if full_document and meta.extra else []
    parts.append(notes_html(profile, facts))
    labels = sorted({f"{k}={v}" for ls in profile.labelsets for k, v in ls.items if k != "state"})
    if labels:
        parts.append("<div style='font-size:12px;opacity:.8'>labels: " + esc(", ".join(labels[:50])) + "</div>")
    if not evs:
        parts.append("<p>(no samples)</p>")
    for i, e in enumerate(evs):
        total = profile.total(e, value_index)
        rows = _top.top(profile, e, n=top, sort=_top.SELF[value_index])
        body = (flame_section(profile, e, value_index, max_nodes=max_nodes, min_fraction=min_fraction)
                + f"<div style='margin-top:6px'>{top_table_html(rows, e, value_index, total)}</div>")
        summary = f"{esc(e.display_name)} — {esc(format_value(total, value_unit(e, value_index)))}"
        if full_document:
            parts.append(f"<details{' open' if i == 0 else ''} style='margin:8px 0'><summary style='font-weight:600'>"
                         f"{summary}</summary>{body}</details>")
        else:
            parts.append(f"<div style='font-weight:600;margin-top:6px'>{summary}</div>{body}")
    parts.append("</div>")
    fragment = "".join(parts)
    return document(heading, fragment) if full_document else fragment


def document(title: str, body: str, head: str = "") -> str:
    """A whole HTML page around ``body`` (``title`` is escaped here; ``head`` is trusted markup)."""
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{esc(title)}</title>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            "<style>body{margin:16px;font-family:system-ui,sans-serif}"
            "@media (prefers-color-scheme: dark){body{color:#ddd;background:#1e1e1e}}</style>"
            f"{head}</head><body>{body}</body></html>\n")
