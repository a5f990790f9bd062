"""The call-tree core: a Profile's stacks merged into a call tree, then pruned for drawing.

The pipeline is ``call_tree`` (or ``diff_tree``) -> ``flame_data``; every output (the
explorer's plotly charts, the static SVG flame of the HTML report and of notebook
fallbacks) draws a ``FlameData``.

- ``call_tree`` merges a Profile view's stacks into a call tree with numpy, one node per
  (path of functions).  Nodes are numbered level by level, so a parent always precedes
  its children; node 0 is the root (all samples).
- ``flame_data`` prunes it: every node holding at least ``min_pct`` % of the visible
  total is kept, the rest of each parent's children fold into one ``[other]`` node, and
  a hard ``max_nodes`` cap raises the threshold when needed (a browser draws a few
  hundred icicle nodes in well under a second; thousands take seconds).  It also carries
  the colours, hover text and search highlight.

Every string that reaches HTML or plotly's pseudo-HTML text (frame names, file names,
labels, thread names) goes through ``esc`` first.  Pure: numpy in, numbers and strings out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np

from ..events import EventType
from ..model import Frame, Profile
from .colors import HIT_LINE, LINE, OTHER_COLOR, ROOT_COLOR, diff_color, faded, frame_color, is_library
from .format import esc, format_change, format_signed, format_value, value_label, value_unit

__all__ = [
    "CallTree", "FlameData", "call_tree", "diff_tree", "flame_data", "search_regex", "shared_csr",
    "stack_weights", "pick_event", "DEFAULT_MIN_PCT", "DEFAULT_MAX_NODES", "OTHER",
]

DEFAULT_MIN_PCT = 0.5
# Browser budget: a default view must draw in <= 2 s in headless Chromium (software
# rendering, 2 cores): measured in tests/integration/test_browser.py.
DEFAULT_MAX_NODES = 600
OTHER = "[other]"


def pick_event(profile: Profile, event=None) -> EventType:
    """``event`` parsed, or the profile's first event (CPU for an empty profile)."""
    if event is not None:
        return EventType.parse(event)
    return profile.events[0] if profile.events else EventType.CPU


# ---------------------------------------------------------------------------------------
# numpy helpers


