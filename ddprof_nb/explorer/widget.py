"""The Explorer: an ipywidgets VBox to browse a Profile (or the diff of two).

State lives in the controls; every change runs one pipeline:

    threads.hide_machinery (unless shown), chips.apply (transforms) -> base
    aggregate.filter (events, threads, labels, focus/ignore/hide)   -> timeline view
    aggregate.filter (time range from the timeline)                 -> view
    render.call_tree / diff_tree (of the inverted view if asked)   -> tree
    render.flame_data (min %, search, flame/icicle)                 -> flame chart
    top.top (grouped by function/line/file, sorted, cut)            -> top table
    sandwich.sandwich_data (the selected function)                  -> sandwich

and stops at the first step the change touches (a search or min-% change re-prunes
the cached tree only).  Figures are plotly FigureWidgets updated inside
``batch_update()``.  A bad regex or label filter shows an inline message and the
previous valid value stays in force, so the charts keep showing the last good view.

The controls are made and laid out in ``controls.py``, the pipeline runs in
``pipeline.py``, the output without widgets is ``static_view.py``; this module wires
them together and answers clicks (selection, sandwich, source view, time range).
"""

from __future__ import annotations

import re
import time

import ipywidgets as W

from .. import render as F
from ..events import EventType
from ..model import Frame, Profile
from .chips import TransformBar
from .controls import ControlsMixin, parse_label_filter
from .figure_widget import figure_widget, remember_state, send_bundle
from .pipeline import PipelineMixin
from .sandwich import SandwichPanel, sandwich_data
from .sources import source_lines
from .static_view import StaticMixin
from ..model.top import top
from .top_rows import cells, columns

__all__ = ["Explorer", "parse_label_filter"]


