"""The call-tree core: a Profile's stacks merged into a call tree with numpy.

``call_tree`` merges a Profile view's stacks into a call tree, one node per (path of
functions); ``diff_tree`` merges two profiles' stacks into one tree with a column per
profile.  Nodes are numbered level by level, so a parent always precedes its children;
node 0 is the root (all samples).  The tree's shape is cached per stacks table, so the
views of one profile (filters) only recompute values.  ``render.flame`` prunes a tree for
drawing.  Pure: numpy in, arrays out.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np

from ..events import EventType
from ..model import Frame, Profile
from .colors import is_library
from .format import value_unit

__all__ = [
    "CallTree", "call_tree", "diff_tree", "shared_csr", "stack_weights", "pick_event", "unique_sorted",
    "unique_inverse", "levels",
]


def pick_event(profile: Profile, event=None) -> EventType:
    """``event`` parsed, or the profile's first event (CPU for an empty profile)."""
    if event is not None:
        return EventType.parse(event)
    return profile.events[0] if profile.events else EventType.CPU


# ---------------------------------------------------------------------------------------
# numpy helpers


def unique_inverse(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
# caches: views made by selection.filter share the frames/stacks tuples of their base, so
# interning and the call-tree shape are computed once per table, not per filter change


class _Cache:
    """A tiny identity-keyed LRU: entries hold their key objects so ids stay unique.

    A hit moves its entry to the end: the base table's shape, used at every filter
    change, must outlive the one-off tables (a sandwich's callers and callees) made since."""

    def __init__(self, size: int = 6):
        self.size = size
        self.items: dict[tuple, tuple[tuple, object]] = {}

    def get(self, key_objs: tuple, make, extra=()):
        key = tuple(id(k) for k in key_objs) + tuple(extra)
        hit = self.items.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], key_objs)):
            self.items[key] = self.items.pop(key)
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
    offsets: np.ndarray  # stack index -> its first CSR position (+ the end)


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
        np.concatenate([[0], np.cumsum(sizes)]), cur, node_of_pos, lengths, offsets,
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
        used = np.flatnonzero(w)
        np.add.at(self_[:, c], shape.leaf[used], w[used])
        if 2 * len(used) < len(w):
            # a view of a few of the table's stacks (a focus, a thread, a time range):
            # only their positions, not the whole table's
            lens = shape.lengths[used]
            ends = np.cumsum(lens)
            pos = np.repeat(shape.offsets[used] - (ends - lens), lens) + np.arange(ends[-1] if len(ends) else 0)
            np.add.at(total[:, c], shape.node_of_pos[pos], np.repeat(w[used], lens))
        else:
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


def levels(tree: CallTree) -> list[np.ndarray]:
    """Node indexes per depth (nodes are stored level by level)."""
    cuts = np.flatnonzero(np.diff(tree.depth)) + 1
    return np.split(np.arange(len(tree)), cuts)