def _unique_inverse(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, return_inverse=True)`` by one sort (numpy 2.4's hash-based unique is
    several times slower on int64 arrays of this size)."""
    if len(x) == 0:
        return x[:0], np.zeros(0, dtype=np.int64)
    srt = np.argsort(x)
    sx = x[srt]
    boundary = np.empty(len(x), dtype=bool)
    boundary[0] = True
    np.not_equal(sx[1:], sx[:-1], out=boundary[1:])
    inv = np.empty(len(x), dtype=np.int64)
    inv[srt] = np.cumsum(boundary) - 1
    return sx[boundary], inv


def unique_sorted(x: np.ndarray) -> np.ndarray:
    if len(x) == 0:
        return x
    sx = np.sort(x)
    keep = np.empty(len(sx), dtype=bool)
    keep[0] = True
    np.not_equal(sx[1:], sx[:-1], out=keep[1:])
    return sx[keep]


# ---------------------------------------------------------------------------------------
# caches: views made by aggregate.filter share the frames/stacks tuples of their base, so
# interning and the call-tree shape are computed once per table, not per filter change


class _Cache:
    """A tiny identity-keyed LRU: entries hold their key objects so ids stay unique."""

    def __init__(self, size: int = 6):
        self.size = size
        self.items: dict[tuple, tuple[tuple, object]] = {}

    def get(self, key_objs: tuple, make, extra=()):
        key = tuple(id(k) for k in key_objs) + tuple(extra)
        hit = self.items.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], key_objs)):
            return hit[1]
        value = make()
        if len(self.items) >= self.size:
            self.items.pop(next(iter(self.items)))
        self.items[key] = (key_objs, value)
        return value


_csr_cache = _Cache()
_frame_info_cache = _Cache()
_shape_cache = _Cache(4)


def shared_csr(profile: Profile) -> tuple[np.ndarray, np.ndarray]:
    """``profile.flat_stacks()``, shared between views with the same stacks table."""
    return _csr_cache.get((profile.stacks,), profile.flat_stacks)


@dataclass
class _FrameInfo:
    func_of_frame: np.ndarray  # frame index -> function index
    functions: list[Frame]  # a representative frame per function
    library: np.ndarray  # frame index -> is_library


def _frame_info(frames: Sequence[Frame]) -> _FrameInfo:
    def make():
        keys: dict[tuple, int] = {}
        reps: list[Frame] = []
        fof = np.empty(len(frames), dtype=np.int64)
        lib_by_file: dict[tuple, bool] = {}
        lib = np.empty(len(frames), dtype=bool)
        for i, f in enumerate(frames):
            k = f.function_key
            j = keys.get(k)
            if j is None:
                j = keys[k] = len(reps)
                reps.append(f)
            fof[i] = j
            lk = (f.filename, f.kind)
            v = lib_by_file.get(lk)
            if v is None:
                v = lib_by_file[lk] = is_library(f)
            lib[i] = v
        return _FrameInfo(fof, reps, lib)

    return _frame_info_cache.get((frames,), make)


# ---------------------------------------------------------------------------------------
# call tree


@dataclass
class CallTree:
    """A call tree merged by function (name, file, first line, kind).

    ``parent[i] < i`` for every node but the root (node 0, ``parent == -1``,
    ``func == -1``); nodes are stored level by level.  ``total``/``self_`` have one
    column per profile: one for a plain tree, two (before, after) for a diff tree.
    Values are in ``unit``.  Only nodes with a non-zero value are present.
    """

    event: EventType
    value_index: int
    unit: str
    functions: list[Frame]
    parent: np.ndarray
    func: np.ndarray
    depth: np.ndarray
    total: np.ndarray  # (n, k) int64
    self_: np.ndarray  # (n, k) int64
    only_my_code: bool = False
    totals: tuple[int, ...] = ()  # per column: the root's total

    def __len__(self) -> int:
        return len(self.parent)

    @property
    def is_diff(self) -> bool:
        return self.total.shape[1] == 2

    def frame(self, node: int) -> Frame | None:
        f = int(self.func[node])
        return self.functions[f] if f >= 0 else None


def stack_weights(profile: Profile, event: EventType, value_index: int) -> np.ndarray:
    rows = profile.event == event.value
    w = np.zeros(len(profile.stacks), dtype=np.int64)
    if rows.any():
        np.add.at(w, profile.stack[rows], profile.values[rows, value_index])
    return w


def _func_csr(profile: Profile, info: _FrameInfo, only_my_code: bool) -> tuple[np.ndarray, np.ndarray]:
    """Stacks as function indexes (CSR), library frames folded into their caller if asked.

    "Folded into the caller": a library frame is dropped unless it is the stack's root,
    so its time becomes its nearest kept caller's self time.
    """
    flat, offsets = shared_csr(profile)
    ffl = info.func_of_frame[flat] if len(flat) else np.zeros(0, np.int64)
    if not only_my_code or not len(flat):
        return ffl, offsets
    keep = ~info.library[flat]
    starts = offsets[:-1][offsets[:-1] < offsets[1:]]
    keep[starts] = True
    ck = np.zeros(len(flat) + 1, dtype=np.int64)
    np.cumsum(keep, out=ck[1:])
    return ffl[keep], ck[offsets]


@dataclass
class _Shape:
    """The call tree of every stack in a table, without values: built once per table."""

    parent: np.ndarray
    func: np.ndarray
    depth: np.ndarray
    bounds: np.ndarray  # node index where each level starts (+ the end)
    leaf: np.ndarray  # stack index -> its node (0 for an empty stack)
    node_of_pos: np.ndarray  # CSR position (stack, depth) -> its node (int32)
    lengths: np.ndarray  # stack index -> its length


def _build_shape(flat: np.ndarray, offsets: np.ndarray, nfunc: int) -> _Shape:
    """Merge all stacks (CSR of function indexes) into a trie, level by level.

    Each level's nodes are the distinct (parent node, function) keys of the stacks still
    that deep, numbered in key order.  The active stacks are kept ordered by their node,
    so each level's keys arrive sorted by parent already and a stable sort (timsort: it
    merges runs) is nearly linear below the first few levels."""
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    cur = np.zeros(len(lengths), dtype=np.int64)  # each stack's node at the current level
    active = np.flatnonzero(lengths > 0)  # ordered by cur
    parents = [np.array([-1], dtype=np.int64)]
    funcs = [np.array([-1], dtype=np.int64)]
    n_nodes = 1
    node_of_pos = np.empty(len(flat), dtype=np.int32)
    d = 0
    while len(active):
        pos = starts[active] + d
        key = cur[active] * nfunc + flat[pos]
        srt = np.argsort(key, kind="stable")
        sk = key[srt]
        boundary = np.empty(len(sk), dtype=bool)
        boundary[0] = True
        np.not_equal(sk[1:], sk[:-1], out=boundary[1:])
        node = n_nodes + np.cumsum(boundary) - 1
        uniq = sk[boundary]
        active = active[srt]
        cur[active] = node
        node_of_pos[pos[srt]] = node
        parents.append(uniq // nfunc)  # sorted keys: each level is ordered by parent
        funcs.append(uniq % nfunc)
        n_nodes += len(uniq)
        d += 1
        active = active[lengths[active] > d]
    sizes = [len(p) for p in parents]
    return _Shape(
        np.concatenate(parents), np.concatenate(funcs),
        np.repeat(np.arange(len(sizes), dtype=np.int32), sizes),
        np.concatenate([[0], np.cumsum(sizes)]), cur, node_of_pos, lengths,
    )


def _tree_values(shape: _Shape, weights: np.ndarray):
    """Self and total per node for per-stack weights (S, k); then drop empty nodes.

    A node's total is the weight of the stacks through it: one scatter-add of each
    stack's weight over its positions (a path visits a node once, recursion or not)."""
    k = weights.shape[1]
    n = len(shape.parent)
    self_ = np.zeros((n, k), dtype=np.int64)
    total = np.zeros((n, k), dtype=np.int64)
    for c in range(k):
        w = weights[:, c]
        used = w != 0
        np.add.at(self_[:, c], shape.leaf[used], w[used])
        np.add.at(total[:, c], shape.node_of_pos, np.repeat(w, shape.lengths))
        total[0, c] = w.sum()
    keep = np.any(total != 0, axis=1)
    keep[0] = True
    if keep.all():  # the shape's arrays are shared, never written to
        return shape.parent, shape.func, shape.depth, total, self_
    new_id = np.cumsum(keep) - 1
    idx = np.flatnonzero(keep)
    parent = shape.parent[idx]
    parent[1:] = new_id[parent[1:]]
    return parent, shape.func[idx], shape.depth[idx], total[idx], self_[idx]


