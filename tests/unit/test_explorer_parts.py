"""The explorer's parts alone, with no Explorer and no frontend: ``Controls`` reports what
the user set as state fields (and shows a state without reporting it); ``Drawing`` sends a
view's changed parts only and turns clicks into its callbacks; ``static_view`` is a
function of a view."""

from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("plotly")

from ddprof_nb.events import EventType  # noqa: E402
from ddprof_nb.explorer import drawing as drawing_module  # noqa: E402
from ddprof_nb.explorer import static_view  # noqa: E402
from ddprof_nb.explorer.controls import Controls  # noqa: E402
from ddprof_nb.explorer.drawing import Drawing  # noqa: E402
from ddprof_nb.explorer.view import Views  # noqa: E402
from ddprof_nb.explorer.view_state import CLEARED, ViewState  # noqa: E402
from ddprof_nb.model import Frame, Metadata, ProfileBuilder  # noqa: E402

MS = 1_000_000
APP = "/home/user/app.py"
MAIN, F_, G = (Frame(n, APP, 10 * i + 2, 10 * i) for i, n in enumerate(("main", "f", "g"), 1))
CELL = Frame("Cell In[3]", "/tmp/ipykernel_1/123.py", 1, 1)
ZMQ = Frame("poll", "/venv/lib/python3.11/site-packages/zmq/sugar/poll.py", 99, 90)


def profile():
    """CPU and WALL: MainThread main->f (40 ms at 5 ms), worker main->g (30 ms at 80 ms),
    a kernel thread IOPub in zmq (wall only, hidden by default); ALLOC: main->f."""
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=100 * MS))
    rows = [([MAIN, F_], EventType.CPU, (1, "MainThread"), 40, 5), ([MAIN, G], EventType.CPU, (2, "worker"), 30, 80),
            ([MAIN, F_], EventType.WALL, (1, "MainThread"), 50, 5), ([ZMQ], EventType.WALL, (3, "IOPub"), 90, 50),
            ([MAIN, F_], EventType.ALLOC, (1, "MainThread"), 2, 50)]
    for stack, event, (tid, name), ms, at in rows:
        b.add(event, b.stack_of(stack), b.thread_id(tid, name), b.labels_id({"request": "a"}), at * MS, ms, ms * MS)
    return b.build()


CPU = ViewState(event="cpu")


@pytest.fixture
def views():
    return Views(profile())


@pytest.fixture
def controls(views):
    reported = []
    c = Controls(views, CPU, [EventType.CPU, EventType.WALL, EventType.ALLOC], on_change=reported.append)
    c.reported = reported
    return c


# -- Controls -------------------------------------------------------------------------------


def test_a_control_change_is_reported_as_the_state_fields_it_sets(controls):
    controls.event_dd.value = "wall"
    controls.threads_sel.value = (2,)
    controls.inverted_tb.value = True
    controls.value_tb.value = 0  # behind "more": made on first use
    assert controls.reported == [{"event": "wall"}, {"threads": (2,)}, {"inverted": True}, {"value_index": 0}]
    state = CPU
    for changes in controls.reported:
        state = state.replace(**changes)
    assert state == CPU.replace(event="wall", threads=(2,), inverted=True, value_index=0)
    assert type(state.threads) is tuple and type(state.value_index) is int


def test_typed_filters_come_together_as_typed(controls):
    controls.focus_txt.value = "^f$"
    controls.labels_txt.value = "request"  # not valid: the owner's ``ViewState.edited`` says so
    assert controls.reported == [{"focus": "^f$", "ignore": "", "hide": "", "labels": ""},
                                 {"focus": "^f$", "ignore": "", "hide": "", "labels": "request"}]
    state, errors = CPU.edited(**controls.reported[-1])
    assert state.focus == "^f$" and state.labels == "" and len(errors) == 1


def test_following_a_state_reports_nothing_and_makes_no_hidden_control(controls):
    target = CPU.replace(event="wall", chart="icicle", search="g", threads=(1,), focus="^main$")
    controls.follow(target)
    assert controls.reported == []
    assert (controls.event_dd.value, controls.chart_tb.value, controls.search_txt.value,
            controls.threads_sel.value) == ("wall", "icicle", "g", (1,))
    assert not controls.more_made  # the focus waits in the state until "more" opens
    assert controls.more_tb.description == "more (1)"
    assert controls.focus_txt.value == "^main$" and controls.reported == []  # made late, showing the state


def test_mark_leaves_typed_text_and_follows_the_event(controls):
    controls.focus_txt.value = "f("  # a bad regex: the state keeps the old focus
    controls.reported.clear()
    cpu_options = list(controls.value_tb.options)
    controls.value_tb.value = 0
    controls.reported.clear()
    controls.mark(CPU.replace(event="alloc", value_index=0))
    assert controls.focus_txt.value == "f(" and controls.reported == []
    assert list(controls.value_tb.options) != cpu_options and controls.value_tb.value == 0


def test_the_kernel_threads_toggle_reports_the_threads_still_offered(controls):
    assert [tid for _, tid in controls.threads_sel.options] == [1, 2]  # IOPub hidden
    controls.follow(CPU.replace(event="wall"))
    controls.threads_sel.value = (1, 2)
    controls.reported.clear()
    controls.machinery_tb.value = True
    assert controls.reported == [{"show_machinery": True, "threads": (1, 2)}]
    assert 3 in [tid for _, tid in controls.threads_sel.options]
    assert controls.machinery_tb.description == "hide kernel threads"


