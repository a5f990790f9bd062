"""first_rows (the explorer's top table, Row objects made only for rows that can show)
gives exactly the first n of every row sorted, for each grouping, sort and n."""

from __future__ import annotations

import numpy as np
import pytest

from ddprof_nb.events import EventType
from ddprof_nb.explorer.top_rows import SORT_KEYS, first_rows, sort_rows, top_rows
from ddprof_nb.model import Frame, Metadata, ProfileBuilder


def _profile(seed: int = 3):
    """Many functions in a few files, recursion, many ties (values from a small set),
    wall samples with counts unequal to their times."""
    rng = np.random.default_rng(seed)
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10**9, interval_ns=10**7, engine="test"))
    frames = [b.frame_id(Frame(f"f{i % 60}", f"/app/m{i % 7}.py", 10 + i, 10 + (i % 60) * 3)) for i in range(120)]
    stacks = [b.stack_id([frames[j] for j in rng.integers(0, 120, size=int(rng.integers(1, 8)))]) for _ in range(300)]
    th = b.thread_id(1, "MainThread")
    lb = b.labels_id({})
    n = 2000
    st = np.array(stacks, dtype=np.int32)[rng.integers(0, len(stacks), size=n)]
    vals = np.column_stack([rng.integers(1, 3, size=n), rng.choice([10, 20, 30], size=n)]).astype(np.int64)
    b.add_many(EventType.WALL, st, np.full(n, th, np.int32), np.full(n, lb, np.int32),
               rng.integers(0, 10**9, size=n), vals)
    return b.build()


@pytest.mark.parametrize("group", ["function", "line", "file"])
@pytest.mark.parametrize("how", sorted(SORT_KEYS))
@pytest.mark.parametrize("n", [1, 7, 40, 10_000])
def test_first_rows_are_the_first_of_all_rows_sorted(group, how, n):
    view = _profile()
    everything = sort_rows(top_rows(view, EventType.WALL, group), how)
    assert len(everything) > (6 if group == "file" else 40)  # the cut matters
    assert first_rows(view, EventType.WALL, group, how, n) == everything[:n]


def test_first_rows_with_a_diff_and_bad_input():
    view, before = _profile(3), _profile(4)
    rows = first_rows(view, EventType.WALL, "function", "change", 5, before)
    assert rows == sort_rows(top_rows(view, EventType.WALL, "function", before), "change")[:5]
    assert first_rows(view, EventType.WALL, "function", "self", 0) == []
    with pytest.raises(ValueError, match="group='module'"):
        first_rows(view, EventType.WALL, "module", "self", 5)
    with pytest.raises(ValueError, match="sort='size'"):
        first_rows(view, EventType.WALL, "function", "size", 5)
