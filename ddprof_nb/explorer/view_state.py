"""What the explorer shows, as one value: the event, the filters, the transforms, the
time range, the selection and the chart's options.  No widget: the explorer's controls
write a new ``ViewState`` on every change and ``view.Views`` turns it into a view.

Text the user types (focus/ignore/hide regexes, the label filter) goes through
``edited``: a bad one leaves the previous valid value in force and says why, so the
charts keep showing the last good view.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..model import selection as aggregate
from ..model import Frame
from ..render import DEFAULT_MAX_NODES, DEFAULT_MIN_PCT

__all__ = ["ViewState", "CLEARED", "TYPED", "DRAW_NODES", "parse_label_filter"]

# The flame chart's most boxes at the default min % (see ``node_budget``); the browser's
# redraw time follows the box count (benchmarks/bench_flame_redraw.py).
DRAW_NODES = 350

# the filters typed as text, checked by ``ViewState.edited`` (a bad one keeps the last good value)
TYPED = ("focus", "ignore", "hide", "labels")
# "clear filters": back to the whole profile (no thread, label, regex or time filter, no search)
CLEARED = dict(focus="", ignore="", hide="", labels="", search="", threads=(), time_range=None)


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


@dataclass(frozen=True)
class ViewState:
    """Every choice that shapes the explorer's views.  Frozen: a change is a new state
    (``replace``), so a view computed from one state never changes under it."""

    event: str  # an EventType label
    value_index: int = 1  # 0: counts, 1: the event's quantity (time, bytes)
    chart: str = "flame"  # or "icicle"
    inverted: bool = False
    only_mine: bool = False
    min_pct: float = DEFAULT_MIN_PCT
    search: str = ""
    threads: tuple[int, ...] = ()  # thread ids; none: every thread
    labels: str = ""  # "key=value, ..." (valid: see ``edited``)
    focus: str = ""
    ignore: str = ""
    hide: str = ""
    transforms: tuple[tuple[str, str], ...] = ()  # (kind, regex) steps, in order (``chips.KINDS``)
    time_range: tuple[int, int] | None = None  # ns since the profile's start, [start, end)
    selected: Frame | None = None  # the function of the sandwich and source view
    show_machinery: bool = False  # the kernel's threads and the profiler's work
    diff_view: str = "diff"  # a diff's chart: "diff", "before" or "after"
    diff_norm: bool = True  # "before" scaled to "after"'s total
    top_group: str = "function"  # or "line", "file"
    top_sort: str = "self"
    max_nodes: int | None = None  # None: ``node_budget`` decides
    top_n: int = 40

    def replace(self, **changes) -> ViewState:
        return replace(self, **changes)

    def edited(self, **texts: str) -> tuple[ViewState, list[str]]:
        """The state with the typed ``focus``/``ignore``/``hide``/``labels`` texts that are
        valid; each invalid one keeps its previous value and adds a message."""
        good, errors = {}, []
        for name, text in texts.items():
            try:
                if name == "labels":
                    parse_label_filter(text)
                elif name in ("focus", "ignore", "hide"):
                    aggregate.compile_regex(text, name)
                else:
                    raise TypeError(f"{name!r} is not a typed filter")
                good[name] = text
            except ValueError as exc:
                kept = "the previous label filter" if name == "labels" else repr(getattr(self, name))
                errors.append(f"{exc} — keeping {kept}")
        return self.replace(**good), errors

    def criteria(self) -> dict:
        """``aggregate.filter``'s arguments for every filter but the time range."""
        return dict(threads=list(self.threads) or None, labels=parse_label_filter(self.labels) or None,
                    focus=self.focus or None, ignore=self.ignore or None, hide=self.hide or None)

    def node_budget(self) -> int:
        """The most boxes the flame chart draws: ``max_nodes`` when given.  Otherwise
        ``DRAW_NODES`` at the default detail, and ``render``'s cap once min % is set
        below its default: plotly's redraw costs the browser about half a millisecond a
        box (more inside JupyterLab), and the boxes a smaller budget folds into
        ``[other]`` are the narrowest, mostly too narrow for a label."""
        if self.max_nodes is not None:
            return self.max_nodes
        return DRAW_NODES if self.min_pct >= DEFAULT_MIN_PCT else DEFAULT_MAX_NODES

    def more_in_force(self) -> int:
        """How many of the choices behind the explorer's "more" button change the view."""
        return (sum(bool(t.strip()) for t in (self.focus, self.ignore, self.hide, self.labels))
                + (self.value_index != 1) + self.only_mine + (self.time_range is not None) + len(self.transforms))
