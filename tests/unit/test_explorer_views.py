"""The explorer's sandwich, inverted view and transform chips (no browser: widget
values are set from Python as the frontend would, and figures' data read back)."""

from __future__ import annotations

import pytest

pytest.importorskip("plotly")
pytest.importorskip("anywidget")
pytest.importorskip("ipywidgets")

from ddprof_nb.events import EventType  # noqa: E402
from ddprof_nb.explorer.widget import Explorer  # noqa: E402
from ddprof_nb.model import Frame, Metadata, ProfileBuilder  # noqa: E402

MS = 1_000_000
APP = "/home/user/app.py"
LIB = "/venv/lib/python3.11/site-packages/lib/core.py"
main = Frame("main", APP, 2, 1)
a = Frame("a", APP, 11, 10)
b = Frame("b", APP, 21, 20)
helper = Frame("helper", APP, 31, 30)
leaf = Frame("leaf", APP, 41, 40)
fib = Frame("fib", APP, 51, 50)
lib1 = Frame("lib_outer", LIB, 5, 5)
lib2 = Frame("lib_inner", LIB, 9, 9)


def build(rows):
    bld = ProfileBuilder(Metadata(start_ns=0, end_ns=100 * MS))
    for i, (stack, ms) in enumerate(rows):
        bld.add(EventType.CPU, bld.stack_of(stack), bld.thread_id(1, "MainThread"), 0, i * MS, ms, ms * MS)
    return bld.build()


def profile():
    """helper called from a (30 ms: 10 in helper, 20 in leaf) and from b (20 ms, all
    self); fib recursing (fib;fib;fib 15 ms); main calling a library (lib_outer;lib_inner 5 ms)."""
    return build([
        ([main, a, helper], 10),
        ([main, a, helper, leaf], 20),
        ([main, b, helper], 20),
        ([main, fib, fib, fib], 15),
        ([main, lib1, lib2], 5),
    ])


def labels(fig) -> dict[str, int]:
    """Value per label, summed over the nodes of that label."""
    tr = fig.data[0]
    out: dict[str, int] = {}
    for label, v in zip(tr.labels, tr.values):
        out[label] = out.get(label, 0) + v
    return out


def names(ex) -> list[str]:
    col = [c["key"] for c in ex.top_table.columns].index("name")
    return [r[col] for r in ex.top_table.rows]


@pytest.fixture
def ex():
    return Explorer(profile(), top_n=100)


def test_clicking_a_row_opens_its_sandwich_with_self_and_total(ex):
    assert ex.sandwich.box.layout.display == "none"
    ex.top_table.selected = names(ex).index("helper")
    # THEN the panel shows helper's callers above and callees below, merged over both call sites
    assert ex.sandwich.box.layout.display == ""
    callers, callees = ex.profile.sandwich(Frame("helper", APP, 30, 30), "cpu")
    assert ex.sandwich.data.total == callees.total("cpu", 1) == 50 * MS
    assert ex.sandwich.data.self == 30 * MS
    up, down = labels(ex.sandwich.callers), labels(ex.sandwich.callees)
    assert up["helper"] == 50 * MS and up["a"] == 30 * MS and up["b"] == 20 * MS and up["main"] == 50 * MS
    assert down["helper"] == 50 * MS and down["leaf"] == 20 * MS and "a" not in down
    assert "self 30.0 ms, total 50.0 ms" in ex.sandwich.header.value
    # and the main flame is unfiltered
    assert ex.focus_txt.value == "" and ex.flame_data.total == 70 * MS


