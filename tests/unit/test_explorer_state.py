"""The explorer's view as a function of its state: ``ViewState`` in, ``Views`` out, no
widget anywhere (ipywidgets and plotly are not even imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddprof_nb.events import EventType
from ddprof_nb.explorer.view import Views, status_text
from ddprof_nb.explorer.view_state import DRAW_NODES, ViewState
from ddprof_nb.model import Frame, Metadata, ProfileBuilder
from ddprof_nb import render as F

MS = 1_000_000
APP = "/home/user/app.py"
main, f, g, h = (Frame(n, APP, 10 * i + 2, 10 * i) for i, n in enumerate(("main", "f", "g", "h"), 1))
decode = Frame("JSONDecoder.decode", "/usr/lib/python3.11/json/decoder.py", 340, 332)
MAIN_T, WORKER = (1, "MainThread"), (2, "worker")


def build(rows, duration_ms: int = 100):
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=duration_ms * MS))
    for stack, event, count, qty, (tid, tname), labels, t_ms in rows:
        b.add(event, b.stack_of(stack), b.thread_id(tid, tname), b.labels_id(labels), t_ms * MS, count, qty)
    return b.build()


def profile():
    """CPU: MainThread main->f 40 ms and main->f->decode 10 ms at 5 ms (request=a); worker
    main->g 30 ms at 80 ms (request=b).  ALLOC: main->h 2 KiB."""
    return build([
        ([main, f], EventType.CPU, 4, 40 * MS, MAIN_T, {"request": "a"}, 5),
        ([main, f, decode], EventType.CPU, 1, 10 * MS, MAIN_T, {"request": "a"}, 5),
        ([main, g], EventType.CPU, 3, 30 * MS, WORKER, {"request": "b"}, 80),
        ([main, h], EventType.ALLOC, 2, 2048, MAIN_T, None, 50),
    ])


CPU = ViewState(event="cpu")


def top_names(views, state) -> dict[str, int]:
    return {r.name: r.self for r in views.top(state) if r.self}


@pytest.fixture
def views():
    return Views(profile())


def test_the_first_view_is_the_whole_event(views):
    v = views.of(CPU)
    assert v.view.total(EventType.CPU, 1) == 80 * MS
    assert top_names(views, CPU) == {"f": 40 * MS, "g": 30 * MS, "JSONDecoder.decode": 10 * MS}
    assert status_text(v).startswith("8 samples in view")


def test_each_filter_of_the_state_narrows_the_view(views):
    def total(**changes):
        return views.of(CPU.replace(**changes)).view.total(EventType.CPU, 1)

    assert total(threads=(2,)) == 30 * MS
    assert total(labels="request=a") == 50 * MS
    assert total(focus="^f$") == 50 * MS
    assert total(ignore="decode") == 70 * MS
    assert total(time_range=(0, 50 * MS)) == 50 * MS
    assert total(transforms=(("drop function", "^g$"),)) == 50 * MS
    # the event and its quantity pick what is summed, not which samples are in view
    alloc = views.of(CPU.replace(event="alloc"))
    assert alloc.tree.unit == "bytes" and alloc.view.total(EventType.ALLOC, 1) == 2048


def test_the_time_range_leaves_the_timeline_view_whole(views):
    v = views.of(CPU.replace(time_range=(50 * MS, 100 * MS)))
    assert v.timeline_view.total(EventType.CPU, 1) == 80 * MS and v.view.total(EventType.CPU, 1) == 30 * MS
    assert "time 50–100 ms" in status_text(v)


def test_a_bad_typed_filter_keeps_the_last_good_one(views):
    s, errors = CPU.edited(focus="^f$")
    assert errors == [] and s.focus == "^f$"
    s2, errors = s.edited(focus="(", labels="nokey")
    assert s2.focus == "^f$" and s2.labels == ""
    assert len(errors) == 2 and "'^f$'" in errors[0] and "previous label filter" in errors[1]
    assert views.of(s2).view.total(EventType.CPU, 1) == 50 * MS


def test_inverted_and_search_and_chart_options_reach_the_flame(views):
    inverted = views.of(CPU.replace(inverted=True)).tree
    roots = [i for i in range(len(inverted)) if inverted.parent[i] == 0]
    assert {inverted.frame(i).name for i in roots} == {"f", "g", "JSONDecoder.decode"}
    fd = views.of(CPU.replace(search="decode")).flame
    assert fd.search == "decode" and fd.search_matches == 1
    assert views.of(CPU.replace(chart="icicle")).flame.orientation == "icicle"


def test_a_change_reruns_only_the_steps_that_read_it(views):
    v = views.of(CPU)
    searched = views.of(CPU.replace(search="g"))
    assert searched.tree is v.tree and searched.view is v.view and searched.flame is not v.flame
    timed = views.of(CPU.replace(search="g", time_range=(0, 50 * MS)))
    assert timed.timeline_view is v.timeline_view and timed.view is not v.view
    assert views.timeline(timed.state) is views.timeline(CPU)  # the timeline ignores the range
    focused = views.of(CPU.replace(focus="^g$"))
    assert focused.timeline_view is not v.timeline_view


def test_a_diff_compares_the_same_filters_of_both_profiles():
    before = build([([main, f], EventType.CPU, 4, 40 * MS, MAIN_T, None, 5),
                    ([main, g], EventType.CPU, 1, 10 * MS, MAIN_T, None, 5)])
    after = build([([main, f], EventType.CPU, 2, 20 * MS, MAIN_T, None, 5),
                   ([main, g], EventType.CPU, 3, 30 * MS, MAIN_T, None, 5)])
    views = Views(after, before)
    s = ViewState(event="cpu", top_sort="change", diff_norm=False)
    rows = {r.name: r.change for r in views.top(s)}
    assert rows["g"] == 20 * MS and rows["f"] == -20 * MS
    assert {r.name: r.change for r in views.top(s.replace(diff_norm=True))}["g"] == 20 * MS  # same totals
    assert views.selected_view(s.replace(diff_view="before")).total(EventType.CPU, 1) == 50 * MS
    only_g = s.replace(focus="^g$")
    assert views.of(only_g).view_before.total(EventType.CPU, 1) == 10 * MS


def test_the_state_counts_what_hides_behind_more_and_the_node_budget():
    assert CPU.more_in_force() == 0 and CPU.node_budget() == DRAW_NODES
    busy = CPU.replace(focus="x", labels="a=b", only_mine=True, value_index=0, time_range=(0, 1),
                       transforms=(("merge function", "x"),))
    assert busy.more_in_force() == 6
    assert CPU.replace(min_pct=0.1).node_budget() == F.DEFAULT_MAX_NODES
    assert CPU.replace(max_nodes=40).node_budget() == 40


def test_the_view_modules_import_no_widget():
    code = ("import sys\nimport ddprof_nb.explorer.view, ddprof_nb.explorer.view_state\n"
            "print(sorted(m for m in ('ipywidgets', 'plotly', 'anywidget') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
