"""explorer.widget.Explorer: each control changes the figures' data as expected.

No browser: widget values are set from Python (as the frontend would) and the
FigureWidgets' data are read back.  Profiles come from synthetic samples.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("plotly")
pytest.importorskip("anywidget")
pytest.importorskip("ipywidgets")

from ddprof_nb.events import EventType  # noqa: E402
from ddprof_nb.explorer import Explorer  # noqa: E402
from ddprof_nb import render as F  # noqa: E402
from ddprof_nb.explorer.widget import parse_label_filter  # noqa: E402
from ddprof_nb.model import Frame, Metadata, ProfileBuilder  # noqa: E402

MS = 1_000_000
APP = "/home/user/app.py"
EVIL = "<script>alert(1)</script>"
main = Frame("main", APP, 12, 10)
f = Frame("f", APP, 22, 20)
g = Frame("g", APP, 32, 30)
h = Frame("h", APP, 42, 40)
decode = Frame("JSONDecoder.decode", "/usr/lib/python3.11/json/decoder.py", 340, 332)
evil = Frame(EVIL, "/home/user/<img src=x onerror=alert(2)>.py", 5, 3)


def build(rows, duration_ms: int = 100):
    """rows: (stack, event, count, quantity, (tid, name), labels, time_ms)."""
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=duration_ms * MS))
    for stack, event, count, qty, (tid, tname), labels, t_ms in rows:
        b.add(event, b.stack_of(stack), b.thread_id(tid, tname), b.labels_id(labels), t_ms * MS, count, qty)
    return b.build()


MAIN_T, WORKER = (1, "MainThread"), (2, "worker")


def sample_profile():
    """CPU: MainThread main->f (40 ms, early) and main->f->decode (10 ms); worker main->g
    (30 ms, late, request=b) and main->evil (20 ms, request=a).  ALLOC on main->h."""
    return build([
        ([main, f], EventType.CPU, 4, 40 * MS, MAIN_T, {"request": "a"}, 5),
        ([main, f, decode], EventType.CPU, 1, 10 * MS, MAIN_T, {"request": "a"}, 5),
        ([main, g], EventType.CPU, 3, 30 * MS, WORKER, {"request": "b"}, 80),
        ([main, evil], EventType.CPU, 2, 20 * MS, WORKER, {"request": "a"}, 80),
        ([main, h], EventType.ALLOC, 2, 2048, MAIN_T, None, 50),
    ])


def table_names(ex) -> list[str]:
    """The name column of the top table (function, line or file), top to bottom."""
    col = [c["key"] for c in ex.top_table.columns].index("name")
    return [cells[col] for cells in ex.top_table.rows]


def table_column(ex, label: str) -> list[str]:
    col = [c["label"] for c in ex.top_table.columns].index(label)
    return [cells[col] for cells in ex.top_table.rows]


def values(ex) -> dict[str, int]:
    tr = ex.flame.data[0]
    return dict(zip(tr.labels, tr.values))


@pytest.fixture
def ex():
    return Explorer(sample_profile())


def test_default_view_shows_the_first_event_in_its_unit(ex):
    # GIVEN a profile with CPU and ALLOC samples THEN only those two events are offered
    assert [v for _, v in ex.event_dd.options] == ["cpu", "alloc"]
    v = values(ex)
    assert v["main"] == 100 * MS and v["f"] == 50 * MS and v["g"] == 30 * MS
    assert ex.flame.data[0].tiling.flip == "y"  # flame: root at the bottom
    assert "100 ms" in ex.flame.layout.title.text


def test_event_switch_changes_values_and_units(ex):
    # WHEN the event becomes "alloc"
    ex.event_dd.value = "alloc"
    # THEN the chart holds the allocation stacks, in bytes, and the value labels follow
    v = values(ex)
    assert set(v) == {"all (Allocated)", "main", "h"} and v["h"] == 2048
    assert ex.flame.data[0].customdata[2][3] == "2.00 KiB"
    assert [lab for lab, _ in ex.value_tb.options] == ["objects", "bytes"]


def test_value_toggle_switches_to_counts(ex):
    ex.value_tb.value = 0
    assert values(ex)["f"] == 5 and values(ex)["main"] == 10


def test_thread_filter_removes_the_other_threads_nodes(ex):
    # WHEN only the worker thread is selected
    ex.threads_sel.value = (2,)
    # THEN MainThread's f and decode disappear, worker's g stays
    v = values(ex)
    assert "f" not in v and "JSONDecoder.decode" not in v and v["g"] == 30 * MS
    # and none selected means all threads again
    ex.threads_sel.value = ()
    assert "f" in values(ex)


def test_label_filter_keeps_matching_samples_and_rejects_bad_text(ex):
    ex.labels_txt.value = "request=b"
    assert set(values(ex)) == {"all (CPU time)", "main", "g"}
    # a key with two values: either matches
    ex.labels_txt.value = "request=a, request=b"
    assert values(ex)["main"] == 100 * MS
    # WHEN the text is not key=value THEN a message shows and the last filter stays
    before = values(ex)
    ex.labels_txt.value = "request"
    assert "expected key=value" in ex.message.value
    assert values(ex) == before
    assert parse_label_filter("a=1; b = 2 ,a=3") == {"a": ["1", "3"], "b": ["2"]}


def test_focus_keeps_only_paths_through_the_match(ex):
    ex.focus_txt.value = "decode"
    v = values(ex)
    assert set(v) == {"all (CPU time)", "main", "f", "JSONDecoder.decode"}
    assert v["main"] == 10 * MS


def test_ignore_and_hide(ex):
    # ignore drops the stacks through f
    ex.ignore_txt.value = "^f$"
    assert "f" not in values(ex) and values(ex)["main"] == 50 * MS
    ex.ignore_txt.value = ""
    # hide removes the frame but keeps its samples (decode now sits under main)
    ex.hide_txt.value = "^f$"
    tr = ex.flame.data[0]
    k = list(tr.labels).index("JSONDecoder.decode")
    assert tr.parents[k] == tr.ids[list(tr.labels).index("main")]
    assert values(ex)["main"] == 100 * MS


def test_bad_regex_shows_a_message_and_keeps_the_last_figure(ex):
    # GIVEN a focused view
    ex.focus_txt.value = "^g$"
    shown = (tuple(ex.flame.data[0].ids), tuple(ex.flame.data[0].values))
    # WHEN the focus becomes an invalid regex
    ex.focus_txt.value = "g(("
    # THEN an inline message names it, the figure is unchanged, and other controls still work
    assert "invalid focus" in ex.message.value and "g((" in ex.message.value
    assert (tuple(ex.flame.data[0].ids), tuple(ex.flame.data[0].values)) == shown
    ex.value_tb.value = 0
    assert values(ex)["g"] == 3
    # and fixing it clears the message
    ex.focus_txt.value = "^f$"
    assert ex.message.value == "" and "f" in values(ex)


def test_min_pct_folds_small_nodes_into_other(ex):
    # decode holds 10 % of the total
    assert "JSONDecoder.decode" in values(ex)
    ex.min_pct_sl.value = 4.0
    assert "JSONDecoder.decode" in values(ex)
    ex.max_nodes = 4  # the cap forces folding even at a low min %
    ex.min_pct_sl.value = 0.0
    tr = ex.flame.data[0]
    assert len(tr.ids) <= 4 and "[other]" in tr.labels
    assert "folded into [other]" in ex.status.value


def test_search_highlights_matches_and_reports_share(ex):
    ex.search_txt.value = "decode"
    tr = ex.flame.data[0]
    k = list(tr.labels).index("JSONDecoder.decode")
    assert tr.marker.line.color[k] == F.HIT_LINE
    assert tr.marker.line.color[list(tr.labels).index("g")] != F.HIT_LINE
    assert "10.0% of total" in ex.status.value and "10.0% of total" in ex.flame.layout.title.text


def test_only_my_code_folds_stdlib_frames(ex):
    ex.only_mine_cb.value = True
    v = values(ex)
    assert "JSONDecoder.decode" not in v and v["f"] == 50 * MS
    k = list(ex.flame.data[0].labels).index("f")
    assert ex.flame.data[0].customdata[k][2] == "50.0 ms"  # decode's time is f's self time now


def test_flame_icicle_toggle(ex):
    ex.chart_tb.value = "icicle"
    assert ex.flame.data[0].tiling.flip is None
    ex.chart_tb.value = "flame"
    assert ex.flame.data[0].tiling.flip == "y"


def test_every_update_resets_a_click_zoom(ex):
    # plotly zooms in the browser without telling Python: each update must re-send the
    # root level, alternating its two spellings so it is never a no-op
    levels = set()
    for pct in (1.0, 2.0, 3.0):
        ex.min_pct_sl.value = pct
        levels.add(ex.flame.data[0].level)
    assert levels == {"", "0"}


def test_timeline_range_filters_the_flame(ex):
    # GIVEN MainThread's samples at 5 ms and the worker's at 80 ms
    lanes = {y for t in ex.timeline.data for y in t.y}
    assert lanes == {"MainThread (1)", "worker (2)"}
    # WHEN the timeline's x range is set to the first 50 ms (as a drag-zoom does)
    ex.timeline.layout.xaxis.range = [0, 50]
    # THEN the flame only holds the early samples, the top table too
    assert set(values(ex)) == {"all (CPU time)", "main", "f", "JSONDecoder.decode"}
    assert "time 0–50 ms" in ex.status.value
    assert "g" not in table_names(ex)
    # and the full range clears it
    ex.timeline.layout.xaxis.range = list(ex.drawing.extent_ms)
    assert "g" in values(ex)


def test_timeline_drag_and_double_click_messages(ex):
    # WHEN the browser reports a drag-zoom on the timeline (plotly_relayout)
    ex.timeline._js2py_relayout = {"relayout_data": {"xaxis.range[0]": 50, "xaxis.range[1]": 100},
                                   "source_view_id": "view"}
    # THEN only the late (worker) samples remain
    assert set(values(ex)) == {"all (CPU time)", "main", "g", F.esc(EVIL)}
    # WHEN it reports a double-click (autorange) THEN the whole profile is back, twice in a row
    for _ in range(2):
        ex.timeline._js2py_relayout = {"relayout_data": {"xaxis.autorange": True}, "source_view_id": "view"}
        assert values(ex)["main"] == 100 * MS and "time " not in ex.status.value
        ex.set_time_range((50, 100))


def test_top_table_is_an_html_table_sorted_by_its_headers(ex):
    # columns for both values of the event, each sortable but the percentages
    assert [(c["label"], c["key"]) for c in ex.top_table.columns] == [
        ("self time", "self"), ("self %", ""), ("total time", "total"), ("total %", ""),
        ("self samples", "self_n"), ("total samples", "total_n"), ("function", "name"), ("where", "")]
    # sorted by self time by default: f 40 ms, g 30, evil 20, decode 10, main 0
    assert table_names(ex) == ["f", "g", EVIL, "JSONDecoder.decode", "main"]
    assert table_column(ex, "self time")[:2] == ["40.0 ms", "30.0 ms"]
    assert table_column(ex, "self %")[0] == "40.0%"
    assert table_column(ex, "total samples")[0] == "5"  # f: 4 + 1 (decode under it)
    # WHEN a header is clicked (the frontend sets ``sort``)
    ex.top_table.sort = "total"
    assert table_names(ex)[:2] == ["main", "f"]
    ex.top_table.sort = "name"
    assert table_names(ex) == sorted(table_names(ex), key=str.lower)
    ex.top_table.sort = "self_n"
    assert table_names(ex)[0] == "f" and table_column(ex, "self samples")[:2] == ["4", "3"]
    # names and paths are whole (no cut at the pane's edge), escaped by the frontend's textContent
    assert table_column(ex, "where")[table_names(ex).index("JSONDecoder.decode")] == \
        "/usr/lib/python3.11/json/decoder.py:332"


def test_top_table_groups_by_function_line_or_file(ex):
    ex.value_tb.value = 0
    ex.top_group_tb.value = "file"
    # app.py: every stack holds it once (main), so its total is all 10 samples;
    # decoder.py's self is decode's 1 sample
    assert [c["label"] for c in ex.top_table.columns][-2] == "file"
    names = table_names(ex)
    assert set(names) == {"app.py", "decoder.py", "<img src=x onerror=alert(2)>.py"}
    assert table_column(ex, "total samples")[names.index("app.py")] == "10"
    assert table_column(ex, "self samples")[names.index("decoder.py")] == "1"
    assert table_column(ex, "where")[names.index("app.py")] == APP
    ex.top_group_tb.value = "line"
    assert table_column(ex, "where")[table_names(ex).index("f")] == f"{APP}:22"


def test_a_row_click_selects_the_function_without_filtering(ex):
    before = values(ex)
    # WHEN the row of g is clicked (the frontend sets ``selected``)
    ex.top_table.selected = table_names(ex).index("g")
    # THEN g is selected (source view) and no filter changed: every view is as it was
    assert ex.focus_txt.value == "" and values(ex) == before
    assert ex.state.selected == Frame("g", APP, 30, 30) and "<b>g</b>" in ex.source.value
    # a row of the line grouping selects the function holding that line
    ex.top_group_tb.value = "line"
    ex.top_table.selected = table_names(ex).index("f")
    assert ex.state.selected == Frame("f", APP, 20, 20)


def test_clicking_a_flame_node_shows_its_source(ex):
    tr = ex.flame.data[0]
    k = list(tr.labels).index("JSONDecoder.decode")
    # as the frontend reports a click
    ex.flame._js2py_pointsCallback = {
        "event_type": "plotly_click",
        "points": {"trace_indexes": [0], "point_indexes": [k], "xs": [None], "ys": [None]},
    }
    assert "JSONDecoder.decode" in ex.source.value and "decoder.py" in ex.source.value


def test_figure_widgets_open_their_comm_with_their_data(ex, monkeypatch):
    # plotly sends a FigureWidget's traces after its comm_open; a page rendering in
    # between drew an empty chart.  Ours open the comm last, with the traces inside.
    import comm

    opened = []
    real = comm.create_comm
    monkeypatch.setattr(comm, "create_comm", lambda **kw: (opened.append(kw["data"]["state"]), real(**kw))[1])
    from ddprof_nb.explorer.figure_widget import figure_widget as _figure_widget

    fd = ex.flame_data
    fw = _figure_widget(F.flame_trace_props(fd), F.flame_layout(fd), "icicle")
    states = [s for s in opened if "_widget_data" in s]
    assert [len(s["_widget_data"]) for s in states] == [1]
    assert states[0]["_widget_data"][0]["ids"] == fd.ids
    assert fw.comm is not None


def test_plotly_bundle_travels_once_per_kernel_not_per_figure(monkeypatch):
    # plotly's FigureWidget sends its whole JS bundle (~5 MB) in every figure's state;
    # ours send a small loader, and one hidden carrier widget sends the bundle once.
    import comm
    import plotly.graph_objects as go

    from ddprof_nb.explorer import figure_widget

    monkeypatch.setattr(figure_widget, "_carrier", None)
    sent = []
    real = comm.create_comm
    monkeypatch.setattr(comm, "create_comm", lambda **kw: (sent.append(kw), real(**kw))[1])
    Explorer(sample_profile())
    Explorer(sample_profile())
    from ddprof_nb.explorer.icicle_patch import lighter_icicle
    from ddprof_nb.explorer.plotly_partial import with_partial_plotly

    # plotly's, with the partial plotly.js, its icicle lightened
    bundle = lighter_icicle(with_partial_plotly(str(go.FigureWidget._esm))).encode()
    assert len(bundle) > 1_000_000
    payload = [len(str(kw["data"]["state"].get("_esm", ""))) + sum(len(b) for b in kw.get("buffers") or [])
               for kw in sent]
    # THEN one message carries the bundle (as a binary buffer) and every other is small
    assert sorted(payload)[-1] >= len(bundle)
    assert sorted(payload)[-2] < 200_000, sorted(payload)[-3:]
    carriers = [kw for kw in sent if kw.get("buffers") and bytes(kw["buffers"][0]) == bundle]
    assert len(carriers) == 1
    # and the figures' loader waits for the very key the carrier publishes under
    fig_esm = figure_widget.figure_widget_class()._esm
    key = figure_widget._bundle_key(partial=True)  # this plotly takes the partial plotly.js
    assert key in str(fig_esm) and key in carriers[0]["data"]["state"]["_esm"]
    # a closed carrier (Widget.close_all()) is replaced by the next figure
    figure_widget._carrier.close()
    Explorer(sample_profile())
    assert sum(1 for kw in sent if kw.get("buffers") and bytes(kw["buffers"][0]) == bundle) == 2


def test_plotly_set_up_waits_for_a_shown_figure_or_the_recordings_delay(monkeypatch):
    # plotly's set-up blocks the page: an Explorer's must not start before the static
    # chart is on screen (a figure's view starts it); a recording's starts at once
    from ddprof_nb.explorer import figure_widget
    from ddprof_nb.magics import display

    monkeypatch.setattr(figure_widget, "_carrier", None)
    Explorer(sample_profile())
    assert figure_widget._carrier.start_after_ms == -1  # an Explorer's: when a figure is shown
    carrier_esm = figure_widget._classes["carrier"]._esm
    assert 'model.on("change:start_after_ms"' in carrier_esm
    fig_esm = figure_widget.figure_widget_class()._esm
    # the figure's model never waits for plotly (anywidget fails it after 2 s); its view does
    init = fig_esm[fig_esm.index("initialize(ctx)"):fig_esm.index("async render(ctx)")]
    assert "await" not in init.split("s.promise.then")[0]
    render = fig_esm[fig_esm.index("async render(ctx)"):]
    assert render.index("s.start()") < render.index("await ready")

    figure_widget._carrier.close()
    monkeypatch.setattr(display, "mode_for", lambda shell, mode: "widget")
    display.prepare(object(), "auto")  # a recording starts
    assert figure_widget._carrier.start_after_ms == round(figure_widget.START_AFTER_S * 1000) == 0
    held = []
    figure_widget._carrier.observe(lambda ch: held.append(ch["new"]), names="start_after_ms")
    assert display._explorer(sample_profile()) is not None  # the cell ended: held, then built
    assert held == [-1] and figure_widget._carrier.start_after_ms == -1
    figure_widget._carrier.close()


def test_first_draw_fills_the_width(ex):
    # WHEN the page reports its first draw THEN autosize is sent once (plotly then measures)
    ex.flame._js2py_traceDeltas = {"trace_deltas": [{}], "trace_edit_id": -1}
    assert ex.flame.layout.autosize is True
    ex.flame.layout.autosize = False
    ex.flame._js2py_traceDeltas = {"trace_deltas": [{}], "trace_edit_id": -1}
    assert ex.flame.layout.autosize is False  # only the first draw is handled


def test_repr_mimebundle_has_static_fallbacks_and_escapes(ex):
    bundle = ex._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert any(line.split()[-2:] == ["f", "…/home/user/app.py:20"] for line in bundle["text/plain"].splitlines())
    html = bundle["text/html"]
    assert "<svg" in html and "<script" not in html and "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_to_html_writes_a_self_contained_escaped_report(ex, tmp_path):
    path = ex.to_html(tmp_path / "report.html")
    text = path.read_text(encoding="utf-8")
    # plotly.js is inlined (no CDN), so it opens offline
    assert len(text) > 3_000_000 and "Plotly.newPlot" in text
    assert re.search(r"<script[^>]*\ssrc=", text) is None
    # the evil name appears only escaped: as HTML text and inside the JSON (\u003c)
    assert "<script>alert" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<img src=x" not in text
    assert "Top functions" in text


def test_diff_mode_shows_exact_changes_normalised_or_absolute():
    # GIVEN before: f 60 ms, g 40 ms; after: f 150 ms, g 40 ms, h 10 ms
    before = build([([main, f], EventType.CPU, 6, 60 * MS, MAIN_T, None, 1),
                    ([main, g], EventType.CPU, 4, 40 * MS, MAIN_T, None, 1)])
    after = build([([main, f], EventType.CPU, 15, 150 * MS, MAIN_T, None, 1),
                   ([main, g], EventType.CPU, 4, 40 * MS, MAIN_T, None, 1),
                   ([main, h], EventType.CPU, 1, 10 * MS, MAIN_T, None, 1)])
    dx = Explorer(before, after)

    def change(name):
        tr = dx.flame.data[0]
        return tr.customdata[list(tr.labels).index(name)][4]

    # normalised by total (before scaled x2): f +30 ms, g -40 ms, h +10 ms
    assert (change("f"), change("g"), change("h")) == ("+30.0 ms", "−40.0 ms", "+10.0 ms")
    assert dx.flame_data.raw[list(dx.flame.data[0].labels).index("g")][2] == -40 * MS
    # absolute: f +90 ms, g ±0
    dx.diff_norm_tb.value = False
    assert (change("f"), change("g")) == ("+90.0 ms", "±0 ns")
    # the top table shows the change column and sorts by it
    assert dx.top_table.sort == "change"
    assert table_names(dx)[:3] == ["main", "f", "h"]
    assert table_column(dx, "change of total time")[:3] == ["+100 ms", "+90.0 ms", "+10.0 ms"]
    # the "before" and "after" views are plain flames of each side
    dx.diff_view_tb.value = "before"
    assert values(dx)["f"] == 60 * MS and "h" not in values(dx)
    dx.diff_view_tb.value = "after"
    assert values(dx)["f"] == 150 * MS


def test_explorer_rejects_an_event_that_is_not_there():
    with pytest.raises(ValueError, match="lock"):
        Explorer(sample_profile(), event="lock")


def test_clear_filters_restores_the_whole_profile(ex):
    full = values(ex)
    ex.focus_txt.value = "^g$"
    ex.threads_sel.value = (2,)
    ex.set_time_range((60, 100))
    ex.clear_filters()
    assert values(ex) == full and ex.threads_sel.value == ()


def test_figures_sent_without_plotly_validation_are_valid(ex):
    # The explorer builds and updates its FigureWidgets without plotly's per-value
    # validation (its cost dominated each update); here plotly validates what was sent.
    import plotly.graph_objects as go

    dx = Explorer(sample_profile(), build([([main, g], EventType.CPU, 4, 40 * MS, MAIN_T, None, 1)]))
    steps = [
        lambda: None,
        lambda: setattr(ex.search_txt, "value", "f"),
        lambda: setattr(ex.chart_tb, "value", "icicle"),
        lambda: setattr(ex.event_dd, "value", "alloc"),
        lambda: setattr(ex.event_dd, "value", "cpu"),
        lambda: ex.set_time_range((0.0, 50.0)),
        lambda: setattr(ex.hide_txt, "value", "main"),
        lambda: setattr(dx.diff_norm_tb, "value", False),
    ]
    for step in steps:
        step()
        for fig in (ex.flame, ex.timeline, dx.flame, dx.timeline):
            spec = fig.to_dict()
            go.Figure(spec)  # raises ValueError on any invalid property
            # a small template: layout basics and the one trace type drawn, not plotly's whole default
            assert set(spec["layout"]["template"]["data"]) <= {"icicle", "bar"}
    with pytest.raises(ValueError):  # (validation does reject a bad property)
        go.Figure({"data": [{"type": "icicle", "bogus": 1}]})


def test_layout_edits_through_plotly_objects_reach_the_browser(ex):
    # The figures are built without validation; edits made through plotly's objects
    # afterwards (first-draw autosize, resetting the timeline's range) must still be
    # sent to the frontend as relayout messages, not only change the Python copy.
    sent = []
    for fig in (ex.flame, ex.timeline):
        fig.observe(lambda ch: ch["new"] and sent.append(ch["new"]["relayout_data"]), names="_py2js_relayout")
        fig.observe(lambda ch: ch["new"] and sent.append(ch["new"]["layout_data"]), names="_py2js_update")
    ex.flame._js2py_traceDeltas = {"trace_deltas": [{}], "trace_edit_id": -1}  # first draw
    assert {"autosize": True} in sent
    ex.timeline.layout.xaxis.range = [0, 50]  # as a drag on the timeline sets it
    assert ex.state.time_range == (0, 50 * MS)
    sent.clear()
    ex.set_time_range(None)  # resets the axis through layout.xaxis.update(...)
    assert any(m.get("xaxis.range") == list(ex.drawing.extent_ms) for m in sent), sent


def test_every_labelled_control_has_a_tooltip(ex):
    # (ipywidgets writes title="null" on a description whose tooltip is None)
    def walk(w):
        yield w
        for c in getattr(w, "children", ()):
            yield from walk(c)

    ex.more_tb.value = True  # the controls behind "more" are made when it first opens
    labelled = [w for w in walk(ex) if getattr(w, "description", "") and hasattr(w, "tooltip")]
    assert len(labelled) >= 10
    assert all(w.tooltip for w in labelled), [w.description for w in labelled if not w.tooltip]


def test_a_reloaded_page_gets_the_current_figures_without_a_second_send(ex, monkeypatch):
    # the stored state a restored view draws from follows every change...
    sent = []
    for fig in (ex.flame, ex.timeline):
        monkeypatch.setattr(fig, "_send", lambda msg, buffers=None, fig=fig: sent.append(msg))
    ex.event_dd.value = "alloc"
    state = ex.flame.get_state()
    assert [t["labels"] for t in state["_widget_data"]] == [list(ex.flame.data[0].labels)]
    assert "h" in state["_widget_data"][0]["labels"]
    assert state["_widget_layout"]["title"]["text"] == ex.flame.layout.title.text
    assert [t["name"] for t in ex.timeline.get_state()["_widget_data"]] == [t.name for t in ex.timeline.data]
    # ...and is not sent again to the open views, which already drew it
    assert sent and not any({"_widget_data", "_widget_layout"} & set(m.get("state", {})) for m in sent)
    # the figures resize with the page
    assert ex.flame._config.get("responsive") is True and ex.timeline._config.get("responsive") is True


def test_display_puts_a_static_chart_beside_the_widget(ex, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append((obj, raw)))
    ex._ipython_display_()
    (static, raw1), (widget, raw2) = shown
    assert raw1 and raw2
    # first a static flame graph (drawn where no widget can be: no kernel, GitHub, nbviewer)
    assert list(static) == ["text/html"] and "ddprof-static-fallback" in static["text/html"]
    assert "<svg" in static["text/html"]
    # and its own style sheet (it applies without a kernel) hides the widget output after
    # it until that holds an explorer: no "Error displaying widget: model not found"
    assert ("<style>\n.jp-OutputArea-child:has(.ddprof-static-fallback) + .jp-OutputArea-child"
            ":not(:has(.ddprof-explorer))") in static["text/html"]
    # ... and keeps an explorer whose flame plotly has not drawn yet (its bundle still
    # loading in a new page) laid out but unseen, the static chart standing in for it ...
    drawn = ".ddprof-explorer .ddprof-flame .main-svg"
    assert (".jp-OutputArea-child:has(.ddprof-static-fallback) + .jp-OutputArea-child:has(.ddprof-explorer)"
            f":not(:has({drawn}))") in static["text/html"]
    assert "visibility: hidden" in static["text/html"]
    # ... and hides itself once that flame is drawn
    assert f".jp-OutputArea:has({drawn}) .jp-OutputArea-child:has(.ddprof-static-fallback)" in static["text/html"]
    # then the widget
    assert widget["application/vnd.jupyter.widget-view+json"]["model_id"] == ex.model_id
    assert "text/html" not in widget and widget["text/plain"]


def test_an_update_sends_only_what_changed_and_the_figure_stays_whole(ex, monkeypatch):
    sent = []
    fig = ex.flame
    orig = fig.plotly_update
    monkeypatch.setattr(fig, "plotly_update", lambda **kw: (sent.append(kw), orig(**kw)))
    ex.focus_txt.value = "^g$"
    (msg,) = sent
    # the nodes changed; the fonts, tiling, height and margins did not
    assert {"ids", "labels", "values", "marker.colors"} <= set(msg["restyle_data"])
    assert not {"insidetextfont.size", "textinfo", "branchvalues"} & set(msg["restyle_data"])
    assert set(msg["relayout_data"]) <= {"title.text", "height"} and "title.text" in msg["relayout_data"]
    # the figure (what a reloaded page draws) holds every property, old and new
    tr = fig.data[0]
    assert tr.textinfo == "label" and tr.branchvalues == "total" and set(tr.labels) >= {"g"}
    assert fig.layout.margin.l == 4 and fig.layout.title.text.startswith("CPU time")


def test_show_draws_a_state_and_the_controls_follow(ex):
    # GIVEN an explorer WHEN a state is shown (no control touched)
    ex.show(ex.state.replace(focus="^g$", inverted=True, threads=(2,), chart="icicle"))
    # THEN the charts draw it
    assert set(values(ex)) >= {"g", "main"} and "f" not in values(ex)
    assert table_names(ex)[0] == "g" and "f" not in table_names(ex)
    # AND the controls say so, those behind "more" when they are made
    assert ex.inverted_tb.value and ex.threads_sel.value == (2,) and ex.chart_tb.value == "icicle"
    assert ex.more_tb.description == "more (1)"
    ex.more_tb.value = True
    assert ex.focus_txt.value == "^g$"
    ex.show(ex.state.replace(focus="", transforms=(("drop function", "^g$"),)))
    assert ex.focus_txt.value == "" and len(ex.transform_bar.chips.children) == 1
    assert "g" not in values(ex)
