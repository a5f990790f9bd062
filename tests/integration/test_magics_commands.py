"""``%ddprof`` line magic: STATEMENT, start/stop, show, list, top, save, load, diff,
status, and what each shows — driven through a real, isolated InteractiveShell (the
fixture lives in test_magics.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("IPython")

import ddprof_nb  # noqa: E402
from ddprof_nb import magics  # noqa: E402
from ddprof_nb.events import EventType  # noqa: E402
from ddprof_nb.exporters import html as html_export  # noqa: E402
from ddprof_nb.render import static_html as render_html  # noqa: E402
from ddprof_nb.history import history  # noqa: E402
from ddprof_nb.model import Frame, Metadata, ProfileBuilder  # noqa: E402
from test_magics import assert_rooted_at, run, shell, top_name  # noqa: E402,F401 - the shared fixture


@pytest.mark.quick
def test_line_magic_profiles_one_statement_and_returns_its_value(shell):
    # GIVEN one statement after %ddprof, with options before it
    res, count = run(shell, "%ddprof -e cpu -l kind=line busy(0.3)")
    # THEN the statement's value is the cell's value and its profile is stored under the
    # cell's count, rooted at the statement, busy() on top, labelled
    assert res.success and res.result > 0
    profile = history[count]
    assert top_name(profile) == "busy"
    assert profile.events == (EventType.CPU,)
    assert_rooted_at(profile, f"Cell In[{count}]")
    assert all(profile.labelsets[i].get("kind") == "line" for i in set(profile.labels.tolist()))


def test_line_magic_statement_is_kept_verbatim_and_exceptions_propagate(shell):
    # GIVEN a statement with quotes and spaces, then one that raises
    res, _ = run(shell, '%ddprof --no-show text = "a  b" + \'{x}\'')
    assert res.success and shell.user_ns["text"] == "a  b{x}"
    res, count = run(shell, "%ddprof --no-show -o boom 1/0")
    # THEN the exception fails the cell and the profile is still stored
    assert isinstance(res.error_in_exec, ZeroDivisionError)
    assert "boom" in history


@pytest.mark.quick
def test_start_stop_profiles_across_cells(shell, capsys):
    # GIVEN %ddprof start, two cells of work, %ddprof stop
    res, first = run(shell, "%ddprof start -e cpu")
    assert res.success
    _, work1 = run(shell, "busy(0.2)")
    _, work2 = run(shell, "busy(0.2)")
    res, last = run(shell, "%ddprof stop")
    assert res.success
    # THEN one profile, named after the first and last cell, holds both cells' work,
    # every stack of this thread rooted at one of those cells
    name = f"{first}-{last}"
    assert history.list() == [name]
    profile = history[name]
    assert top_name(profile) == "busy"
    roots = {profile.stack_frames(s)[0].filename for s in set(profile.stack.tolist())}
    # (the start and stop cells run a little code of their own while sampling)
    assert roots <= {f"Cell In[{c}]" for c in (first, work1, work2, last)} | {"Cell In[2]"}
    assert {f"Cell In[{work1}]", f"Cell In[{work2}]"} <= roots
    assert profile.total("cpu") >= 0.3e9
    # AND status said it was running, and says so no longer
    out = capsys.readouterr().out
    assert "profiling until %ddprof stop" in out


def test_start_twice_and_stop_without_start_say_so(shell, capsys):
    # GIVEN a running profile
    _, first = run(shell, "%ddprof start")
    run(shell, "%ddprof status")
    out = capsys.readouterr().out
    assert f"started by %ddprof start in In[{first}]" in out
    # WHEN start is asked again
    res, _ = run(shell, "%ddprof start")
    err = capsys.readouterr().err
    # THEN one line says a profile is already running
    assert not res.success
    assert err.strip() == (f"UsageError: %ddprof start: a profile is already running "
                           f"(started by %ddprof start in In[{first}]); run %ddprof stop first")
    # AND after stopping, a second stop says nothing is running
    assert run(shell, "%ddprof stop")[0].success
    res, _ = run(shell, "%ddprof stop")
    err = capsys.readouterr().err
    assert not res.success
    assert err.strip() == "UsageError: %ddprof stop: no profile is running (start one with %ddprof start)"
    run(shell, "%ddprof status")
    assert "ddprof: not profiling" in capsys.readouterr().out


@pytest.mark.quick
def test_list_top_show_and_status(shell, capsys):
    # GIVEN two stored profiles
    run(shell, "%%ddprof --no-show -o first\nbusy()\n")
    run(shell, "%%ddprof --no-show -o second\nidle(0.05)\nbusy(0.1)\n")
    capsys.readouterr()
    # WHEN listing
    run(shell, "%ddprof list")
    out = capsys.readouterr().out
    # THEN both are listed, oldest first, with events, duration, samples and size
    lines = out.splitlines()
    assert lines[0].startswith("2 of at most 20 profiles")
    assert lines[1].split()[:3] == ["name", "events", "duration"]
    assert [ln.split()[0] for ln in lines[2:]] == ["first", "second"]
    assert "cpu,wall" in lines[2]
    # WHEN asking for the top table of a named profile
    res, _ = run(shell, "%ddprof top 3 first")
    out = capsys.readouterr().out
    # THEN a text table per event, busy() first under its header
    assert res.success
    assert out.startswith("ddprof [first]")
    cpu = out.split("CPU time: top 3 functions")[1]
    rows = cpu.splitlines()[1:]
    assert rows[0].split()[0] == "self" and "busy" in rows[1]
    # AND top with only a name, and with -e, work; a missing profile is one line
    assert run(shell, "%ddprof top second -e wall")[0].success
    assert "Wall time: top 10" in capsys.readouterr().out
    res, _ = run(shell, "%ddprof top 5 nosuch")
    err = capsys.readouterr().err
    assert not res.success and "no profile named 'nosuch' in the history (known: first, second)" in err
    # WHEN showing the latest profile
    shell.display_pub.outputs.clear()
    assert run(shell, "%ddprof show")[0].success
    (output,) = shell.display_pub.outputs
    assert "ddprof [second]" in output["data"]["text/plain"]
    # AND status reports the history
    run(shell, "%ddprof status")
    assert "history: 2 of at most 20 profiles" in capsys.readouterr().out


@pytest.mark.quick
def test_save_load_and_diff(shell, tmp_path, capsys):
    # GIVEN two profiles with different hot spots
    run(shell, "%%ddprof --no-show -o before\nbusy(0.3)\n")
    run(shell, "%%ddprof --no-show -o after\nbusy(0.1)\n")
    # WHEN saving it in each format the exporters know (HTML: see test_cli.py, it is slow)
    for name in ("before.pprof", "before.speedscope.json", "before.cpu.folded"):
        res, _ = run(shell, f"%ddprof save before {tmp_path / name}")
        assert res.success, name
    assert ddprof_nb.load(tmp_path / "before.pprof").total("cpu") > 0
    assert ddprof_nb.load(tmp_path / "before.speedscope.json").total("cpu") > 0
    assert "busy" in (tmp_path / "before.cpu.folded").read_text()
    # AND loading the pprof file back into the history
    res, _ = run(shell, f"%ddprof load {tmp_path / 'before.pprof'} -o reloaded")
    assert res.success
    assert top_name(history["reloaded"]) == "busy"
    assert abs(history["reloaded"].total("cpu") - history["before"].total("cpu")) <= 1
    # AND diffing two stored profiles displays one view of both
    shell.display_pub.outputs.clear()
    assert run(shell, "%ddprof diff before after")[0].success
    (output,) = shell.display_pub.outputs
    text = output["data"]["text/plain"]
    assert "ddprof [A]" in text and "ddprof [B]" in text and "busy" in text
    # AND errors are one line each
    capsys.readouterr()
    for cmd, message in [
        ("%ddprof save before", "usage: %ddprof save NAME PATH"),
        (f"%ddprof save nosuch {tmp_path / 'x.pprof'}", "no profile named 'nosuch'"),
        (f"%ddprof save before {tmp_path / 'x.unknown'}", "cannot tell the format"),
        (f"%ddprof load {tmp_path / 'missing.pprof'}", "cannot read"),
        ("%ddprof diff before", "usage: %ddprof diff A B"),
    ]:
        res, _ = run(shell, cmd)
        out = capsys.readouterr()
        assert not res.success, cmd
        assert message in out.err + out.out, (cmd, out)
        assert "Traceback" not in out.err + out.out


def test_history_evicts_the_oldest_with_a_message(shell, capsys):
    # GIVEN a history bounded to two profiles
    ddprof_nb.history.max_count = 2
    names = []
    for i in range(3):
        _, count = run(shell, "%%ddprof --no-show\nx = 1\n")
        names.append(str(count))
    out = capsys.readouterr().out
    # THEN the oldest was evicted, with a message naming it
    assert history.list() == names[1:]
    assert f"ddprof: evicted profile {names[0]!r} from the history (more than 2 profiles" in out


def test_help_and_unknown_statement_errors(shell, capsys):
    run(shell, "%ddprof help")
    assert "%%ddprof [-e EVENTS]" in capsys.readouterr().out
    res, _ = run(shell, "%ddprof -e cpu")
    err = capsys.readouterr().err
    assert not res.success and "nothing to profile" in err
    res, _ = run(shell, "%ddprof --no-show 1 +")
    err = capsys.readouterr().err
    assert not res.success and "invalid statement" in err and "Traceback" not in err


# -- what is shown where ----------------------------------------------------------------


def test_widget_display_uses_the_explorer_mimebundle(shell):
    # GIVEN a frontend that renders widgets (forced: no kernel in this test)
    magics.display_mode = "widget"
    res, count = run(shell, "%%ddprof\nbusy()\n")
    assert res.success
    # THEN the explorer is displayed as a static flame (what a notebook reopened without its
    # kernel shows) and then its widget view with a text fallback
    static, widget = shell.display_pub.outputs
    assert "busy" in static["data"]["text/html"] and "ddprof-static-fallback" in static["data"]["text/html"]
    data = widget["data"]
    assert "application/vnd.jupyter.widget-view+json" in data
    assert "busy" in data["text/plain"]


@pytest.mark.pure_python  # (a loaded or hand-built profile through the magic: no sampling)
@pytest.mark.parametrize("mode", ["widget", "static", "text"])
def test_show_opens_a_loaded_profile_without_timestamps(shell, capsys, tmp_path, mode):
    # GIVEN a folded file (no threads, no timestamps, no counts) loaded into the history
    (tmp_path / "cpu.folded").write_text("main;work;inner 10\nmain;other 5\n")
    res, _ = run(shell, f"%ddprof load {tmp_path / 'cpu.folded'} -o folded")
    assert res.success
    capsys.readouterr()
    # WHEN it is shown in each display mode
    magics.display_mode = mode
    res, _ = run(shell, "%ddprof show folded")
    out = capsys.readouterr()
    # THEN it opens, with its functions, and nothing failed
    assert res.success and "failed" not in out.err and "Traceback" not in out.err
    if mode == "text":
        assert "inner" in out.out and shell.display_pub.outputs == []
    elif mode == "static":
        (output,) = shell.display_pub.outputs
        data = output["data"]
        assert "application/vnd.jupyter.widget-view+json" not in data
        assert "inner" in data["text/plain"] and "inner" in data["text/html"]
    else:  # the static flame, then the widget
        static, widget = shell.display_pub.outputs
        assert "inner" in static["data"]["text/html"]
        assert "application/vnd.jupyter.widget-view+json" in widget["data"] and "inner" in widget["data"]["text/plain"]


def test_terminal_display_prints_the_text_table(shell, capsys):
    # GIVEN a terminal (no rich display)
    magics.display_mode = "text"
    res, count = run(shell, "%%ddprof -e cpu\nbusy()\n")
    out = capsys.readouterr().out
    # THEN nothing goes to the display system; the status line and a top table are printed
    assert res.success
    assert shell.display_pub.outputs == []
    assert f"ddprof [{count}]: " in out
    table = out.split("CPU time: top 10 functions")[1].splitlines()
    assert "busy" in table[2] and "Cell In[2]:2" in table[2]


@pytest.mark.pure_python  # (a loaded or hand-built profile through the magic: no sampling)
def test_static_html_escapes_every_name_label_and_path(tmp_path):
    # GIVEN a profile (as if loaded from an untrusted file) whose names, files, labels,
    # notes and thread names carry markup
    evil = '<script>alert("x")</script>'
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10**9, engine="<b>eng</b>", notes=(evil,),
                                extra={"cell": "<img src=x onerror=alert(1)>"}))
    frames = [Frame(evil, '/tmp/"><img src=x onerror=alert(2)>.py', 3, 1), Frame("leaf&<i>", "<f>.py", 9, 8)]
    sid = b.stack_of(frames)
    tid = b.thread_id(1, "<thread>")
    lid = b.labels_id({"user": "<b>bob</b>"})
    b.add(EventType.CPU, sid, tid, lid, 0, 5, 50_000_000)
    profile = b.build()
    # WHEN rendering the static report (document and fragment) and writing it
    doc = render_html.report(profile, title="<title>")
    fragment = magics.fallback_bundle(profile, name="<n>")["text/html"]
    html_export.write(profile, tmp_path / "r.html", static=True)
    written = (tmp_path / "r.html").read_text(encoding="utf-8")
    # THEN no markup from the profile survives unescaped
    for text in (doc, fragment, written):
        assert "<script" not in text and "<img" not in text and "<b>" not in text and "<i>" not in text
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text
        assert "leaf&amp;&lt;i&gt;" in text
    assert "&lt;b&gt;bob&lt;/b&gt;" in doc
    assert "&lt;title&gt;" in doc


@pytest.mark.pure_python  # (a loaded or hand-built profile through the magic: no sampling)
def test_top_tables_are_identical_in_the_magic_the_widget_fallback_and_the_cli(shell, capsys, tmp_path):
    # GIVEN one profile file with values at the formatter's edges (999.6 µs, 3 s, 620 ms)
    pytest.importorskip("ipywidgets")
    from ddprof_nb.__main__ import main as cli_main
    from ddprof_nb.explorer.widget import Explorer

    b = ProfileBuilder(Metadata(start_ns=0, end_ns=5 * 10**9, engine="native"))
    tid = b.thread_id(1, "MainThread")
    root = Frame("main", "/home/user/app.py", 10, 1)
    for i, ns in enumerate((999_600, 3 * 10**9, 620 * 10**6, 3_210_000_000, 1_500)):
        leaf = Frame(f"work_{i}", f"/home/user/pkg/mod{i}.py", 20 + i, 20 + i)
        b.add(EventType.CPU, b.stack_of([root, leaf]), tid, 0, 0, 1 + i, ns)
    path = tmp_path / "one.pprof"
    ddprof_nb.save(b.build(), path)
    # WHEN the magic, the explorer's text fallback and the CLI show its top 20
    run(shell, f"%ddprof load {path} -o one")
    capsys.readouterr()
    run(shell, "%ddprof top 20 one -e cpu")
    magic_out = capsys.readouterr().out
    widget_text = Explorer(history["one"])._repr_mimebundle_()["text/plain"]
    assert cli_main(["report", str(path), "--top", "20", "-e", "cpu"]) == 0
    cli_out = capsys.readouterr().out
    # THEN all three print the very same table
    assert widget_text.startswith("CPU time: top 20 functions")
    assert magic_out == f"ddprof [one]\n{widget_text}\n"
    assert cli_out.endswith(f"\n\n{widget_text}\n")
    assert "1.00 ms" in widget_text and "3.00 s" in widget_text and "620 ms" in widget_text


@pytest.mark.pure_python  # (a loaded or hand-built profile through the magic: no sampling)
def test_load_takes_the_event_and_interval_of_a_sample_count_file(shell, capsys, tmp_path):
    from pathlib import Path

    raw = Path(__file__).resolve().parents[1] / "data" / "other_tools" / "py-spy.raw.txt"
    # GIVEN py-spy's --format raw output: 40 samples, a file name that names no event
    # WHEN it is loaded without an event THEN the error says which option to give
    res, _ = run(shell, f"%ddprof load {raw} -o nope")
    out = capsys.readouterr()
    assert not res.success and "event" in out.err + out.out and "Traceback" not in out.err + out.out
    # WHEN -e and -i say what a sample is THEN 40 samples of 10 ms are 400 ms of CPU time
    res, _ = run(shell, f"%ddprof load {raw} -e cpu -i 10ms -o spy")
    assert res.success, capsys.readouterr()
    assert history["spy"].total("cpu", 1) == 400 * 10**6 and history["spy"].total("cpu", 0) == 40
    # a bad interval is one clear line
    res, _ = run(shell, f"%ddprof load {raw} -e cpu -i 10 -o bad")
    out = capsys.readouterr()
    assert not res.success and "invalid interval '10'" in out.err + out.out
