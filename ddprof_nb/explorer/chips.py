"""Call-tree transforms as removable chips: the explorer's row of ``ddprof_nb.transforms``.

Each chip is one step (merge function, collapse recursion, collapse module, drop
function) with its regex; the steps stack in the order added and apply to every view
(``apply``).  A click on a chip removes it.
"""

from __future__ import annotations

import re
from typing import Callable

import ipywidgets as W

from ..model import calltree as transforms, selection as aggregate
from ..model import Frame, Profile
from ..render.format import esc

__all__ = ["KINDS", "apply", "TransformBar"]

# kind -> (the transform, whether an empty regex means "every function")
KINDS: dict[str, tuple[Callable, bool]] = {
    "merge function": (transforms.merge_function, False),
    "collapse recursion": (lambda p, rx: transforms.collapse_recursion(p, rx or None), True),
    "collapse direct recursion": (lambda p, rx: transforms.collapse_recursion(p, rx or None, direct_only=True), True),
    "collapse module": (transforms.collapse_module, False),
    "drop function": (transforms.drop_function, False),
}


def apply(profile: Profile | None, steps) -> Profile | None:
    """``profile`` through every ``(kind, regex)`` step, in order."""
    if profile is None:
        return None
    for kind, rx in steps:
        profile = KINDS[kind][0](profile, rx)
    return profile


def chip_text(kind: str, rx: str) -> str:
    return f"✕ {kind}" + (f": {rx}" if rx else "")


def regex_for(frame: Frame, kind: str) -> str:
    """The regex a step takes for the selected function: its exact name, or for a
    module its file."""
    if kind == "collapse module":
        return re.escape(frame.filename) + "$" if frame.filename else ""
    return "^" + re.escape(frame.name) + "$"


class TransformBar:
    """The controls: a kind, a regex (empty: the selected function), "add", and the chips.

    ``steps`` is the source of truth; ``on_change()`` runs after every add or removal;
    ``add`` and ``remove`` are what the buttons call."""

    def __init__(self, on_change: Callable[[], None], selected: Callable[[], Frame | None]):
        self.steps: list[tuple[str, str]] = []
        self._on_change = on_change
        self._selected = selected
        self.kind_dd = W.Dropdown(options=list(KINDS), value="merge function", layout=W.Layout(width="205px"))
        self.regex_txt = W.Text(placeholder="regex (empty: the selected function)", layout=W.Layout(width="240px"))
        self.add_btn = W.Button(description="add transform", layout=W.Layout(width="120px"))
        self.message = W.HTML(value="")
        self.message.add_class("ddprof-msg")
        self.chips = W.HBox([], layout=W.Layout(flex_flow="row wrap"))
        self.kind_dd.tooltip = "what the transform does to every view"
        self.regex_txt.tooltip = "the functions (or files, for a module) it applies to"
        self.add_btn.tooltip = "apply it to every view; click its chip to remove it"
        self.add_btn.on_click(lambda _: self.add(self.kind_dd.value, self.regex_txt.value))
        self.box = W.VBox([W.HBox([W.Label("transform"), self.kind_dd, self.regex_txt, self.add_btn],
                                  layout=W.Layout(flex_flow="row wrap")), self.chips, self.message])

    def add(self, kind: str, rx: str = "") -> None:
        """Add a step; an empty regex stands for the selected function.  A bad regex, or
        none, leaves a message and adds nothing."""
        if kind not in KINDS:
            raise ValueError(f"unknown transform {kind!r}: expected one of {', '.join(KINDS)}")
        rx = rx.strip()
        if not rx and not KINDS[kind][1]:
            frame = self._selected()
            if frame is None:
                self.message.value = esc(f"{kind}: type a regex or select a function first")
                return
            rx = regex_for(frame, kind)
        try:
            aggregate.compile_regex(rx, f"{kind} regex")
        except ValueError as exc:
            self.message.value = esc(str(exc))
            return
        self.message.value = ""
        self.steps.append((kind, rx))
        self._changed()
        self.regex_txt.value = ""

    def remove(self, index: int) -> None:
        del self.steps[index]
        self._changed()

    def _changed(self) -> None:
        # the views first: the chart's message leaves before the chips' new buttons
        try:
            self._on_change()
        finally:
            self._redraw()

    def _redraw(self) -> None:
        chips = []
        for i, (kind, rx) in enumerate(self.steps):
            b = W.Button(description=chip_text(kind, rx), layout=W.Layout(width="auto"),
                         tooltip="remove this transform")
            b.add_class("ddprof-chip")
            b.on_click(lambda _, i=i: self.remove(i))
            chips.append(b)
        self.chips.children = chips
