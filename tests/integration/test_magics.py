"""``%%ddprof`` driven through a real, isolated IPython InteractiveShell.

Each test gets a fresh shell (temporary IPython dir, no history database, a capturing
display publisher — as memray's ``_ipython`` tests do) with ``%load_ext ddprof_nb``
already run, and an empty ``ddprof_nb.history``.  Cells are run with
``store_history=True`` so execution counts advance as in a notebook.

The workload is a CPU busy loop measured on the process CPU clock, so it burns its
0.3 s of CPU even on a loaded machine.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

pytest.importorskip("IPython")

from IPython.core.displaypub import CapturingDisplayPublisher  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from traitlets.config import Config  # noqa: E402

import ddprof_nb  # noqa: E402
from ddprof_nb import EventType, magics  # noqa: E402
from ddprof_nb.history import DEFAULT_MAX_BYTES, DEFAULT_MAX_COUNT, history  # noqa: E402

BUSY = """\
import time
def busy(seconds=0.3):
    end = time.process_time() + seconds
    n = 0
    while time.process_time() < end:
        n += 1
    return n
def idle(seconds=0.1):
    time.sleep(seconds)
"""


def make_shell(tmp_path):
    """A fresh InteractiveShell that touches nothing outside ``tmp_path``."""
    InteractiveShell.clear_instance()
    cfg = Config()
    cfg.HistoryManager.enabled = False  # no sqlite history database
    cfg.InteractiveShell.colors = "nocolor"
    ipython_dir = tmp_path / "ipython"
    ipython_dir.mkdir(exist_ok=True)
    return InteractiveShell.instance(config=cfg, ipython_dir=str(ipython_dir),
                                     display_pub_class=CapturingDisplayPublisher)


def reset_ddprof():
    if magics._session is not None:  # a failed test must not leave a sampler running
        try:
            magics._session.sampler.stop()
        except Exception:
            pass
        magics._session = None
    history.clear()
    history.max_count = DEFAULT_MAX_COUNT
    history.max_bytes = DEFAULT_MAX_BYTES
    magics.display_mode = "auto"


@pytest.fixture
def shell(tmp_path, monkeypatch):
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.chdir(tmp_path)
    reset_ddprof()
    sh = make_shell(tmp_path)
    assert sh.run_cell("%load_ext ddprof_nb", store_history=True).success
    assert sh.run_cell(BUSY, store_history=True).success
    yield sh
    reset_ddprof()
    InteractiveShell.clear_instance()


def run(shell, code):
    """Run ``code`` as the next notebook cell; returns (ExecutionResult, its execution count)."""
    count = shell.execution_count
    return shell.run_cell(code, store_history=True), count


def cell_rows(profile):
    """Row mask of the samples taken on this (the cell's) thread."""
    tid = threading.get_native_id()
    idx = [i for i, t in enumerate(profile.threads) if t.tid == tid]
    return np.isin(profile.thread, idx)


def assert_rooted_at(profile, label):
    """Every stack of the cell's thread starts with the frame ``label`` (e.g. Cell In[3])."""
    rows = cell_rows(profile)
    assert rows.any(), "no samples on the cell's thread"
    firsts = {profile.stack_frames(s)[0] for s in set(profile.stack[rows].tolist())}
    assert {(f.name, f.filename) for f in firsts} == {(label, label)}, firsts


def top_name(profile, event="cpu"):
    rows = profile.top(event, n=1)
    assert rows, f"no {event} samples"
    return rows[0].name


# -- the cell runs as an ordinary cell ------------------------------------------------


def test_cell_profile_finds_hot_function_and_roots_stacks_at_the_cell(shell):
    # GIVEN a cell that burns 0.3 s of CPU in busy() and sleeps 0.1 s in idle()
    code = "%%ddprof\nn = busy()\nidle()\nresult = n * 2\nresult + 1\n"
    # WHEN it runs under %%ddprof
    res, count = run(shell, code)
    # THEN the cell ran as usual: its variables are in the namespace and its last
    # expression's value is the cell's result (Out[count])
    assert res.success, res.error_in_exec
    assert shell.user_ns["result"] == shell.user_ns["n"] * 2 > 0
    assert res.result == shell.user_ns["result"] + 1
    assert shell.user_ns["Out"][count] == res.result
    # AND the profile is in the history under the cell's execution count
    assert history.list() == [str(count)]
    profile = history[count]
    assert profile is ddprof_nb.history.latest
    # AND busy() is the hottest CPU function, with most of the CPU time
    assert top_name(profile, "cpu") == "busy"
    busy_row = profile.top("cpu", n=1)[0]
    assert busy_row.self >= 0.7 * profile.total("cpu")
    # busy() was defined in the fixture's second cell (In[2]), on its line 2
    assert (busy_row.filename, busy_row.line) == ("Cell In[2]", 2)
    # AND the wall profile holds the sleep too
    wall_names = {r.name for r in profile.top("wall", n=None)}
    assert {"busy", "idle"} <= wall_names
    # AND the cell's code is the root of every stack of the thread that ran it (no
    # IPython machinery, no profiler frames)
    assert_rooted_at(profile, f"Cell In[{count}]")
    names = {f.name for f in profile.frames}
    assert not any(n in names for n in ("run_cell", "run_code", "begin", "end", "start", "stop"))


def test_cell_frames_keep_the_cells_own_line_numbers(shell):
    # GIVEN a cell whose busy loop sits on line 4 (line 1 is %%ddprof)
    code = "%%ddprof -e cpu\nx = 1\ny = 2\nbusy()\n"
    res, count = run(shell, code)
    assert res.success
    profile = history.latest
    # THEN the cell frame calling busy() reads Cell In[count], line 4
    lines = {f.line for f in profile.frames if f.filename == f"Cell In[{count}]" and f.name == f"Cell In[{count}]"}
    assert lines == {4}


def test_exception_propagates_after_profile_is_stored_and_shown(shell, capsys):
    # GIVEN a cell that works, then fails
    code = "%%ddprof -o failing\nbusy()\nraise ValueError('bad input 42')\n"
    # WHEN it runs
    res, count = run(shell, code)
    out = capsys.readouterr()
    # THEN the cell failed with the user's own exception, shown by IPython as usual
    assert isinstance(res.error_in_exec, ValueError)
    assert not res.success
    assert "ValueError" in out.out + out.err and "bad input 42" in out.out + out.err
    assert f"Cell In[{count}], line 3" in out.out + out.err
    # AND the profile was stored and shown first
    assert top_name(history["failing"]) == "busy"
    assert shell.display_pub.outputs, "the profile was not displayed"
    assert "busy" in shell.display_pub.outputs[-1]["data"]["text/plain"]
    # AND the status line was printed before the traceback
    text = out.out
    assert text.index("ddprof [failing]") < text.index("ValueError")


def test_keyboard_interrupt_stops_the_cell_and_keeps_the_partial_profile(shell):
    # GIVEN a cell that would loop for 20 s, interrupted (as by Ctrl-C) after 0.4 s
    code = (
        "%%ddprof -o interrupted\n"
        "import _thread, signal, threading, time\n"
        # a shell running pytest in the background ignores SIGINT (interrupt_main then does nothing)
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "threading.Timer(0.4, _thread.interrupt_main).start()\n"
        "deadline = time.monotonic() + 20\n"
        "while time.monotonic() < deadline:\n"
        "    busy(0.05)\n"
    )
    # WHEN it runs
    res, count = run(shell, code)
    # THEN the cell stopped with KeyboardInterrupt (its loop ends only by its 20 s
    # deadline, which raises nothing)
    assert isinstance(res.error_in_exec, KeyboardInterrupt)
    profile = history["interrupted"]
    # AND the partial profile was kept, busy() on top, rooted at the cell
    assert top_name(profile) == "busy"
    assert_rooted_at(profile, f"Cell In[{count}]")
    assert magics._session is None


def test_top_level_await_runs_and_waits_are_charged_to_the_cell(shell):
    # GIVEN a cell awaiting at top level (IPython's autoawait)
    code = "%%ddprof -e wall\nimport asyncio\nawait asyncio.sleep(0.3)\nz = 5\nz\n"
    # WHEN it runs
    res, count = run(shell, code)
    # THEN it ran to the end and its value is the result
    assert res.success, res.error_in_exec
    assert shell.user_ns["z"] == 5 and res.result == 5
    # AND the wait is charged under the cell twice, once per account: the cell's thread
    # (its loop waiting in the selector, no cell frame on the stack) under [await], and
    # the cell's suspended task on the task sampler's synthetic thread (same tid) under
    # what it awaits.  Both are ~0.3 s, so which one tops profile.top() is sampling
    # noise: each account is checked on its own thread.
    profile = history.latest
    cell = f"Cell In[{count}]"
    assert_rooted_at(profile, cell)
    for suffix, leaf in (("", "[await]"), (" (asyncio tasks)", "[asyncio.sleep]")):
        name = threading.current_thread().name + suffix
        mine = profile.filter(events="wall", threads=[name])
        assert top_name(mine, "wall") == leaf, (name, mine.top("wall", n=3))
        waits = [s for s in set(mine.stack.tolist()) if mine.stack_frames(s)[-1].name == leaf]
        assert [[f.name for f in mine.stack_frames(s)] for s in waits] == [[cell, leaf]]
        assert mine.total("wall") >= 0.2e9, (name, mine.total("wall"))


def test_top_level_await_tasks_get_their_own_stacks_labels_and_waits(shell):
    # GIVEN a cell awaiting two tasks at top level: one sleeping, one computing
    code = ("%%ddprof -e cpu,wall,park -i 5ms\nimport asyncio\n"
            "async def sleeper():\n    await asyncio.sleep(0.3)\n"
            "async def spinner():\n    busy(0.2)\n"
            "await asyncio.gather(asyncio.create_task(sleeper(), name='sleeper'),\n"
            "                     asyncio.create_task(spinner(), name='spinner'))\n")
    # WHEN it runs under %%ddprof (asyncio support on by default)
    res, _ = run(shell, code)
    assert res.success, res.error_in_exec
    profile = history.latest
    # THEN the computing task's CPU carries its task label, and its stacks start at the
    # cell's code (the coroutine), none of the event loop's machinery left
    spin = profile.filter(events="cpu", focus="^busy$")
    assert spin.total("cpu") > 0.1e9
    assert {profile.labelsets[i].get("task") for i in set(spin.labels.tolist())} == {"spinner"}
    names = [[f.name for f in profile.stack_frames(s)] for s in set(spin.stack.tolist())]
    assert all(n[0] == "spinner" and n[-1] == "busy" for n in names), names
    # AND the sleeping task's suspension is a park sample naming what it awaits
    parked = profile.filter(events="park", labels={"task": "sleeper"})
    assert parked.total("park") > 0.15e9, parked.total("park")
    assert {profile.stack_frames(s)[-1].name for s in set(parked.stack.tolist())} == {"[asyncio.sleep]"}


def test_asyncio_off_and_raw_options(shell):
    code = ("%%ddprof -e cpu,wall --asyncio {mode}\nimport asyncio\n"
            "async def spinner():\n    busy(0.15)\n"
            "await asyncio.create_task(spinner(), name='spinner')\n")
    frames = {}
    for mode in ("off", "raw"):
        res, _ = run(shell, code.format(mode=mode))
        assert res.success, res.error_in_exec
        p = history.latest
        frames[mode] = {f.name for s in set(p.stack.tolist()) for f in p.stack_frames(s)}
        tasks = {ls.get("task") for ls in p.labelsets}
        # off: no task labels, no task sampler thread; raw: both, loop frames kept
        assert (tasks == {None}) == (mode == "off"), (mode, tasks)
        assert any(t.name.endswith("(asyncio tasks)") for t in p.threads) == (mode == "raw")
    assert "[asyncio loop]" not in frames["off"] and "[asyncio loop]" not in frames["raw"]
    assert {"spinner", "busy"} <= frames["raw"] and {"spinner", "busy"} <= frames["off"]
    # AND a bad mode names the option's values
    res, _ = run(shell, "%%ddprof --asyncio sometimes\nx = 1\n")
    assert not res.success and "fold, raw, off" in str(res.error_in_exec)


# -- options --------------------------------------------------------------------------


def test_labels_name_events_interval_and_engine_options(shell):
    # GIVEN every option of the cell magic at once
    code = "%%ddprof -e cpu -i 5ms -l team=ml run=3 -l step=$step_no -o tuned --engine python\nbusy()\n"
    shell.user_ns["step_no"] = 7
    # WHEN the cell runs
    res, _ = run(shell, code)
    assert res.success, res.error_in_exec
    profile = history["tuned"]
    # THEN the profile is named by -o, holds only CPU samples, sampled every 5 ms by the
    # python engine, and every sample carries the labels (with $step_no expanded)
    assert profile.events == (EventType.CPU,)
    assert profile.metadata.interval_ns == 5_000_000
    assert profile.metadata.engine == "python"
    used = {profile.labelsets[i] for i in set(profile.labels.tolist())}
    assert used and all(ls.get("team") == "ml" and ls.get("run") == "3" and ls.get("step") == "7" for ls in used)
    # AND the samples add up to the busy loop's CPU (the python engine samples only when it
    # gets the GIL, so on a loaded machine the count varies; the time total does not)
    assert profile.total("cpu", 0) >= 15 and profile.total("cpu") >= 0.2e9
    assert top_name(profile) == "busy"


def test_alloc_rate_option_is_used_or_clearly_refused(shell, capsys):
    # GIVEN the allocation event with a sampling rate
    code = "%%ddprof -e alloc --alloc-rate 64KiB\nblobs = [bytes(4096) for _ in range(2000)]\n"
    # WHEN the cell runs
    res, _ = run(shell, code)
    out = capsys.readouterr()
    if res.success:
        # THEN (engine with allocation sampling) the profile holds allocation samples
        assert EventType.ALLOC in history.latest.events
    else:
        # THEN (no engine samples allocations yet) one clear line names the event
        assert "alloc" in out.err and "cannot start profiling" in out.err
        assert "Traceback" not in out.out + out.err
        assert "blobs" not in shell.user_ns


def test_save_option_writes_the_profile(shell, tmp_path, capsys):
    # GIVEN --save with a pprof destination whose name has a space, and a quoted -o
    res, count = run(shell, f"%%ddprof --no-show -o 'my run' --save \"{tmp_path / 'my cell.pprof'}\"\nbusy()\n")
    assert res.success, res.error_in_exec
    # THEN the file is written and loads back with busy() on top
    assert f"ddprof: saved to {tmp_path / 'my cell.pprof'}" in capsys.readouterr().out
    assert "my run" in history
    loaded = ddprof_nb.load(tmp_path / "my cell.pprof")
    assert top_name(loaded) == "busy"
    # AND a destination that cannot be written gives one line; the profile is still kept
    res, count = run(shell, f"%%ddprof --no-show --save {tmp_path / 'missing' / 'x.pprof'}\nbusy(0.05)\n")
    err = capsys.readouterr().err
    assert res.success
    assert f"ddprof: could not save to {tmp_path / 'missing' / 'x.pprof'}" in err and "Traceback" not in err
    assert str(count) in history


def test_no_show_prints_the_status_line_only(shell, capsys):
    # GIVEN --no-show
    res, count = run(shell, "%%ddprof --no-show\nbusy()\n")
    out = capsys.readouterr().out
    # THEN nothing is displayed, but one status line names engine, duration and samples
    assert res.success
    assert shell.display_pub.outputs == []
    line = [ln for ln in out.splitlines() if ln.startswith(f"ddprof [{count}]")]
    assert len(line) == 1
    assert " engine · " in line[0] and " · cpu " in line[0] and " samples" in line[0]


def test_default_display_outside_a_kernel_is_text_and_static_html(shell):
    # GIVEN a plain InteractiveShell (no kernel, not a terminal)
    res, count = run(shell, "%%ddprof\nbusy()\n")
    assert res.success
    # THEN one display: a text summary (top functions) and a static HTML flame graph
    (output,) = shell.display_pub.outputs
    data = output["data"]
    assert set(data) == {"text/plain", "text/html"}
    assert "busy" in data["text/plain"] and "CPU time: top" in data["text/plain"]
    assert "ddp-flame" in data["text/html"] and "busy" in data["text/html"]
    assert "<script" not in data["text/html"]


@pytest.mark.parametrize(
    "options, message",
    [
        ("-i 10xs", "invalid interval '10xs'"),
        ("-i 0ms", "invalid interval '0ms'"),
        ("-e cpu,bogus", "unknown EventType 'bogus'"),
        ("--engine turbo", "invalid engine 'turbo'"),
        ("-l novalue", "invalid label 'novalue'"),
        ("-o ''", "invalid name '' for -o"),
        ("--alloc-rate lots", "invalid alloc rate 'lots'"),
    ],
)
def test_bad_option_values_give_one_line_naming_them(shell, capsys, options, message):
    # GIVEN a cell with a bad option value
    res, _ = run(shell, f"%%ddprof {options}\nran = True\n")
    out = capsys.readouterr()
    # THEN the cell fails with one line naming the bad value, no traceback, body not run
    assert not res.success
    assert message in out.err
    assert "Traceback" not in out.out + out.err
    lines = [ln for ln in out.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("UsageError: "), lines
    assert "ran" not in shell.user_ns
    assert magics._session is None


def test_unknown_option_shows_the_usage_text(shell, capsys):
    res, _ = run(shell, "%%ddprof --frobnicate\nran = True\n")
    out = capsys.readouterr()
    assert not res.success
    assert "unrecognized arguments: --frobnicate" in out.err
    assert "usage: %%ddprof [-e EVENTS] [-i INTERVAL] [--alloc-rate SIZE]" in out.err
    assert "[--engine auto|native|python]" in out.err
    assert "Traceback" not in out.out + out.err
    assert "ran" not in shell.user_ns


def test_nested_ddprof_says_a_profile_is_already_running(shell, capsys):
    # GIVEN a profiled cell that runs another %%ddprof cell inside it
    code = (
        "%%ddprof -o outer\n"
        "busy()\n"
        "inner = get_ipython().run_cell('%%ddprof -o inner\\nx = 1')\n"
    )
    # WHEN it runs
    res, count = run(shell, code)
    out = capsys.readouterr()
    # THEN the inner cell fails with a one-line message; the outer profile is unharmed
    assert res.success, res.error_in_exec
    assert not shell.user_ns["inner"].success
    assert f"a profile is already running (started by %%ddprof in In[{count}])" in out.err
    assert "Traceback" not in out.out + out.err
    assert history.list() == ["outer"]
    assert top_name(history["outer"]) == "busy"


def test_ddprof_cell_while_start_is_running_is_refused(shell, capsys):
    res, start_count = run(shell, "%ddprof start")
    assert res.success
    res, _ = run(shell, "%%ddprof\nran = True\n")
    out = capsys.readouterr()
    assert not res.success and "ran" not in shell.user_ns
    assert f"a profile is already running (started by %ddprof start in In[{start_count}]); run %ddprof stop first" in out.err
    assert run(shell, "%ddprof stop")[0].success


# -- IPython's display settings are respected ------------------------------------------


def test_interactivity_all_and_last_expr_or_assign_and_semicolon(shell, capsys):
    # GIVEN ast_node_interactivity = "all": every expression statement is shown
    shell.ast_node_interactivity = "all"
    res, count = run(shell, "%%ddprof --no-show\n40 + 1\n40 + 2\nq = 3\n")
    out = capsys.readouterr().out
    assert res.success and f"Out[{count}]: 41" in out and f"Out[{count}]: 42" in out
    # GIVEN "last_expr_or_assign": a final assignment is shown
    shell.ast_node_interactivity = "last_expr_or_assign"
    res, count = run(shell, "%%ddprof --no-show\nw = 7\n")
    assert res.success and res.result == 7 and shell.user_ns["w"] == 7
    # GIVEN the default, a trailing semicolon silences the value
    shell.ast_node_interactivity = "last_expr"
    res, count = run(shell, "%%ddprof --no-show\n8;\n")
    assert res.success and res.result is None


def test_future_import_in_a_profiled_cell(shell):
    res, _ = run(shell, "%%ddprof --no-show\nfrom __future__ import annotations\ndef f(x: Undefined) -> int:\n    return 1\nv = f(0)\n")
    assert res.success, res.error_in_exec
    assert shell.user_ns["v"] == 1


def test_cell_magic_called_directly_runs_through_the_same_path(shell):
    # GIVEN code calling run_cell_magic itself (no %%ddprof line to transform)
    res, _ = run(shell, "get_ipython().run_cell_magic('ddprof', '--no-show -o direct', 'busy()\\ndone = 1')")
    # THEN the body ran and was profiled
    assert res.success
    assert shell.user_ns["done"] == 1
    assert top_name(history["direct"]) == "busy"


# -- extension lifecycle ----------------------------------------------------------------


def test_reload_ext_keeps_one_set_of_hooks(shell):
    # GIVEN the extension reloaded twice
    for _ in range(2):
        assert run(shell, "%reload_ext ddprof_nb")[0].success
    # THEN one input transformer and one AST transformer are registered, and it works
    assert shell.input_transformers_cleanup.count(magics._cell_transform) == 1
    assert sum(isinstance(t, magics._CellWrapper) for t in shell.ast_transformers) == 1
    res, _ = run(shell, "%%ddprof --no-show -o reloaded\nbusy()\n")
    assert res.success and top_name(history["reloaded"]) == "busy"


def test_unload_ext_stops_a_running_profile_and_removes_the_magics(shell, capsys):
    # GIVEN a profile started across cells
    assert run(shell, "%ddprof start -o running")[0].success
    assert run(shell, "busy()")[0].success
    # WHEN the extension is unloaded
    assert run(shell, "%unload_ext ddprof_nb")[0].success
    out = capsys.readouterr().out
    # THEN the profile was stopped and kept, and nothing of ours is left in the shell
    assert magics._session is None
    assert "stopped and stored as 'running'" in out
    assert top_name(history["running"]) == "busy"
    assert magics._cell_transform not in shell.input_transformers_cleanup
    assert not any(isinstance(t, magics._CellWrapper) for t in shell.ast_transformers)
    assert not hasattr(shell, "_ddprof_cell")
    assert "ddprof" not in shell.magics_manager.magics["line"]
    assert "ddprof" not in shell.magics_manager.magics["cell"]
    # AND loading it again works
    assert run(shell, "%load_ext ddprof_nb")[0].success
    assert run(shell, "%%ddprof --no-show\nx = 1\n")[0].success


def test_no_native_alloc_option_keeps_alloc_to_python_objects(shell):
    # GIVEN a cell making numpy arrays (160 MB) under alloc/live, with and without --no-native-alloc
    code = "%%ddprof --no-show -e alloc,live{flag}\narrays = [np.ones(1_000_000) for _ in range(20)]\n"
    shell.user_ns["np"] = np
    leaves = {}
    for flag in ("", " --no-native-alloc"):
        res, _ = run(shell, code.format(flag=flag))
        assert res.success, res.error_in_exec
        prof = history.latest
        leaves[flag] = {prof.stack_frames(s)[-1].name for s in set(prof.stack.tolist())}
        leaves[flag + " notes"] = " ".join(prof.metadata.notes)
    # THEN by default the arrays' data shows as [numpy]; with the flag it does not, and the notes say so
    assert "[numpy]" in leaves[""], leaves
    assert "[numpy]" not in leaves[" --no-native-alloc"], leaves
    assert "native_alloc=False" in leaves[" --no-native-alloc notes"], leaves
