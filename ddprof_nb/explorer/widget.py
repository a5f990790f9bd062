"""The Explorer: an ipywidgets VBox to browse a Profile (or the diff of two).

State lives in the controls; every change runs one pipeline:

    threads.hide_machinery (unless shown), chips.apply (transforms) -> base
    aggregate.filter (events, threads, labels, focus/ignore/hide)   -> timeline view
    aggregate.filter (time range from the timeline)                 -> view
    render.call_tree / diff_tree (of the inverted view if asked)   -> tree
    render.flame_data (min %, search, flame/icicle)                 -> flame chart
    first_rows (grouped by function/line/file, sorted, cut)         -> top table
    sandwich.sandwich_data (the selected function)                  -> sandwich

and stops at the first step the change touches (a search or min-% change re-prunes
the cached tree only).  Figures are plotly FigureWidgets updated inside
``batch_update()``.  A bad regex or label filter shows an inline message and the
previous valid value stays in force, so the charts keep showing the last good view.
"""

from __future__ import annotations

import html
import re
import time
from pathlib import Path

import ipywidgets as W
import numpy as np

from .. import aggregate, transforms
from .. import render as F
from ..events import EventType
from ..exporters import write_atomic
from ..model import Frame, Profile
from ..render.figures import report as interactive_report
from .chips import TransformBar, apply as apply_transforms
from .figure_widget import figure_widget, remember_state, send_update
from .sandwich import SandwichPanel, sandwich_data
from .sources import source_lines
from .threads import Machinery, hide_machinery, user_first
from .top_rows import GROUPS, cells, columns, first_rows
from .top_table import TopTable

__all__ = ["Explorer"]

_CSS = """<style>
.ddprof-msg { color: #d33; font-size: 12px; }
.ddprof-status { font-size: 12px; opacity: .85; }
.ddprof-legend { font-size: 12px; opacity: .85; }
.ddprof-banner { font-size: 12px; }
.jp-OutputArea:has(.ddprof-explorer) .jp-OutputArea-child:has(.ddprof-static-fallback),
.output:has(.ddprof-explorer) .output_area:has(.ddprof-static-fallback) { display: none; }
.ddprof-banner summary { cursor: pointer; }
.ddprof-banner div { margin-left: 1.2em; opacity: .85; }
</style>"""


def parse_label_filter(text: str) -> dict[str, list[str]]:
    """``"k=v, k=w; k2=x"`` -> {"k": ["v", "w"], "k2": ["x"]}: one key OR-ed, keys AND-ed."""
    out: dict[str, list[str]] = {}
    for part in re.split(r"[,;]", text or ""):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise ValueError(f"invalid label filter {part!r}: expected key=value")
        k, v = (s.strip() for s in part.split("=", 1))
        if not k:
            raise ValueError(f"invalid label filter {part!r}: empty key")
        out.setdefault(k, []).append(v)
    return out


