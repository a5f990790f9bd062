"""The Explorer's drawing: a new ``ViewState`` in, its view (``view.Views``) out to the
figures, the status line, the legend, the timeline, the top table, the source view and
the sandwich.  A mixin of ``Explorer``: it reads no control; it sends only the parts
whose data is not the object it drew last (the views keep unchanged steps' results)."""

from __future__ import annotations

import time

from .. import render as F
from ..events import EventType
from .figure_widget import remember_state, send_update
from .view import status_text
from .view_state import DRAW_NODES, ViewState

__all__ = ["PipelineMixin", "DRAW_NODES"]


class PipelineMixin:
    """``_show(state)``: make ``state`` the explorer's and draw what it changed."""

    # the current view's parts, as the rest of the explorer (and its tests) reads them
    @property
    def event(self) -> EventType:
        return EventType.parse(self.state.event)

    @property
    def value_index(self) -> int:
        return self.state.value_index

    @property
    def _view(self):
        return self._v.view

    @property
    def _tl_view(self):
        return self._v.timeline_view

    @property
    def _view_before(self):
        return self._v.view_before

    @property
    def _tree(self):
        return self._v.tree

    @property
    def _fd(self):
        return self._v.flame

    @property
    def _selected(self):
        return self.state.selected

    @property
    def _time_range(self):
        return self.state.time_range

    def node_budget(self) -> int:
        return self.state.node_budget()

    def _timeline_data(self) -> F.TimelineData:
        return self.views.timeline(self.state)

    def _set(self, **changes) -> None:
        self._show(self.state.replace(**changes))

    def _show(self, state: ViewState) -> None:
        """Draw ``state``: the flame chart first, in one batch, then the timeline, then
        the top table and source view.  ``timings`` records each step (seconds)."""
        if self._busy:
            return
        busy, self._busy = self._busy, True
        t = self.timings
        t.clear()
        t0 = time.perf_counter()
        old = getattr(self, "_v", None)
        try:
            self.state = state
            self._v = v = self.views.of(state)
            t["view"] = time.perf_counter() - t0
            if hasattr(self, "flame") and (old is None or v.flame is not old.flame):
                t1 = time.perf_counter()
                # Undo any click-zoom: node ids mean other functions in the new tree.
                # Python never hears of the browser's zoom, so alternate between two
                # spellings of "the root" ("" and its id "0") to make plotly apply it.
                self._zoom_level = "0" if self._zoom_level != "0" else ""
                props = dict(F.flame_trace_props(v.flame), level=self._zoom_level)
                send_update(self.flame, [props], F.flame_layout(v.flame))
                t["figures"] = time.perf_counter() - t1
            self.status.value = F.esc(status_text(v))
            t["chart"] = time.perf_counter() - t0
            if old is None or v.tree is not old.tree:
                self.legend.value = F.legend_html(v.tree)
            self._mark_more()
            if hasattr(self, "timeline"):
                t1 = time.perf_counter()
                if self._refresh_timeline():
                    t["timeline"] = time.perf_counter() - t1
            if hasattr(self, "top_table"):
                rows = self.views.top(state)
                if rows is not self._top:
                    self._refresh_top(rows)
                if old is None or v.view is not old.view or v.view_before is not old.view_before \
                        or state.selected != old.state.selected or state.diff_view != old.state.diff_view:
                    self._refresh_source()
            self._refresh_sandwich()
        finally:
            self._busy = busy
            # a reloaded page draws what the controls say
            if hasattr(self, "flame"):
                remember_state(self.flame)
            if hasattr(self, "timeline"):
                remember_state(self.timeline, data="timeline" in t)
            t["update"] = time.perf_counter() - t0

    def _refresh_timeline(self) -> bool:
        """Redraw the timeline if its data or range changed; True if its data did."""
        td = self.views.timeline(self.state)
        if td is self._drawn_timeline:  # a time range alone: the timeline shows it already
            return False
        self._drawn_timeline = td
        self._extent_ms = td.extent_ms
        traces = F.timeline_traces(td)
        layout = F.timeline_layout(td)
        if self.state.time_range is not None:
            layout["xaxis"]["range"] = [self.state.time_range[0] / 1e6, self.state.time_range[1] / 1e6]
        if [t["name"] for t in traces] == [t.get("name") for t in self.timeline._data]:
            send_update(self.timeline, traces, layout)
        else:  # other states: new traces (rare: an event switch)
            with self.timeline.batch_update():
                self.timeline.data = ()
                self.timeline.layout.update(layout)
            self.timeline.add_traces(traces)
        return True
