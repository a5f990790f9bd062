"""The gecko reader's column path for plain sample tables gives exactly what its
one-by-one loop gives, and leaves anything else to that loop."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from ddprof_nb.importers import gecko

DATA = Path(__file__).resolve().parents[1] / "data" / "other_tools" / "cpython-3.15.gecko.json"


def _same(a, b) -> None:
    assert a.frames == b.frames and a.stacks == b.stacks and a.threads == b.threads
    for col in ("event", "stack", "thread", "labels", "time_ns", "values"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    assert a.metadata == b.metadata and a.tick_ns == b.tick_ns


def _variants():
    doc = json.loads(DATA.read_text())
    yield "as written", doc
    d = copy.deepcopy(doc)  # time deltas instead of times, some samples without a stack
    for th in d["threads"]:
        s = th["samples"]
        t = s.pop("time")
        s["timeDeltas"] = [t[0]] + [b - a for a, b in zip(t, t[1:])]
        s["stack"] = [None if i % 7 == 3 else x for i, x in enumerate(s["stack"])]
    yield "deltas and nulls", d
    for wt in ("tracing-ms", "bytes"):
        d = copy.deepcopy(doc)
        for th in d["threads"]:
            th["samples"]["weightType"] = wt
        yield wt, d


@pytest.mark.parametrize("label,doc", list(_variants()), ids=lambda x: x if isinstance(x, str) else "")
def test_column_path_matches_the_loop(label, doc, monkeypatch):
    # GIVEN a real CPython 3.15 gecko file (and variants of its samples table)
    fast = gecko.from_json(copy.deepcopy(doc), name="g")
    # WHEN read again with the column path turned off
    monkeypatch.setattr(gecko, "_plain_samples", lambda *a: None)
    slow = gecko.from_json(copy.deepcopy(doc), name="g")
    # THEN the profiles are the same, and not empty
    assert len(fast) > 0
    _same(fast, slow)


@pytest.mark.parametrize("bad,match", [
    (float("inf"), "finite number"), (True, "finite number"), ("1", "finite number"),
])
def test_a_bad_time_still_gets_the_loop_s_error(bad, match):
    doc = json.loads(DATA.read_text())
    th = max(doc["threads"], key=lambda t: len(t["samples"]["stack"]))
    th["samples"]["time"][2] = bad
    with pytest.raises(ValueError, match=match):
        gecko.from_json(doc, name="g")


def test_a_bad_stack_index_still_gets_the_loop_s_error():
    doc = json.loads(DATA.read_text())
    th = max(doc["threads"], key=lambda t: len(t["samples"]["stack"]))
    th["samples"]["stack"][1] = 10 ** 6
    with pytest.raises(ValueError, match=r"samples\.stack\[1\] is out of range"):
        gecko.from_json(doc, name="g")
