"""A ``ViewState`` turned into what the explorer shows: no widget, no side effect.

    hide_machinery (unless shown), the transforms            -> base
    aggregate.filter (threads, labels, focus/ignore/hide)     -> timeline view
    aggregate.filter (time range)                             -> view
    render.call_tree / diff_tree (of the inverted view)       -> tree
    render.flame_data (min %, search, flame/icicle)           -> flame
    render.timeline_data, top.top                             -> timeline, top rows

``Views(profile)`` (or ``Views(before, after)``) keeps the last result of each step with
the part of the state it read: a new state reruns only the steps whose part changed (a
search re-prunes the cached tree only), and an unchanged step returns the same object,
so a caller redraws what is not ``is`` the last one it drew.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..model import calltree as transforms, selection as aggregate
from .. import render as F
from ..events import EventType
from ..model import Profile
from ..model.top import top
from .threads import Machinery, hide_machinery
from .view_state import ViewState

__all__ = ["KINDS", "apply_transforms", "View", "Views", "status_text"]

# transform kind -> (the transform, whether an empty regex means "every function")
KINDS: dict[str, tuple[Callable, bool]] = {
    "merge function": (transforms.merge_function, False),
    "collapse recursion": (lambda p, rx: transforms.collapse_recursion(p, rx or None), True),
    "collapse direct recursion": (lambda p, rx: transforms.collapse_recursion(p, rx or None, direct_only=True), True),
    "collapse module": (transforms.collapse_module, False),
    "drop function": (transforms.drop_function, False),
}


def apply_transforms(profile: Profile | None, steps) -> Profile | None:
    """``profile`` through every ``(kind, regex)`` step, in order."""
    if profile is None:
        return None
    for kind, rx in steps:
        profile = KINDS[kind][0](profile, rx)
    return profile


@dataclass(frozen=True)
class View:
    """The flame chart's part of a state's view (the timeline and top rows: ``Views``)."""

    state: ViewState
    base: Profile
    timeline_view: Profile  # every filter but the time range
    view: Profile  # what every chart but the timeline shows
    view_before: Profile | None  # a diff's "before", same filters (no time range)
    tree: F.CallTree
    flame: F.FlameData

    @property
    def event(self) -> EventType:
        return EventType.parse(self.state.event)


class Views:
    """The views of one profile (or of the diff ``after`` against ``before``)."""

    def __init__(self, profile: Profile, before: Profile | None = None):
        self.profile, self.before = profile, before
        self.diff = before is not None
        base, hidden = hide_machinery(profile)
        base_before = None
        if self.diff:
            base_before, hidden_before = hide_machinery(before)
            hidden = hidden + hidden_before
        if len(profile) and not len(base):  # nothing but machinery: hide nothing
            base, base_before, hidden = profile, before, Machinery()
        self.hidden = hidden  # what the views leave out unless ``show_machinery``
        self._without_machinery = (base, base_before)
        self._last: dict[str, tuple] = {}  # step -> (its key, its result)

    def _step(self, name: str, key: tuple, make: Callable):
        hit = self._last.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        out = make()
        self._last[name] = (key, out)
        return out

    # the steps, each keyed by the part of the state it reads (and its inputs' keys)

    def bases(self, s: ViewState) -> tuple[Profile, Profile | None]:
        def make():
            base, before = (self.profile, self.before) if s.show_machinery else self._without_machinery
            return apply_transforms(base, s.transforms), apply_transforms(before, s.transforms)
        return self._step("bases", self._bases_key(s), make)

    def _bases_key(self, s: ViewState) -> tuple:
        return (s.show_machinery, s.transforms)

    def _filter_key(self, s: ViewState) -> tuple:
        return self._bases_key(s) + (s.threads, s.labels, s.focus, s.ignore, s.hide)

    def filtered(self, s: ViewState) -> tuple[Profile, Profile | None]:
        """(the timeline's view, the "before" view): every filter but the time range."""
        def make():
            base, before = self.bases(s)
            crit = s.criteria()
            tl_view = _primed(aggregate.filter(base, **crit), base)
            # the time range comes from the "after" timeline; it does not apply to "before"
            return tl_view, (_primed(aggregate.filter(before, **crit), before) if self.diff else None)
        return self._step("filtered", self._filter_key(s), make)

    def _time_key(self, s: ViewState) -> tuple:
        return self._filter_key(s) + (s.time_range,)

    def timed(self, s: ViewState) -> Profile:
        def make():
            v = self.filtered(s)[0]
            return v if s.time_range is None else _primed(aggregate.filter(v, time_range=s.time_range), v)
        return self._step("timed", self._time_key(s), make)

    def _tree_key(self, s: ViewState) -> tuple:
        return self._time_key(s) + (s.event, s.value_index, s.only_mine, s.inverted, s.diff_view)

    def tree(self, s: ViewState) -> F.CallTree:
        def make():
            view, before = self.timed(s), self.filtered(s)[1]
            if s.inverted:
                view = transforms.inverted(view)
                before = transforms.inverted(before) if before is not None else None
            e = EventType.parse(s.event)
            mode = s.diff_view if self.diff else "single"
            if mode == "diff":
                return F.diff_tree(before, view, e, s.value_index, s.only_mine)
            return F.call_tree(before if mode == "before" else view, e, s.value_index, s.only_mine)
        return self._step("tree", self._tree_key(s), make)

    def flame(self, s: ViewState) -> F.FlameData:
        key = self._tree_key(s) + (s.min_pct, s.node_budget(), s.search, s.chart, s.diff_norm)
        return self._step("flame", key, lambda: F.flame_data(
            self.tree(s), min_pct=s.min_pct, max_nodes=s.node_budget(), search=s.search, orientation=s.chart,
            normalize=s.diff_norm))

    def of(self, s: ViewState) -> View:
        """The flame chart's view of ``s``."""
        tl_view, before = self.filtered(s)
        return View(s, self.bases(s)[0], tl_view, self.timed(s), before, self.tree(s), self.flame(s))

    def timeline(self, s: ViewState) -> F.TimelineData:
        """The timeline: every filter but the time range (the range is drawn on it)."""
        return self._step("timeline", self._filter_key(s) + (s.event,),
                          lambda: F.timeline_data(self.filtered(s)[0], EventType.parse(s.event), 0))

    def top(self, s: ViewState) -> list:
        """The top table's rows: grouped, sorted, cut to ``top_n`` (in a diff, against "before")."""
        key = self._time_key(s) + (s.event, s.top_n, s.top_group, s.top_sort, s.diff_norm)
        return self._step("top", key, lambda: top(
            self.timed(s), EventType.parse(s.event), s.top_n, by=s.top_group, sort=s.top_sort,
            before=self.filtered(s)[1] if self.diff else None, normalize=s.diff_norm))

    def selected_view(self, s: ViewState) -> Profile:
        """The profile the sandwich and source view read: a diff's "before" when it is shown."""
        return self.filtered(s)[1] if self.diff and s.diff_view == "before" else self.timed(s)


def status_text(v: View) -> str:
    """The line above the flame: samples in view, nodes drawn, what is folded, the time
    range, the search's matches."""
    fd, e = v.flame, v.event
    parts = [f"{v.view.total(e, 0):,} {F.value_label(e, 0)} in view",
             f"{fd.node_count:,} nodes drawn of {fd.tree_nodes:,}"]
    if fd.folded_nodes:
        parts.append(f"smaller than {F.format_value(fd.threshold, v.tree.unit)} folded into [other]")
    if v.state.time_range is not None:
        a, b = v.state.time_range
        parts.append(f"time {a / 1e6:,.0f}–{b / 1e6:,.0f} ms")
    if fd.search:
        parts.append(f"search matches {fd.search_matches} nodes, {100 * fd.search_share:.1f}% of total")
    return " · ".join(parts)


def _primed(view: Profile, base: Profile) -> Profile:
    """Let a filtered view reuse its base's CSR stacks when the stacks table is shared.

    aggregate.filter keeps the tables of its input (unless hide rewrote stacks);
    computing ``flat_stacks()`` again walks every frame in Python (~0.1 s at 50k stacks).
    """
    if view is not base and view.stacks is base.stacks and view._flat is None:
        view._flat = F.shared_csr(base)
    return view
