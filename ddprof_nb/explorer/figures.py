"""Profile -> figure data for the explorer: pure functions, testable without a browser.

The pipeline is ``call_tree`` (or ``diff_tree``) -> ``flame_data`` -> ``flame_figure``:

- ``call_tree`` merges a Profile view's stacks into a call tree with numpy, one node per
  (path of functions).  Nodes are numbered level by level, so a parent always precedes
  its children; node 0 is the root (all samples).
- ``flame_data`` prunes it for the browser: every node holding at least ``min_pct`` % of
  the visible total is kept, the rest of each parent's children fold into one
  ``[other]`` node, and a hard ``max_nodes`` cap raises the threshold when needed
  (headless Chromium needs ~5 s to draw 2k icicle nodes, DESIGN §6).  It also carries
  the colours, hover text and search highlight.
- ``flame_figure`` turns that into a plotly icicle: a flame graph (root at the bottom,
  ``tiling.flip='y'``) or an icicle (root at the top).

Every string that reaches HTML or plotly's pseudo-HTML text (frame names, file names,
labels, thread names) goes through ``esc`` first.
"""

from __future__ import annotations

import colorsys
import html
import linecache
import os
import re
import sysconfig
import zlib
from dataclasses import dataclass
from collections.abc import Iterable, Sequence

import numpy as np

from ..events import EventType, FrameKind
from ..model import Frame, Profile

__all__ = [
    "CallTree",
    "FlameData",
    "SourceLine",
    "SourceView",
    "call_tree",
    "diff_tree",
    "flame_data",
    "flame_figure",
    "flame_trace_props",
    "timeline_figure",
    "timeline_data",
    "source_view",
    "source_html",
    "static_flame_html",
    "top_table_text",
    "top_table_html",
    "format_value",
    "value_label",
    "module_of",
    "color_for",
    "is_library",
    "esc",
    "DEFAULT_MIN_PCT",
    "DEFAULT_MAX_NODES",
]

DEFAULT_MIN_PCT = 0.5
# Browser budget: a default view must draw in <= 2 s in headless Chromium (software
# rendering, 2 cores): measured in tests/integration/test_browser.py.
DEFAULT_MAX_NODES = 600
OTHER = "[other]"
MAX_LEVELS = 40  # levels drawn at once (~19 px each); deeper stacks show after a click-zoom


def esc(text: object) -> str:
    """HTML-escape ``text`` (quotes too): safe in HTML, SVG and plotly's pseudo-HTML labels."""
    return html.escape(str(text), quote=True)


# ---------------------------------------------------------------------------------------
# units


def format_value(value: float, unit: str) -> str:
    """``value`` in a human unit: ns -> ns/µs/ms/s, bytes -> B/KiB/MiB/GiB, counts with commas."""
    v = float(value)
    a = abs(v)
    if unit == "nanoseconds":
        for limit, div, name in ((1e3, 1, "ns"), (1e6, 1e3, "µs"), (1e9, 1e6, "ms")):
            if a < limit:
                return f"{v / div:.3g} {name}" if div > 1 else f"{v:.0f} ns"
        return f"{v / 1e9:.3g} s" if a < 100e9 else f"{v / 1e9:,.0f} s"
    if unit == "bytes":
        if a < 1024:
            return f"{v:.0f} B"
        for div, name in ((1024, "KiB"), (1024**2, "MiB"), (1024**3, "GiB")):
            if a < div * 1024 or name == "GiB":
                return f"{v / div:.3g} {name}"
    if v == int(v):
        return f"{int(v):,}"
    return f"{v:,.2f}"


def value_unit(event: EventType, value_index: int) -> str:
    """The unit of one of the event's two values (``count``, ``nanoseconds`` or ``bytes``)."""
    return event.value_types[value_index].unit


def value_label(event: EventType, value_index: int) -> str:
    """Short name of a value for controls: samples/count, time/bytes."""
    vt = event.value_types[value_index]
    if value_index == 0:
        return "samples" if vt.type.endswith("samples") else "count"
    return "time" if vt.unit == "nanoseconds" else "bytes"


# ---------------------------------------------------------------------------------------
# modules, colours, library frames


