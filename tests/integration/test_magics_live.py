"""``%%ddprof --live``, ``%ddprof start --live`` and ``profile(live=...)``: the live view
refreshes while the code runs, ends as the explorer of the whole profile, and its refresh
thread ("ddprof_nb-live") never outlives the session, whatever the cell does.

Driven through the isolated InteractiveShell of ``test_magics`` with the widget display
forced (no kernel here: the widgets' comms go nowhere, their state is read directly).
"""

from __future__ import annotations

import io
import threading
import time

import pytest

pytest.importorskip("IPython")
pytest.importorskip("ipywidgets")

import ipywidgets  # noqa: E402
from IPython.core.error import UsageError  # noqa: E402

import ddprof_nb  # noqa: E402
from ddprof_nb import magics  # noqa: E402
from ddprof_nb.explorer.live_view import LiveView  # noqa: E402
from ddprof_nb.explorer.widget import Explorer  # noqa: E402
from ddprof_nb.history import history  # noqa: E402
from ddprof_nb.live import THREAD_NAME  # noqa: E402
from ddprof_nb.live_display import StderrLine, line_sink  # noqa: E402
from test_magics import run, shell  # noqa: E402,F401 - the shared fixture

SPIN = """\
import time
def spin(seconds):
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n
"""


def live_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


_WIDGETS = getattr(ipywidgets.widgets.widget, "_instances", None)  # (Widget.widgets before ipywidgets 8)
if _WIDGETS is None:
    _WIDGETS = ipywidgets.Widget.widgets


def displayed_live_views(shell) -> list[LiveView]:
    out = []
    for output in shell.display_pub.outputs:
        view = output["data"].get("application/vnd.jupyter.widget-view+json")
        widget = _WIDGETS.get(view["model_id"]) if view else None
        if isinstance(widget, LiveView):
            out.append(widget)
    return out


def refreshes_in_state(view: LiveView) -> int:
    """The refresh count the page was sent (the header's data-refreshes)."""
    state = view.status.get_state()["value"]
    return int(state.split("data-refreshes='")[1].split("'")[0])


def _traces(fig) -> list[dict]:
    """A figure's traces, without plotly's per-widget ids."""
    return [{k: v for k, v in t.items() if k != "uid"} for t in fig.to_dict()["data"]]


@pytest.fixture
def live_shell(shell):  # noqa: F811
    magics.display_mode = "widget"
    assert shell.run_cell(SPIN, store_history=True).success
    shell.display_pub.clear_output()
    yield shell
    assert not live_threads()


@pytest.mark.quick
def test_live_cell_refreshes_while_it_runs_and_ends_as_the_explorer(live_shell):
    # WHEN a 6-second cell runs with --live (about 6 refreshes: asking for 3 leaves room for
    # a refresh thread that waits long for the GIL)
    res, count = run(live_shell, "%%ddprof --live\nspin(6.0)\n")
    assert res.success, res.error_in_exec
    # THEN one live view was shown, the only output (not a second explorer below it)
    (view,) = displayed_live_views(live_shell)
    assert len(live_shell.display_pub.outputs) == 1
    # it refreshed at least 3 times while the cell ran, and the page was told so
    assert view.refreshes >= 3
    assert refreshes_in_state(view) == view.refreshes
    # its last refresh drew the cell's function in the flame and the main thread's row
    assert "spin" in view.flame.value and "MainThread" in view.threads.value
    # AND it became the explorer of the whole profile stored in the history
    assert view.children == (view.final,) and isinstance(view.final, Explorer)
    assert view.final.profile is history[str(count)]
    assert view.final.profile.top("cpu", n=1)[0].name == "spin"
    # the same views the normal explorer of that profile shows
    normal = Explorer(history[str(count)])
    assert _traces(view.final.flame) == _traces(normal.flame)
    assert _traces(view.final.timeline) == _traces(normal.timeline)
    assert not live_threads()


def test_a_failing_live_cell_keeps_the_profile_and_stops_the_refresh(live_shell, capsys):
    # WHEN a --live cell raises after 2 s
    res, count = run(live_shell, "%%ddprof --live\nspin(2.0)\nraise ValueError('boom')\n")
    # THEN the cell failed with its own error, the profile is stored and the view shows it
    assert isinstance(res.error_in_exec, ValueError)
    assert "spin" in [r.name for r in history[str(count)].top("cpu", n=3)]
    (view,) = displayed_live_views(live_shell)
    assert isinstance(view.final, Explorer) and view.final.profile is history[str(count)]
    # and the refresh thread ended with the session
    assert not live_threads() and magics._session is None


def test_keyboard_interrupt_in_a_live_cell_stops_the_refresh(live_shell):
    res, count = run(live_shell, "%%ddprof --live\nspin(1.5)\nraise KeyboardInterrupt\n")
    assert isinstance(res.error_in_exec, KeyboardInterrupt)
    assert history[str(count)] is not None
    assert not live_threads() and magics._session is None


