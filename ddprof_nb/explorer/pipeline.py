"""The Explorer's pipeline (see ``widget.py``'s docstring): the bases, the filtered
views, the call tree, the flame data, and the flame chart, timeline and status they
feed.  A mixin of ``Explorer``: every step reads the controls' current values."""

from __future__ import annotations

import time

from ..model import calltree as transforms, selection as aggregate
from .. import render as F
from ..model import Profile
from .chips import apply as apply_transforms
from .controls import parse_label_filter
from .figure_widget import remember_state, send_update
from .threads import Machinery, hide_machinery

__all__ = ["PipelineMixin", "DRAW_NODES"]

# The flame chart's most boxes at the default min % (see ``node_budget``); the browser's
# redraw time follows the box count (benchmarks/bench_flame_redraw.py).
DRAW_NODES = 350


class PipelineMixin:
    """``_update(stage)`` runs the pipeline from ``stage`` on."""

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

    def node_budget(self) -> int:
        """The most boxes the flame chart draws: ``max_nodes`` when given.  Otherwise
        ``DRAW_NODES`` at the default detail, and ``render``'s cap once min % is set
        below its default: plotly's redraw costs the browser about half a millisecond a
        box (more inside JupyterLab), and the boxes a smaller budget folds into
        ``[other]`` are the narrowest, mostly too narrow for a label."""
        if self.max_nodes is not None:
            return self.max_nodes
        return DRAW_NODES if self.min_pct_sl.value >= F.DEFAULT_MIN_PCT else F.DEFAULT_MAX_NODES

    def _flame_data(self) -> F.FlameData:
        return F.flame_data(
            self._tree,
            min_pct=self.min_pct_sl.value,
            max_nodes=self.node_budget(),
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


def _primed(view: Profile, base: Profile) -> Profile:
    """Let a filtered view reuse its base's CSR stacks when the stacks table is shared.

    aggregate.filter keeps the tables of its input (unless hide rewrote stacks);
    computing ``flat_stacks()`` again walks every frame in Python (~0.1 s at 50k stacks).
    """
    if view is not base and view.stacks is base.stacks and view._flat is None:
        view._flat = F.shared_csr(base)
    return view