def test_clear_filters_reports_the_cleared_fields_and_empties_the_boxes(controls):
    controls.follow(CPU.replace(focus="^f$", search="g", threads=(2,), time_range=(0, 50 * MS)))
    controls.clear_btn.click()
    assert controls.reported == [CLEARED]
    assert controls.focus_txt.value == controls.search_txt.value == "" and controls.threads_sel.value == ()


def test_a_transform_is_reported_with_every_step(controls):
    controls.mark(CPU.replace(selected=G))
    controls.transform_bar.add("drop function")  # empty regex: the selected function
    controls.transform_bar.add("collapse recursion", "^main$")
    assert controls.reported == [{"transforms": (("drop function", "^g$"),)},
                                 {"transforms": (("drop function", "^g$"), ("collapse recursion", "^main$"))}]


# -- Drawing --------------------------------------------------------------------------------


class Recorder:
    def __init__(self):
        self.selected, self.ranges, self.sorts = [], [], []

    def drawing(self, views, state=CPU):
        return Drawing(views, views.of(state), on_select=self.selected.append, on_time_range=self.ranges.append,
                       on_sort=self.sorts.append)


@pytest.fixture
def sent(monkeypatch):
    """The figures each draw sends an update to (by name)."""
    names = []
    real = drawing_module.send_update

    def record(fig, traces, layout):
        names.append(fig)
        real(fig, traces, layout)
    monkeypatch.setattr(drawing_module, "send_update", record)
    return names


def test_a_draw_sends_only_the_parts_that_changed(views, sent):
    d = Recorder().drawing(views)
    rows, table_rows, source = d.top_rows, d.top_table.rows, d.source.value
    d.draw(views.of(CPU))  # the same state: nothing to send
    assert sent == [] and d.top_rows is rows

    d.draw(views.of(CPU.replace(search="g")))  # the flame's highlight only
    assert sent == [d.flame] and d.top_rows is rows and "timeline" not in d.timings
    assert "search matches" in d.status.value

    sent.clear()
    d.draw(views.of(CPU.replace(search="g", threads=(2,))))  # a filter: every chart
    assert sent == [d.flame, d.timeline] and d.top_rows is not rows and d.top_table.rows != table_rows
    assert [r[0] for r in d.top_table.rows if r] and all("f" != r.name for r in d.top_rows)

    sent.clear()
    d.draw(views.of(CPU.replace(search="g", threads=(2,), selected=G)))  # a selection: the source view
    assert sent == [] and d.source.value != source and "<b>g</b>" in d.source.value


def test_a_time_range_redraws_the_flame_not_the_timeline_and_clearing_it_shows_the_whole_axis(views, sent):
    d = Recorder().drawing(views)
    d.draw(views.of(CPU.replace(time_range=(0, 50 * MS))))
    assert sent == [d.flame] and d.top_rows is not None
    assert [r.name for r in d.top_rows if r.self] == ["f"]
    d.timeline.layout.xaxis.range = [0, 50]  # as the browser left it
    d.draw(views.of(CPU))
    assert list(d.timeline.layout.xaxis.range) == list(d.extent_ms)


def test_clicks_and_zooms_reach_the_callbacks_but_not_while_drawing(views):
    rec = Recorder()
    d = rec.drawing(views)
    lo, hi = d.extent_ms
    d._on_xrange(None, (lo, hi))
    d._on_xrange(None, (lo, (lo + hi) / 2))
    assert rec.ranges == [None, (lo, (lo + hi) / 2)]

    g = list(d.view.flame.labels).index("g")

    class Points:
        point_inds = [g]
    d._on_flame_click(None, Points())
    assert rec.selected == [G]
    d.top_table.selected = [r.name for r in d.top_rows].index("f")
    assert rec.selected == [G, Frame("f", APP, 20, 20)]
    d.top_table.sort = "total"
    assert rec.sorts == ["total"]

    rec.ranges.clear()
    d.draw(views.of(CPU.replace(time_range=(0, 50 * MS))))
    d.draw(views.of(CPU))  # resets the axis: our own change is not the user's
    assert rec.ranges == [] and rec.sorts == ["total"]


# -- static_view ----------------------------------------------------------------------------


def test_the_static_output_is_a_function_of_the_view(views):
    only_g = views.of(CPU.replace(threads=(2,)))
    bundle = static_view.fallback_bundle(only_g)
    assert "g" in bundle["text/plain"] and " f\n" not in bundle["text/plain"]
    assert "<svg" in bundle["text/html"] and "ddprof-static" in bundle["text/html"]
    assert static_view.top_now(only_g, 5)[1] == 30 * MS
    assert "ddprof-static-fallback" in static_view.fallback_html(bundle["text/html"])


# -- the Explorer's wiring ------------------------------------------------------------------


def test_the_explorer_wires_a_change_through_the_state_to_the_drawing_and_back(sent):
    from ddprof_nb.explorer import Explorer

    ex = Explorer(profile())
    ex.inverted_tb.value = True
    assert ex.state == CPU.replace(inverted=True, top_sort="self") and ex.controls.shown is ex.state
    assert ex.view.state is ex.state and sent == [ex.flame]
    ex.focus_txt.value = "f("  # a bad regex: the last good view stays, the text as typed
    assert ex.state.focus == "" and "keeping" in ex.message.value and ex.focus_txt.value == "f("
    sent.clear()
    ex.search_txt.value = "g"  # a search selects its heaviest match and opens its sandwich
    assert ex.state.selected == G and ex.sandwich.data is not None and ex.flame in sent
    ex.set_time_range((0, 50))
    assert ex.state.time_range == (0, 50 * MS) and not ex.range_btn.disabled and ex.more_tb.description == "more (1)"
    ex.range_btn.click()
    assert ex.state.time_range is None and ex.range_btn.disabled
