"""Call-tree transforms (ddprof_nb.model.calltree, as Profile methods) against totals
computed by hand on small profiles: a recursive function, a helper with many callers,
indirect recursion, a library collapsed into one frame."""

from __future__ import annotations

import pytest

from ddprof_nb.events import EventType
from ddprof_nb.model import Frame, Metadata, Profile, ProfileBuilder

NB = "nb.py"
NP = "/venv/lib/python3.11/site-packages/numpy/core/fromnumeric.py"
NP_METHODS = "/venv/lib/python3.11/site-packages/numpy/core/_methods.py"
NP_SHAPE = "/venv/lib/python3.11/site-packages/numpy/lib/shape_base.py"

FILES = {"sum": NP, "_wrapreduction": NP, "_sum": NP_METHODS, "apply_along_axis": NP_SHAPE}
FIRST_LINES = {"main": 1, "fib": 10, "a": 20, "b": 30, "c": 40, "x": 50, "helper": 60, "leaf": 70,
               "f": 80, "g": 90, "h": 100, "other": 110, "callback": 120,
               "sum": 2300, "_wrapreduction": 70, "_sum": 48, "apply_along_axis": 300}


def frame(name: str, line_offset: int = 1) -> Frame:
    first = FIRST_LINES[name]
    return Frame(name, FILES.get(name, NB), first + line_offset, first)


def build(rows, event="cpu") -> Profile:
    """rows: (";"-joined function names, value[, thread name]); each call site one line
    below the function's first line, so frames of one function differ only by line."""
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10**9))
    for i, row in enumerate(rows):
        stack, value = row[0], row[1]
        thread = b.thread_id(1 if len(row) < 3 else 2, "main" if len(row) < 3 else row[2])
        names = [n for n in stack.split(";") if n]
        frames = [frame(n, 1 + (k % 2)) for k, n in enumerate(names)]  # lines vary along the stack
        b.add(event, b.stack_of(frames), thread, b.labels_id({"run": "1"}), i * 1_000_000, 1, value)
    return b.build()


def stacks(p: Profile, event="cpu") -> dict[str, int]:
    """";"-joined names of each stack -> its total for ``event``."""
    out: dict[str, int] = {}
    for s in p.samples():
        if s.event.label == event:
            key = ";".join(f.name for f in s.stack)
            out[key] = out.get(key, 0) + s.values[1]
    return out


def self_total(p: Profile, event="cpu") -> dict[str, tuple[int, int]]:
    return {r.name: (r.self, r.total) for r in p.top(event, n=None)}


# ------------------------------------------------------------------ a recursive function

RECURSIVE = [("main;fib;fib;fib", 30), ("main;fib;fib", 20), ("main;fib", 10), ("main;other", 5), ("main", 7)]


def test_sandwich_of_a_recursive_function_counts_it_once():
    p = build(RECURSIVE)
    callers, callees = p.sandwich("fib")
    # THEN callers is the inverted tree rooted at fib: fib <- main, all 60 of fib's time
    assert stacks(callers) == {"fib;main": 60}
    # AND callees starts at fib's outermost call: the recursion below it stays visible
    assert stacks(callees) == {"fib;fib;fib": 30, "fib;fib": 20, "fib": 10}
    # AND both roots are one frame (fib at its first line): total 60 = fib's total, counted once
    for q in (callers, callees):
        roots = {q.stacks[s][0] for s in set(q.stack.tolist())}
        assert len(roots) == 1 and q.frames[roots.pop()] == Frame("fib", NB, 10, 10)
        assert q.total("cpu") == 60 == self_total(p)["fib"][1]
    assert self_total(callees)["fib"] == (60, 60)


def test_collapse_recursion_of_a_recursive_function():
    p = build(RECURSIVE)
    q = p.collapse_recursion()
    assert stacks(q) == {"main;fib": 60, "main;other": 5, "main": 7}
    assert self_total(q) == self_total(p) == {"fib": (60, 60), "main": (7, 72), "other": (5, 5)}
    assert stacks(p.collapse_recursion(direct_only=True)) == stacks(q)


