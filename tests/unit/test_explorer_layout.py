"""The explorer's first screen: a one-line summary (notes closed), one toolbar of the most
used controls, the rest behind "more" (which says when a control it hides is in force),
then the flame."""

from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("plotly")

import ipywidgets as W  # noqa: E402

from ddprof_nb.events import EventType  # noqa: E402
from ddprof_nb.explorer import Explorer  # noqa: E402
from ddprof_nb.model import Frame, Metadata, ProfileBuilder  # noqa: E402

MS = 1_000_000
MAIN, WORK = Frame("main", "/app.py", 2, 1), Frame("work", "/app.py", 12, 10)


def profile():
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=100 * MS, engine="native",
                                notes=("cpu: 8 samples", "alloc: 3 sample(s) lost (sample buffer full)")))
    for tid, name in ((1, "MainThread"), (2, "worker")):
        t = b.thread_id(tid, name)
        b.add(EventType.CPU, b.stack_of([MAIN, WORK]), t, 0, tid * MS, 4, 40 * MS)
        b.add(EventType.WALL, b.stack_of([MAIN]), t, 0, tid * MS, 5, 50 * MS)
    return b.build()


def test_the_flame_comes_after_the_summary_one_toolbar_and_a_closed_more():
    ex = Explorer(profile())
    rows = list(ex.children)
    flame_at = rows.index(ex.flame)
    above = rows[:flame_at]
    # the summary (one line, the notes in a closed <details>), the toolbar, "more", message, status
    assert above == [ex.banner, above[1], ex.more_box, ex.message, ex.status]
    assert "<details" in ex.banner.value and "<details open" not in ex.banner.value
    assert ex.banner.value.split("<details")[0].count("<div") == 1
    toolbar = above[1]
    assert isinstance(toolbar, W.HBox)
    assert list(toolbar.children) == [ex.event_dd, ex.chart_tb, ex.inverted_tb, ex.search_txt, ex.threads_sel,
                                      ex.more_tb]
    assert ex.threads_sel.rows <= 2
    # every other control is behind "more", closed at first, and not made until it opens
    assert ex.more_box.children == () and ex.more_box.layout.display == "none"
    ex._repr_mimebundle_()  # displayed (the static fallback reads the state, not the controls)
    assert not {"value_tb", "focus_txt", "transform_bar"} & set(ex.controls.__dict__)
    ex.more_tb.value = True
    assert {"value_tb", "focus_txt", "transform_bar"} <= set(ex.controls.__dict__)  # made now
    assert ex.more_box.layout.display == ""
    behind = {id(w) for box in ex.more_box.children for w in getattr(box, "children", [box])}
    for w in (ex.value_tb, ex.only_mine_cb, ex.min_pct_sl, ex.focus_txt, ex.ignore_txt, ex.hide_txt, ex.labels_txt,
              ex.range_btn, ex.clear_btn):
        assert id(w) in behind
    assert ex.transform_bar.box in ex.more_box.children


def test_the_controls_behind_more_show_the_state_when_made_late():
    ex = Explorer(profile())
    ex.focus_function("work", "/app.py", 10)
    ex.set_time_range((1.0, 2.0))
    assert "focus_txt" not in ex.controls.__dict__  # no control was needed for either
    ex.more_tb.value = True
    assert ex.focus_txt.value == "^work$" and not ex.range_btn.disabled
    ex.focus_txt.value = ""  # and, made late, they drive the view
    assert ex.state.focus == "" and ex.more_tb.description == "more (1)"


def test_more_says_when_a_control_it_hides_is_in_force():
    ex = Explorer(profile())
    assert ex.more_tb.description == "more"
    ex.focus_function("work", "/app.py", 10)  # a click focuses: the focus box is behind "more"
    assert ex.more_tb.description == "more (1)"
    ex.transform_bar.add("merge function", "^main$")
    assert ex.more_tb.description == "more (2)"
    ex.clear_filters()
    ex.transform_bar.remove(0)
    assert ex.more_tb.description == "more"


def test_a_diff_puts_its_views_in_the_toolbar():
    ex = Explorer(profile(), profile())
    toolbar = list(ex.children)[1]
    assert ex.diff_view_tb in toolbar.children and ex.diff_norm_tb in toolbar.children
