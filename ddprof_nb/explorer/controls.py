"""The Explorer's controls: made, laid out (the summary line, one toolbar of the most used
controls, the rest behind "more"), and described (banner, tooltips, thread list, label
placeholder).  A mixin of ``Explorer``: the controls are its attributes, read by the
pipeline (``pipeline.py``) and wired in ``widget.py``."""

from __future__ import annotations

import re

import ipywidgets as W
import numpy as np

from .. import render as F
from ..events import EventType
from .threads import user_first
from ..model.top import GROUPS
from .top_table import TopTable

__all__ = ["ControlsMixin", "parse_label_filter"]

_CSS = """<style>
.ddprof-msg { color: #d33; font-size: 12px; }
.ddprof-status { font-size: 12px; opacity: .85; }
.ddprof-legend { font-size: 12px; opacity: .85; }
.ddprof-banner { font-size: 12px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
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



class ControlsMixin:
    """Making and laying out the controls; the banner and the kernel-threads toggle."""

    def _make_controls(self, events: list[EventType], first: EventType, min_pct: float) -> None:
        self.event_dd = W.Dropdown(options=[(e.display_name, e.label) for e in events], value=first.label,
                                   description="event", layout=W.Layout(width="190px"),
                                   style={"description_width": "40px"})
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
        self.search_txt = W.Text(description="search", placeholder="highlight functions/files",
                                 **{**text, "layout": W.Layout(width="210px")})
        self.machinery_tb = W.ToggleButton(value=False, description=self._machinery_text(),
                                           layout=W.Layout(width="auto", display="" if self._hidden else "none"))
        # two rows: the toolbar stays one line high
        self.threads_sel = W.SelectMultiple(options=self._thread_options(), value=(), rows=2,
                                            description="threads", layout=W.Layout(width="225px"),
                                            style={"description_width": "52px"})
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
        self.more_tb = W.ToggleButton(value=False, description="more", icon="sliders", layout=W.Layout(width="78px"))
        self.more_tb.observe(self._on_more, names="value")
        for widget in (self.value_tb, self.only_mine_cb, self.focus_txt, self.ignore_txt, self.hide_txt, self.labels_txt):
            widget.observe(lambda _: self._mark_more(), names="value")
        self.range_btn.observe(lambda _: self._mark_more(), names="disabled")
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
            (self.more_tb, "more controls: count or time, only my code, min %, focus/ignore/hide, labels, "
                           "transforms, time range"),
        ):
            widget.tooltip = tip

    def _rows(self) -> list:
        """The summary, one toolbar of the most used controls (event, chart, inverted,
        search, threads; diff views in a diff), the rest behind "more", then the charts:
        the flame starts within the first screen under the cell."""
        wrap = W.Layout(flex_flow="row wrap", align_items="center")
        toolbar = [self.event_dd, self.chart_tb, self.inverted_tb, self.search_txt, self.threads_sel, self.more_tb]
        if self.diff:
            toolbar[1:1] = [self.diff_view_tb, self.diff_norm_tb]
        self.more_box = W.VBox([
            W.HBox([self.value_tb, self.only_mine_cb, self.min_pct_sl, self.machinery_tb, self.clear_btn,
                    self.range_btn], layout=wrap),
            W.HBox([self.focus_txt, self.ignore_txt, self.hide_txt, self.labels_txt], layout=wrap),
            self.transform_bar.box,
        ], layout=W.Layout(display="none"))
        bar = W.HBox(toolbar, layout=wrap)
        bar.add_class("ddprof-toolbar")
        return [
            self.banner,
            bar,
            self.more_box,
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

    def _on_more(self, change) -> None:
        self.more_box.layout.display = "" if change["new"] else "none"

    def more_in_force(self) -> int:
        """How many of the controls behind "more" change the view now."""
        return (sum(bool(w.value.strip()) for w in (self.focus_txt, self.ignore_txt, self.hide_txt, self.labels_txt))
                + (self.value_tb.value != 1) + bool(self.only_mine_cb.value) + (not self.range_btn.disabled)
                + len(self.transform_bar.steps))

    def _mark_more(self) -> None:
        """The "more" button says when a control it hides is in force (a focus from a
        click, a transform, a time range): the chart never changes for a hidden reason."""
        n = self.more_in_force()
        self.more_tb.description = f"more ({n})" if n else "more"
        self.more_tb.layout.width = "96px" if n else "78px"

    @staticmethod
    def _value_options(e: EventType):
        return [(F.value_label(e, 0), 0), (F.value_label(e, 1), 1)]


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
        """One line (engine, duration, each event's total and samples, warnings, what is
        hidden); the notes, warnings first, and what is hidden, one click away."""
        meta = self.profile.metadata
        line = F.summary_parts(self.profile)
        details = []
        if self._hidden:
            line.append(self._hidden.describe())
            if self._hidden.threads:
                details.append("Hidden in every view (the button beside the thread list shows them): "
                               + ", ".join(sorted(set(self._hidden.threads))) + ".")
            if self._hidden.own_samples:
                details.append("The profiler's own work (its asyncio task sampler) is left out of the user's view.")
        if meta.python_version or meta.host:
            details.append(f"Python {meta.python_version} · pid {meta.pid} · host {meta.host}")
        summary = F.esc(" · ".join(line))
        return (f"<div class='ddprof-banner' title='{summary}'>{summary}</div>"
                + F.notes_html(self.profile, details))

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