def test_inverted_roots_are_self_time():
    p = build(RECURSIVE)
    q = p.inverted()
    assert stacks(q) == {"fib;fib;fib;main": 30, "fib;fib;main": 20, "fib;main": 10, "other;main": 5, "main": 7}
    # THEN the total of each root is that function's self time in the original
    roots: dict[str, int] = {}
    for key, v in stacks(q).items():
        roots[key.split(";")[0]] = roots.get(key.split(";")[0], 0) + v
    assert roots == {name: st[0] for name, st in self_total(p).items() if st[0]}
    assert q.total("cpu") == p.total("cpu") == 72
    assert stacks(q.inverted()) == stacks(p)


def test_inverted_views_of_one_table_share_one_reversed_table():
    # GIVEN two filtered views of one profile (they share its stacks table, as the explorer's do)
    p = build(RECURSIVE)
    a, b = p.filter(threads=None), p.filter(focus="fib")
    assert a.stacks is p.stacks and b.stacks is p.stacks
    # WHEN both are inverted / THEN they share one reversed table (the call tree's shape cache
    # is keyed by it), and each still holds its own samples
    qa, qb = a.inverted(), b.inverted()
    assert qa.stacks is qb.stacks
    assert stacks(qa) == stacks(p.inverted()) and stacks(qb) == stacks(b.inverted())
    assert set(stacks(qb)) == {"fib;fib;fib;main", "fib;fib;main", "fib;main"}


# ------------------------------------------------------------------ a helper with many callers

HELPER = [("main;a;helper;leaf", 10), ("main;b;helper", 20), ("main;c;x;helper", 30), ("main;c", 4), ("main;a", 6)]


def test_sandwich_of_a_helper_merges_all_its_call_sites():
    p = build(HELPER)
    callers, callees = p.sandwich("helper")
    assert stacks(callers) == {"helper;a;main": 10, "helper;b;main": 20, "helper;x;c;main": 30}
    assert stacks(callees) == {"helper;leaf": 10, "helper": 50}
    assert callers.total("cpu") == callees.total("cpu") == 60
    # the callers' table: each caller's total is the helper's time reached through it
    assert {k: v[1] for k, v in self_total(callers).items()} == {
        "helper": 60, "a": 10, "b": 20, "x": 30, "c": 30, "main": 60}
    assert self_total(callees) == {"helper": (50, 60), "leaf": (10, 10)}


def test_sandwich_names_a_function_by_name_file_or_frame_and_refuses_unknown_or_ambiguous():
    p = build(HELPER)
    by_name = stacks(p.sandwich("helper")[1])
    assert stacks(p.sandwich("helper (nb.py)")[1]) == by_name
    assert stacks(p.sandwich("helper (nb.py:60)")[1]) == by_name
    assert stacks(p.sandwich(frame("helper", 5))[1]) == by_name
    with pytest.raises(ValueError, match=r"no function named 'helpr'.*did you mean 'helper'"):
        p.sandwich("helpr")
    twin = ProfileBuilder(Metadata())
    t = twin.thread_id(1, "main")
    twin.add("cpu", twin.stack_of([Frame("run", "a.py", 2, 1)]), t, 0, 0, 1, 5)
    twin.add("cpu", twin.stack_of([Frame("run", "b.py", 2, 1)]), t, 0, 0, 1, 5)
    with pytest.raises(ValueError, match=r"2 functions are named 'run' \(run \(a\.py:1\); run \(b\.py:1\)\)"):
        twin.build().sandwich("run")
    assert twin.build().sandwich("run (b.py)")[0].total("cpu") == 5