def test_a_search_opens_the_sandwich_of_its_heaviest_match(ex):
    # "help" matches helper (50 ms over two call sites, heaviest node a;helper 30 ms) only
    ex.search_txt.value = "help"
    assert ex.sandwich.box.layout.display == ""
    assert ex.sandwich.data.total == 50 * MS and ex.sandwich.data.self == 30 * MS
    assert "helper" in ex.sandwich.header.value
    # "lib_" matches lib_outer (5 ms) and lib_inner (5 ms): the outer node comes first
    ex.search_txt.value = "lib_"
    assert "lib_outer" in ex.sandwich.header.value
    # no match: the sandwich stays as it was; the flame is never filtered
    ex.search_txt.value = "nothing_matches_this"
    assert "lib_outer" in ex.sandwich.header.value
    assert ex.flame_data.total == 70 * MS


def test_a_recursive_function_is_counted_once_and_a_click_in_the_sandwich_moves_it(ex):
    ex.select_function(Frame("fib", APP, 50, 50))
    assert ex.sandwich.data.total == 15 * MS
    # below it, its recursive calls (each 15 ms, all of its time)
    tr = ex.sandwich.callees.data[0]
    assert [v for lab, v in zip(tr.labels, tr.values) if lab == "fib"] == [15 * MS] * 3
    # WHEN a caller is clicked in the sandwich (the node of main in the callers' chart)
    tr = ex.sandwich.callers.data[0]
    i = list(tr.labels).index("main")

    class Points:
        point_inds = [i]

    ex.sandwich._click("callers", Points())
    assert ex.state.selected.name == "main" and ex.sandwich.data.total == 70 * MS
    # and the close button hides it
    ex.sandwich.close_btn.click()
    assert ex.sandwich.box.layout.display == "none"


def test_inverted_roots_the_flame_at_the_leaves(ex):
    ex.inverted_tb.value = True
    roots = {lab: v for lab, v, parent in zip(ex.flame.data[0].labels, ex.flame.data[0].values,
                                               ex.flame.data[0].parents) if parent == "0" or parent == ex.flame.data[0].ids[0]}
    # every root is a leaf function with its self time
    assert roots == {"helper": 30 * MS, "leaf": 20 * MS, "fib": 15 * MS, "lib_inner": 5 * MS}
    assert roots == {r.name: r.self for r in ex.profile.top("cpu", n=None) if r.self}
    ex.inverted_tb.value = False
    assert "main" in labels(ex.flame) and labels(ex.flame)["main"] == 70 * MS


def test_transform_chips_stack_apply_everywhere_and_come_off(ex):
    bar = ex.transform_bar
    # merge helper: its time goes to a and b
    bar.add("merge function", "^helper$")
    assert "helper" not in labels(ex.flame) and "helper" not in names(ex)
    assert [c.description for c in bar.chips.children] == ["✕ merge function: ^helper$"]
    # collapse recursion stacks on it: fib once
    bar.add("collapse recursion")
    flame = ex.flame.data[0]
    assert list(flame.labels).count("fib") == 1
    # collapse module: the library is one frame
    bar.add("collapse module", "site-packages/lib/")
    assert "lib_outer" not in labels(ex.flame) and "lib" in labels(ex.flame)
    # drop function: without fib's samples (the timeline too)
    bar.add("drop function", "^fib$")
    assert ex.flame_data.total == 55 * MS
    assert sum(sum(t.x) for t in ex.timeline.data) == pytest.approx(55, rel=0.01) or \
        ex.view.timeline_view.total("cpu", 1) == 55 * MS
    assert len(bar.chips.children) == 4
    # WHEN the merge chip is clicked THEN only it comes off; the others stay
    bar.chips.children[0].click()
    assert [kind for kind, _ in bar.steps] == ["collapse recursion", "collapse module", "drop function"]
    assert labels(ex.flame)["helper"] == 50 * MS and ex.flame_data.total == 55 * MS
    for _ in range(3):
        bar.chips.children[0].click()
    assert bar.steps == [] and ex.flame_data.total == 70 * MS and "lib_outer" in labels(ex.flame)


