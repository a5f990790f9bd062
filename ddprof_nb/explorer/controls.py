"""The Explorer's inputs: made, laid out (the summary line, one toolbar of the most used
controls, the rest behind "more"), described (banner, tooltips, thread list, label
placeholder), and heard.  ``Controls`` reads only the ``Views`` and the state it is shown
(``follow``, ``mark``); a change by the user reaches its owner as the state fields it sets,
through ``on_change(changes)``: the controls never draw and never see the Explorer."""

from __future__ import annotations

from typing import Callable

import ipywidgets as W
import numpy as np

from .. import render as F
from ..events import EventType
from ..model import Profile
from ..model.top import GROUPS
from .chips import TransformBar
from .threads import Machinery, user_first
from .view import Views
from .view_state import CLEARED, TYPED, ViewState

__all__ = ["Controls", "thread_options", "banner_html"]

_CSS = """<style>
.ddprof-msg { color: #d33; font-size: 12px; }
.ddprof-status { font-size: 12px; opacity: .85; }
.ddprof-legend { font-size: 12px; opacity: .85; }
.ddprof-banner { font-size: 12px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
</style>"""

def _text(width: str = "250px") -> dict:
    """A text box's options: a narrow label column leaves room for its whole placeholder."""
    return dict(continuous_update=False, layout=W.Layout(width=width), style={"description_width": "52px"})

_TIPS = {
    "event_dd": "the event every view shows",
    "value_tb": "what the charts measure: the count, or the time or bytes",
    "inverted_tb": "bottom-up: the roots are the leaves (self time first)",
    "only_mine_cb": "fold stdlib, site-packages and native frames into their caller",
    "min_pct_sl": "nodes under this share of the total fold into [other]",
    "focus_txt": "regex: keep only the stacks through a matching function or file",
    "ignore_txt": "regex: drop the stacks through a matching function or file",
    "hide_txt": "regex: remove matching frames from every stack",
    "search_txt": "highlight matching functions and files",
    "labels_txt": "key=value, ...: values of one key OR-ed, keys AND-ed",
    "clear_btn": "back to the whole profile",
    "diff_view_tb": "the difference, or either profile alone",
    "top_group_tb": "one row per function, per line or per file",
    "range_btn": "show the whole time axis again",
    "machinery_tb": "the kernel's own threads and the profiler's work are left out of every view",
    "more_tb": "more controls: count or time, only my code, min %, focus/ignore/hide, labels, transforms, time range",
}


_WRAP = dict(flex_flow="row wrap", align_items="center")