def _stdlib_dirs() -> tuple[str, ...]:
    dirs = set()
    for key in ("stdlib", "platstdlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.add(os.path.normpath(p))
            dirs.add(os.path.realpath(p))
    return tuple(sorted(dirs, key=len, reverse=True))


_STDLIB_DIRS = _stdlib_dirs()
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # ddprof_nb itself
_LIB_RE = re.compile(r"/lib/python\d\.\d+t?/(?:(site|dist)-packages/)?")
_CELL_RE = re.compile(r"(?:ipykernel_\d+/\d+\.py$|^<ipython-input-|^<cell|^Cell In\[)")


def module_of(frame: Frame) -> str:
    """The top-level package (site-packages, stdlib) or file a frame belongs to.

    Pseudo-frames map to their bracketed kind, notebook cells to ``notebook``.  This is
    what colours hash, so a package keeps its colour across profiles and sessions.
    """
    if frame.kind is not FrameKind.PYTHON:
        return f"[{frame.kind.label}]"
    fn = (frame.filename or "").replace("\\", "/")
    if not fn:
        return "?"
    if fn.startswith("<frozen "):
        return fn[len("<frozen ") : -1].split(".")[0]
    if _CELL_RE.search(fn):
        return "notebook"
    found = list(_LIB_RE.finditer(fn))  # the last one: a venv inside a project inside ...
    if found:
        m = found[-1]
        top = fn[m.end() :].split("/")[0]
        return top[:-3] if top.endswith(".py") else top
    for d in _STDLIB_DIRS:
        if fn.startswith(d + "/"):
            top = fn[len(d) + 1 :].split("/")[0]
            return top[:-3] if top.endswith(".py") else top
    base = fn.rsplit("/", 1)[-1]
    return base[:-3] if base.endswith(".py") else base


def is_library(frame: Frame) -> bool:
    """True for frames that are not the user's code: stdlib, site-packages, frozen, native,
    and ddprof_nb's own frames.  Pseudo-frames (GC, lock, ...) are not library frames."""
    if frame.kind is FrameKind.NATIVE:
        return True
    if frame.kind is not FrameKind.PYTHON:
        return False
    fn = (frame.filename or "").replace("\\", "/")
    if not fn or _CELL_RE.search(fn):
        return False
    if fn.startswith("<frozen ") or _LIB_RE.search(fn):
        return True
    if fn.startswith(_PKG_DIR + "/"):
        return True
    return any(fn.startswith(d + "/") for d in _STDLIB_DIRS)


_KIND_COLORS = {
    FrameKind.GC: "#c9b458",
    FrameKind.THREAD: "#a7a7a7",
    FrameKind.TRUNCATED: "#bdbdbd",
    FrameKind.ERROR: "#e57373",
    FrameKind.LOCK: "#e0a060",
    FrameKind.BLOCKER: "#d4a0d8",
    FrameKind.ALLOC_TYPE: "#8fc9c0",
    FrameKind.UNKNOWN: "#bdbdbd",
    FrameKind.NATIVE: "#b0a8c8",
}
ROOT_COLOR = "#9aa0a6"
OTHER_COLOR = "#c4c4c4"
TEXT_COLOR = "#1b1b1b"  # node text: every node colour is light enough for dark text
LINE = "rgba(255,255,255,0.6)"
HIT_LINE = "#d6006f"  # border of search matches


def _hsl(h: float, s: float, light: float) -> str:
    r, g, b = colorsys.hls_to_rgb(h % 1.0, light, s)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def color_for(module: str) -> str:
    """A stable colour for a module name: crc32 -> hue (never Python's salted ``hash``).

    Lightness 0.68-0.76 and saturation ~0.55 keep dark node text readable, and the
    blocks stand out on both light and dark notebook themes.
    """
    h = zlib.crc32(module.encode("utf-8", "surrogatepass"))
    hue = (h & 0xFFFF) / 0x10000
    sat = 0.45 + ((h >> 16) & 0xFF) / 255 * 0.2
    light = 0.68 + ((h >> 24) & 0xFF) / 255 * 0.08
    return _hsl(hue, sat, light)


def _frame_color(frame: Frame) -> str:
    return _KIND_COLORS.get(frame.kind) or color_for(module_of(frame))


def _faded(color: str) -> str:
    """The colour washed towards grey: non-matching nodes while searching."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    mix = lambda c: round(c * 0.25 + 0xD6 * 0.75)  # noqa: E731
    return f"#{mix(r):02x}{mix(g):02x}{mix(b):02x}"


def _diff_color(rel: float) -> str:
    """Red for growth (rel > 0), blue for shrinkage; rel in [-1, 1]; white-ish near 0."""
    rel = max(-1.0, min(1.0, rel))
    t = abs(rel) ** 0.7
    if rel >= 0:  # towards #e8504a
        r, g, b = 0xF2 + (0xE8 - 0xF2) * t, 0xF2 + (0x50 - 0xF2) * t, 0xF2 + (0x4A - 0xF2) * t
    else:  # towards #4a7fe8
        r, g, b = 0xF2 + (0x4A - 0xF2) * t, 0xF2 + (0x7F - 0xF2) * t, 0xF2 + (0xE8 - 0xF2) * t
    return f"#{round(r):02x}{round(g):02x}{round(b):02x}"


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


def _unique(x: np.ndarray) -> np.ndarray:
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


def _csr(profile: Profile) -> tuple[np.ndarray, np.ndarray]:
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


def _stack_weights(profile: Profile, event: EventType, value_index: int) -> np.ndarray:
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
    flat, offsets = _csr(profile)
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
    e = EventType.parse(event) if event is not None else (profile.events[0] if profile.events else EventType.CPU)
    info = _frame_info(profile.frames)

    def make():
        flat, offsets = _func_csr(profile, info, only_my_code)
        return _build_shape(flat, offsets, max(1, len(info.functions)))

    shape = _shape_cache.get((profile.stacks, profile.frames), make, extra=(bool(only_my_code),))
    w = _stack_weights(profile, e, value_index)[:, None]
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
    wb, wa = _stack_weights(before, e, value_index), _stack_weights(after, e, value_index)
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
                color = fn_color_cache[f] = _frame_color(fr)
        labels.append(name)
        if diff:
            b, a = float(before[node]), float(after[node])
            d = a - b
            sb, sa = float(tree.self_[node, 0] * scale), float(tree.self_[node, 1])
            raw[i] = (b, a, d, sb, sa)
            color = _diff_color(d / max_abs) if node else ROOT_COLOR
            custom.append([name, loc, format_value(b, unit), format_value(a, unit), _signed(d, unit),
                           _pct(d, b), format_value(sb, unit), format_value(sa, unit)])
        else:
            s, t = int(tree.self_[node, 0]), int(tree.total[node, 0])
            raw[i] = (s, t)
            custom.append([name, loc, format_value(s, unit), format_value(t, unit), f"{100.0 * t / denom:.2f}%"])
        hit = searching and node > 0 and match[node]
        if searching and not hit and node > 0:
            color = _faded(color)
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
            colors.append(_diff_color((a - b) / max_abs))
            custom.append([OTHER, loc, format_value(b, unit), format_value(a, unit), _signed(a - b, unit),
                           _pct(a - b, b), format_value(b, unit), format_value(a, unit)])
        else:
            t = int(o_tot[j])
            raw[i] = (t, t)
            colors.append(OTHER_COLOR if not searching or o_match[j] else _faded(OTHER_COLOR))
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


def _signed(v: float, unit: str) -> str:
    return ("+" if v > 0 else "−" if v < 0 else "±") + format_value(abs(v), unit)


def _pct(d: float, base: float) -> str:
    if base == 0:
        return "new" if d > 0 else "0%"
    return f"{100.0 * d / base:+.1f}%"


def flame_trace_props(fd: FlameData) -> dict:
    """Properties of the plotly icicle trace for ``fd`` (used to build or update it)."""
    tiling = dict(orientation="v", flip="y" if fd.orientation == "flame" else None)  # None: plotly default
    return dict(
        ids=fd.ids,
        labels=fd.labels,
        parents=fd.parents,
        values=fd.values,
        branchvalues="total",
        customdata=fd.customdata,
        hovertemplate=fd.hovertemplate,
        marker=dict(colors=fd.colors, line=dict(color=fd.line_colors, width=fd.line_width)),
        insidetextfont=dict(color=TEXT_COLOR, size=11),
        textinfo="label",
        tiling=tiling,
        pathbar=dict(visible=True),
        sort=True,
        # deeper trees show MAX_LEVELS levels at a time; a click zooms further down
        maxdepth=MAX_LEVELS if fd.levels > MAX_LEVELS else -1,
    )


def flame_layout(fd: FlameData) -> dict:
    """Layout for the flame figure: height follows the depth; transparent background
    and a mid-grey font so it reads in light and dark themes."""
    height = int(min(900, max(300, 60 + 19 * min(fd.levels, MAX_LEVELS))))
    return dict(
        height=height,
        margin=dict(l=4, r=4, t=44, b=4),
        title=dict(text=fd.title, font=dict(size=13), x=0.01, y=0.98, yanchor="top"),
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
        font=dict(color="#8a8a8a"),
        uirevision="flame",
    )


def flame_figure(fd: FlameData):
    """A plotly ``Figure`` holding one icicle trace for ``fd``."""
    import plotly.graph_objects as go

    return go.Figure(data=[go.Icicle(**flame_trace_props(fd))], layout=flame_layout(fd))


# ---------------------------------------------------------------------------------------
# timeline

_STATE_COLORS = {
    "cpu": "#3bab5a", "running": "#3bab5a", "on-cpu": "#3bab5a", "r": "#3bab5a",
    "off-cpu": "#9aa3ad", "sleep": "#8fa8c8", "sleeping": "#8fa8c8", "idle": "#b8bec5",
    "lock": "#e08a3c", "futex": "#e08a3c", "wait": "#e0b03c",
    "select": "#4a8fe0", "io": "#4a8fe0", "poll": "#4a8fe0", "epoll": "#4a8fe0", "socket": "#4a8fe0",
    "gil": "#a066d3", "samples": "#5c8fd6",
}


def _state_color(state: str) -> str:
    return _STATE_COLORS.get(state.lower()) or color_for("state:" + state)


@dataclass
class TimelineData:
    """Runs of (thread lane, state) over time, ready for bar traces.

    Times are milliseconds from the profile's start.  Each run is one bar:
    ``base[i]`` .. ``base[i] + length[i]`` in lane ``lane[i]``.
    """

    lanes: list[str]
    states: list[str]
    lane: np.ndarray
    state: np.ndarray
    base: np.ndarray
    length: np.ndarray
    value: np.ndarray  # the chosen value summed over the run
    density: np.ndarray  # 0..1: the run's value per tick against the busiest tick
    extent_ms: tuple[float, float]
    unit: str
    event: EventType
    value_index: int


def timeline_data(
    profile: Profile, event=None, value_index: int = 0, state_key: str = "state", max_lanes: int = 24
) -> TimelineData:
    """Samples over time, one lane per thread, each tick coloured by its dominant state.

    Consecutive ticks with the same state and a similar density (4 levels) merge into
    one run, keeping the bar count small for the browser.  Threads beyond ``max_lanes``
    (least busy first) share one ``[other threads]`` lane.
    """
    e = EventType.parse(event) if event is not None else (profile.events[0] if profile.events else EventType.CPU)
    rows = np.flatnonzero(profile.event == e.value)
    tick = profile.tick_ns
    unit = value_unit(e, value_index)
    extent = (0.0, max(profile.metadata.duration_ns, int(profile.time_ns.max()) + tick if len(profile) else tick) / 1e6)
    if not len(rows):
        empty = np.zeros(0)
        return TimelineData([], [], *(np.zeros(0, np.int64),) * 4, empty, empty, extent, unit, e, value_index)
    th = profile.thread[rows].astype(np.int64)
    vals = profile.values[rows, value_index]
    # lanes: busiest threads first
    per_thread = np.bincount(th, weights=vals.astype(np.float64), minlength=len(profile.threads))
    order = [int(t) for t in np.argsort(-per_thread, kind="stable") if per_thread[t] > 0]
    lane_of_thread = np.full(len(profile.threads), -1, dtype=np.int64)
    lanes = []
    for t in order[:max_lanes]:
        lane_of_thread[t] = len(lanes)
        thr = profile.threads[t]
        lanes.append(esc(f"{thr.name} ({thr.tid})"))
    if len(order) > max_lanes:
        lane_of_thread[order[max_lanes:]] = len(lanes)
        lanes.append("[other threads]")
    lane = lane_of_thread[th]
    # states from the label sets
    state_names: list[str] = []
    state_idx: dict[str, int] = {}
    state_of_ls = np.empty(len(profile.labelsets), dtype=np.int64)
    for i, ls in enumerate(profile.labelsets):
        s = ls.get(state_key) or ""
        j = state_idx.get(s)
        if j is None:
            j = state_idx[s] = len(state_names)
            state_names.append(s)
        state_of_ls[i] = j
    st = state_of_ls[profile.labels[rows]]
    used = np.flatnonzero(np.bincount(st, minlength=len(state_names)))  # states this event has
    remap = np.zeros(len(state_names), dtype=np.int64)
    remap[used] = np.arange(len(used))
    st = remap[st]
    state_names = [state_names[i] for i in used.tolist()]
    tk = profile.time_ns[rows] // tick
    nst, nt, nl = len(state_names), int(tk.max()) + 1, len(lanes)
    # a dense (lane, tick, state) grid: at most lanes x MAX_TICKS x states cells
    grid = np.bincount((lane * nt + tk) * nst + st, weights=vals, minlength=nl * nt * nst).reshape(nl * nt, nst)
    cell_val = grid.sum(axis=1)
    cells = np.flatnonzero(cell_val > 0)
    c_lane, c_tick = cells // nt, cells % nt
    c_state = np.argmax(grid[cells], axis=1)  # dominant state; first one on ties
    c_val = cell_val[cells]
    level = np.minimum(3, (4 * c_val / max(1.0, float(c_val.max()))).astype(np.int64))
    # runs: same lane, consecutive tick, same state and density level
    brk = np.ones(len(cells), dtype=bool)
    brk[1:] = (c_lane[1:] != c_lane[:-1]) | (c_tick[1:] != c_tick[:-1] + 1) | (c_state[1:] != c_state[:-1]) | (
        level[1:] != level[:-1]
    )
    heads = np.flatnonzero(brk)
    run_len = np.diff(np.append(heads, len(cells)))
    run_val = np.add.reduceat(c_val, heads) if len(heads) else c_val
    tick_ms = tick / 1e6
    no_states = state_names == [""]
    return TimelineData(
        lanes=lanes,
        states=["samples"] if no_states else [esc(s or "(none)") for s in state_names],
        lane=c_lane[heads],
        state=c_state[heads],
        base=c_tick[heads] * tick_ms,
        length=run_len * tick_ms,
        value=np.rint(run_val).astype(np.int64),
        density=(level[heads] + 1) / 4.0,
        extent_ms=extent,
        unit=unit,
        event=e,
        value_index=value_index,
    )


def timeline_traces(td: TimelineData) -> list[dict]:
    """One horizontal bar trace per state (the legend names the states)."""
    traces = []
    for s, name in enumerate(td.states):
        sel = td.state == s
        if not sel.any():
            continue
        vals = td.value[sel]
        spans = [f"{b:,.0f}–{b + n:,.0f} ms" for b, n in zip(td.base[sel].tolist(), td.length[sel].tolist())]
        traces.append(
            dict(
                type="bar",
                orientation="h",
                name=name,
                y=[td.lanes[i] for i in td.lane[sel].tolist()],
                x=td.length[sel].tolist(),
                base=td.base[sel].tolist(),
                marker=dict(color=_state_color(name), line=dict(width=0),
                            opacity=(0.3 + 0.7 * td.density[sel]).round(2).tolist()),
                customdata=[[format_value(v, td.unit), sp] for v, sp in zip(vals.tolist(), spans)],
                hovertemplate=f"{name}<br>%{{customdata[1]}}<br>%{{customdata[0]}}<extra>%{{y}}</extra>",
                width=0.8,
            )
        )
    return traces


def timeline_layout(td: TimelineData) -> dict:
    return dict(
        height=int(min(420, 110 + 26 * max(1, len(td.lanes)))),
        barmode="overlay",
        margin=dict(l=4, r=4, t=34, b=30),
        title=dict(
            text=f"Timeline ({esc(td.event.display_name)}): drag to select a time range, double-click to reset",
            font=dict(size=12), x=0.01,
        ),
        # autorange stays False so a double-click (autorange -> True) is a change Python hears
        xaxis=dict(title=dict(text="ms since start"), range=list(td.extent_ms), autorange=False,
                   gridcolor="rgba(128,128,128,0.25)",
                   zeroline=False),
        yaxis=dict(fixedrange=True, automargin=True, autorange="reversed", categoryorder="array",
                   categoryarray=td.lanes, gridcolor="rgba(0,0,0,0)"),
        dragmode="zoom",
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
        font=dict(color="#8a8a8a"),
        legend=dict(orientation="h", y=1.0, x=1.0, xanchor="right", yanchor="bottom"),
        showlegend=True,
    )


def timeline_figure(profile: Profile, event=None, value_index: int = 0, state_key: str = "state"):
    """A plotly Figure: samples over time, a lane per thread, coloured by state."""
    import plotly.graph_objects as go

    td = timeline_data(profile, event, value_index, state_key)
    return go.Figure(data=[go.Bar(**t) for t in timeline_traces(td)], layout=timeline_layout(td))


# ---------------------------------------------------------------------------------------
# source view


@dataclass
class SourceLine:
    line: int
    text: str | None  # None when the source is not available
    self: int
    total: int


@dataclass
class SourceView:
    """A function's source lines with per-line self and total values."""

    name: str
    filename: str
    first_line: int
    unit: str
    lines: list[SourceLine]
    total: int  # the function's total (counted once per stack)
    has_source: bool


def _block_end(lines: list[str], first: int) -> int:
    """Last line (1-based) of the def/class starting at ``first``, by indentation."""
    if not 0 < first <= len(lines):
        return first
    head = lines[first - 1]
    indent = len(head) - len(head.lstrip())
    i = first
    # skip decorators and the (maybe multi-line) signature up to the colon line
    while i < len(lines) and not lines[i - 1].rstrip().endswith(":"):
        i += 1
    end = i
    for j in range(i + 1, len(lines) + 1):
        text = lines[j - 1]
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        if len(text) - len(text.lstrip()) <= indent:
            break
        end = j
    return end


_CELL_LABEL = re.compile(r"^Cell In\[(\d+)\]$")


def _source_lines(filename: str) -> list[str]:
    """Source of ``filename`` from linecache; a cell renamed ``Cell In[N]`` (ddprof_nb.cells)
    is looked up under the name IPython compiled it with."""
    if not filename:
        return []
    lines = linecache.getlines(filename)
    m = _CELL_LABEL.match(filename)
    if lines or not m:
        return lines
    from ..cells import filename_map

    number = int(m.group(1))
    for real, n in filename_map().items():
        if n == number:
            return linecache.getlines(real)
    return []


def source_view(profile: Profile, event, function, value_index: int = 1, max_lines: int = 400) -> SourceView:
    """Per-line values of one function, with its source from ``linecache`` (IPython
    registers notebook cells there, so cells work too).

    ``function`` is a Frame or a (name, filename, first_line) tuple.  A line's total
    counts each stack once; its self counts stacks whose leaf is that line.
    """
    e = EventType.parse(event)
    if isinstance(function, Frame):
        name, filename, first = function.name, function.filename, function.first_line
    else:
        name, filename, first = function
    w = _stack_weights(profile, e, value_index)
    sel = np.fromiter(
        (f.name == name and f.filename == filename and f.first_line == first for f in profile.frames),
        dtype=bool,
        count=len(profile.frames),
    )
    line_of = np.fromiter((f.line for f in profile.frames), dtype=np.int64, count=len(profile.frames))
    flat, offsets = _csr(profile)
    per_self: dict[int, int] = {}
    per_total: dict[int, int] = {}
    func_total = 0
    if len(flat) and sel.any():
        lengths = np.diff(offsets)
        stack_of_pos = np.repeat(np.arange(len(lengths)), lengths)
        hit = sel[flat] & (w[stack_of_pos] != 0)
        hp = np.flatnonzero(hit)
        hs = stack_of_pos[hp]
        hl = line_of[flat[hp]]
        maxl = int(hl.max()) + 1 if len(hl) else 1
        pairs = _unique(hs * maxl + hl)
        ps, pl = pairs // maxl, pairs % maxl
        tot = np.zeros(maxl, dtype=np.int64)
        np.add.at(tot, pl, w[ps])
        func_total = int(w[_unique(hs)].sum())
        leaf_pos = offsets[1:][lengths > 0] - 1
        leaf_stack = np.flatnonzero(lengths > 0)
        lh = sel[flat[leaf_pos]]
        slf = np.zeros(maxl, dtype=np.int64)
        np.add.at(slf, line_of[flat[leaf_pos[lh]]], w[leaf_stack[lh]])
        for ln in np.flatnonzero(tot).tolist():
            per_total[ln] = int(tot[ln])
            per_self[ln] = int(slf[ln])
    src = _source_lines(filename)
    sampled = sorted(per_total)
    if src:
        start = max(1, min([first] + sampled)) if first else max(1, min(sampled or [1]))
        head = src[first - 1].lstrip() if 0 < first <= len(src) else ""
        if head.startswith(("def ", "async def ", "class ", "@")):
            end = _block_end(src, first)
        else:
            end = max(sampled or [start]) + 2
        end = max([end] + sampled)
        end = min(end, len(src), start + max_lines - 1)
        lines = [
            SourceLine(i, src[i - 1].rstrip("\n"), per_self.get(i, 0), per_total.get(i, 0))
            for i in range(start, end + 1)
        ]
    else:
        lines = [SourceLine(i, None, per_self[i], per_total[i]) for i in sampled]
    return SourceView(name, filename, first, value_unit(e, value_index), lines, func_total, bool(src))


def source_html(view: SourceView | None) -> str:
    """The source view as an HTML table (everything escaped, theme-neutral colours)."""
    if view is None:
        return "<div style='opacity:.7'>Click a function in the chart or the top table to see its source.</div>"
    peak = max([ln.total for ln in view.lines] or [0]) or 1
    head = (
        f"<div><b>{esc(view.name)}</b> <span style='opacity:.7'>{esc(view.filename)}:{view.first_line}</span>"
        f" — total {esc(format_value(view.total, view.unit))}</div>"
    )
    if not view.lines:
        return head + "<div style='opacity:.7'>No samples in this function for the current view.</div>"
    note = "" if view.has_source else "<div style='opacity:.7'>Source not available; sampled lines only.</div>"
    rows = []
    for ln in view.lines:
        pct = 100.0 * ln.total / peak
        bg = f"background:linear-gradient(90deg, rgba(232,80,74,0.35) {pct:.1f}%, transparent {pct:.1f}%);"
        rows.append(
            f"<tr style='{bg if ln.total else ''}'><td style='text-align:right;opacity:.6;padding-right:8px'>{ln.line}</td>"
            f"<td style='text-align:right;padding-right:8px'>{esc(format_value(ln.self, view.unit)) if ln.self else ''}</td>"
            f"<td style='text-align:right;padding-right:8px'>{esc(format_value(ln.total, view.unit)) if ln.total else ''}</td>"
            f"<td style='white-space:pre;font-family:monospace'>{esc(ln.text) if ln.text is not None else ''}</td></tr>"
        )
    return (
        head + note
        + "<div style='max-height:360px;overflow:auto'><table style='border-collapse:collapse;font-size:12px'>"
        + "<tr style='opacity:.7'><th>line</th><th>self</th><th>total</th><th style='text-align:left'>code</th></tr>"
        + "".join(rows) + "</table></div>"
    )


# ---------------------------------------------------------------------------------------
# static views (no JavaScript): text/plain and text/html fallbacks, HTML report


def top_table_text(rows: Iterable, event: EventType, value_index: int = 1, total: int | None = None) -> str:
    """A fixed-width top table (self, total, function, location)."""
    unit = value_unit(event, value_index)
    rows = list(rows)
    out = [f"{event.display_name} ({value_label(event, value_index)})"
           + (f", total {format_value(total, unit)}" if total is not None else "")]
    out.append(f"{'self':>10} {'self%':>6} {'total':>10} {'total%':>6}  function (file:line)")
    denom = float(total) if total else 0.0
    for r in rows:
        sp = f"{100 * r.self / denom:5.1f}%" if denom else ""
        tp = f"{100 * r.total / denom:5.1f}%" if denom else ""
        loc = f" ({r.filename}:{r.line})" if r.filename else ""
        out.append(f"{format_value(r.self, unit):>10} {sp:>6} {format_value(r.total, unit):>10} {tp:>6}  {r.name}{loc}")
    return "\n".join(out)


def top_table_html(rows: Iterable, event: EventType, value_index: int = 1, total: int | None = None) -> str:
    """The top table as an escaped HTML table."""
    unit = value_unit(event, value_index)
    denom = float(total) if total else 0.0
    body = []
    for r in rows:
        pct = lambda v: f"{100 * v / denom:.1f}%" if denom else ""  # noqa: E731
        loc = f"{r.filename}:{r.line}" if r.filename else ""
        body.append(
            f"<tr><td class='n'>{esc(format_value(r.self, unit))}</td><td class='n'>{pct(r.self)}</td>"
            f"<td class='n'>{esc(format_value(r.total, unit))}</td><td class='n'>{pct(r.total)}</td>"
            f"<td>{esc(r.name)}</td><td class='loc'>{esc(loc)}</td></tr>"
        )
    return (
        "<table class='ddprof-top'><thead><tr><th>self</th><th>self %</th><th>total</th><th>total %</th>"
        "<th>function</th><th>file:line</th></tr></thead><tbody>" + "".join(body) + "</tbody></table>"
    )


def static_flame_html(fd: FlameData, width: int = 1000, row_height: int = 17) -> str:
    """A flame graph as plain SVG inside HTML (no JavaScript; tooltips via <title>).

    Used where no widget frontend runs (nbconvert, GitHub's viewer).  Root at the
    bottom for ``orientation='flame'``.  Every text is escaped.
    """
    n = len(fd.ids)
    if n == 0 or fd.total <= 0:
        return "<div>(no samples)</div>"
    index = {i: k for k, i in enumerate(fd.ids)}
    children: dict[int, list[int]] = {}
    for k, p in enumerate(fd.parents):
        if p:
            children.setdefault(index[p], []).append(k)
    x = [0.0] * n
    depth = [0] * n
    order = [0]
    for k in order:  # breadth-first: parents placed before children
        kids = sorted(children.get(k, []), key=lambda c: -fd.values[c])
        cx = x[k]
        for c in kids:
            x[c] = cx
            depth[c] = depth[k] + 1
            cx += fd.values[c] / fd.total * width
            order.append(c)
    levels = max(depth) + 1
    height = levels * row_height
    parts = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='100%' viewBox='0 0 {width} {height}' "
        f"style='max-width:{width}px;font-family:sans-serif;font-size:11px'>"
    ]
    for k in order:
        w = fd.values[k] / fd.total * width
        if w < 0.3:
            continue
        d = depth[k]
        y = (levels - 1 - d) * row_height if fd.orientation == "flame" else d * row_height
        cd = fd.customdata[k]
        tip = f"{cd[0]}\n{cd[1]}\n" + (
            f"self {cd[2]}, total {cd[3]} ({cd[4]})" if not fd.diff else f"before {cd[2]}, after {cd[3]}, change {cd[4]}"
        )
        # customdata strings are already escaped once for plotly; titles take them as they are
        label = fd.labels[k]
        chars = int(w / 6.5)
        text = ""
        if chars >= 3:
            plain = html.unescape(label)
            text = esc(plain if len(plain) <= chars else plain[: max(1, chars - 1)] + "…")
        parts.append(
            f"<g><title>{html.escape(html.unescape(tip), quote=False)}</title>"
            f"<rect x='{x[k]:.2f}' y='{y}' width='{max(w - 0.5, 0.3):.2f}' height='{row_height - 1}' "
            f"fill='{fd.colors[k]}' rx='2'/>"
            + (f"<text x='{x[k] + 3:.2f}' y='{y + row_height - 5}' fill='{TEXT_COLOR}'>{text}</text>" if text else "")
            + "</g>"
        )
    parts.append("</svg>")
    return (
        f"<div class='ddprof-static-flame'><div style='font:12px sans-serif;opacity:.8'>{fd.title}</div>"
        + "".join(parts)
        + "</div>"
    )
