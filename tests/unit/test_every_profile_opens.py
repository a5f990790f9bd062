"""Every Profile opens: the explorer, the HTML reports and the magics' fallbacks work for
profiles without timestamps, with no threads, one thread, a single stack, an empty
stack, one event or all six, and views filtered down to zero samples."""

from __future__ import annotations

import os
import stat

import pytest

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")

import ddprof_nb  # noqa: E402
from ddprof_nb import magics, render  # noqa: E402
from ddprof_nb.events import EventType  # noqa: E402
from ddprof_nb.explorer.widget import Explorer  # noqa: E402
from ddprof_nb.exporters import html as html_export  # noqa: E402
from ddprof_nb.model import Frame, Metadata, ProfileBuilder  # noqa: E402

MS = 1_000_000
MAIN = Frame("main", "/home/user/app.py", 2, 1)


def folded(tmp_path):
    """A folded file: no threads, no times, no counts (what py-spy and flamegraph.pl write)."""
    (tmp_path / "cpu.folded").write_text("main;work;inner 10\nmain;other 5\n")
    return ddprof_nb.load(str(tmp_path / "cpu.folded"))


def empty(tmp_path):
    return ProfileBuilder(Metadata(start_ns=0, end_ns=10 * MS)).build()


def single_stack(tmp_path):
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10 * MS))
    b.add(EventType.CPU, b.stack_of([MAIN, Frame("only", "/x.py", 5, 5)]), b.thread_id(1, "MainThread"), 0, 0, 1, MS)
    return b.build()


def empty_stack(tmp_path):
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10 * MS))
    b.add(EventType.WALL, b.stack_of([]), b.thread_id(1, "MainThread"), 0, 0, 3, 3 * MS)
    return b.build()


def all_six(tmp_path):
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10 * MS))
    t = b.thread_id(1, "MainThread")
    for i, e in enumerate(EventType):
        b.add(e, b.stack_of([MAIN, Frame(f"f_{e.label}", "/x.py", 10 + i, 10 + i)]), t, 0, i * MS, 2, 1000 + i)
    return b.build()


KINDS = [folded, empty, single_stack, empty_stack, all_six]


def _private_file(path) -> str:
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    return open(path, encoding="utf-8").read()


@pytest.mark.parametrize("make", KINDS, ids=lambda m: m.__name__)
def test_every_view_of_every_profile_opens(make, tmp_path, capsys):
    p = make(tmp_path)
    has_samples = bool(len(p)) and p.total(p.events[0], 1) > 0 if p.events else False
    # the explorer builds, and so do its static fallbacks and its HTML report
    ex = Explorer(p)
    bundle = ex._repr_mimebundle_()
    if has_samples:
        assert ex.flame_data.total > 0 and "<svg" in bundle["text/html"]
        assert bundle["text/plain"].startswith(f"{ex.event.display_name}: top")
    else:
        assert "(no samples)" in bundle["text/plain"] and "(no samples)" in bundle["text/html"]
    doc = _private_file(ex.to_html(tmp_path / "explorer.html"))
    assert doc.startswith("<!DOCTYPE html>") and "Plotly.newPlot" in doc
    # the HTML exporter (interactive and static) and ddprof_nb.save write private files
    html_export.write(p, tmp_path / "report.html")
    assert "Plotly.newPlot" in _private_file(tmp_path / "report.html")
    html_export.write(p, tmp_path / "static.html", static=True)
    static = _private_file(tmp_path / "static.html")
    assert "<script" not in static and ("<svg" in static) == has_samples
    ddprof_nb.save(p, tmp_path / "saved.html")
    assert _private_file(tmp_path / "saved.html").startswith("<!DOCTYPE html>")
    # %ddprof show's fallbacks: a text summary and a static HTML flame, or the printed table
    fb = magics.fallback_bundle(p, "x")
    assert fb["text/plain"].startswith("ddprof [x]: ")
    assert "ddp-flame" in fb["text/html"] if p.events else "(no samples)" in fb["text/html"]
    saved_mode = magics.display_mode
    magics.display_mode = "text"
    try:
        magics.show(p, "x")
    finally:
        magics.display_mode = saved_mode
    out = capsys.readouterr().out
    assert ("top 10 functions" in out) if p.events else out.strip() == "(no samples)"


def test_a_profile_without_timestamps_has_no_time_axis_and_no_range_filter(tmp_path):
    # GIVEN a folded file (no timestamps, no counts: the count value is 0 everywhere)
    p = folded(tmp_path)
    assert not render.has_time_axis(p)
    ex = Explorer(p)
    # THEN the flame shows its stacks, and the timeline says there is no time axis
    assert dict(zip(ex.flame.data[0].labels, ex.flame.data[0].values))["work"] == 10
    td = render.timeline_data(p)
    assert not td.has_time and td.lanes == []
    assert render.NO_TIME_AXIS in ex.timeline.layout.title.text
    assert ex.timeline.layout.xaxis.fixedrange is True and ex.timeline.layout.dragmode is False
    # and the time-range filter is off: the button disabled, a range refused, a drag ignored
    assert ex.range_btn.disabled
    with pytest.raises(ValueError, match="no sample timestamps"):
        ex.set_time_range((0, 1))
    ex.drawing._on_xrange(None, (0.0, 0.5))
    assert ex.state.time_range is None


def test_a_profile_with_timestamps_has_a_time_axis(tmp_path):
    p = all_six(tmp_path)
    assert render.has_time_axis(p)
    ex = Explorer(p)
    assert "drag to select a time range" in ex.timeline.layout.title.text
    assert ex.timeline.layout.xaxis.fixedrange is False


def test_all_six_events_each_show_their_own_stacks(tmp_path):
    ex = Explorer(all_six(tmp_path))
    assert [v for _, v in ex.event_dd.options] == [e.label for e in EventType]
    for e in EventType:
        ex.event_dd.value = e.label
        labels = set(ex.flame.data[0].labels)
        assert f"f_{e.label}" in labels and not any(x.startswith("f_") and x != f"f_{e.label}" for x in labels)


def test_a_filter_that_leaves_no_samples_shows_empty_views(tmp_path):
    # GIVEN a profile with samples, filtered to nothing
    ex = Explorer(all_six(tmp_path))
    ex.focus_txt.value = "^no_such_function$"
    # THEN every view is empty and says so, and nothing raised
    assert ex.last_error == ""
    assert ex.flame_data.total == 0 and list(ex.flame.data[0].labels) == ["all (CPU time)"]
    assert "no samples in this view" in ex.timeline.layout.title.text
    assert ex.top_table.rows == []
    bundle = ex._repr_mimebundle_()
    assert "(no samples)" in bundle["text/plain"] and "(no samples)" in bundle["text/html"]
    # and clearing the filter brings them back
    ex.clear_filters()
    assert ex.flame_data.total > 0
