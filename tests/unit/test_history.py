"""ddprof_nb.history: naming, dict-like access, eviction by count and by memory."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import ddprof_nb
from ddprof_nb.events import EventType
from ddprof_nb.history import History, estimate_bytes
from ddprof_nb.model import Frame, Metadata, ProfileBuilder


def mock_profile(rows: int = 1, depth: int = 3, tag: str = "f"):
    """A profile of ``rows`` distinct stacks, each ``depth`` frames deep."""
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10**9, engine="mock"))
    tid = b.thread_id(1, "main")
    for r in range(rows):
        sid = b.stack_of([Frame(f"{tag}{r}_{d}", "/src/mod.py", d + 1, d + 1) for d in range(depth)])
        b.add(EventType.CPU, sid, tid, 0, 0, 1, 10_000_000)
    return b.build()


def test_profiles_are_kept_by_name_oldest_first():
    # GIVEN an empty history
    h = History()
    p1, p2 = mock_profile(), mock_profile(tag="g")
    # WHEN adding by execution count and by a user name
    assert h.add(p1, 12) == "12"
    assert h.add(p2, "warmup") == "warmup"
    # THEN access works by name, by number and by In[N], newest is latest
    assert h["12"] is p1 and h[12] is p1 and h["In[12]"] is p1
    assert h["warmup"] is p2
    assert h.latest is p2 and h.latest_name == "warmup"
    assert h.list() == ["12", "warmup"] == list(h)
    assert "12" in h and 12 in h and "13" not in h and None not in h
    assert len(h) == 2 and h.values() == [p1, p2] and h.items() == [("12", p1), ("warmup", p2)]


def test_adding_an_existing_name_replaces_it_and_makes_it_newest():
    h = History()
    p1, p2, p3 = mock_profile(), mock_profile(), mock_profile()
    h.add(p1, "a")
    h.add(p2, "b")
    h.add(p3, "a")
    assert h.list() == ["b", "a"] and h["a"] is p3


def test_missing_names_raise_keyerror_listing_known_names():
    h = History()
    h.add(mock_profile(), "x")
    with pytest.raises(KeyError, match=r"no profile named 'y' in the history \(known: x\)"):
        h["y"]
    assert h.get("y") is None
    with pytest.raises(KeyError):
        del h["y"]
    del h["x"]
    assert len(h) == 0 and h.latest is None


def test_count_bound_evicts_the_oldest_with_a_message(capsys):
    # GIVEN a history of at most 3 profiles
    h = History(max_count=3)
    # WHEN a fifth profile arrives
    for i in range(5):
        h.add(mock_profile(), i)
    # THEN the two oldest were evicted, each with a printed message
    assert h.list() == ["2", "3", "4"]
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "ddprof: evicted profile '0' from the history (more than 3 profiles; see ddprof_nb.history.max_count / max_bytes)",
        "ddprof: evicted profile '1' from the history (more than 3 profiles; see ddprof_nb.history.max_count / max_bytes)",
    ]
    # AND lowering the bound evicts at once
    h.max_count = 1
    assert h.list() == ["4"]


def test_memory_bound_evicts_the_oldest_but_never_the_newest(capsys):
    # GIVEN profiles of known estimated size, and a bound that holds two of them
    p = [mock_profile(rows=200, tag=t) for t in "abc"]
    size = estimate_bytes(p[0])
    h = History(max_count=100, max_bytes=2 * size + size // 2)
    # WHEN three are added
    for i, prof in enumerate(p):
        h.add(prof, f"p{i}")
    # THEN the oldest was evicted for memory, with a message
    assert h.list() == ["p1", "p2"]
    assert h.nbytes <= h.max_bytes
    assert "evicted profile 'p0' from the history (history over" in capsys.readouterr().out
    # AND a profile larger than the whole bound is still kept, alone
    big = mock_profile(rows=2000, tag="z")
    h.add(big, "big")
    assert h.list() == ["big"] and h.latest is big


def test_estimate_grows_with_columns_and_tables():
    small, large = mock_profile(rows=10), mock_profile(rows=1000)
    assert 0 < estimate_bytes(small) < estimate_bytes(large)
    cols = sum(c.nbytes for c in (large.event, large.stack, large.thread, large.labels, large.time_ns, large.values))
    assert estimate_bytes(large) > cols


def test_bounds_are_validated_and_sizes_parse():
    h = History()
    h.max_bytes = "1MiB"
    assert h.max_bytes == 1 << 20
    for bad in (0, -1, True, 1.5, "lots"):
        with pytest.raises(ValueError):
            h.max_bytes = bad
    for bad in (0, True, "3"):
        with pytest.raises(ValueError):
            h.max_count = bad
    with pytest.raises(TypeError):
        h.add("not a profile")
    with pytest.raises(TypeError):
        h[1.5]


def test_package_attribute_behaves_like_the_history_object():
    # GIVEN the submodule imported explicitly (which makes ddprof_nb.history the module)
    mod = importlib.import_module("ddprof_nb.history")
    h = mod.history
    h.clear()
    try:
        p = mock_profile()
        # WHEN using both spellings
        ddprof_nb.history.add(p, "via-package")
        # THEN they are the same store, with dict access, latest and list()
        assert ddprof_nb.history["via-package"] is p is h["via-package"]
        assert ddprof_nb.history.latest is p
        assert ddprof_nb.history.list() == ["via-package"]
        assert "via-package" in ddprof_nb.history and len(ddprof_nb.history) == 1
        ddprof_nb.history.max_count = 5
        assert h.max_count == 5
    finally:
        h.clear()
        h.max_count = 20


def test_table_lists_each_profile():
    h = History()
    h.add(mock_profile(rows=3), "one")
    text = h.table()
    assert text.splitlines()[0].startswith("1 of at most 20 profiles")
    assert text.splitlines()[2].split()[:2] == ["one", "cpu"]
    assert np.isclose(h.nbytes, estimate_bytes(h["one"]))
