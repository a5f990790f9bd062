"""The Explorer's output without a widget frontend, as plain functions of a view: a static
flame graph (HTML/SVG, no JavaScript) and a text top table for terminals, nbconvert and
notebook viewers, the page the explorer shows before (or instead of) its widget, and the
self-contained HTML report."""

from __future__ import annotations

from pathlib import Path

from ..model import top as _top
from .. import render as F
from ..exporters.files import write_atomic
from ..render.figures import report as interactive_report
from .view import View

__all__ = ["top_now", "top_text", "static_html", "fallback_bundle", "fallback_html", "write_report"]


def top_now(v: View, n: int) -> tuple[list, int]:
    """The top ``n`` functions of ``v`` (by self) and the view's total."""
    e, vi = v.event, v.state.value_index
    return _top.top(v.view, e, n=n, sort=_top.SELF[vi]), v.view.total(e, vi)


def top_text(v: View, n: int = 20, rows=None) -> str:
    """``v``'s top table as fixed-width text (the table ``%ddprof top`` prints)."""
    return F.top_table(v.view, v.event, n=n, value_index=v.state.value_index, rows=rows)


def static_html(v: View, max_nodes: int = 300, rows=None) -> str:
    """A flame graph of ``v`` in plain HTML/SVG (no JavaScript) and its top table."""
    s, e = v.state, v.event
    fd = F.flame_data(v.tree, min_pct=max(s.min_pct, 0.5), max_nodes=max_nodes, orientation=s.chart,
                      normalize=s.diff_norm)
    rows, total = (rows, v.view.total(e, s.value_index)) if rows else top_now(v, 15)
    return (
        "<div class='ddprof-static'>"
        + F.static_flame_html(fd)
        + "<details><summary>top functions</summary>"
        + F.top_table_html(rows[:15], e, s.value_index, total)
        + "</details></div>"
    )


def fallback_bundle(v: View) -> dict:
    """text/plain (the top table) and text/html (the static flame graph) of ``v``, for
    frontends without widgets (terminal, nbconvert, GitHub's viewer)."""
    rows, _ = top_now(v, 20)  # one top for both fallbacks
    return {"text/plain": top_text(v, rows=rows), "text/html": static_html(v, rows=rows)}


def fallback_html(static: str) -> str:
    """The static output shown before the widget (see ``_FALLBACK_CSS``)."""
    return f"{_FALLBACK_CSS}<div class='ddprof-static-fallback'>{static}</div>"


def write_report(path, v: View, status: str) -> Path:
    """A self-contained HTML report of ``v`` (plotly.js inlined: opens offline) with the
    flame chart, timeline and top table, written atomically (mode 0600)."""
    path = Path(path)
    write_atomic(path, interactive_report(v.view, v.event, v.state.value_index, fd=v.flame, status=status))
    return path


# The static flame graph output stands in for the widget output right after it until that
# holds an explorer whose flame chart plotly has drawn.  Before that the widget output shows
# ipywidgets' "Error displaying widget: model not found" (no kernel) or "Loading widget...":
# hidden outright; or an explorer waiting for plotly's bundle, which the browser evaluates
# once per page (seconds of CPU the first time in a new kernel): kept in the layout at its
# full width but with no height and unseen, so plotly draws it at the right size and the
# swap costs no second drawing.
_DRAWN = ".ddprof-explorer .ddprof-flame .main-svg"
_FALLBACK_CSS = f"""<style>
.jp-OutputArea-child:has(.ddprof-static-fallback) + .jp-OutputArea-child:not(:has(.ddprof-explorer)),
.output_area:has(.ddprof-static-fallback) + .output_area:not(:has(.ddprof-explorer)) {{ display: none; }}
.jp-OutputArea-child:has(.ddprof-static-fallback) + .jp-OutputArea-child:has(.ddprof-explorer):not(:has({_DRAWN})),
.output_area:has(.ddprof-static-fallback) + .output_area:has(.ddprof-explorer):not(:has({_DRAWN})) {{
  height: 0; min-height: 0; overflow: hidden; visibility: hidden; }}
.jp-OutputArea:has({_DRAWN}) .jp-OutputArea-child:has(.ddprof-static-fallback),
.output:has({_DRAWN}) .output_area:has(.ddprof-static-fallback) {{ display: none; }}
</style>"""