def test_sandwich_of_one_event_keeps_only_that_event():
    p = ProfileBuilder(Metadata())
    t = p.thread_id(1, "main")
    s = p.stack_of([frame("main"), frame("helper")])
    p.add("cpu", s, t, 0, 0, 1, 10)
    p.add("wall", s, t, 0, 0, 1, 25)
    prof = p.build()
    callers, callees = prof.sandwich("helper", event="wall")
    assert [e.label for e in callers.events] == ["wall"] and callees.total("wall") == 25
    both = prof.sandwich("helper")[1]
    assert both.total("cpu") == 10 and both.total("wall") == 25


def test_merge_function_gives_its_time_to_its_callers():
    p = build(HELPER)
    q = p.merge_function("^helper$")
    assert stacks(q) == {"main;a;leaf": 10, "main;b": 20, "main;c;x": 30, "main;c": 4, "main;a": 6}
    st = self_total(q)
    assert st["b"] == (20, 20) and st["x"] == (30, 30) and st["a"] == (6, 16) and st["leaf"] == (10, 10)
    assert "helper" not in st and q.total("cpu") == p.total("cpu") == 70


def test_drop_function_drops_its_samples():
    p = build(HELPER)
    q = p.drop_function("^helper$")
    assert stacks(q) == {"main;c": 4, "main;a": 6}


# ------------------------------------------------------------------ indirect recursion

INDIRECT = [("main;f;g;f;g;h", 8), ("main;f;g;f", 4), ("main;f;g", 2), ("main;g;f", 1)]


def test_collapse_recursion_collapses_indirect_recursion():
    p = build(INDIRECT)
    q = p.collapse_recursion()
    # f;g;f;g;h -> f;g;h (the second f and the g between are gone); f;g;f -> f
    assert stacks(q) == {"main;f;g;h": 8, "main;f": 4, "main;f;g": 2, "main;g;f": 1}
    st = self_total(q)
    # THEN leaves (self times) and the total are unchanged; g, between two f, loses those 4
    assert {k: v[0] for k, v in st.items()} == {k: v[0] for k, v in self_total(p).items()}
    assert st["f"] == (5, 15) and st["g"] == (2, 11) and st["h"] == (8, 8)
    assert self_total(p)["g"] == (2, 15)


def test_direct_only_leaves_indirect_recursion():
    p = build(INDIRECT + [("main;f;f;f;h", 3)])
    q = p.collapse_recursion(direct_only=True)
    assert stacks(q) == {"main;f;g;f;g;h": 8, "main;f;g;f": 4, "main;f;g": 2, "main;g;f": 1, "main;f;h": 3}


def test_collapse_recursion_of_matching_functions_only():
    p = build(INDIRECT)
    assert stacks(p.collapse_recursion("^g$")) == {"main;f;g;h": 8, "main;f;g;f": 4, "main;f;g": 2, "main;g;f": 1}


# ------------------------------------------------------------------ a library as one frame

NUMPY = [("main;sum;_wrapreduction;_sum", 10), ("main;sum;_wrapreduction", 5),
         ("main;apply_along_axis;callback;_sum", 7), ("main", 3)]


def test_collapse_module_makes_a_library_one_frame():
    p = build(NUMPY)
    q = p.collapse_module("site-packages/numpy/")
    assert stacks(q) == {"main;numpy": 15, "main;numpy;callback;numpy": 7, "main": 3}
    np_frame = next(f for f in q.frames if f.name == "numpy")
    assert np_frame.filename == "/venv/lib/python3.11/site-packages/numpy/"
    assert self_total(q) == {"numpy": (22, 22), "main": (3, 25), "callback": (0, 7)}
    # collapsing again changes nothing; a narrower regex collapses only its files
    assert stacks(q.collapse_module("site-packages/numpy/")) == stacks(q)
    assert stacks(p.collapse_module(r"_methods\.py$")) == {
        "main;sum;_wrapreduction;_methods.py": 10, "main;sum;_wrapreduction": 5,
        "main;apply_along_axis;callback;_methods.py": 7, "main": 3}


# ------------------------------------------------------------------ composition and what is kept