class Explorer(W.VBox):
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
        max_nodes: int = F.DEFAULT_MAX_NODES,
        top_n: int = 40,
    ):
        self.diff = other is not None
        self.before = profile if self.diff else None
        self.profile = other if self.diff else profile  # the primary ("after") profile
        self.max_nodes = max_nodes
        self.top_n = top_n
        self.timings: dict[str, float] = {}  # seconds spent in the last update's steps
        self.last_error = ""
        self._time_range: tuple[int, int] | None = None
        self._selected: Frame | None = None
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

    def _make_controls(self, events: list[EventType], first: EventType, min_pct: float) -> None:
        self.event_dd = W.Dropdown(options=[(e.display_name, e.label) for e in events], value=first.label,
                                   description="event", layout=W.Layout(width="210px"))
        self.value_tb = W.ToggleButtons(options=self._value_options(first), value=1,
                                        style={"button_width": "78px"})
        self.chart_tb = W.ToggleButtons(options=[("flame", "flame"), ("icicle", "icicle")], value="flame",
                                        tooltips=["root at the bottom", "root at the top"],
                                        style={"button_width": "62px"})
        self.inverted_tb = W.ToggleButton(value=False, description="inverted", layout=W.Layout(width="80px"))
        self.only_mine_cb = W.Checkbox(value=False, description="only my code", indent=False,
                                       layout=W.Layout(width="115px"))
        self.min_pct_sl = W.FloatSlider(value=min_pct, min=0.0, max=5.0, step=0.1, description="min %",
                                        continuous_update=False, readout_format=".1f",
                                        layout=W.Layout(width="260px"))
        # a narrow label column leaves the box room for its whole placeholder
        text = dict(continuous_update=False, layout=W.Layout(width="250px"), style={"description_width": "52px"})
        self.focus_txt = W.Text(description="focus", placeholder="regex: keep stacks through", **text)
        self.ignore_txt = W.Text(description="ignore", placeholder="regex: drop stacks through", **text)
        self.hide_txt = W.Text(description="hide", placeholder="regex: remove frames", **text)
        self.search_txt = W.Text(description="search", placeholder="highlight functions/files", **text)
        self.machinery_tb = W.ToggleButton(value=False, description=self._machinery_text(),
                                           layout=W.Layout(width="auto", display="" if self._hidden else "none"))
        threads = self._thread_options()
        self.threads_sel = W.SelectMultiple(options=threads, value=(), rows=min(4, max(2, len(threads))),
                                            description="threads", layout=W.Layout(width="300px"))
        self.threads_sel.tooltip = "none selected = all threads"
        self.labels_txt = W.Text(description="labels", placeholder=self._label_placeholder(), **text)
        self.clear_btn = W.Button(description="clear filters", layout=W.Layout(width="110px"))
        self.message = W.HTML(value="")
        self.message.add_class("ddprof-msg")
        self.status = W.HTML(value="")
        self.status.add_class("ddprof-status")
        self.banner = W.HTML(value=self._banner_html())
        self.diff_view_tb = W.ToggleButtons(options=[("diff", "diff"), ("before", "before"), ("after", "after")],
                                            value="diff", style={"button_width": "60px"})
        self.diff_norm_tb = W.ToggleButtons(options=[("normalised", True), ("absolute", False)], value=True,
                                            tooltips=["before scaled to after's total", "raw values"],
                                            style={"button_width": "80px"})
        self.top_group_tb = W.ToggleButtons(options=list(GROUPS), value="function", description="group by",
                                            style={"button_width": "80px"})
        self.top_table = TopTable(sort="change" if self.diff else "self", layout=W.Layout(width="100%"))
        self.source = W.HTML(value=F.source_html(None), layout=W.Layout(width="100%"))
        self.range_btn = W.Button(description="clear time range", layout=W.Layout(width="130px"), disabled=True)
        # every labelled control says on hover what it does (with no tooltip, ipywidgets
        # writes title="null" on its label)
        for widget, tip in (
            (self.event_dd, "the event every view shows"),
            (self.value_tb, "what the charts measure: the count, or the time or bytes"),
            (self.inverted_tb, "bottom-up: the roots are the leaves (self time first)"),
            (self.only_mine_cb, "fold stdlib, site-packages and native frames into their caller"),
            (self.min_pct_sl, "nodes under this share of the total fold into [other]"),
            (self.focus_txt, "regex: keep only the stacks through a matching function or file"),
            (self.ignore_txt, "regex: drop the stacks through a matching function or file"),
            (self.hide_txt, "regex: remove matching frames from every stack"),
            (self.search_txt, "highlight matching functions and files"),
            (self.labels_txt, "key=value, ...: values of one key OR-ed, keys AND-ed"),
            (self.clear_btn, "back to the whole profile"),
            (self.diff_view_tb, "the difference, or either profile alone"),
            (self.top_group_tb, "one row per function, per line or per file"),
            (self.range_btn, "show the whole time axis again"),
            (self.machinery_tb, "the kernel's own threads and the profiler's work are left out of every view"),
        ):
            widget.tooltip = tip

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

    def _rows(self) -> list:
        row1 = [self.event_dd, self.value_tb, self.chart_tb, self.inverted_tb, self.only_mine_cb, self.min_pct_sl]
        rows = [self.banner, W.HBox(row1, layout=W.Layout(flex_flow="row wrap"))]
        if self.diff:
            rows.append(W.HBox([W.Label("compare:"), self.diff_view_tb, self.diff_norm_tb],
                               layout=W.Layout(flex_flow="row wrap")))
        rows += [
            W.HBox([self.focus_txt, self.ignore_txt, self.hide_txt, self.search_txt],
                   layout=W.Layout(flex_flow="row wrap")),
            W.HBox([self.threads_sel, self.machinery_tb, self.labels_txt, self.clear_btn, self.range_btn],
                   layout=W.Layout(flex_flow="row wrap", align_items="flex-start")),
            self.transform_bar.box,
            self.message,
            self.status,
            self.flame,
            self.legend,
            self.sandwich.box,
            self.timeline,
            # side by side where the pane is wide enough for every column of the table
            # (in halves, the function names came last and out of sight); else stacked
            W.HBox(
                [W.VBox([self.top_group_tb, self.top_table], layout=W.Layout(flex="1 1 760px", min_width="0")),
                 W.VBox([self.source], layout=W.Layout(flex="1 1 420px", min_width="0"))],
                layout=W.Layout(flex_flow="row wrap"),
            ),
            W.HTML(_CSS),
        ]
        return rows

    # ---------------------------------------------------------------------------------
    # options

    @property
    def event(self) -> EventType:
        return EventType.parse(self.event_dd.value)

    @property
    def value_index(self) -> int:
        return int(self.value_tb.value)

    @staticmethod
    def _value_options(e: EventType):
        return [(F.value_label(e, 0), 0), (F.value_label(e, 1), 1)]

    def _make_bases(self) -> None:
        """``_base`` (and ``_base_before``): the profiles every view starts from: without
        the kernel's and the profiler's threads and work (unless shown), through the
        transforms' chips."""
        if not hasattr(self, "_hidden"):
            base, hidden = hide_machinery(self.profile)
            before = None
            if self.diff:
                before, hidden_before = hide_machinery(self.before)
                hidden = Machinery(tuple(dict.fromkeys(hidden.threads + hidden_before.threads)),
                                   hidden.own_samples + hidden_before.own_samples)
            if len(self.profile) and not len(base):  # nothing but machinery: hide nothing
                base, before, hidden = self.profile, self.before, Machinery()
            self._hidden, self._hidden_bases = hidden, (base, before)
        base, before = (self.profile, self.before) if self._show_machinery else self._hidden_bases
        steps = self.transform_bar.steps
        self._base, self._base_before = apply_transforms(base, steps), apply_transforms(before, steps)
        self._last_criteria = None  # the views are cut from another base

    def _machinery_text(self) -> str:
        h = self._hidden
        n = len(h.threads)
        return (f"show {n} kernel thread{'s' if n != 1 else ''}" if n else "show the profiler's work")

    def _thread_options(self):
        seen: dict[int, object] = {}
        for p in ([self._base_before, self._base] if self.diff else [self._base]):
            busy = np.bincount(p.thread, minlength=len(p.threads)) if len(p) else np.zeros(len(p.threads))
            for i, t in enumerate(p.threads):
                if busy[i]:
                    seen.setdefault(t.tid, t)
        return [(f"{t.name} ({t.tid})", t.tid) for t in user_first(seen.values())]

    def _banner_html(self) -> str:
        """One line (engine, duration, samples, what is hidden or dropped); the details
        (notes, hidden threads, dropped samples explained) one click away."""
        meta = self.profile.metadata
        n = int(self.profile.values[:, 0].sum()) if len(self.profile) else 0
        line = [meta.engine or "unknown engine", F.format_duration(meta.duration_ns), f"{n:,} samples"]
        details = []
        if self._hidden:
            line.append(self._hidden.describe())
            if self._hidden.threads:
                details.append("Hidden in every view (the button beside the thread list shows them): "
                               + ", ".join(sorted(set(self._hidden.threads))) + ".")
            if self._hidden.own_samples:
                details.append("The profiler's own work (its asyncio task sampler) is left out of the user's view.")
        dropped = sum(int(v) for v in dict(meta.dropped).values())
        if dropped:
            line.append(f"{dropped:,} samples lost")
            per = ", ".join(f"{EventType.parse(e).label} {int(v):,}" for e, v in dict(meta.dropped).items() if int(v))
            details.append(
                f"{dropped:,} samples were lost while recording ({per}): the sampler's buffer was full, or a stack "
                "changed while it was being read.  The totals shown are that much lower than what ran.")
        details += [f"Note: {note}" for note in meta.notes]
        if meta.python_version or meta.host:
            details.append(f"Python {meta.python_version} · pid {meta.pid} · host {meta.host}")
        summary = F.esc(" · ".join(line))
        body = "".join(f"<div>{F.esc(d)}</div>" for d in details)
        return (f"<details class='ddprof-banner'><summary>{summary}</summary>{body}</details>" if body
                else f"<div class='ddprof-banner'>{summary}</div>")

    def _on_machinery(self, change) -> None:
        """Show or hide the kernel's threads and the profiler's work in every view."""
        self._show_machinery = bool(change["new"])
        self._make_bases()
        self.machinery_tb.description = ("hide kernel threads" if change["new"] else self._machinery_text())
        busy, self._busy = self._busy, True
        try:
            kept = set(self.threads_sel.value)
            opts = self._thread_options()
            self.threads_sel.options = opts
            self.threads_sel.value = tuple(tid for _, tid in opts if tid in kept)
        finally:
            self._busy = busy
        self._update("filter", timeline=True, top=True)

    def _label_placeholder(self) -> str:
        for ls in self.profile.labelsets:
            for k, v in ls.items:
                return f"e.g. {k}={v}"
        return "key=value, ..."

    # ---------------------------------------------------------------------------------
    # pipeline

    def _validated(self) -> dict:
        """Criteria for aggregate.filter from the controls; invalid inputs keep their
        previous valid value and leave a message.  Events are not filtered here: the
        tree, top table and timeline each pick the event, so switching it re-filters nothing."""
        errors = []
        for name, box in (("focus", self.focus_txt), ("ignore", self.ignore_txt), ("hide", self.hide_txt)):
            try:
                aggregate.compile_regex(box.value, name)
                self._good[name] = box.value
            except ValueError as exc:
                errors.append(f"{exc} — keeping {self._good[name]!r}")
        try:
            self._good["labels"] = parse_label_filter(self.labels_txt.value)
        except ValueError as exc:
            errors.append(f"{exc} — keeping the previous label filter")
        self.last_error = "; ".join(errors)
        self.message.value = F.esc(self.last_error)
        return dict(
            threads=list(self.threads_sel.value) or None,
            labels=self._good["labels"] or None,
            focus=self._good["focus"] or None,
            ignore=self._good["ignore"] or None,
            hide=self._good["hide"] or None,
        )

    def _filter_views(self) -> None:
        """``_tl_view``: every filter but the time range (what the timeline shows);
        ``_view_before``: the same filters on the "before" profile in diff mode."""
        crit = self._validated()
        if crit == self._last_criteria:
            return
        self._last_criteria = crit
        self._tl_view = _primed(aggregate.filter(self._base, **crit), self._base)
        self._view_before = None
        if self.diff:
            # the time range comes from the "after" timeline; it does not apply to "before"
            self._view_before = _primed(aggregate.filter(self._base_before, **crit), self._base_before)

    def _time_view(self) -> None:
        """``_view``: ``_tl_view`` cut to the timeline's range (every other view uses it)."""
        v = self._tl_view
        self._view = v if self._time_range is None else _primed(aggregate.filter(v, time_range=self._time_range), v)

    def _build_tree(self) -> F.CallTree:
        mode = self.diff_view_tb.value if self.diff else "single"
        omc = self.only_mine_cb.value
        view, before = self._view, self._view_before
        if self.inverted_tb.value:
            view, before = transforms.inverted(view), (transforms.inverted(before) if before is not None else None)
        if mode == "diff":
            return F.diff_tree(before, view, self.event, self.value_index, omc)
        if mode == "before":
            return F.call_tree(before, self.event, self.value_index, omc)
        return F.call_tree(view, self.event, self.value_index, omc)

    def _flame_data(self) -> F.FlameData:
        return F.flame_data(
            self._tree,
            min_pct=self.min_pct_sl.value,
            max_nodes=self.max_nodes,
            search=self.search_txt.value,
            orientation=self.chart_tb.value,
            normalize=bool(self.diff_norm_tb.value),
        )

    def _timeline_data(self) -> F.TimelineData:
        return F.timeline_data(self._tl_view, self.event, 0)

    _STAGES = ("filter", "time", "tree", "render")

    def _update(self, stage: str, *, timeline: bool = False, top: bool = False) -> None:
        """Run the pipeline from ``stage`` on (filter -> time -> tree -> render).

        The flame chart goes out first, in one batch, then the timeline, then the top
        table and source view.  ``timings`` records each step (seconds)."""
        if self._busy:
            return
        first = self._STAGES.index(stage)
        busy, self._busy = self._busy, True
        t = self.timings
        t.clear()
        t0 = time.perf_counter()
        try:
            if first <= 0:
                self._filter_views()
                t["filter"] = time.perf_counter() - t0
            if first <= 1:
                self._time_view()
            if first <= 2:
                t1 = time.perf_counter()
                self._tree = self._build_tree()
                t["tree"] = time.perf_counter() - t1
            t1 = time.perf_counter()
            self._fd = self._flame_data()
            t["prune"] = time.perf_counter() - t1
            t1 = time.perf_counter()
            if hasattr(self, "flame"):
                # Undo any click-zoom: node ids mean other functions in the new tree.
                # Python never hears of the browser's zoom, so alternate between two
                # spellings of "the root" ("" and its id "0") to make plotly apply it.
                self._zoom_level = "0" if self._zoom_level != "0" else ""
                props = dict(F.flame_trace_props(self._fd), level=self._zoom_level)
                send_update(self.flame, [props], F.flame_layout(self._fd))
            t["figures"] = time.perf_counter() - t1
            self._refresh_status()
            t["chart"] = time.perf_counter() - t0
            if first <= 2:
                self.legend.value = F.legend_html(self._tree)
            if timeline and hasattr(self, "timeline"):
                t1 = time.perf_counter()
                self._refresh_timeline()
                t["timeline"] = time.perf_counter() - t1
            if top:
                self._refresh_top()
                self._refresh_source()
            if first <= 2:
                self._refresh_sandwich()
        finally:
            self._busy = busy
            # a reloaded page draws what the controls say
            if hasattr(self, "flame"):
                remember_state(self.flame)
            if hasattr(self, "timeline"):
                remember_state(self.timeline, data="timeline" in t)
            t["update"] = time.perf_counter() - t0

    def _refresh_timeline(self) -> None:
        td = self._timeline_data()
        self._extent_ms = td.extent_ms
        traces = F.timeline_traces(td)
        layout = F.timeline_layout(td)
        if self._time_range is not None:
            layout["xaxis"]["range"] = [self._time_range[0] / 1e6, self._time_range[1] / 1e6]
        same = [t["name"] for t in traces] == [t.get("name") for t in self.timeline._data]
        if same:
            send_update(self.timeline, traces, layout)
        else:  # other states: new traces (rare: an event switch)
            with self.timeline.batch_update():
                self.timeline.data = ()
                self.timeline.layout.update(layout)
            self.timeline.add_traces(traces)

    def _refresh_status(self) -> None:
        fd = self._fd
        e = self.event
        unit = self._tree.unit
        n = self._view.total(e, 0)
        parts = [
            f"{n:,} {F.value_label(e, 0)} in view",
            f"{fd.node_count:,} nodes drawn of {fd.tree_nodes:,}",
        ]
        if fd.folded_nodes:
            parts.append(f"smaller than {F.format_value(fd.threshold, unit)} folded into [other]")
        if self._time_range is not None:
            a, b = self._time_range
            parts.append(f"time {a / 1e6:,.0f}–{b / 1e6:,.0f} ms")
        if fd.search:
            parts.append(f"search matches {fd.search_matches} nodes, {100 * fd.search_share:.1f}% of total")
        self.status.value = F.esc(" · ".join(parts))

    # -- top table ----------------------------------------------------------------------

    def _refresh_top(self) -> None:
        """The table's rows: grouped, sorted by the clicked header, cut to ``top_n``."""
        t0 = time.perf_counter()
        e, group = self.event, self.top_group_tb.value
        self._top = rows = first_rows(self._view, e, group, self.top_table.sort, self.top_n,
                                      self._view_before if self.diff else None, normalize=bool(self.diff_norm_tb.value))
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
        try:
            data = sandwich_data(view, self.event, self.value_index, self._selected,
                                 min_pct=self.min_pct_sl.value, max_nodes=self.max_nodes)
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

    # ---------------------------------------------------------------------------------
    # static output

    @property
    def flame_data(self) -> F.FlameData:
        """The flame chart's current data (ids, labels, values, colours, hover)."""
        return self._fd

    def _top_now(self, n: int) -> tuple[list, int]:
        """The top ``n`` functions of the current view (by self) and the view's total."""
        e, vi = self.event, self.value_index
        return aggregate.top(self._view, e, n=n, value_index=vi), self._view.total(e, vi)

    def top_text(self, n: int = 20, rows=None) -> str:
        """The current view's top table as fixed-width text (the table ``%ddprof top`` prints)."""
        return F.top_table(self._view, self.event, n=n, value_index=self.value_index, rows=rows)

    def static_html(self, max_nodes: int = 300, rows=None) -> str:
        """A flame graph in plain HTML/SVG (no JavaScript) and the top table."""
        fd = F.flame_data(self._tree, min_pct=max(self.min_pct_sl.value, 0.5), max_nodes=max_nodes,
                          orientation=self.chart_tb.value, normalize=bool(self.diff_norm_tb.value))
        rows, total = (rows, self._view.total(self.event, self.value_index)) if rows else self._top_now(15)
        return (
            "<div class='ddprof-static'>"
            + F.static_flame_html(fd)
            + "<details><summary>top functions</summary>"
            + F.top_table_html(rows[:15], self.event, self.value_index, total)
            + "</details></div>"
        )

    def _repr_mimebundle_(self, **kwargs):
        """The widget view plus text/plain (top table) and text/html (static flame graph)
        for frontends without widgets (terminal, nbconvert, GitHub's viewer)."""
        # ipywidgets' own bundle starts with repr(self), which walks every child
        # (figures included) only to be cut to 110 characters: build it here instead
        bundle = {}
        if self._view_name is not None:
            bundle["application/vnd.jupyter.widget-view+json"] = {
                "version_major": 2, "version_minor": 0, "model_id": self._model_id}
        rows, _ = self._top_now(20)  # one aggregate.top for both fallbacks
        bundle["text/plain"] = self.top_text(rows=rows)
        bundle["text/html"] = self.static_html(rows=rows)
        return bundle

    def _ipython_display_(self) -> None:
        """Two outputs: the static flame graph, then the widget.  A notebook saved with
        them and reopened without its kernel (or on GitHub, nbviewer) shows the static
        chart where the widget cannot be drawn; while the widget is drawn, its style
        sheet (``_CSS``) hides the static output of its own output area."""
        from IPython.display import display

        bundle = self._repr_mimebundle_()
        static = bundle.pop("text/html")
        display({"text/html": f"{_FALLBACK_CSS}<div class='ddprof-static-fallback'>{static}</div>"}, raw=True)
        display(bundle, raw=True)

    def to_html(self, path) -> Path:
        """Write a self-contained HTML report (plotly.js inlined: opens offline) with the
        flame chart, timeline and top table of the current view (atomically, mode 0600).
        Returns the path."""
        path = Path(path)
        status = html.unescape(self.status.value)
        write_atomic(path, interactive_report(self._view, self.event, self.value_index, fd=self._fd, status=status))
        return path


# Shipped with the static output, so it applies without a kernel: the widget output
# right after it (ipywidgets' "Error displaying widget: model not found", or "Loading
# widget...") is hidden until it holds a drawn explorer.
_FALLBACK_CSS = """<style>
.jp-OutputArea-child:has(.ddprof-static-fallback) + .jp-OutputArea-child:not(:has(.ddprof-explorer)),
.output_area:has(.ddprof-static-fallback) + .output_area:not(:has(.ddprof-explorer)) { display: none; }
</style>"""


def _primed(view: Profile, base: Profile) -> Profile:
    """Let a filtered view reuse its base's CSR stacks when the stacks table is shared.

    aggregate.filter keeps the tables of its input (unless hide rewrote stacks);
    computing ``flat_stacks()`` again walks every frame in Python (~0.1 s at 50k stacks).
    """
    if view is not base and view.stacks is base.stacks and view._flat is None:
        view._flat = F.shared_csr(base)
    return view