def call_tree(profile: Profile, event=None, value_index: int = 1, only_my_code: bool = False) -> CallTree:
    """The call tree of one event's samples in ``profile`` (already filtered by the caller).

    ``event`` defaults to the first event present; ``value_index`` 0 is the count,
    1 the quantity (ns or bytes).  ``only_my_code`` folds stdlib/site-packages/native
    frames into their caller.  The tree's shape is cached per stacks table, so views
    of one profile (filters other than ``hide``) only recompute values.
    """
    e = pick_event(profile, event)
    info = _frame_info(profile.frames)

    def make():
        flat, offsets = _func_csr(profile, info, only_my_code)
        return _build_shape(flat, offsets, max(1, len(info.functions)))

    shape = _shape_cache.get((profile.stacks, profile.frames), make, extra=(bool(only_my_code),))
    w = stack_weights(profile, e, value_index)[:, None]
    parent, func, depth, total, self_ = _tree_values(shape, w)
    return CallTree(
        e, value_index, value_unit(e, value_index), info.functions, parent, func, depth, total, self_,
        only_my_code, tuple(int(x) for x in total[0]),
    )


def diff_tree(before: Profile, after: Profile, event=None, value_index: int = 1, only_my_code: bool = False) -> CallTree:
    """One tree over both profiles: column 0 holds ``before``'s values, column 1 ``after``'s.

    Paths are matched by function (name, file, first line, kind), so the two profiles
    need not share frame tables.
    """
    if event is None:
        present = [e for e in after.events if e in before.events] or list(after.events or before.events)
        event = present[0] if present else EventType.CPU
    e = EventType.parse(event)
    ib, ia = _frame_info(before.frames), _frame_info(after.frames)

    def make():
        keys: dict[tuple, int] = {f.function_key: i for i, f in enumerate(ib.functions)}
        functions = list(ib.functions)
        remap = np.empty(len(ia.functions), dtype=np.int64)
        for i, f in enumerate(ia.functions):
            j = keys.get(f.function_key)
            if j is None:
                j = keys[f.function_key] = len(functions)
                functions.append(f)
            remap[i] = j
        fb, ob = _func_csr(before, ib, only_my_code)
        fa, oa = _func_csr(after, ia, only_my_code)
        flat = np.concatenate([fb, remap[fa] if len(fa) else fa])
        offsets = np.concatenate([ob, oa[1:] + ob[-1]])
        return functions, _build_shape(flat, offsets, max(1, len(functions)))

    functions, shape = _shape_cache.get(
        (before.stacks, before.frames, after.stacks, after.frames), make, extra=("diff", bool(only_my_code))
    )
    wb, wa = stack_weights(before, e, value_index), stack_weights(after, e, value_index)
    w = np.zeros((len(wb) + len(wa), 2), dtype=np.int64)
    w[: len(wb), 0] = wb
    w[len(wb) :, 1] = wa
    parent, func, depth, total, self_ = _tree_values(shape, w)
    return CallTree(
        e, value_index, value_unit(e, value_index), functions, parent, func, depth, total, self_,
        only_my_code, tuple(int(x) for x in total[0]),
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


def _levels(tree: CallTree) -> list[np.ndarray]:
    """Node indexes per depth (nodes are stored level by level)."""
    cuts = np.flatnonzero(np.diff(tree.depth)) + 1
    return np.split(np.arange(len(tree)), cuts)


def _has_matched_ancestor(tree: CallTree, match: np.ndarray) -> np.ndarray:
    anc = np.zeros(len(tree), dtype=bool)
    for lvl in _levels(tree)[1:]:
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
    for lvl in reversed(_levels(tree)[1:]):
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
    unit = tree.unit
    diff = tree.is_diff
    if diff:
        tb, ta = tree.totals
        scale = (ta / tb) if (normalize and tb > 0 and ta > 0) else 1.0
        width, before, after = _diff_widths(tree, scale)
    else:
        scale = 1.0
        width = tree.total[:, 0]
    root_total = int(width[0])
    threshold = root_total * max(0.0, float(min_pct)) / 100.0
    keep, used_threshold = _keep_mask(width, tree.parent, threshold, max(2, int(max_nodes)))
    kept = np.flatnonzero(keep)

    dropped = ~keep & (tree.parent >= 0) & keep[np.maximum(tree.parent, 0)] & (width > 0)
    dropped_idx = np.flatnonzero(dropped)
    o_par, o_inv = _unique_inverse(tree.parent[dropped_idx])
    o_width = np.zeros(len(o_par), dtype=np.int64)
    np.add.at(o_width, o_inv, width[dropped_idx])
    o_count = np.bincount(o_inv, minlength=len(o_par))
    if diff:
        o_b = np.zeros(len(o_par))
        o_a = np.zeros(len(o_par))
        np.add.at(o_b, o_inv, before[dropped_idx])
        np.add.at(o_a, o_inv, after[dropped_idx])
    else:
        o_tot = np.zeros(len(o_par), dtype=np.int64)
        np.add.at(o_tot, o_inv, tree.total[dropped_idx, 0])

    # search: matching nodes keep their colour and get a border; the rest fade
    match = _match_nodes(tree, search)
    searching = bool(search)
    share, n_matches = 0.0, 0
    o_match = np.zeros(len(o_par), dtype=bool)
    if searching:
        col = 1 if diff else 0
        root = tree.total[0, col]
        top_match = match & ~_has_matched_ancestor(tree, match)
        share = float(tree.total[top_match, col].sum()) / float(root) if root else 0.0
        n_matches = int(np.count_nonzero(match))
        sub = match.copy()  # does the subtree hold a match?
        for lvl in reversed(_levels(tree)[1:]):
            np.logical_or.at(sub, tree.parent[lvl], sub[lvl])
        if len(dropped_idx):
            np.logical_or.at(o_match, o_inv, sub[dropped_idx])

    root_label = f"all ({esc(tree.event.display_name)})"
    ids: list[str] = []
    labels: list[str] = []
    parents: list[str] = []
    colors: list[str] = []
    line_colors: list[str] = []
    custom: list[list] = []
    fn_color_cache: dict[int, str] = {}
    denom = float(root_total) if root_total else 1.0

    if diff:
        delta = after - before
        nonroot = kept[kept > 0]
        max_abs = float(np.max(np.abs(delta[nonroot]))) if len(nonroot) else 0.0
        if len(o_par):
            max_abs = max(max_abs, float(np.max(np.abs(o_a - o_b))))
        max_abs = max_abs or 1.0
        raw = np.zeros((len(kept) + len(o_par), 5))
    else:
        raw = np.zeros((len(kept) + len(o_par), 2), dtype=np.int64)

    for i, node in enumerate(kept.tolist()):
        ids.append(str(node))
        parents.append("" if node == 0 else str(int(tree.parent[node])))
        f = int(tree.func[node])
        if node == 0:
            name, loc = root_label, ""
            color = ROOT_COLOR
        else:
            fr = tree.functions[f]
            name = esc(fr.name)
            loc = esc(f"{fr.filename}:{fr.first_line}") if fr.filename else esc(fr.kind.description)
            color = fn_color_cache.get(f)
            if color is None:
                color = fn_color_cache[f] = frame_color(fr)
        labels.append(name)
        if diff:
            b, a = float(before[node]), float(after[node])
            d = a - b
            sb, sa = float(tree.self_[node, 0] * scale), float(tree.self_[node, 1])
            raw[i] = (b, a, d, sb, sa)
            color = diff_color(d / max_abs) if node else ROOT_COLOR
            custom.append([name, loc, format_value(b, unit), format_value(a, unit), format_signed(d, unit),
                           format_change(d, b), format_value(sb, unit), format_value(sa, unit)])
        else:
            s, t = int(tree.self_[node, 0]), int(tree.total[node, 0])
            raw[i] = (s, t)
            custom.append([name, loc, format_value(s, unit), format_value(t, unit), f"{100.0 * t / denom:.2f}%"])
        hit = searching and node > 0 and match[node]
        if searching and not hit and node > 0:
            color = faded(color)
        colors.append(color)
        line_colors.append(HIT_LINE if hit else LINE)
    for j, p in enumerate(o_par.tolist()):
        i = len(kept) + j
        ids.append(f"o{p}")
        parents.append(str(p))
        labels.append(OTHER)
        loc = f"{int(o_count[j])} smaller calls folded"
        if diff:
            b, a = float(o_b[j]), float(o_a[j])
            raw[i] = (b, a, a - b, b, a)
            colors.append(diff_color((a - b) / max_abs))
            custom.append([OTHER, loc, format_value(b, unit), format_value(a, unit), format_signed(a - b, unit),
                           format_change(a - b, b), format_value(b, unit), format_value(a, unit)])
        else:
            t = int(o_tot[j])
            raw[i] = (t, t)
            colors.append(OTHER_COLOR if not searching or o_match[j] else faded(OTHER_COLOR))
            custom.append([OTHER, loc, format_value(t, unit), format_value(t, unit), f"{100.0 * t / denom:.2f}%"])
        line_colors.append(HIT_LINE if searching and o_match[j] else LINE)

    values = np.concatenate([width[kept], o_width]).tolist()
    if diff:
        hover = (
            "<b>%{customdata[0]}</b><br>%{customdata[1]}<br>"
            "before: %{customdata[2]}<br>after: %{customdata[3]}<br>"
            "change: %{customdata[4]} (%{customdata[5]})<br>"
            "self: %{customdata[6]} → %{customdata[7]}<extra></extra>"
        )
    else:
        hover = (
            "<b>%{customdata[0]}</b><br>%{customdata[1]}<br>"
            "self: %{customdata[2]}<br>total: %{customdata[3]} (%{customdata[4]} of total)<extra></extra>"
        )
    node_map = np.concatenate([kept, np.full(len(o_par), -1)])
    other_parent = np.concatenate([np.full(len(kept), -1), o_par])
    levels = int(np.concatenate([tree.depth[kept], tree.depth[o_par] + 1]).max()) + 1
    if title is None:
        what = f"{tree.event.display_name} — {value_label(tree.event, tree.value_index)}"
        if diff:
            mode = "normalised by total" if normalize else "absolute"
            title = (f"Diff: {what} ({mode}): before {format_value(tree.totals[0], unit)}, "
                     f"after {format_value(tree.totals[1], unit)}")
        else:
            title = f"{what}: {format_value(root_total, unit)}"
        if searching:
            title += f" · search “{esc(search)}”: {100 * share:.1f}% of total"
    return FlameData(
        ids=ids, labels=labels, parents=parents, values=[int(v) for v in values], colors=colors,
        line_colors=line_colors, line_width=2.0 if searching else 0.5, customdata=custom, hovertemplate=hover,
        node=node_map, other_parent=other_parent, raw=raw, total=root_total,
        threshold=max(threshold, used_threshold), folded_nodes=len(tree) - len(kept), levels=levels,
        search=search or "", search_share=share, search_matches=n_matches, orientation=orientation,
        title=title, tree_nodes=len(tree), diff=diff, normalized=bool(normalize and diff),
    )


