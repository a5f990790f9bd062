"""A call tree pruned for drawing: ``flame_data`` -> ``FlameData``, what every flame chart
draws (the explorer's plotly icicle, the static SVG flame of the reports and fallbacks).

Every node holding at least ``min_pct`` % of the visible total is kept, the rest of each
parent's children fold into one ``[other]`` item, and a hard ``max_nodes`` cap raises the
threshold when needed (a browser draws a few hundred icicle nodes in well under a
second; thousands take seconds).  It also carries the colours, hover text and search
highlight.  Every name that reaches a label or hover text is escaped here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..events import FrameKind
from ..model import Frame
from .colors import HIT_LINE, LINE, OTHER_COLOR, ROOT_COLOR, diff_color, faded, frame_color, module_of
from .format import esc, format_change, format_signed, format_value, value_label
from .pseudo import explain, explain_kind
from .tree import CallTree, levels, unique_inverse

__all__ = ["FlameData", "flame_data", "search_regex", "heaviest_match", "color_legend", "legend_html", "DEFAULT_MIN_PCT", "DEFAULT_MAX_NODES", "OTHER"]

DEFAULT_MIN_PCT = 0.5
# Browser budget: a default view must draw in <= 2 s in headless Chromium (software
# rendering, 2 cores): measured in tests/integration/test_browser.py.
DEFAULT_MAX_NODES = 600
OTHER = "[other]"

_HOVER = (
    "<b>%{customdata[0]}</b><br>%{customdata[1]}<br>"
    "self: %{customdata[2]}<br>total: %{customdata[3]} (%{customdata[4]} of total)<extra></extra>"
)
_HOVER_DIFF = (
    "<b>%{customdata[0]}</b><br>%{customdata[1]}<br>"
    "before: %{customdata[2]}<br>after: %{customdata[3]}<br>"
    "change: %{customdata[4]} (%{customdata[5]})<br>"
    "self: %{customdata[6]} → %{customdata[7]}<extra></extra>"
)


# ---------------------------------------------------------------------------------------
# search


def search_regex(pattern: str | None):
    """A case-insensitive regex for the search box; text that is not a valid regex is
    searched literally (typing ``f(`` must not break anything)."""
    if not pattern:
        return None
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error:
        return re.compile(re.escape(pattern), re.IGNORECASE)


def _match_nodes(tree: CallTree, pattern) -> np.ndarray:
    rx = search_regex(pattern) if isinstance(pattern, str) or pattern is None else pattern
    if rx is None:
        return np.zeros(len(tree), dtype=bool)
    fmatch = np.fromiter(
        (bool(rx.search(f.name) or (f.filename and rx.search(f.filename))) for f in tree.functions),
        dtype=bool,
        count=len(tree.functions),
    )
    m = np.zeros(len(tree), dtype=bool)
    m[1:] = fmatch[tree.func[1:]]
    return m


def heaviest_match(tree: CallTree, pattern: str) -> Frame | None:
    """The function of the search's heaviest matching node (largest total), or None."""
    match = _match_nodes(tree, pattern)
    if not match.any():
        return None
    col = 1 if tree.is_diff else 0
    nodes = np.flatnonzero(match)
    return tree.frame(int(nodes[np.argmax(np.abs(tree.total[nodes, col]))]))


def color_legend(tree: CallTree, n: int = 8) -> list[tuple[str, str, float]]:
    """What the flame's colours mean: ``(module, colour, share of self)`` for the ``n``
    modules (packages, files, pseudo-frame kinds) with the most self value, largest
    first.  Empty for a diff tree (its colours are the change: see ``legend_html``)."""
    if tree.is_diff or len(tree) < 2 or not tree.functions:
        return []
    per_func = np.bincount(tree.func[1:], weights=tree.self_[1:, 0], minlength=len(tree.functions))
    total = float(per_func.sum())
    if total <= 0:
        return []
    shares: dict[str, float] = {}
    colors: dict[str, str] = {}
    for f in np.flatnonzero(per_func):
        fr = tree.functions[int(f)]
        m = module_of(fr)
        shares[m] = shares.get(m, 0.0) + float(per_func[f]) / total
        colors.setdefault(m, frame_color(fr))
    # an entry shown as 0 % says nothing: only shares that round to 1 % or more
    top = sorted(((m, s) for m, s in shares.items() if s >= 0.005), key=lambda kv: (-kv[1], kv[0]))[:n]
    return [(m, colors[m], share) for m, share in top]


def legend_html(tree: CallTree, n: int = 8) -> str:
    """``color_legend`` as one line of HTML swatches (or the diff colours' meaning)."""
    def swatch(color: str) -> str:
        return (f"<span style='display:inline-block;width:.9em;height:.9em;vertical-align:middle;"
                f"background:{color};border-radius:2px;margin:0 .25em 0 .6em'></span>")

    if tree.is_diff:
        return (f"<div class='ddprof-legend'>colour = change of total:{swatch(diff_color(1.0))}grew"
                f"{swatch(diff_color(-1.0))}shrank</div>")
    items = color_legend(tree, n)
    if not items:
        return ""
    kinds = {f"[{k.label}]": k for k in FrameKind if k is not FrameKind.PYTHON}  # module_of's names of kinds

    def entry(m: str, c: str, s: float) -> str:
        tip = explain_kind(kinds[m]) if m in kinds else f"package or file {m}"
        return f"<span title='{esc(tip)}'>{swatch(c)}{esc(m)} {100 * s:.0f}%</span>"

    parts = "".join(entry(m, c, s) for m, c, s in items)
    return f"<div class='ddprof-legend'>colour = package or file (its share of self):{parts}</div>"


def _has_matched_ancestor(tree: CallTree, match: np.ndarray) -> np.ndarray:
    anc = np.zeros(len(tree), dtype=bool)
    for lvl in levels(tree)[1:]:
        p = tree.parent[lvl]
        anc[lvl] = anc[p] | match[p]
    return anc


# ---------------------------------------------------------------------------------------
# pruning and flame data


@dataclass
class FlameData:
    """Everything a flame/icicle trace needs, plus facts for the status line.

    ``node`` maps each plotted item to its tree node (``-1`` for an ``[other]`` item,
    whose parent is ``other_parent``).  ``raw`` holds exact numbers per item: for a plain
    tree (self, total); for a diff tree (before total, after total, delta, before self,
    after self) with ``before`` already scaled when normalised.
    """

    ids: list[str]
    labels: list[str]
    parents: list[str]
    values: list[int]
    colors: list[str]
    line_colors: list[str]
    line_width: float  # one width for all: per-node widths break plotly's path bar (NaN paths)
    customdata: list[list]
    hovertemplate: str
    node: np.ndarray
    other_parent: np.ndarray
    raw: np.ndarray
    total: int  # the root's width
    threshold: float  # nodes narrower than this were folded
    folded_nodes: int  # tree nodes hidden in [other] items
    levels: int  # depth of the plotted tree (root = 1)
    search: str = ""
    search_share: float = 0.0
    search_matches: int = 0
    orientation: str = "flame"
    title: str = ""
    tree_nodes: int = 0
    diff: bool = False
    normalized: bool = True

    @property
    def node_count(self) -> int:
        return len(self.ids)


def _diff_widths(tree: CallTree, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Widths of a diff tree: each node's own width is max(scaled before self, after self),
    integer, summed up the tree, so children never outgrow parents (plotly checks)."""
    sb = np.rint(tree.self_[:, 0] * scale).astype(np.int64)
    own = np.maximum(sb, tree.self_[:, 1])
    width = own.copy()
    for lvl in reversed(levels(tree)[1:]):
        np.add.at(width, tree.parent[lvl], width[lvl])
    return width, tree.total[:, 0] * scale, tree.total[:, 1].astype(np.float64)


def _top_k(width: np.ndarray, k: int) -> np.ndarray:
    """Mask of the ``k`` widest nodes, ties going to lower node indexes.

    Widths never grow from parent to child and parents have lower indexes, so the
    result is a connected subtree containing the root.  O(n) (a partition, no sort).
    """
    n = len(width)
    if k >= n:
        return np.ones(n, dtype=bool)
    kth = np.partition(width, n - k)[n - k]
    keep = width > kth
    ties = np.flatnonzero(width == kth)[: k - int(np.count_nonzero(keep))]
    keep[ties] = True
    return keep


def _keep_mask(width: np.ndarray, parent: np.ndarray, threshold: float, max_nodes: int) -> tuple[np.ndarray, float]:
    """Nodes to plot: width >= threshold, at most ``max_nodes`` including [other] items.

    Returns the mask and the threshold actually applied (raised when the cap bites).
    """
    eligible = max(1, int(np.count_nonzero(width >= threshold if threshold > 0 else width > 0)))
    has_parent = parent >= 0
    safe_parent = np.where(has_parent, parent, 0)

    def mask_for(k: int) -> tuple[np.ndarray, int]:
        keep = _top_k(width, k)
        keep[0] = True
        dropped = ~keep & has_parent & keep[safe_parent] & (width > 0)
        n_other = int(np.count_nonzero(np.bincount(parent[dropped], minlength=1)))
        return keep, int(np.count_nonzero(keep)) + n_other

    k = min(eligible, max_nodes)
    keep, count = mask_for(k)
    while count > max_nodes and k > 1:
        k = max(1, k - (count - max_nodes))
        keep, count = mask_for(k)
    used_threshold = threshold
    if k < eligible:
        used_threshold = float(width[keep].min())
    return keep, used_threshold



@dataclass
class _Widths:
    """What each node's block measures: ``width`` (ints, summed up the tree) and, for a diff
    tree, the (scaled) totals before and after."""

    width: np.ndarray
    before: np.ndarray | None = None
    after: np.ndarray | None = None
    scale: float = 1.0


def _widths(tree: CallTree, normalize: bool) -> _Widths:
    if not tree.is_diff:
        return _Widths(tree.total[:, 0])
    tb, ta = tree.totals
    scale = (ta / tb) if (normalize and tb > 0 and ta > 0) else 1.0
    return _Widths(*_diff_widths(tree, scale), scale=scale)


@dataclass
class _Others:
    """The ``[other]`` item of each parent whose small children were folded."""

    parent: np.ndarray  # parent node of each item
    inv: np.ndarray  # folded node -> its item
    folded: np.ndarray  # the folded nodes (children of kept nodes)
    width: np.ndarray
    count: np.ndarray  # nodes folded into each item
    value: np.ndarray  # plain tree: total; diff tree: (before, after)


def _fold_small(tree: CallTree, w: _Widths, keep: np.ndarray) -> _Others:
    folded = np.flatnonzero(~keep & (tree.parent >= 0) & keep[np.maximum(tree.parent, 0)] & (w.width > 0))
    parent, inv = unique_inverse(tree.parent[folded])
    width = np.zeros(len(parent), dtype=np.int64)
    np.add.at(width, inv, w.width[folded])
    if w.before is not None:
        value = np.zeros((len(parent), 2))
        np.add.at(value[:, 0], inv, w.before[folded])
        np.add.at(value[:, 1], inv, w.after[folded])
    else:
        value = np.zeros((len(parent), 1), dtype=np.int64)
        np.add.at(value[:, 0], inv, tree.total[folded, 0])
    return _Others(parent, inv, folded, width, np.bincount(inv, minlength=len(parent)), value)


@dataclass
class _Search:
    """Matching nodes keep their colour and get a border; the rest fade."""

    active: bool
    match: np.ndarray  # node -> matches
    other_match: np.ndarray  # [other] item -> holds a match
    share: float = 0.0  # of the total, in the outermost matching nodes
    matches: int = 0


def _search(tree: CallTree, pattern: str | None, others: _Others) -> _Search:
    match = _match_nodes(tree, pattern)
    o_match = np.zeros(len(others.parent), dtype=bool)
    if not pattern:
        return _Search(False, match, o_match)
    col = 1 if tree.is_diff else 0
    root = tree.total[0, col]
    top_match = match & ~_has_matched_ancestor(tree, match)
    share = float(tree.total[top_match, col].sum()) / float(root) if root else 0.0
    sub = match.copy()  # does the subtree hold a match?
    for lvl in reversed(levels(tree)[1:]):
        np.logical_or.at(sub, tree.parent[lvl], sub[lvl])
    if len(others.folded):
        np.logical_or.at(o_match, others.inv, sub[others.folded])
    return _Search(True, match, o_match, share, int(np.count_nonzero(match)))


def _node_text(tree: CallTree, node: int, colors: dict[int, str]) -> tuple[str, str, str]:
    """(escaped name, escaped location, colour) of a tree node."""
    if node == 0:
        return f"all ({esc(tree.event.display_name)})", "", ROOT_COLOR
    f = int(tree.func[node])
    fr = tree.functions[f]
    loc = esc(f"{fr.filename}:{fr.first_line}") if fr.filename else esc(explain(fr) or "")
    color = colors.get(f)
    if color is None:
        color = colors[f] = frame_color(fr)
    return esc(fr.name), loc, color


def _items(tree: CallTree, kept: np.ndarray, others: _Others, w: _Widths, search: _Search) -> dict:
    """Per plotted item: ids, parents, labels, colours, borders, hover data and exact values."""
    unit = tree.unit
    diff = tree.is_diff
    n_kept = len(kept)
    out = dict(ids=[], parents=[], labels=[], colors=[], line_colors=[], customdata=[])
    raw = np.zeros((n_kept + len(others.parent), 5)) if diff else \
        np.zeros((n_kept + len(others.parent), 2), dtype=np.int64)
    denom = float(w.width[0]) or 1.0
    if diff:
        delta = w.after - w.before
        nonroot = kept[kept > 0]
        max_abs = float(np.max(np.abs(delta[nonroot]))) if len(nonroot) else 0.0
        if len(others.parent):
            max_abs = max(max_abs, float(np.max(np.abs(others.value[:, 1] - others.value[:, 0]))))
        max_abs = max_abs or 1.0

    def hover_diff(name, loc, b, a, sb, sa):
        d = a - b
        return [name, loc, format_value(b, unit), format_value(a, unit), format_signed(d, unit),
                format_change(d, b), format_value(sb, unit), format_value(sa, unit)]

    def hover(name, loc, s, t):
        return [name, loc, format_value(s, unit), format_value(t, unit), f"{100.0 * t / denom:.2f}%"]

    colors: dict[int, str] = {}
    for i, node in enumerate(kept.tolist()):
        name, loc, color = _node_text(tree, node, colors)
        out["ids"].append(str(node))
        out["parents"].append("" if node == 0 else str(int(tree.parent[node])))
        out["labels"].append(name)
        if diff:
            b, a = float(w.before[node]), float(w.after[node])
            sb, sa = float(tree.self_[node, 0] * w.scale), float(tree.self_[node, 1])
            raw[i] = (b, a, a - b, sb, sa)
            color = diff_color((a - b) / max_abs) if node else ROOT_COLOR
            out["customdata"].append(hover_diff(name, loc, b, a, sb, sa))
        else:
            s, t = int(tree.self_[node, 0]), int(tree.total[node, 0])
            raw[i] = (s, t)
            out["customdata"].append(hover(name, loc, s, t))
        hit = search.active and node > 0 and search.match[node]
        out["colors"].append(faded(color) if search.active and not hit and node > 0 else color)
        out["line_colors"].append(HIT_LINE if hit else LINE)
    for j, p in enumerate(others.parent.tolist()):
        i = n_kept + j
        loc = f"{int(others.count[j])} smaller calls folded"
        out["ids"].append(f"o{p}")
        out["parents"].append(str(p))
        out["labels"].append(OTHER)
        if diff:
            b, a = (float(v) for v in others.value[j])
            raw[i] = (b, a, a - b, b, a)
            out["colors"].append(diff_color((a - b) / max_abs))
            out["customdata"].append(hover_diff(OTHER, loc, b, a, b, a))
        else:
            t = int(others.value[j, 0])
            raw[i] = (t, t)
            out["colors"].append(OTHER_COLOR if not search.active or search.other_match[j] else faded(OTHER_COLOR))
            out["customdata"].append(hover(OTHER, loc, t, t))
        out["line_colors"].append(HIT_LINE if search.active and search.other_match[j] else LINE)
    out["raw"] = raw
    return out


def _title(tree: CallTree, root_total: int, normalize: bool, pattern: str | None, share: float) -> str:
    unit = tree.unit
    # "CPU time: 3.27 s", "CPU time (samples): 327": the quantity needs no name of its own
    what = tree.event.display_name
    if tree.value_index == 0:
        what += f" ({value_label(tree.event, 0)})"
    if tree.is_diff:
        mode = "normalised by total" if normalize else "absolute"
        title = (f"Diff: {what} ({mode}): before {format_value(tree.totals[0], unit)}, "
                 f"after {format_value(tree.totals[1], unit)}")
    else:
        title = f"{what}: {format_value(root_total, unit)}"
    if pattern:
        title += f" · search “{esc(pattern)}”: {100 * share:.1f}% of total"
    return title


def flame_data(
    tree: CallTree,
    *,
    min_pct: float = DEFAULT_MIN_PCT,
    max_nodes: int = DEFAULT_MAX_NODES,
    search: str | None = None,
    orientation: str = "flame",
    normalize: bool = True,
    title: str | None = None,
) -> FlameData:
    """Prune ``tree`` and compute everything plotted: ids, labels, colours, hover.

    Nodes narrower than ``min_pct`` % of the root fold into one ``[other]`` item per
    parent; if more than ``max_nodes`` items would remain, the threshold rises until
    they fit (``FlameData.threshold`` says where it ended).  For a diff tree, widths are
    the union of both profiles and colours show the change (red: growth, blue:
    shrinkage) with ``before`` scaled to ``after``'s total when ``normalize``.
    """
    if orientation not in ("flame", "icicle"):
        raise ValueError(f"orientation must be 'flame' or 'icicle', not {orientation!r}")
    w = _widths(tree, normalize)
    root_total = int(w.width[0])
    threshold = root_total * max(0.0, float(min_pct)) / 100.0
    keep, used_threshold = _keep_mask(w.width, tree.parent, threshold, max(2, int(max_nodes)))
    kept = np.flatnonzero(keep)
    others = _fold_small(tree, w, keep)
    found = _search(tree, search, others)
    items = _items(tree, kept, others, w, found)
    values = np.concatenate([w.width[kept], others.width])
    return FlameData(
        **items, values=[int(v) for v in values.tolist()],
        line_width=2.0 if found.active else 0.5, hovertemplate=_HOVER_DIFF if tree.is_diff else _HOVER,
        node=np.concatenate([kept, np.full(len(others.parent), -1)]),
        other_parent=np.concatenate([np.full(len(kept), -1), others.parent]),
        total=root_total, threshold=max(threshold, used_threshold), folded_nodes=len(tree) - len(kept),
        levels=int(np.concatenate([tree.depth[kept], tree.depth[others.parent] + 1]).max()) + 1,
        search=search or "", search_share=found.share, search_matches=found.matches, orientation=orientation,
        title=title if title is not None else _title(tree, root_total, normalize, search, found.share),
        tree_nodes=len(tree), diff=tree.is_diff, normalized=bool(normalize and tree.is_diff),
    )