def test_start_live_refreshes_across_cells_until_stop(live_shell):
    # GIVEN %ddprof start --live
    res, _ = run(live_shell, "%ddprof start --live")
    assert res.success
    (view,) = displayed_live_views(live_shell)
    # WHILE later cells run, the view refreshes (its thread lives as long as the session)
    assert run(live_shell, "spin(2.5)")[0].success
    assert len(live_threads()) == 1 and view.refreshes >= 1
    # WHEN it stops, the refresh thread is gone and the view is the explorer of the profile
    res, _ = run(live_shell, "%ddprof stop")
    assert res.success and not live_threads()
    assert isinstance(view.final, Explorer) and view.final.profile is history[history.latest_name]
    assert len(displayed_live_views(live_shell)) == 1


def test_live_with_no_show_is_refused_naming_both(live_shell, capsys):
    res, _ = run(live_shell, "%%ddprof --live --no-show\nspin(0.1)\n")
    err = capsys.readouterr().err
    assert "--live" in err and "--no-show" in err
    assert magics._session is None and not live_threads()


# -- profile(live=...) in plain code ----------------------------------------------------------


class CountingSink:
    def __init__(self):
        self.snapshots = []
        self.finished = None

    def update(self, snap):
        self.snapshots.append(snap)

    def finish(self, profile, error=None):
        self.finished = (profile, error)


def _spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_profile_live_sink_sees_the_samples_grow_then_the_whole_profile():
    sink = CountingSink()
    with ddprof_nb.profile(live=sink) as p:
        assert len(live_threads()) == 1
        workers = [threading.Thread(target=_spin, args=(3.5,), name=f"worker-{i}") for i in range(2)]
        for w in workers:
            w.start()
        _spin(5.5)
        for w in workers:
            w.join()
    assert not live_threads()
    assert len(sink.snapshots) >= 3
    assert [s.refresh for s in sink.snapshots] == list(range(1, len(sink.snapshots) + 1))
    # the samples so far only grow, and never pass the whole profile's
    walls = [s.samples.get(ddprof_nb.EventType.WALL, 0) for s in sink.snapshots]
    assert walls == sorted(walls) and walls[-1] > 0
    assert walls[-1] <= int(p.profile.values[p.profile.event == ddprof_nb.EventType.WALL.value, 0].sum())
    # the recent activity names the workers
    last = sink.snapshots[-1]
    names = {last.profile.threads[i].name for i in last.recent.get(ddprof_nb.EventType.WALL, {})}
    assert {"worker-0", "worker-1"} <= names
    assert sink.finished == (p.profile, None)


def test_profile_live_block_that_raises_still_finishes_the_view():
    sink = CountingSink()
    with pytest.raises(RuntimeError, match="boom"):
        with ddprof_nb.profile(live=sink) as p:
            _spin(1.5)
            raise RuntimeError("boom")
    assert not live_threads()
    assert sink.finished[0] is p.profile and p.profile is not None


def test_a_sink_that_fails_stops_refreshing_but_not_the_session():
    class Broken(CountingSink):
        def update(self, snap):
            raise RuntimeError("view gone")

    sink = Broken()
    with ddprof_nb.profile(live=sink) as p:
        _spin(2.5)
        assert not live_threads()  # it gave up after the first failure
    assert p.profile.total("wall") > 0 and sink.finished[0] is p.profile
    # and the profile says why its live view stopped
    assert any("live view: stopped refreshing after 0 refresh(es): RuntimeError: view gone" in n
               for n in p.profile.metadata.notes)


def test_profile_live_that_cannot_start_tells_its_sink_and_leaves_no_thread():
    sink = CountingSink()
    with ddprof_nb.profile():
        with pytest.raises(ddprof_nb.ProfilerBusyError):
            with ddprof_nb.profile(live=sink):
                pass
    assert not live_threads() and sink.finished[0] is None and "ProfilerBusyError" in sink.finished[1]


def test_profile_live_rejects_what_is_not_a_sink():
    with pytest.raises(TypeError, match="live=.*str"):
        with ddprof_nb.profile(live="yes"):
            pass
    assert not live_threads() and ddprof_nb.sampler.active() is None


def test_outside_a_notebook_a_terminal_gets_one_line_and_a_file_nothing(capsys):
    # a file or a pipe for stderr: nothing is written (a log wants no line a second)
    assert line_sink(io.StringIO()) is None
    with ddprof_nb.profile(live=True) as p:  # pytest's stderr is not a terminal
        _spin(1.5)
    assert capsys.readouterr().err == "" and p.profile is not None

    # a terminal: one line rewritten in place, then erased
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    sink = line_sink(tty)
    assert isinstance(sink, StderrLine)
    with ddprof_nb.profile(live=sink):
        _spin(2.5)
    text = tty.getvalue()
    assert text.count("\r") >= 2 and "ddprof live:" in text and "samples" in text
    assert text.endswith("\r\x1b[K") and "\n" not in text


def test_profile_live_with_the_python_engine():
    # the portable engine feeds the same running aggregate (flushed twice a second)
    sink = CountingSink()
    with ddprof_nb.profile(live=sink, engine="python") as p:
        _spin(5.5)
    assert not live_threads()
    assert len(sink.snapshots) >= 3 and sink.snapshots[-1].samples.get(ddprof_nb.EventType.WALL, 0) > 0
    assert p.profile.metadata.engine == "python" and sink.finished == (p.profile, None)
