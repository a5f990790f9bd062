"""The sandwich panel: one function's callers as a flame above it and its callees as an
icicle below it, merged over every call site (``transforms.sandwich``), with its self
and total.  Its figures are made the first time a function is shown."""

from __future__ import annotations

from typing import Callable, NamedTuple

import ipywidgets as W

from ..model import top as _top
from .. import render as F
from ..model import Frame, Profile
from .figure_widget import figure_widget, remember_state, send_update

__all__ = ["SandwichData", "sandwich_data", "SandwichPanel"]


class SandwichData(NamedTuple):
    function: Frame
    callers: F.FlameData  # the function at the bottom, its callers above
    callees: F.FlameData  # the function at the top, its callees below
    self: int
    total: int
    unit: str
    trees: tuple  # (callers, callees) call trees: what a click on a node names


def sandwich_data(view: Profile, event, value_index: int, function: Frame, *, min_pct: float = 0.0,
                  max_nodes: int = F.DEFAULT_MAX_NODES) -> SandwichData:
    """The panel's data for ``function`` in ``view`` (already filtered and transformed)."""
    callers, callees = view.sandwich(function, event)
    trees = [F.call_tree(p, event, value_index) for p in (callers, callees)]
    fds = [F.flame_data(t, min_pct=min_pct, max_nodes=max_nodes, orientation=o)
           for t, o in zip(trees, ("flame", "icicle"))]
    key = function.function_key
    self_v = sum(r.values(value_index)[0] for r in _top.top(view, event, n=None) if r.key == key)
    total = int(trees[1].totals[-1]) if trees[1].totals else 0
    return SandwichData(function, fds[0], fds[1], int(self_v), total, F.value_unit(event, value_index), tuple(trees))


class SandwichPanel:
    """``box`` (hidden until ``show``): a header with the function's self and total, a
    close button, and the two charts.  A click on a chart node calls ``on_select``."""

    def __init__(self, on_select: Callable[[Frame], None]):
        self._on_select = on_select
        self.data: SandwichData | None = None
        self.header = W.HTML(value="")
        self.close_btn = W.Button(description="close sandwich", layout=W.Layout(width="120px"),
                                  tooltip="hide the callers and callees of the selected function")
        self.close_btn.on_click(lambda _: self.hide())
        self.callers = self.callees = None
        self._head = W.HBox([self.header, self.close_btn])
        self.box = W.VBox([self._head], layout=W.Layout(display="none", width="100%"))
        self.box.add_class("ddprof-sandwich")

    def show(self, data: SandwichData) -> None:
        self.data = data
        f = data.function
        where = f" ({f.filename}:{f.first_line})" if f.filename else ""
        self.header.value = (f"<b>{F.esc(f.name)}</b>{F.esc(where)} — self {F.esc(F.format_value(data.self, data.unit))}"
                             f", total {F.esc(F.format_value(data.total, data.unit))}: callers above, callees below")
        for name, fd in (("callers", data.callers), ("callees", data.callees)):
            layout = F.flame_layout(fd)
            layout["height"] = min(layout["height"], 420)
            fig = getattr(self, name)
            if fig is None:
                fig = figure_widget(F.flame_trace_props(fd), layout, "icicle")
                fig.data[0].on_click(lambda trace, points, selector=None, name=name: self._click(name, points))
                setattr(self, name, fig)
            else:
                send_update(fig, [F.flame_trace_props(fd)], layout)
                remember_state(fig)
        # a closed panel holds no chart views (see hide): they are made now, drawn at the
        # width they are shown at; an open one updates its views in place
        if len(self.box.children) == 1:
            self.box.children = [self._head, self.callers, self.callees]
        self.box.layout.display = ""

    def hide(self) -> None:
        """Close the panel and drop its charts' views: with the views kept, plotly updated
        the hidden charts and laid them out again once shown (1 M samples, load average 2,
        one run each: 0.74 s to open the sandwich, against 0.42 s with new views)."""
        self.data = None
        self.box.layout.display = "none"
        self.box.children = [self._head]

    def _click(self, name: str, points) -> None:
        inds = list(getattr(points, "point_inds", []) or [])
        if not inds or self.data is None:
            return
        fd, tree = (self.data.callers, self.data.trees[0]) if name == "callers" else (self.data.callees, self.data.trees[1])
        node = int(fd.node[inds[0]])
        frame = tree.frame(node) if node > 0 else None
        if frame is not None:
            self._on_select(frame)
