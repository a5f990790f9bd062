"""The Explorer: an ipywidgets VBox to browse a Profile (or the diff of two).

A thin shell over a ``ViewState`` (``view_state.py``: the event, filters, transforms,
time range, selection and chart options), which ``view.Views`` turns into a view
without any widget.  Each control's change writes a new state (``_set``); the drawing
(``pipeline.py``) sends the parts of its view that changed: figures are plotly
FigureWidgets updated in one message each.  A bad regex or label filter shows an
inline message and the previous valid value stays in force, so the charts keep
showing the last good view.

The controls are made and laid out in ``controls.py``, the output without widgets is
``static_view.py``; this module wires the controls to the state and answers clicks
(selection, sandwich, source view, time range).
"""

from __future__ import annotations

import re

import ipywidgets as W

from .. import render as F
from ..events import EventType
from ..model import Frame, Profile
from .controls import ControlsMixin
from .figure_widget import figure_widget, remember_state, send_bundle
from .pipeline import PipelineMixin
from .sandwich import SandwichPanel, sandwich_data
from .sources import source_lines
from .static_view import StaticMixin
from .top_rows import cells, columns
from .view import Views
from .view_state import ViewState, parse_label_filter

__all__ = ["Explorer", "parse_label_filter"]


class Explorer(ControlsMixin, PipelineMixin, StaticMixin, W.VBox):
    """Interactive flame/icicle charts, timeline, top table and source view of a Profile.

    ``Explorer(profile)`` explores one profile; ``Explorer(before, after)`` shows the
    differential flame chart of ``after`` against ``before`` (with views of each).
    Where no widget frontend runs, the display falls back to a static HTML flame graph
    and a text top table (see ``_repr_mimebundle_``).  ``state`` is what it shows;
    ``show(state)`` shows another (the controls follow).
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
        self.views = Views(self.profile, self.before)
        self._hidden = self.views.hidden
        self.timings: dict[str, float] = {}  # seconds spent in the last update's steps
        self.last_error = ""
        self._sandwich_key, self._sandwich_view = None, None  # what the open sandwich shows
        self._busy = False
        self._top, self._drawn_timeline = None, None
        events, first = self._events(event)
        self.state = ViewState(event=first.label, min_pct=min_pct, max_nodes=max_nodes, top_n=top_n,
                               top_sort="change" if self.diff else "self")
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
        self._zoom_level = ""  # the flame trace's ``level`` (see _show)
        self.legend = W.HTML()
        self.legend.add_class("ddprof-legend-row")
        self._show(self.state)
        self.flame = figure_widget(F.flame_trace_props(self._fd), F.flame_layout(self._fd), "icicle")
        td = self._drawn_timeline = self._timeline_data()
        self.timeline = figure_widget(F.timeline_traces(td), F.timeline_layout(td), "bar")
        self.flame.add_class("ddprof-flame")
        self.timeline.add_class("ddprof-timeline")
        self._extent_ms = td.extent_ms
        self._has_time = td.has_time  # False: no sample timestamps, so no time-range filter
        self._refresh_top(self.views.top(self.state))

    @property
    def max_nodes(self) -> int | None:
        """The flame's most boxes (None: the state's ``node_budget`` decides); a new value
        takes effect at the next change."""
        return self.state.max_nodes

    @max_nodes.setter
    def max_nodes(self, n: int | None) -> None:
        self.state = self.state.replace(max_nodes=n)

    @property
    def top_n(self) -> int:
        return self.state.top_n

    @top_n.setter
    def top_n(self, n: int) -> None:
        self.state = self.state.replace(top_n=n)

    # each control -> the state field it sets (text filters: ``_on_text``)
    _FIELDS = {"event_dd": "event", "chart_tb": "chart", "inverted_tb": "inverted", "search_txt": "search",
               "threads_sel": "threads", "diff_view_tb": "diff_view", "diff_norm_tb": "diff_norm",
               "top_group_tb": "top_group"}
    _MORE_FIELDS = {"value_tb": "value_index", "only_mine_cb": "only_mine", "min_pct_sl": "min_pct",
                    "machinery_tb": "show_machinery"}

    def _wire_fields(self, fields: dict) -> None:
        for name, field in fields.items():
            getattr(self, name).observe(lambda change, field=field: self._on_control(field, change), names="value")

    def _wire(self) -> None:
        self._wire_fields(self._FIELDS)
        self.search_txt.observe(self._on_search, names="value")  # after the redraw above
        self.top_table.observe(lambda c: self._on_control("top_sort", c), names="sort")
        self.top_table.observe(self._on_top_select, names="selected")
        self.flame.data[0].on_click(self._on_flame_click)
        for fig in (self.flame, self.timeline):
            fig.observe(self._on_first_draw, names="_js2py_traceDeltas")
        self.timeline.layout.xaxis.on_change(self._on_xrange, "range")
        self.timeline.layout.xaxis.on_change(self._on_autorange, "autorange")

    def _wire_more(self) -> None:
        """The controls behind "more", once made (``_make_more``)."""
        self._wire_fields(self._MORE_FIELDS)
        for w in (self.focus_txt, self.ignore_txt, self.hide_txt, self.labels_txt):
            w.observe(self._on_text, names="value")
        self.clear_btn.on_click(lambda _: self.clear_filters())
        self.range_btn.on_click(lambda _: self.set_time_range(None))

    def show(self, state: ViewState) -> None:
        """Show ``state`` (e.g. ``ex.show(ex.state.replace(focus="^main$"))``): the
        charts draw it and the controls follow."""
        if state.show_machinery != self.state.show_machinery:
            self._machinery_shown(state.show_machinery)
        self._with_controls_quiet(lambda: self._controls_follow(state))
        self._show(state)

    def _controls_follow(self, state: ViewState) -> None:
        fields = {**self._FIELDS, **(self._MORE_FIELDS if self._more_made else {})}
        if state.event != self.state.event:
            self.event_dd.value = state.event
            self._set_value_options(EventType.parse(state.event))
        for name, field in fields.items():
            widget, value = getattr(self, name), getattr(state, field)
            if name == "machinery_tb":
                continue  # ``_machinery_shown`` above
            widget.value = value
        self.top_table.sort = state.top_sort
        if self._more_made:
            for name in ("focus", "ignore", "hide", "labels"):
                getattr(self, f"{name}_txt").value = getattr(state, name)
            self.range_btn.disabled = state.time_range is None
            if list(state.transforms) != self.transform_bar.steps:
                self.transform_bar.steps[:] = state.transforms
                self.transform_bar._redraw()

    def _on_control(self, field: str, change) -> None:
        if self._busy:
            return
        value = change["new"]
        if field == "threads":
            value = tuple(value)
        elif field == "value_index":
            value = int(value)
        elif field == "diff_norm":
            value = bool(value)
        if field == "event":
            self._with_controls_quiet(lambda: self._set_value_options(EventType.parse(value)))
        if field == "show_machinery":
            self._machinery_shown(bool(value))
            value = bool(value)
        self._set(**{field: value})

    def _on_text(self, change) -> None:
        """A typed filter: the valid ones go into the state, a bad one leaves a message."""
        if self._busy:
            return
        state, errors = self.state.edited(focus=self.focus_txt.value, ignore=self.ignore_txt.value,
                                          hide=self.hide_txt.value, labels=self.labels_txt.value)
        self.last_error = "; ".join(errors)
        self.message.value = F.esc(self.last_error)
        self._show(state)

    def _with_controls_quiet(self, change) -> None:
        """Set controls to follow the state without their observers writing it again."""
        busy, self._busy = self._busy, True
        try:
            change()
        finally:
            self._busy = busy

    def _set_value_options(self, e: EventType) -> None:
        if not self._more_made:
            return
        vi = self.value_tb.value
        self.value_tb.options = self._value_options(e)
        self.value_tb.value = vi

    # -- top table ----------------------------------------------------------------------

    def _refresh_top(self, rows: list) -> None:
        """The table's rows (``Views.top``: grouped, sorted by the clicked header, cut)."""
        e, group = self.event, self.state.top_group
        self._top = rows
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
        if self.state.top_group == "file":
            return None
        if self.state.top_group == "line":
            for fr in self._view.frames:
                if (fr.name, fr.filename, fr.line, fr.kind) == row.key:
                    return Frame(fr.name, fr.filename, fr.first_line, fr.first_line, fr.kind)
        return Frame(row.name, row.filename, row.line, row.line, row.kind)

    def focus_function(self, name: str, filename: str = "", first_line: int = 0) -> None:
        """Focus every chart on one function and show its source."""
        selected = Frame(name, filename, first_line, first_line) if filename else Frame(name)
        focus = "^" + re.escape(name) + "$"
        if self._more_made:
            self._with_controls_quiet(lambda: setattr(self.focus_txt, "value", focus))
        self.message.value = self.last_error = ""
        self._show(self.state.replace(selected=selected, focus=focus))

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
        self._sandwich_wanted = True
        try:
            self._set(selected=frame)
        finally:
            self._sandwich_wanted = False

    _sandwich_wanted = False  # a selection opens the sandwich; other changes redraw an open one

    def _refresh_sandwich(self) -> None:
        """Redraw the open sandwich from the current view (closed when its function left it)."""
        s = self.state
        if not hasattr(self, "sandwich") or s.selected is None or not (self._sandwich_wanted or self.sandwich.data):
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
            data = sandwich_data(view, self.event, s.value_index, s.selected,
                                 min_pct=s.min_pct, max_nodes=s.node_budget() // 2)
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
        self._set(transforms=tuple(self.transform_bar.steps))

    def _refresh_source(self) -> None:
        fr = self._selected
        if fr is None:
            self.source.value = F.source_html(None)
            return
        view = self.views.selected_view(self.state)
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
        if self._more_made:
            self.range_btn.disabled = new is None
        if new is None:  # show the whole axis again (our own range change must not recurse)
            self._with_controls_quiet(self._whole_time_axis)
        self._set(time_range=new)

    def _whole_time_axis(self) -> None:
        with self.timeline.batch_update():
            self.timeline.layout.xaxis.update(range=list(self._extent_ms), autorange=False)

    def clear_filters(self) -> None:
        """Back to the whole profile: no thread/label/regex/time filters, no search."""
        busy, self._busy = self._busy, True
        try:
            boxes = (self.focus_txt, self.ignore_txt, self.hide_txt, self.labels_txt) if self._more_made else ()
            for box in (*boxes, self.search_txt):
                box.value = ""
            self.threads_sel.value = ()
            if self._more_made:
                self.range_btn.disabled = True
            self._whole_time_axis()
        finally:
            self._busy = busy
        self.message.value = self.last_error = ""
        self._set(focus="", ignore="", hide="", labels="", search="", threads=(), time_range=None)
