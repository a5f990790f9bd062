"""The Explorer: an ipywidgets VBox to browse a Profile (or the diff of two).

A thin shell over a ``ViewState`` (``view_state.py``: the event, filters, transforms,
time range, selection and chart options).  It owns three parts and wires them:

    Controls (controls.py) --changes--> Explorer: state.replace / state.edited
        --> Views.of(state) (view.py, no widget) --> Drawing.draw(view) (drawing.py)
        --> Controls.mark(state)

``Controls`` makes the inputs and reports what the user set; ``Drawing`` owns the
figures, table, source view and sandwich and sends the parts of a view that changed;
``static_view`` turns a view into the output for frontends without widgets.  A bad
regex or label filter shows an inline message and the previous valid value stays in
force, so the charts keep showing the last good view.
"""

from __future__ import annotations

import re
import time

import ipywidgets as W

from .. import render as F
from ..events import EventType
from ..model import Frame, Profile
from . import static_view
from .controls import Controls
from .drawing import Drawing
from .figure_widget import send_bundle
from .view import View, Views, status_text
from .view_state import CLEARED, TYPED, ViewState, parse_label_filter

__all__ = ["Explorer", "parse_label_filter"]


class Explorer(W.VBox):
    """Interactive flame/icicle charts, timeline, top table and source view of a Profile.

    ``Explorer(profile)`` explores one profile; ``Explorer(before, after)`` shows the
    differential flame chart of ``after`` against ``before`` (with views of each).
    Where no widget frontend runs, the display falls back to a static HTML flame graph
    and a text top table (see ``_repr_mimebundle_``).  ``state`` is what it shows;
    ``show(state)`` shows another (the controls follow).  The widgets of its parts are
    its attributes too (``ex.focus_txt`` is ``ex.controls.focus_txt``, ``ex.flame`` is
    ``ex.drawing.flame``).
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
        self.last_error = ""
        self._busy = False  # drawing: a change it causes is not the user's
        events, first = self._events(event)
        self.state = ViewState(event=first.label, min_pct=min_pct, max_nodes=max_nodes, top_n=top_n,
                               top_sort="change" if self.diff else "self")
        t0 = time.perf_counter()
        first_view = self.views.of(self.state)
        self.timings: dict[str, float] = {"view": time.perf_counter() - t0}  # seconds, the last update's steps
        self.drawing = Drawing(self.views, first_view, on_select=self.select_function,
                               on_time_range=self.set_time_range, on_sort=lambda key: self._edit({"top_sort": key}))
        self.timings["update"] = time.perf_counter() - t0
        self.controls = Controls(self.views, self.state, events, on_change=self._edit,
                                 has_time=self.drawing.has_time)
        self.controls.mark(self.state)
        d = self.drawing
        super().__init__(children=self.controls.rows(status=d.status, flame=d.flame, legend=d.legend,
                                                     sandwich=d.sandwich.box, timeline=d.timeline,
                                                     table=d.top_table, source=d.source))
        self.add_class("ddprof-explorer")

    def __getattr__(self, name):
        """The parts' widgets, by name (``Controls.NAMES``, ``Drawing.NAMES``)."""
        parts = self.__dict__
        if name in Controls.NAMES and "controls" in parts:
            return getattr(parts["controls"], name)
        if name in Drawing.NAMES and "drawing" in parts:
            return getattr(parts["drawing"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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

    # -- the state, and what reads it ---------------------------------------------------

    @property
    def event(self) -> EventType:
        return EventType.parse(self.state.event)

    @property
    def value_index(self) -> int:
        return self.state.value_index

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

    def node_budget(self) -> int:
        return self.state.node_budget()

    def more_in_force(self) -> int:
        """How many of the controls behind "more" change the view now."""
        return self.state.more_in_force()

    @property
    def view(self) -> View:
        """The view drawn now (``Views.of(state)`` at the last change)."""
        return self.drawing.view

    @property
    def flame_data(self) -> F.FlameData:
        """The flame chart's current data (ids, labels, values, colours, hover)."""
        return self.view.flame

    # -- a change: control -> state -> view -> drawing -> controls -----------------------

    def show(self, state: ViewState) -> None:
        """Show ``state`` (e.g. ``ex.show(ex.state.replace(focus="^main$"))``): the
        charts draw it and the controls follow."""
        self.controls.follow(state)
        self._show(state)

    def _show(self, state: ViewState, open_sandwich: bool = False) -> None:
        """Draw ``state`` (``timings`` records each step, in seconds)."""
        if self._busy:
            return
        self._busy = True
        try:
            t0 = time.perf_counter()
            self.state = state
            view = self.views.of(state)
            view_s = time.perf_counter() - t0
            self.timings = {"view": view_s, **self.drawing.draw(view, open_sandwich=open_sandwich, started=t0)}
            self.controls.mark(state)
        finally:
            self._busy = False

    def _edit(self, changes: dict) -> None:
        """The user set some of the state's fields (``Controls``, the table's sort): the
        typed filters that are valid go into the state, a bad one leaves a message."""
        if self._busy:
            return
        changes = dict(changes)
        texts = {k: changes.pop(k) for k in TYPED if k in changes}
        state = self.state.replace(**changes)
        if texts:
            state, errors = state.edited(**texts)
            self.last_error = "; ".join(errors)
            self.controls.say(self.last_error)
        self._show(state)
        if changes.get("search"):  # a search selects its heaviest match: its sandwich opens
            frame = F.heaviest_match(self.view.tree, changes["search"])  # (text, not a regex)
            if frame is not None:
                self.select_function(frame)

    def select_function(self, frame: Frame) -> None:
        """Select one function: its sandwich (callers and callees over every call site)
        and its per-line values in the source view.  No filter changes."""
        self._show(self.state.replace(selected=frame), open_sandwich=True)

    def focus_function(self, name: str, filename: str = "", first_line: int = 0) -> None:
        """Focus every chart on one function and show its source."""
        selected = Frame(name, filename, first_line, first_line) if filename else Frame(name)
        self.last_error = ""
        self.controls.say("")
        self.show(self.state.replace(selected=selected, focus="^" + re.escape(name) + "$"))

    def set_time_range(self, range_ms: tuple[float, float] | None) -> None:
        """Filter every view to [start, end) milliseconds since the profile's start (None: all)."""
        if range_ms is not None and not self.drawing.has_time:
            raise ValueError("this profile has no sample timestamps: there is no time range to select")
        new = None if range_ms is None else (int(range_ms[0] * 1e6), int(range_ms[1] * 1e6))
        if new != self.state.time_range:
            self._show(self.state.replace(time_range=new))

    def clear_filters(self) -> None:
        """Back to the whole profile: no thread/label/regex/time filters, no search."""
        self.last_error = ""
        self.controls.say("")
        self.drawing.whole_time_axis()
        self.show(self.state.replace(**CLEARED))

    # -- without a widget frontend (static_view.py) -------------------------------------

    def top_text(self, n: int = 20, rows=None) -> str:
        """The current view's top table as fixed-width text (the table ``%ddprof top`` prints)."""
        return static_view.top_text(self.view, n, rows)

    def static_html(self, max_nodes: int = 300, rows=None) -> str:
        """A flame graph in plain HTML/SVG (no JavaScript) and the top table."""
        return static_view.static_html(self.view, max_nodes, rows)

    def _repr_mimebundle_(self, **kwargs):
        """The widget view plus text/plain (top table) and text/html (static flame graph)
        for frontends without widgets (terminal, nbconvert, GitHub's viewer)."""
        # ipywidgets' own bundle starts with repr(self), which walks every child
        # (figures included) only to be cut to 110 characters: build it here instead
        bundle = {}
        if self._view_name is not None:
            bundle["application/vnd.jupyter.widget-view+json"] = {
                "version_major": 2, "version_minor": 0, "model_id": self._model_id}
        bundle.update(static_view.fallback_bundle(self.view))
        return bundle

    def _ipython_display_(self) -> None:
        """Two outputs: the static flame graph, then the widget.  A notebook saved with
        them and reopened without its kernel (or on GitHub, nbviewer) shows the static
        chart where the widget cannot be drawn, and a new page shows it while plotly's
        bundle loads; once the explorer's flame chart is drawn, the static output's own
        style sheet hides it and shows the explorer in its place."""
        from IPython.display import display

        bundle = self._repr_mimebundle_()
        static = bundle.pop("text/html")
        display({"text/html": static_view.fallback_html(static)}, raw=True)
        display(bundle, raw=True)

    def to_html(self, path):
        """Write a self-contained HTML report (plotly.js inlined: opens offline) with the
        flame chart, timeline and top table of the current view (atomically, mode 0600).
        Returns the path."""
        return static_view.write_report(path, self.view, status_text(self.view))
