"""The Profile model and its transforms, on mock samples shaped like the engines' records."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddprof_nb import EventType, FrameKind
from ddprof_nb.model import selection
from ddprof_nb.model import MAX_TICKS, Frame, LabelSet, Metadata, ProfileBuilder, tick_for


def F(name, line=1, file="m.py"):
    return Frame(name, file, line, 1)


def sample_profile():
    """main->a->hot 60ns cpu on thread 1; main->b->hot 30ns cpu on thread 2 labelled;
    main->rec->rec->leaf 10ns cpu; one wall sample; one truncated stack."""
    b = ProfileBuilder(Metadata(start_ns=1_000, end_ns=1_000 + 10_000_000, interval_ns=10))
    t1, t2 = b.thread_id(1, "main"), b.thread_id(2, "worker")
    s1 = b.stack_of([F("main"), F("a"), F("hot", 5)])
    s2 = b.stack_of([F("main"), F("b"), F("hot", 6)])
    s3 = b.stack_of([F("main"), F("rec"), F("rec"), F("leaf")])
    s4 = b.stack_of([Frame("[truncated]", kind=FrameKind.TRUNCATED), F("deep")])
    lab = b.labels_id({"req": "x"})
    b.add("cpu", s1, t1, 0, 0, 1, 40)
    b.add("cpu", s1, t1, 0, 100, 1, 20)  # same tick as above: merges
    b.add("cpu", s2, t2, lab, 5_000_000, 1, 30)
    b.add("cpu", s3, t1, 0, 9_000_000, 1, 10)
    b.add("wall", s1, t1, 0, 0, 1, 100)
    b.add("wall", s4, t2, 0, 0, 1, 7)
    return b.build()


def test_identical_stack_and_labels_merge_and_values_add():
    # GIVEN two cpu samples on the same stack, thread, labels and tick
    p = sample_profile()
    # THEN they are one row whose values are summed
    rows = [s for s in p.samples() if s.event is EventType.CPU and s.stack[-1].name == "hot" and s.thread.tid == 1]
    assert len(rows) == 1 and rows[0].values == (2, 60)
    assert p.total("cpu") == 100 and p.total("cpu", 0) == 4 and p.total("wall") == 107
    assert p.events == (EventType.CPU, EventType.WALL)


def test_label_sets_are_interned_sorted_and_hashed_once():
    a = LabelSet.of({"b": 2, "a": 1})
    b = LabelSet.of([("a", "1"), ("b", "2")])
    assert a is b and a.items == (("a", "1"), ("b", "2"))
    assert isinstance(a.hash64, int) and 0 <= a.hash64 < 2**64
    assert LabelSet.of({"a": 1}) is not a
    long = LabelSet.of({"k" * 500: "v" * 5000})
    (k, v), = long.items
    assert len(k) <= 64 and len(v) <= 256 and v.endswith("…")


def test_memory_grows_with_unique_keys_not_samples():
    # GIVEN 200k samples over 100 stacks in a 1 s window
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10**9))
    for i in range(100):
        b.stack_id((i,))
    b.thread_id(1)
    rng = np.random.default_rng(1)
    n = 200_000
    b.add_many("cpu", rng.integers(0, 100, n), 0, 0, rng.integers(0, 10**9, n), np.ones((n, 2)))
    p = b.build()
    # THEN rows are bounded by stacks x ticks, far below the sample count, and nothing is lost
    assert len(p) <= 100 * MAX_TICKS and len(p) < n
    assert p.total("cpu", 0) == n


def test_tick_is_power_of_two_multiple_of_1ms_and_bounded():
    for d in (0, 10**6, 10**9, 3600 * 10**9):
        t = tick_for(d)
        assert t % 1_000_000 == 0 and ((t // 1_000_000) & (t // 1_000_000 - 1)) == 0
        assert d / t <= MAX_TICKS


def test_top_self_and_total_count_recursion_once():
    p = sample_profile()
    rows = {r.name: r for r in p.top("cpu", n=None)}
    assert rows["hot"].self == 90 and rows["hot"].total == 90
    assert rows["main"].self == 0 and rows["main"].total == 100
    assert rows["rec"].total == 10  # appears twice in one stack, counted once
    assert [r.name for r in p.top("cpu", n=2)] == ["hot", "leaf"]
    by_line = {(r.name, r.line): r.self for r in p.top("cpu", by="line", n=None)}
    assert by_line[("hot", 5)] == 60 and by_line[("hot", 6)] == 30


def test_filters_follow_pprof_semantics():
    p = sample_profile()
    assert p.filter(focus="^b$").total("cpu") == 30
    assert p.filter(ignore="hot").total("cpu") == 10
    assert p.filter(threads=["worker"]).total("cpu") == 30
    assert p.filter(threads=[1]).total("cpu") == 70
    assert p.filter(labels={"req": "x"}).total("cpu") == 30
    assert p.filter(labels={"req": ["y", "x"]}).total("cpu") == 30
    assert p.filter(events=["wall"]).events == (EventType.WALL,)
    assert p.filter(time_range=(4_000_000, None)).total("cpu") == 40
    assert p.filter(time_range=(None, 1_000_000)).total("cpu") == 60
    hidden = p.filter(hide="^(a|b)$")
    assert {tuple(f.name for f in s.stack) for s in hidden.samples() if s.event is EventType.CPU} == {
        ("main", "hot"), ("main", "rec", "rec", "leaf")}
    assert hidden.total("cpu") == 100  # hide keeps the samples


def test_filter_returns_new_profile_and_leaves_input_alone():
    p = sample_profile()
    before = (p.values.copy(), len(p))
    q = p.filter(focus="hot", hide="main")
    assert q is not p and np.array_equal(p.values, before[0]) and len(p) == before[1]


def test_bad_regex_raises_value_error_naming_it():
    with pytest.raises(ValueError, match=r"invalid focus '\('"):
        sample_profile().filter(focus="(")


def test_merge_adds_labels_and_sums():
    p = sample_profile()
    m = selection.merge(p, p, labels=[{"pid": 1}, {"pid": 2}])
    assert m.total("cpu") == 200
    assert m.filter(labels={"pid": "2"}).total("cpu") == 100
    assert selection.merge(p, p).total("cpu") == 200
    with pytest.raises(ValueError):
        selection.merge()


def test_profile_rejects_inconsistent_columns():
    p = sample_profile()
    with pytest.raises(ValueError, match="same length"):
        p.replace(event=p.event[:1])
    bad_stack = p.stack.copy()
    bad_stack[0] = len(p.stacks)
    with pytest.raises(ValueError, match="stack index out of range"):
        p.replace(stack=bad_stack)


def test_replace_changes_only_what_it_names_and_fields_go_by_name():
    p = sample_profile()
    p.flat_stacks()
    meta = p.metadata.replace(notes=("n",))
    q = p.replace(values=p.values * 2, metadata=meta)
    # the named fields changed, the rest is the same objects (the stacks' flat form too)
    assert (q.values == p.values * 2).all() and q.metadata is meta
    assert q.frames is p.frames and q.stacks is p.stacks and q.threads is p.threads and q._flat is p._flat
    assert p.metadata.notes != ("n",)  # the original is left alone
    # a new stacks table drops the old flat form
    assert p.replace(stacks=tuple(reversed(p.stacks)))._flat is None
    with pytest.raises(TypeError, match="no field"):
        p.replace(valuez=p.values)
    with pytest.raises(TypeError):
        type(p)(p.frames, p.stacks, p.threads, p.labelsets, p.event, p.stack, p.thread, p.labels,
                p.time_ns, p.values, p.metadata)  # twelve positional arguments: refused


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 2), st.integers(0, 10**9),
                          st.integers(0, 10**6)), min_size=1, max_size=300))
def test_aggregation_preserves_totals_per_key(rows):
    # GIVEN arbitrary raw samples  WHEN aggregated  THEN totals per (event, stack, thread) are unchanged
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10**9))
    for i in range(4):
        b.stack_id((i,))
    for i in range(3):
        b.thread_id(i)
    expected = {}
    for ev, s, t, time_ns, v in rows:
        b.add(EventType.from_id(ev), s, t, 0, time_ns, 1, v)
        key = (ev, s, t)
        c, q = expected.get(key, (0, 0))
        expected[key] = (c + 1, q + v)
    p = b.build()
    got = {}
    for i in range(len(p)):
        key = (int(p.event[i]), int(p.stack[i]), int(p.thread[i]))
        c, q = got.get(key, (0, 0))
        got[key] = (c + int(p.values[i, 0]), q + int(p.values[i, 1]))
    assert got == expected


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=5),
       st.text(max_size=300), st.one_of(st.text(max_size=300), st.integers()))
def test_labelset_plus_is_merged_with_one_label(base, key, value):
    # plus() is the drain's shortcut for merged({key: value}): the same interned set
    ls = LabelSet.of(base)
    assert ls.plus(key, value) is ls.merged({key: value})