class Explorer(ControlsMixin, PipelineMixin, StaticMixin, W.VBox):
    """Interactive flame/icicle charts, timeline, top table and source view of a Profile.

    ``Explorer(profile)`` explores one profile; ``Explorer(before, after)`` shows the
    differential flame chart of ``after`` against ``before`` (with views of each).
    Where no widget frontend runs, the display falls back to a static HTML flame graph
    and a text top table (see ``_repr_mimebundle_``).
    """

    def __init__(
        self,
        profile: Profile,
        other: Profile | None = None,
        *,
        event=None,
        min_pct: float = F.DEFAULT_MIN_PCT,
        max_nodes: int | None = None,
        top_n: int = 40,
    ):
        send_bundle(None)  # sent while the first view is computed, evaluated after the static chart
        self.diff = other is not None
        self.before = profile if self.diff else None
        self.profile = other if self.diff else profile  # the primary ("after") profile
        self.max_nodes = max_nodes  # None: node_budget() decides
        self.top_n = top_n
        self.timings: dict[str, float] = {}  # seconds spent in the last update's steps
        self.last_error = ""
        self._time_range: tuple[int, int] | None = None
        self._selected: Frame | None = None
        self._sandwich_key, self._sandwich_view = None, None  # what the open sandwich shows
        self._good = {"focus": "", "ignore": "", "hide": "", "labels": {}}
        self._busy = False
        self._show_machinery = False
        self.transform_bar = TransformBar(on_change=self._on_transforms, selected=lambda: self._selected)
        self._make_bases()

        events, first = self._events(event)
        self._make_controls(events, first, min_pct)
        self._make_figures()
        self._wire()
        super().__init__(children=self._rows())
        self.add_class("ddprof-explorer")

    def _events(self, event) -> tuple[list[EventType], EventType]:
        """The events to offer (in diff mode, those both profiles have) and the first one shown."""
        events = [e for e in self.profile.events if not self.diff or e in self.before.events]
        if not events:
            events = list(self.profile.events) or [EventType.CPU]
        first = EventType.parse(event) if event is not None else events[0]
        if first not in events:
            present = ", ".join(e.label for e in events)
            raise ValueError(f"event {first.label!r} is not in the profile; present: {present}")

        return events, first

    def _make_figures(self) -> None:
        self.sandwich = SandwichPanel(on_select=self.select_function)
        self._last_criteria = None
        self._zoom_level = ""  # the flame trace's ``level`` (see _update)
        self.legend = W.HTML()
        self.legend.add_class("ddprof-legend-row")
        self._update("filter")
        self.flame = figure_widget(F.flame_trace_props(self._fd), F.flame_layout(self._fd), "icicle")
        td = self._timeline_data()
        self.timeline = figure_widget(F.timeline_traces(td), F.timeline_layout(td), "bar")
        self.flame.add_class("ddprof-flame")
        self.timeline.add_class("ddprof-timeline")
        self._extent_ms = td.extent_ms
        self._has_time = td.has_time  # False: no sample timestamps, so no time-range filter
        if not self._has_time:
            self.range_btn.description = "no time axis"
        self._refresh_top()

    def _wire(self) -> None:
        for w in (self.event_dd, self.value_tb, self.only_mine_cb, self.inverted_tb, self.threads_sel, self.labels_txt,
                  self.focus_txt, self.ignore_txt, self.hide_txt, self.diff_view_tb):
            w.observe(self._on_filter, names="value")
        for w in (self.min_pct_sl, self.search_txt, self.chart_tb, self.diff_norm_tb):
            w.observe(self._on_render, names="value")
        self.search_txt.observe(self._on_search, names="value")  # after the redraw above
        self.machinery_tb.observe(self._on_machinery, names="value")
        self.top_group_tb.observe(lambda _: self._refresh_top(), names="value")
        self.top_table.observe(lambda _: self._refresh_top(), names="sort")
        self.top_table.observe(self._on_top_select, names="selected")
        self.clear_btn.on_click(lambda _: self.clear_filters())
        self.range_btn.on_click(lambda _: self.set_time_range(None))
        self.flame.data[0].on_click(self._on_flame_click)
        for fig in (self.flame, self.timeline):
            fig.observe(self._on_first_draw, names="_js2py_traceDeltas")
        self.timeline.layout.xaxis.on_change(self._on_xrange, "range")
        self.timeline.layout.xaxis.on_change(self._on_autorange, "autorange")

    # ---------------------------------------------------------------------------------
    # options

    @property
    def event(self) -> EventType:
        return EventType.parse(self.event_dd.value)

    @property
    def value_index(self) -> int:
        return int(self.value_tb.value)

    # -- top table ----------------------------------------------------------------------

    def _refresh_top(self) -> None:
        """The table's rows: grouped, sorted by the clicked header, cut to ``top_n``."""
        t0 = time.perf_counter()
        e, group = self.event, self.top_group_tb.value
        self._top = rows = top(self._view, e, self.top_n, by=group, sort=self.top_table.sort,
                               before=self._view_before if self.diff else None, normalize=bool(self.diff_norm_tb.value))
        self.timings["top"] = time.perf_counter() - t0
        total = self._view.total(e, 1)
        busy, self._busy = self._busy, True
        try:
            with self.top_table.hold_sync():
                self.top_table.columns = columns(e, self.diff, group)
                self.top_table.rows = [cells(r, e, total, self.diff, group) for r in rows]
                self.top_table.titles = [r.name + (f" — {r.filename}:{r.line}" if r.filename else "") for r in rows]
                self.top_table.selected = -1
        finally:
            self._busy = busy

    def _on_top_select(self, change) -> None:
        """A row click selects its function (for the source view), changing no filter."""
        if self._busy or change["new"] < 0 or change["new"] >= len(self._top):
            return
        row = self._top[change["new"]]
        frame = self._function_of(row)
        if frame is not None:
            self.select_function(frame)

    def _function_of(self, row) -> Frame | None:
        """The function a table row stands for (a file row stands for none)."""
        if self.top_group_tb.value == "file":
            return None
        if self.top_group_tb.value == "line":
            for fr in self._view.frames:
                if (fr.name, fr.filename, fr.line, fr.kind) == row.key:
                    return Frame(fr.name, fr.filename, fr.first_line, fr.first_line, fr.kind)
        return Frame(row.name, row.filename, row.line, row.line, row.kind)

    def focus_function(self, name: str, filename: str = "", first_line: int = 0) -> None:
        """Focus every chart on one function and show its source."""
        self._selected = Frame(name, filename, first_line, first_line) if filename else Frame(name)
        self.focus_txt.value = "^" + re.escape(name) + "$"  # observers rebuild the views
        self._refresh_source()

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

    # -- flame clicks, source view ------------------------------------------------------

    def _on_flame_click(self, trace, points, selector=None) -> None:
        inds = list(getattr(points, "point_inds", []) or [])
        if not inds:
            return
        node = int(self._fd.node[inds[0]])
        fr = self._tree.frame(node) if node > 0 else None
        if fr is not None:
            self.select_function(fr)

    def select_function(self, frame: Frame) -> None:
        """Select one function: its sandwich (callers and callees over every call site)
        and its per-line values in the source view.  No filter changes."""
        self._selected = frame
        self._refresh_source()
        self._refresh_sandwich(open_it=True)

    def _refresh_sandwich(self, open_it: bool = False) -> None:
        """Redraw the open sandwich from the current view (closed when its function left it)."""
        if not hasattr(self, "sandwich") or self._selected is None or not (open_it or self.sandwich.data):
            return
        view = self._view_before if self.diff and self.diff_view_tb.value == "before" else self._view
        # the panel depends on these only (not on inverted, only-my-code, flame/icicle):
        # a change of anything else leaves it as it is
        key = (self.event, self.value_index, self._selected, self.min_pct_sl.value, self.node_budget())
        if self.sandwich.data is not None and key == self._sandwich_key and view is self._sandwich_view:
            return
        self._sandwich_key, self._sandwich_view = key, view
        # two charts of half the flame's nodes each: the pair costs the browser what the
        # flame does (plotly's redraw of a chart grows with its nodes)
        try:
            data = sandwich_data(view, self.event, self.value_index, self._selected,
                                 min_pct=self.min_pct_sl.value, max_nodes=self.node_budget() // 2)
        except ValueError:  # not a function of this view
            data = None
        if data is None or not data.total:
            self.sandwich.hide()
        else:
            self.sandwich.show(data)

    def _on_search(self, change) -> None:
        """A search selects its heaviest match: that function's sandwich opens."""
        if self._busy or not change["new"]:
            return
        frame = F.heaviest_match(self._tree, change["new"])  # (not a regex: searched as text)
        if frame is not None:
            self.select_function(frame)

    def _on_transforms(self) -> None:
        """The chips changed: every view starts again from the transformed base."""
        self._mark_more()
        self._make_bases()
        self._update("filter", timeline=True, top=True)

    def _refresh_source(self) -> None:
        fr = self._selected
        if fr is None:
            self.source.value = F.source_html(None)
            return
        view = self._view_before if self.diff and self.diff_view_tb.value == "before" else self._view
        sv = F.source_view(view, self.event, (fr.name, fr.filename, fr.first_line), self.value_index,
                           read_lines=source_lines)
        self.source.value = F.source_html(sv)

    # -- time range ---------------------------------------------------------------------

    def _on_autorange(self, axis, autorange) -> None:
        if not self._busy and autorange:  # a double-click on the timeline
            self.set_time_range(None)

    def _on_xrange(self, layout, xrange) -> None:
        if self._busy or xrange is None or not self._has_time:
            return
        a, b = float(xrange[0]), float(xrange[1])
        lo, hi = self._extent_ms
        span = max(hi - lo, 1e-9)
        if a <= lo + span * 1e-3 and b >= hi - span * 1e-3:
            self.set_time_range(None)
        else:
            self.set_time_range((max(a, lo), min(b, hi)))

    def set_time_range(self, range_ms: tuple[float, float] | None) -> None:
        """Filter every view to [start, end) milliseconds since the profile's start (None: all)."""
        if range_ms is not None and not self._has_time:
            raise ValueError("this profile has no sample timestamps: there is no time range to select")
        new = None if range_ms is None else (int(range_ms[0] * 1e6), int(range_ms[1] * 1e6))
        if new == self._time_range:
            return
        self._time_range = new
        self.range_btn.disabled = new is None
        if new is None:  # show the whole axis again (our own range change must not recurse)
            busy, self._busy = self._busy, True
            try:
                with self.timeline.batch_update():
                    self.timeline.layout.xaxis.update(range=list(self._extent_ms), autorange=False)
            finally:
                self._busy = busy
        self._update("time", top=True)

    # -- observers ----------------------------------------------------------------------

    def _on_filter(self, change) -> None:
        if self._busy:
            return
        owner = change["owner"]
        if owner is self.event_dd:
            busy, self._busy = self._busy, True
            try:
                vi = self.value_tb.value
                self.value_tb.options = self._value_options(self.event)
                self.value_tb.value = vi
            finally:
                self._busy = busy
            self._update("tree", timeline=True, top=True)
        elif owner is self.value_tb:
            self._update("tree", top=True)
        elif owner in (self.only_mine_cb, self.inverted_tb, self.diff_view_tb):
            # the top table and source view do not fold library frames
            self._update("tree", top=owner is self.diff_view_tb)
        else:
            self._update("filter", timeline=True, top=True)

    def _on_render(self, change) -> None:
        if self._busy:
            return
        self._update("render", top=change["owner"] is self.diff_norm_tb)

    def clear_filters(self) -> None:
        """Back to the whole profile: no thread/label/regex/time filters, no search."""
        busy, self._busy = self._busy, True
        try:
            for box in (self.focus_txt, self.ignore_txt, self.hide_txt, self.labels_txt, self.search_txt):
                box.value = ""
            self.threads_sel.value = ()
            self._time_range = None
            self.range_btn.disabled = True
            with self.timeline.batch_update():
                self.timeline.layout.xaxis.update(range=list(self._extent_ms), autorange=False)
        finally:
            self._busy = busy
        self._update("filter", timeline=True, top=True)