def test_the_colour_legend_names_the_modules_by_their_share_of_self(ex):
    from ddprof_nb import render as F
    from ddprof_nb.render.colors import frame_color, module_of

    # app.py holds 65 of the 70 ms of self time (helper 30, leaf 20, fib 15), the library 5
    legend = F.color_legend(ex.view.tree)
    assert [(m, c) for m, c, _ in legend] == [(module_of(helper), frame_color(helper)), (module_of(lib1), frame_color(lib1))]
    assert [round(s, 3) for _, _, s in legend] == [round(65 / 70, 3), round(5 / 70, 3)]
    assert module_of(lib1) in ex.legend.value and "93%" in ex.legend.value and frame_color(lib1) in ex.legend.value
    # the legend follows the view: a focus on the library leaves it alone
    ex.focus_txt.value = "lib_"
    assert F.color_legend(ex.view.tree) == [(module_of(lib1), frame_color(lib1), 1.0)]
    # a diff's colours are the change
    diff = Explorer(profile(), build([([main, a, helper], 10)]))
    assert F.color_legend(diff.view.tree) == [] and "grew" in diff.legend.value and "shrank" in diff.legend.value


def test_direct_recursion_chip_leaves_indirect_recursion_alone():
    # GIVEN a calling b calling a again (indirect) and fib calling itself (direct)
    ex = Explorer(build([([main, a, b, a, leaf], 10), ([main, fib, fib, leaf], 5)]))

    def count(name):
        return list(ex.flame.data[0].labels).count(name)

    assert (count("a"), count("fib")) == (2, 2)
    # WHEN "collapse direct recursion" is added (empty regex: every function)
    ex.transform_bar.add("collapse direct recursion")
    # THEN fib shows once and a still twice, and no time was lost
    assert [c.description for c in ex.transform_bar.chips.children] == ["✕ collapse direct recursion"]
    assert (count("a"), count("fib")) == (2, 1) and ex.flame_data.total == 15 * MS
    # WHEN "collapse recursion" stacks on it THEN a's indirect recursion goes too
    ex.transform_bar.add("collapse recursion")
    assert (count("a"), count("fib")) == (1, 1) and ex.flame_data.total == 15 * MS


def test_an_empty_regex_means_the_selected_function_and_a_bad_one_says_so(ex):
    bar = ex.transform_bar
    bar.add("merge function")
    assert bar.steps == [] and "select a function first" in bar.message.value
    ex.select_function(Frame("helper", APP, 30, 30))
    bar.kind_dd.value = "drop function"
    bar.add_btn.click()
    assert bar.steps == [("drop function", "^helper$")] and ex.flame_data.total == 20 * MS
    # the sandwich of a dropped function closes
    assert ex.sandwich.box.layout.display == "none"
    bar.regex_txt.value = "(("
    bar.add_btn.click()
    assert len(bar.steps) == 1 and "drop function regex" in bar.message.value


def test_the_open_sandwich_is_kept_when_only_the_chart_changes_and_redone_when_its_view_does(ex):
    ex.select_function(Frame("helper", APP, 30, 30))
    shown = ex.sandwich.data
    # inverted, only my code, flame/icicle: the sandwich's samples are the same
    ex.inverted_tb.value = True
    ex.only_mine_cb.value = True
    ex.chart_tb.value = "icicle"
    assert ex.sandwich.data is shown
    # a filter changes them: the panel is computed again from the new view
    ex.focus_txt.value = "^a$"
    assert ex.sandwich.data is not shown and ex.sandwich.data.total == 30 * MS
    ex.focus_txt.value = ""
    assert ex.sandwich.data.total == 50 * MS


def test_the_node_budget_follows_min_pct_unless_max_nodes_is_given(ex):
    from ddprof_nb import render as F
    from ddprof_nb.explorer.view_state import DRAW_NODES

    assert ex.node_budget() == DRAW_NODES < F.DEFAULT_MAX_NODES
    ex.min_pct_sl.value = F.DEFAULT_MIN_PCT / 5  # the user asked for more detail
    assert ex.node_budget() == F.DEFAULT_MAX_NODES
    assert Explorer(profile(), max_nodes=40).node_budget() == 40
