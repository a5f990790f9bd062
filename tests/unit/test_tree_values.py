"""render.call_tree's totals against a brute-force count over paths, on random profiles
and on views of a few of their stacks (which sum only those stacks' positions)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ddprof_nb.model import selection
from ddprof_nb import render as F
from ddprof_nb.events import EventType
from ddprof_nb.model import Frame, Metadata, ProfileBuilder

FRAMES = [Frame(f"f{i}", "/app/m.py", 10 * i + 1, 10 * i) for i in range(5)]

stacks = st.lists(st.lists(st.integers(0, 4), min_size=0, max_size=6), min_size=1, max_size=25)


def build(paths, weights):
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10**9))
    for i, (path, w) in enumerate(zip(paths, weights)):
        b.add(EventType.CPU, b.stack_of([FRAMES[j] for j in path]), b.thread_id(1, "t"), 0, i * 1000, 1, w)
    return b.build()


def brute(profile):
    """(path of function names -> total), (path -> self) of the CPU samples."""
    total, self_ = {}, {}
    for row in range(len(profile)):
        names = tuple(f.name for f in profile.stack_frames(int(profile.stack[row])))
        w = int(profile.values[row, 1])
        for d in range(len(names) + 1):
            total[names[:d]] = total.get(names[:d], 0) + w
        self_[names] = self_.get(names, 0) + w
    return {k: v for k, v in total.items() if v}, {k: v for k, v in self_.items() if v}


def tree_paths(tree):
    paths = [()]
    for i in range(1, len(tree)):
        paths.append(paths[int(tree.parent[i])] + (tree.frame(i).name,))
    total = {p: int(tree.total[i, 0]) for i, p in enumerate(paths) if tree.total[i, 0]}
    self_ = {p: int(tree.self_[i, 0]) for i, p in enumerate(paths) if tree.self_[i, 0]}
    return total, self_


@settings(max_examples=150, deadline=None)
@given(paths=stacks, data=st.data())
def test_call_tree_totals_match_a_count_over_paths(paths, data):
    weights = data.draw(st.lists(st.integers(1, 1000), min_size=len(paths), max_size=len(paths)))
    p = build(paths, weights)
    assert tree_paths(F.call_tree(p, "cpu")) == brute(p)
    # a view of a few rows shares the table: its tree is summed over those stacks only
    keep = data.draw(st.lists(st.booleans(), min_size=len(p), max_size=len(p)))
    view = selection._select(p, __import__("numpy").array(keep, dtype=bool))
    assert tree_paths(F.call_tree(view, "cpu")) == brute(view)
