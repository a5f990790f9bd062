"""top.top, the one top table: its first n rows (Row objects made only for rows that can
show) are exactly the first n of every row sorted, for each grouping, sort and n; a diff's
change is the total here minus the total before, scaled or not; the text diff reads it."""

from __future__ import annotations

import numpy as np
import pytest

from ddprof_nb.events import EventType
from ddprof_nb import render as F
from ddprof_nb.model.top import SORT_KEYS, top
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
    everything = sorted(top(view, EventType.WALL, None, by=group, sort="name"), key=SORT_KEYS[how])
    assert len(everything) > (6 if group == "file" else 40)  # the cut matters
    assert top(view, EventType.WALL, n, by=group, sort=how) == everything[:n]


def test_rows_with_a_diff_and_bad_input():
    view, before = _profile(3), _profile(4)
    rows = top(view, EventType.WALL, 5, sort="change", before=before)
    assert rows == sorted(top(view, EventType.WALL, None, sort="name", before=before), key=SORT_KEYS["change"])[:5]
    assert top(view, EventType.WALL, 0) == []
    with pytest.raises(ValueError, match="by='module'"):
        top(view, EventType.WALL, 5, by="module")
    with pytest.raises(ValueError, match="sort='size'"):
        top(view, EventType.WALL, 5, sort="size")


def _two_runs():
    """before: a 60 ms, b 40 ms; after: a 60 ms, b 140 ms, c 0 (gone), d 50 ms (new)."""
    out = []
    for cpu in ({"a": 60, "b": 40, "c": 20}, {"a": 60, "b": 140, "d": 50}):
        b = ProfileBuilder(Metadata(start_ns=0, end_ns=10**9, interval_ns=10**7))
        th = b.thread_id(1, "main")
        for name, ms in cpu.items():
            b.add("cpu", b.stack_of([Frame("main", "/app/m.py", 1, 1), Frame(name, "/app/m.py", 5, 5)]), th, 0, 0, 1,
                  ms * 10**6)
        out.append(b.build())
    return out


def test_a_diffs_change_is_the_total_minus_before_scaled_or_not():
    before, after = _two_runs()
    absolute = {r.name: r.change for r in top(after, "cpu", None, before=before, normalize=False)}
    assert absolute == {"main": 130e6, "a": 0.0, "b": 100e6, "c": -20e6, "d": 50e6}
    scaled = {r.name: r.change for r in top(after, "cpu", None, before=before)}  # before x 250/120
    k = 250 / 120
    assert scaled == pytest.approx({"main": 0.0, "a": 60e6 - 60e6 * k, "b": 140e6 - 40e6 * k, "c": -20e6 * k,
                                    "d": 50e6}, abs=1e-3)
    # the text diff reads the same rows: biggest change first, before and after of the total
    lines = F.diff_table(before, after, "cpu", n=2, normalize=False).splitlines()
    assert "biggest changes of total (absolute)" in lines[0]
    assert lines[2].split()[:4] == ["+130", "ms", "120", "ms"] and "main" in lines[2]
    assert lines[3].split()[:4] == ["+100", "ms", "40.0", "ms"] and " b " in lines[3]
    assert "scaled" in F.diff_table(before, after, "cpu")


def test_grouped_by_file_counts_each_file_once_per_stack():
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10**9, interval_ns=10**7))
    th = b.thread_id(1, "main")
    stack = [Frame("f", "/app/x.py", 1, 1), Frame("g", "/app/x.py", 9, 9), Frame("h", "/lib/y.py", 3, 3)]
    b.add("cpu", b.stack_of(stack), th, 0, 0, 1, 10)
    rows = {r.name: (r.self, r.total) for r in top(b.build(), "cpu", None, by="file")}
    assert rows == {"x.py": (0, 10), "y.py": (10, 10)}