class Controls:
    """The widgets that write the state.  ``on_change(changes)`` gets the ``ViewState``
    fields a user's change sets (typed: a tuple of threads, an int value index); the four
    typed filters come together, as typed, for the owner to check (``ViewState.edited``)."""

    # each control -> the state field it sets
    FIELDS = {"event_dd": "event", "chart_tb": "chart", "inverted_tb": "inverted", "search_txt": "search",
              "threads_sel": "threads", "diff_view_tb": "diff_view", "diff_norm_tb": "diff_norm",
              "top_group_tb": "top_group"}
    MORE_FIELDS = {"value_tb": "value_index", "only_mine_cb": "only_mine", "min_pct_sl": "min_pct"}
    # The controls behind "more" are made when it first opens or when one is asked for
    # (about 40 % of the explorer's widgets: a new kernel's first chart waits for each
    # widget's comm message); until then the state holds their values.
    MORE = ("value_tb", "only_mine_cb", "min_pct_sl", "machinery_tb", "clear_btn", "range_btn", "focus_txt",
            "ignore_txt", "hide_txt", "labels_txt", "transform_bar")
    # every widget, as the Explorer offers them to its users
    NAMES = (*FIELDS, *MORE, "more_tb", "more_box", "message", "banner")
    _TYPES = {"threads": tuple, "value_index": int, "diff_norm": bool}

    def __init__(self, views: Views, state: ViewState, events: list[EventType],
                 on_change: Callable[[dict], None], has_time: bool = True):
        self.views, self.diff = views, views.diff
        self.shown = state  # what the widgets show (``follow``, ``mark``)
        self.has_time = has_time  # False: the profile has no timestamps (the range button says so)
        self._on_change = on_change
        self._quiet = False
        self._options_for = state.show_machinery  # the thread list's options are this toggle's
        self.event_dd = W.Dropdown(options=[(e.display_name, e.label) for e in events], value=state.event,
                                   description="event", layout=W.Layout(width="190px"),
                                   style={"description_width": "40px"})
        self.chart_tb = W.ToggleButtons(options=[("flame", "flame"), ("icicle", "icicle")], value=state.chart,
                                        tooltips=["root at the bottom", "root at the top"],
                                        style={"button_width": "62px"})
        self.inverted_tb = W.ToggleButton(value=state.inverted, description="inverted", layout=W.Layout(width="80px"))
        self.search_txt = W.Text(value=state.search, description="search", placeholder="highlight functions/files",
                                 **_text("210px"))
        # two rows: the toolbar stays one line high
        self.threads_sel = W.SelectMultiple(options=thread_options(views, state), value=state.threads, rows=2,
                                            description="threads", layout=W.Layout(width="225px"),
                                            style={"description_width": "52px"})
        self.threads_sel.tooltip = "none selected = all threads"
        self.message = W.HTML(value="")
        self.message.add_class("ddprof-msg")
        self.banner = W.HTML(value=banner_html(views.profile, views.hidden))
        self.diff_view_tb = W.ToggleButtons(options=[("diff", "diff"), ("before", "before"), ("after", "after")],
                                            value=state.diff_view, style={"button_width": "60px"})
        self.diff_norm_tb = W.ToggleButtons(options=[("normalised", True), ("absolute", False)],
                                            value=state.diff_norm,
                                            tooltips=["before scaled to after's total", "raw values"],
                                            style={"button_width": "80px"})
        self.top_group_tb = W.ToggleButtons(options=list(GROUPS), value=state.top_group, description="group by",
                                            style={"button_width": "80px"})
        self.more_tb = W.ToggleButton(value=False, description="more", icon="sliders", layout=W.Layout(width="78px"))
        self.more_tb.observe(self._on_more, names="value")
        self.more_box = W.VBox([], layout=W.Layout(display="none"))  # filled when first opened
        self._tips()
        self._wire(self.FIELDS)

    # -- what the user changes -------------------------------------------------------------

    def _report(self, **changes) -> None:
        if not self._quiet:
            self._on_change(changes)

    def _wire(self, fields: dict) -> None:
        for name, field in fields.items():
            getattr(self, name).observe(lambda change, field=field: self._on_field(field, change["new"]),
                                        names="value")

    def _on_field(self, field: str, value) -> None:
        self._report(**{field: self._TYPES.get(field, lambda v: v)(value)})

    def _on_text(self, _change) -> None:
        self._report(**{name: getattr(self, f"{name}_txt").value for name in TYPED})

    def _on_machinery(self, change) -> None:
        """The kernel's threads and the profiler's work shown (or hidden): the thread list
        offers them (or not), and keeps the chosen threads it still offers."""
        shown = bool(change["new"])
        self._quietly(lambda: self._machinery_follow(self.shown.replace(show_machinery=shown)))
        self._report(show_machinery=shown, threads=tuple(self.threads_sel.value))

    def _on_clear(self) -> None:
        """Back to the whole profile: no thread/label/regex/time filters, no search."""
        self._quietly(lambda: self._follow_filters(self.shown.replace(**CLEARED)))
        self._report(**CLEARED)

    # -- showing a state -------------------------------------------------------------------

    def _quietly(self, change: Callable[[], None]) -> None:
        """Set widgets without their observers reporting it."""
        quiet, self._quiet = self._quiet, True
        try:
            change()
        finally:
            self._quiet = quiet

    def follow(self, state: ViewState) -> None:
        """Show ``state`` in every widget (a state set by code: ``Explorer.show``)."""
        def change():
            for name, field in {**self.FIELDS, **(self.MORE_FIELDS if self.more_made else {})}.items():
                if name not in ("threads_sel", "search_txt"):
                    getattr(self, name).value = getattr(state, field)
            self._follow_filters(state)
            if self.more_made and list(state.transforms) != self.transform_bar.steps:
                self.transform_bar.steps[:] = state.transforms
                self.transform_bar._redraw()
        self._quietly(change)
        self.mark(state)

    def _follow_filters(self, state: ViewState) -> None:
        self._machinery_follow(state)
        offered = {tid for _, tid in self.threads_sel.options}
        self.threads_sel.value = tuple(t for t in state.threads if t in offered)
        self.search_txt.value = state.search
        if self.more_made:
            for name in TYPED:
                getattr(self, f"{name}_txt").value = getattr(state, name)

    def mark(self, state: ViewState) -> None:
        """After each drawn state: the parts of the widgets that follow it whoever set it
        (the value options of its event, the "more" button's count, the range button);
        a typed filter's text stays as typed, even when it was not valid."""
        old, self.shown = self.shown, state

        def change():
            if self.more_made and state.event != old.event:
                vi = self.value_tb.value
                self.value_tb.options = _value_options(EventType.parse(state.event))
                self.value_tb.value = vi
            self._machinery_follow(state)
            if self.more_made:
                self.range_btn.disabled = state.time_range is None
        self._quietly(change)
        # the "more" button says when a control it hides is in force (a focus from a click,
        # a transform, a time range): the chart never changes for a hidden reason
        n = state.more_in_force()
        self.more_tb.description = f"more ({n})" if n else "more"
        self.more_tb.layout.width = "96px" if n else "78px"

    def _machinery_follow(self, state: ViewState) -> None:
        """The toggle's text and the thread list's options for ``state`` (quietly)."""
        shown = state.show_machinery
        if self.more_made:
            self.machinery_tb.value = shown
            self.machinery_tb.description = "hide kernel threads" if shown else _machinery_text(self.views.hidden)
        if shown == self._options_for:
            return
        self._options_for = shown
        kept = set(self.threads_sel.value)
        opts = thread_options(self.views, state)
        self.threads_sel.options = opts
        self.threads_sel.value = tuple(tid for _, tid in opts if tid in kept)

    def say(self, message: str) -> None:
        """The line under the toolbar: why a typed filter was not taken (or nothing)."""
        self.message.value = F.esc(message)

    # -- "more" ----------------------------------------------------------------------------

    def __getattr__(self, name):
        if name in Controls.MORE and "event_dd" in self.__dict__ and "transform_bar" not in self.__dict__:
            self._make_more()
            return getattr(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def more_made(self) -> bool:
        return "transform_bar" in self.__dict__

    def _make_more(self) -> None:
        """The controls behind "more", showing the state, wired to it."""
        s = self.shown
        self.value_tb = W.ToggleButtons(options=_value_options(EventType.parse(s.event)), value=s.value_index,
                                        style={"button_width": "78px"})
        self.only_mine_cb = W.Checkbox(value=s.only_mine, description="only my code", indent=False,
                                       layout=W.Layout(width="115px"))
        self.min_pct_sl = W.FloatSlider(value=s.min_pct, min=0.0, max=5.0, step=0.1, description="min %",
                                        continuous_update=False, readout_format=".1f",
                                        layout=W.Layout(width="260px"))
        self.focus_txt = W.Text(value=s.focus, description="focus", placeholder="regex: keep stacks through", **_text())
        self.ignore_txt = W.Text(value=s.ignore, description="ignore", placeholder="regex: drop stacks through",
                                 **_text())
        self.hide_txt = W.Text(value=s.hide, description="hide", placeholder="regex: remove frames", **_text())
        self.labels_txt = W.Text(value=s.labels, description="labels", placeholder=label_placeholder(self.views.profile),
                                 **_text())
        hidden = self.views.hidden
        self.machinery_tb = W.ToggleButton(
            value=s.show_machinery, description="hide kernel threads" if s.show_machinery else _machinery_text(hidden),
            layout=W.Layout(width="auto", display="" if hidden else "none"))
        self.clear_btn = W.Button(description="clear filters", layout=W.Layout(width="110px"))
        self.range_btn = W.Button(description="clear time range" if self.has_time else "no time axis",
                                  layout=W.Layout(width="130px"), disabled=s.time_range is None)
        bar = TransformBar(on_change=lambda: self._report(transforms=tuple(bar.steps)),
                           selected=lambda: self.shown.selected)
        bar.steps[:] = s.transforms
        bar._redraw()
        self.more_box.children = [
            W.HBox([self.value_tb, self.only_mine_cb, self.min_pct_sl, self.machinery_tb, self.clear_btn,
                    self.range_btn], layout=W.Layout(**_WRAP)),
            W.HBox([self.focus_txt, self.ignore_txt, self.hide_txt, self.labels_txt], layout=W.Layout(**_WRAP)),
            bar.box,
        ]
        self.transform_bar = bar  # last: the controls are made
        self._tips()
        self._wire(self.MORE_FIELDS)
        self.machinery_tb.observe(self._on_machinery, names="value")
        for name in TYPED:
            getattr(self, f"{name}_txt").observe(self._on_text, names="value")
        self.clear_btn.on_click(lambda _: self._on_clear())
        self.range_btn.on_click(lambda _: self._report(time_range=None))

    def _on_more(self, change) -> None:
        if change["new"] and not self.more_made:
            self._make_more()
        self.more_box.layout.display = "" if change["new"] else "none"

    def _tips(self) -> None:
        """Every labelled control says on hover what it does (with no tooltip, ipywidgets
        writes title="null" on its label)."""
        for name, tip in _TIPS.items():
            widget = self.__dict__.get(name)
            if widget is not None:
                widget.tooltip = tip

    # -- layout ----------------------------------------------------------------------------

    def rows(self, *, status, flame, legend, sandwich, timeline, table, source) -> list:
        """The summary, one toolbar of the most used controls (event, chart, inverted,
        search, threads; diff views in a diff), the rest behind "more", then the charts
        (the given output widgets): the flame starts within the first screen under the cell."""
        toolbar = [self.event_dd, self.chart_tb, self.inverted_tb, self.search_txt, self.threads_sel, self.more_tb]
        if self.diff:
            toolbar[1:1] = [self.diff_view_tb, self.diff_norm_tb]
        bar = W.HBox(toolbar, layout=W.Layout(**_WRAP))
        bar.add_class("ddprof-toolbar")
        return [
            self.banner, bar, self.more_box, self.message, status, flame, legend, sandwich, timeline,
            # side by side where the pane is wide enough for every column of the table
            # (in halves, the function names came last and out of sight); else stacked
            W.HBox(
                [W.VBox([self.top_group_tb, table], layout=W.Layout(flex="1 1 760px", min_width="0")),
                 W.VBox([source], layout=W.Layout(flex="1 1 420px", min_width="0"))],
                layout=W.Layout(flex_flow="row wrap"),
            ),
            W.HTML(_CSS),
        ]


def _value_options(e: EventType) -> list:
    return [(F.value_label(e, 0), 0), (F.value_label(e, 1), 1)]


def _machinery_text(hidden: Machinery) -> str:
    n = len(hidden.threads)
    if n:
        return f"show {n} kernel thread{'s' if n != 1 else ''}"
    return "show idle native threads" if hidden.idle_pool_samples and not hidden.own_samples else "show the profiler's work"


def thread_options(views: Views, state: ViewState) -> list[tuple[str, int]]:
    """The thread list: (name (tid), tid) of each thread with samples in ``state``'s bases,
    the user's first."""
    seen: dict[int, object] = {}
    base, before = views.bases(state)
    for p in ([before, base] if views.diff else [base]):
        busy = np.bincount(p.thread, minlength=len(p.threads)) if len(p) else np.zeros(len(p.threads))
        for i, t in enumerate(p.threads):
            if busy[i]:
                seen.setdefault(t.tid, t)
    return [(f"{t.name} ({t.tid})", t.tid) for t in user_first(seen.values())]


def banner_html(profile: Profile, hidden: Machinery) -> str:
    """One line (engine, duration, each event's total and samples, warnings, what is
    hidden); the notes, warnings first, and what is hidden, one click away."""
    meta = profile.metadata
    line = F.summary_parts(profile)
    details = []
    if hidden:
        line.append(hidden.describe())
        if hidden.threads:
            details.append("Hidden in every view (the button beside the thread list shows them): "
                           + ", ".join(sorted(set(hidden.threads))) + ".")
        if hidden.own_samples:
            details.append("The profiler's own work (its asyncio task sampler) is left out of the user's view.")
        if hidden.idle_pool_samples:
            details.append("Threads that run no Python waiting for work (their wall samples under [native threads],"
                           " not running) are left out; the same button shows them.")
    if meta.python_version or meta.host:
        details.append(f"Python {meta.python_version} · pid {meta.pid} · host {meta.host}")
    summary = F.esc(" · ".join(line))
    return f"<div class='ddprof-banner' title='{summary}'>{summary}</div>" + F.notes_html(profile, details)


def label_placeholder(profile: Profile) -> str:
    for ls in profile.labelsets:
        for k, v in ls.items:
            return f"e.g. {k}={v}"
    return "key=value, ..."
