"""The Explorer's outputs: the flame chart, its status line and legend, the timeline, the
top table, the source view and the sandwich.  ``Drawing.draw(view)`` takes a ``view.View``
(and reads the rest of its state's view from the same ``Views``) and sends only the parts
whose data is not the object it drew last (the views keep unchanged steps' results).  What
the user does on an output (a click on a box or a row, a header's sort, a dragged time
range) reaches its owner through the callbacks it was given; it reads no control.
"""

from __future__ import annotations

import time
from typing import Callable

import ipywidgets as W

from .. import render as F
from ..model import Frame
from .figure_widget import figure_widget, remember_state, send_update
from .sandwich import SandwichPanel, sandwich_data
from .source_text import source_lines
from .top_rows import cells, columns
from .top_table import TopTable
from .view import View, Views, status_text

__all__ = ["Drawing", "function_of"]


class Drawing:
    """The output widgets of ``views`` (``NAMES``), first showing ``first``.

    ``on_select(frame)``: a box of the flame or the sandwich, or a row of the table, was
    clicked.  ``on_time_range(range_ms)``: the timeline was zoomed to ``(start, end)`` ms,
    or back to the whole axis (None).  ``on_sort(key)``: a header of the table was clicked.
    While it draws, the figures' own change events reach no callback."""

    NAMES = ("flame", "timeline", "legend", "status", "top_table", "source", "sandwich")

    def __init__(self, views: Views, first: View, *, on_select: Callable[[Frame], None],
                 on_time_range: Callable[[tuple[float, float] | None], None], on_sort: Callable[[str], None]):
        self.views = views
        self.timings: dict[str, float] = {}  # seconds spent in the last draw's steps
        self._on_select, self._on_time_range, self._on_sort = on_select, on_time_range, on_sort
        self._drawing = True
        self.view: View = first  # the view drawn last
        self.top_rows: list | None = None  # the table's rows drawn last
        self._zoom_level = ""  # the flame trace's ``level`` (see ``_send_flame``)
        self._sandwich_key, self._sandwich_view = None, None  # what the open sandwich shows
        self.status = W.HTML(value=F.esc(status_text(first)))
        self.status.add_class("ddprof-status")
        self.legend = W.HTML(value=F.legend_html(first.tree))
        self.legend.add_class("ddprof-legend-row")
        self.sandwich = SandwichPanel(on_select=on_select)
        self.flame = figure_widget(F.flame_trace_props(first.flame), F.flame_layout(first.flame), "icicle")
        td = self.drawn_timeline = views.timeline(first.state)
        self.timeline = figure_widget(F.timeline_traces(td), F.timeline_layout(td), "bar")
        self.flame.add_class("ddprof-flame")
        self.timeline.add_class("ddprof-timeline")
        self.extent_ms = td.extent_ms
        self.has_time = td.has_time  # False: no sample timestamps, so no time-range filter
        self.top_table = TopTable(sort=first.state.top_sort, layout=W.Layout(width="100%"))
        self.source = W.HTML(value=F.source_html(None), layout=W.Layout(width="100%"))
        self._draw_top(views.top(first.state))
        self._draw_source()
        self._drawing = False
        self._wire()

    def _wire(self) -> None:
        self.flame.data[0].on_click(self._on_flame_click)
        for fig in (self.flame, self.timeline):
            fig.observe(self._on_first_draw, names="_js2py_traceDeltas")
        self.timeline.layout.xaxis.on_change(self._on_xrange, "range")
        self.timeline.layout.xaxis.on_change(self._on_autorange, "autorange")
        self.top_table.observe(self._on_sort_click, names="sort")
        self.top_table.observe(self._on_row_click, names="selected")

    # -- drawing -----------------------------------------------------------------------

    def draw(self, v: View, *, open_sandwich: bool = False, started: float | None = None) -> dict[str, float]:
        """Draw ``v``: the flame chart first, in one batch, then the timeline, then the top
        table and source view, then the sandwich (opened for a selection when
        ``open_sandwich``, else redrawn if open).  Returns ``timings`` (seconds since
        ``started``, the change's start)."""
        t = self.timings
        t.clear()
        t0 = time.perf_counter() if started is None else started
        old, self.view = self.view, v
        drawing, self._drawing = self._drawing, True
        try:
            if v.flame is not old.flame:
                t1 = time.perf_counter()
                self._send_flame(v.flame)
                t["figures"] = time.perf_counter() - t1
            self.status.value = F.esc(status_text(v))
            t["chart"] = time.perf_counter() - t0
            if v.tree is not old.tree:
                self.legend.value = F.legend_html(v.tree)
            t1 = time.perf_counter()
            if old.state.time_range is not None and v.state.time_range is None:
                self.whole_time_axis()
            if self._draw_timeline(v):
                t["timeline"] = time.perf_counter() - t1
            rows = self.views.top(v.state)
            if rows is not self.top_rows:
                self._draw_top(rows)
            if v.view is not old.view or v.view_before is not old.view_before \
                    or v.state.selected != old.state.selected or v.state.diff_view != old.state.diff_view:
                self._draw_source()
            self._draw_sandwich(open_sandwich)
        finally:
            self._drawing = drawing
            # a reloaded page draws what the controls say
            remember_state(self.flame)
            remember_state(self.timeline, data="timeline" in t)
            t["update"] = time.perf_counter() - t0
        return t

    def _send_flame(self, fd: F.FlameData) -> None:
        # Undo any click-zoom: node ids mean other functions in the new tree.  Python
        # never hears of the browser's zoom, so alternate between two spellings of "the
        # root" ("" and its id "0") to make plotly apply it.
        self._zoom_level = "0" if self._zoom_level != "0" else ""
        send_update(self.flame, [dict(F.flame_trace_props(fd), level=self._zoom_level)], F.flame_layout(fd))

    def _draw_timeline(self, v: View) -> bool:
        """Redraw the timeline if its data changed; True if it did."""
        td = self.views.timeline(v.state)
        if td is self.drawn_timeline:  # a time range alone: the timeline shows it already
            return False
        self.drawn_timeline = td
        self.extent_ms = td.extent_ms
        traces = F.timeline_traces(td)
        layout = F.timeline_layout(td)
        if v.state.time_range is not None:
            layout["xaxis"]["range"] = [v.state.time_range[0] / 1e6, v.state.time_range[1] / 1e6]
        if [t["name"] for t in traces] == [t.get("name") for t in self.timeline._data]:
            send_update(self.timeline, traces, layout)
        else:  # other states: new traces (rare: an event switch)
            with self.timeline.batch_update():
                self.timeline.data = ()
                self.timeline.layout.update(layout)
            self.timeline.add_traces(traces)
        return True

    def whole_time_axis(self) -> None:
        """Show the whole time axis again (our own range change reaches no callback)."""
        drawing, self._drawing = self._drawing, True
        try:
            with self.timeline.batch_update():
                self.timeline.layout.xaxis.update(range=list(self.extent_ms), autorange=False)
        finally:
            self._drawing = drawing

    def _draw_top(self, rows: list) -> None:
        """The table's rows (``Views.top``: grouped, sorted by the clicked header, cut)."""
        s, v = self.view.state, self.view
        e, group, diff = v.event, s.top_group, self.views.diff
        self.top_rows = rows
        total = v.view.total(e, 1)
        with self.top_table.hold_sync():
            self.top_table.columns = columns(e, diff, group)
            self.top_table.rows = [cells(r, e, total, diff, group) for r in rows]
            self.top_table.titles = [r.name + (f" — {r.filename}:{r.line}" if r.filename else "") for r in rows]
            self.top_table.sort = s.top_sort
            self.top_table.selected = -1

    def _draw_source(self) -> None:
        s = self.view.state
        fr = s.selected
        if fr is None:
            self.source.value = F.source_html(None)
            return
        sv = F.source_view(self.views.selected_view(s), self.view.event, (fr.name, fr.filename, fr.first_line),
                           s.value_index, read_lines=source_lines)
        self.source.value = F.source_html(sv)

    def _draw_sandwich(self, wanted: bool) -> None:
        """Open the sandwich (``wanted``) or redraw the open one from the current view
        (closed when its function left it)."""
        s = self.view.state
        if s.selected is None or not (wanted or self.sandwich.data):
            return
        view = self.views.selected_view(s)
        # the panel depends on these only (not on inverted, only-my-code, flame/icicle):
        # a change of anything else leaves it as it is
        key = (s.event, s.value_index, s.selected, s.min_pct, s.node_budget())
        if self.sandwich.data is not None and key == self._sandwich_key and view is self._sandwich_view:
            return
        self._sandwich_key, self._sandwich_view = key, view
        # two charts of half the flame's nodes each: the pair costs the browser what the
        # flame does (plotly's redraw of a chart grows with its nodes)
        try:
            data = sandwich_data(view, self.view.event, s.value_index, s.selected,
                                 min_pct=s.min_pct, max_nodes=s.node_budget() // 2)
        except ValueError:  # not a function of this view
            data = None
        if data is None or not data.total:
            self.sandwich.hide()
        else:
            self.sandwich.show(data)

    # -- what the user does on the outputs ---------------------------------------------

    def _on_flame_click(self, trace, points, selector=None) -> None:
        inds = list(getattr(points, "point_inds", []) or [])
        if not inds:
            return
        node = int(self.view.flame.node[inds[0]])
        fr = self.view.tree.frame(node) if node > 0 else None
        if fr is not None:
            self._on_select(fr)

    def _on_row_click(self, change) -> None:
        """A row click selects its function (for the source view), changing no filter."""
        rows = self.top_rows or []
        if self._drawing or change["new"] < 0 or change["new"] >= len(rows):
            return
        frame = self.function_of(rows[change["new"]])
        if frame is not None:
            self._on_select(frame)

    def function_of(self, row) -> Frame | None:
        """The function a table row stands for (a file row stands for none)."""
        return function_of(row, self.view)

    def _on_sort_click(self, change) -> None:
        if not self._drawing:
            self._on_sort(change["new"])

    def _on_autorange(self, axis, autorange) -> None:
        if not self._drawing and autorange:  # a double-click on the timeline
            self._on_time_range(None)

    def _on_xrange(self, layout, xrange) -> None:
        if self._drawing or xrange is None or not self.has_time:
            return
        a, b = float(xrange[0]), float(xrange[1])
        lo, hi = self.extent_ms
        span = max(hi - lo, 1e-9)
        if a <= lo + span * 1e-3 and b >= hi - span * 1e-3:
            self._on_time_range(None)
        else:
            self._on_time_range((max(a, lo), min(b, hi)))

    def _on_first_draw(self, change) -> None:
        """Fill the output's width once the figure is on the page.

        The frontend draws a FigureWidget before it is attached, so plotly.js falls back
        to 700 px; its first trace-delta message (sent after the first draw; plotly 7's
        layout-delta message never reaches Python) tells us it is drawn, and a relayout
        with ``autosize`` makes plotly measure the (now attached) container."""
        fig = change["owner"]
        if change["new"] is None:
            return
        fig.unobserve(self._on_first_draw, names="_js2py_traceDeltas")
        # plotly.js re-measures on relayout only when the *user* layout says autosize
        if not fig.to_plotly_json()["layout"].get("autosize"):
            fig.layout.autosize = True
            remember_state(fig)


def function_of(row, v: View) -> Frame | None:
    """The function a top-table row of ``v`` stands for (a file row stands for none)."""
    if v.state.top_group == "file":
        return None
    if v.state.top_group == "line":
        for fr in v.view.frames:
            if (fr.name, fr.filename, fr.line, fr.kind) == row.key:
                return Frame(fr.name, fr.filename, fr.first_line, fr.first_line, fr.kind)
    return Frame(row.name, row.filename, row.line, row.line, row.kind)