def test_transforms_compose():
    p = build(INDIRECT + HELPER)
    q = p.collapse_recursion().merge_function("^helper$").drop_function("^b$").inverted()
    assert stacks(q) == {
        "h;g;f;main": 8, "f;main": 4, "g;f;main": 2, "f;g;main": 1,
        "leaf;a;main": 10, "x;c;main": 30, "c;main": 4, "a;main": 6}
    callers, callees = p.collapse_module(r"nb\.py").sandwich("nb.py")
    assert callees.total("cpu") == p.total("cpu") and stacks(callers) == {"nb.py": p.total("cpu")}


def test_transforms_keep_threads_labels_times_and_leave_the_input_alone():
    p = build(RECURSIVE + [("main;fib;fib", 9, "worker")])
    before = stacks(p)
    for q in (p.inverted(), p.collapse_recursion(), p.merge_function("other"), p.sandwich("fib")[1],
              p.collapse_module(r"nb\.py"), p.drop_function("other")):
        assert isinstance(q, Profile) and q is not p
        assert {t.name for t in q.threads} >= {"worker"}
        assert q.filter(threads=["worker"]).total("cpu") == 9
        assert all(ls.as_dict() == {"run": "1"} for ls in (q.labelsets[i] for i in set(q.labels.tolist())))
        assert q.metadata == p.metadata and set(q.time_ns.tolist()) <= set(p.time_ns.tolist())
    assert stacks(p) == before


def test_empty_and_bad_input():
    empty = ProfileBuilder(Metadata()).build()
    assert len(empty.inverted()) == 0 and len(empty.collapse_recursion()) == 0
    p = build(HELPER)
    assert len(p.filter(events=["wall"]).inverted()) == 0
    with pytest.raises(ValueError, match="invalid merge_function regex"):
        p.merge_function("(")
    with pytest.raises(ValueError, match="regex is empty"):
        p.collapse_module("")


def test_caller_chains_read_direct_and_reached_through():
    from ddprof_nb.model.calltree import caller_chains

    callers, _ = build(HELPER).sandwich("helper")
    chains = caller_chains(callers)
    assert stacks(chains) == {"main;a": 10, "main;b": 20, "main;c;x": 30}
    assert self_total(chains) == {"x": (30, 30), "b": (20, 20), "a": (10, 10), "main": (0, 60), "c": (0, 30)}


def test_sandwich_root_of_a_function_without_a_first_line_is_its_lowest_line():
    # GIVEN frames of one function known only by their lines (as folded stacks give them)
    b = ProfileBuilder(Metadata())
    t = b.thread_id(1, "main")
    main = Frame("main", NB, 3)
    b.add("cpu", b.stack_of([main, Frame("fib", NB, 5), Frame("fib", NB, 4)]), t, 0, 0, 1, 7)
    b.add("cpu", b.stack_of([main, Frame("fib", NB, 4)]), t, 0, 0, 1, 2)
    callers, callees = b.build().sandwich("fib")
    # THEN both trees have one root, fib at line 4
    assert {callees.stack_frames(s)[0] for s in set(callees.stack.tolist())} == {Frame("fib", NB, 4)}
    assert stacks(callers) == {"fib;main": 9} and stacks(callees) == {"fib;fib": 7, "fib": 2}


def test_sandwich_of_a_profile_whose_last_stack_is_empty():
    # an empty stack last in the table (py-spy writes samples with no frames)
    b = ProfileBuilder(Metadata())
    t = b.thread_id(1, "MainThread")
    b.add(EventType.CPU, b.stack_of([Frame("main", "/a.py", 1, 1), Frame("f", "/a.py", 5, 5)]), t, 0, 0, 2, 2)
    b.add(EventType.CPU, b.stack_of([]), t, 0, 0, 3, 3)
    callers, callees = b.build().sandwich("f")
    assert callers.total("cpu", 0) == callees.total("cpu", 0) == 2
