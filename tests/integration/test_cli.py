"""``python -m ddprof_nb record | convert | report`` in subprocesses.

The recorded script reports what it sees (argv, __name__, sys.path[0], __file__) in a
JSON file, so the tests check it ran exactly as ``python script.py`` would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import ddprof_nb
from ddprof_nb.events import FrameKind

SCRIPT = textwrap.dedent("""\
    import json, os, sys, time

    def busy(seconds):
        end = time.process_time() + seconds
        n = 0
        while time.process_time() < end:
            n += 1
        return n

    def report():
        with open(os.environ["REPORT"], "w") as f:
            json.dump({"argv": sys.argv, "name": __name__, "path0": sys.path[0], "file": __file__,
                       "cwd_on_path": os.getcwd() in sys.path}, f)

    if __name__ == "__main__":
        report()
        busy(float(os.environ.get("BUSY", "0.3")))
        action = sys.argv[1] if len(sys.argv) > 1 else ""
        if action == "exit":
            sys.exit(int(sys.argv[2]))
        if action == "exit-message":
            sys.exit("leaving with a message")
        if action == "raise":
            raise RuntimeError("script failed on purpose")
""")


def cli(args, cwd, busy="0.3", timeout=120, env=None):
    env = dict(os.environ, REPORT=str(cwd / "report.json"), BUSY=busy, PYTHONPATH="", **(env or {}))
    return subprocess.run([sys.executable, "-m", "ddprof_nb", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "prog.py").write_text(SCRIPT)
    return tmp_path


def seen(workdir):
    return json.loads((workdir / "report.json").read_text())


@pytest.mark.quick
def test_record_runs_the_script_as_python_would_and_writes_every_output(workdir):
    # GIVEN a script taking arguments that look like options
    # WHEN it is recorded with all three outputs
    r = cli(["record", "--interval", "5ms", "-o", "out.pprof", "--folded", "folded", "--html", "out.html",
             "-l", "run=cli", "--", "scripts/prog.py", "a", "--b", "-c"], workdir)
    # THEN it exits 0 and saw its own argv, __name__ == "__main__", its folder first on
    # sys.path (not the cwd) and an absolute __file__
    assert r.returncode == 0, r.stderr
    info = seen(workdir)
    assert info["argv"][1:] == ["a", "--b", "-c"] and info["argv"][0].endswith("prog.py")
    assert info["name"] == "__main__"
    assert info["path0"] == str(workdir / "scripts")
    assert info["file"] == str(workdir / "scripts" / "prog.py")
    assert not info["cwd_on_path"]
    # AND the profile was written in every format asked for: busy() on top, rooted at
    # the script's module code (no runpy or ddprof_nb frames), labelled
    profile = ddprof_nb.load(workdir / "out.pprof")
    assert profile.top("cpu", n=1)[0].name == "busy"
    roots = {profile.stack_frames(s)[0] for s in set(profile.stack.tolist())}
    main_roots = {f for f in roots if f.filename.endswith("prog.py")}
    assert main_roots and all(f.name == "<module>" for f in main_roots)
    assert not any("runpy" in f.filename or "ddprof_nb" in f.filename for f in profile.frames)
    assert all(ls.get("run") == "cli" for ls in profile.labelsets if len(ls))
    assert profile.metadata.interval_ns == 5_000_000
    assert sorted(p.name for p in (workdir / "folded").iterdir()) == ["cpu.folded", "wall.folded"]
    assert "busy" in (workdir / "folded" / "cpu.folded").read_text()
    assert (workdir / "out.html").read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html")
    # AND one line on stderr says what was written
    assert "ddprof_nb: wrote out.pprof, folded/, out.html" in r.stderr


@pytest.mark.parametrize(
    "args, code, stderr_has",
    [
        (["exit", "7"], 7, None),
        (["exit-message"], 1, "leaving with a message"),
        (["raise"], 1, "RuntimeError: script failed on purpose"),
    ],
)
def test_exit_codes_are_the_scripts_and_the_profile_is_still_written(workdir, args, code, stderr_has):
    # GIVEN a script that exits with a code, with a message, or with an exception
    r = cli(["record", "-o", "p.pprof", "--", "scripts/prog.py", *args], workdir, busy="0.05")
    # THEN the exit code is what `python script.py` gives, and the profile exists
    assert r.returncode == code, r.stderr
    assert (workdir / "p.pprof").stat().st_size > 0
    if stderr_has:
        assert stderr_has in r.stderr
    if args == ["raise"]:
        # the traceback is the script's, as Python prints it: no runpy or ddprof_nb frames
        tb = r.stderr.split("Traceback (most recent call last):")[1]
        assert 'prog.py", line' in tb and "runpy" not in tb and "ddprof_nb" not in tb.split("RuntimeError")[0]


def test_record_module_with_default_output_name(workdir):
    # GIVEN a package runnable with -m, next to the working directory
    pkg = workdir / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(SCRIPT)
    # WHEN it is recorded with -m and no output option
    r = cli(["record", "-e", "cpu", "-m", "mypkg", "x", "--y"], workdir)
    # THEN it ran as `python -m mypkg x --y` would, and mypkg.pprof was written
    assert r.returncode == 0, r.stderr
    info = seen(workdir)
    assert info["name"] == "__main__" and info["argv"][1:] == ["x", "--y"]
    assert info["argv"][0] == str(pkg / "__main__.py")
    assert info["cwd_on_path"]
    profile = ddprof_nb.load(workdir / "mypkg.pprof")
    assert profile.events == (ddprof_nb.EventType.CPU,)
    assert profile.top("cpu", n=1)[0].name == "busy"


@pytest.mark.parametrize(
    "args, message",
    [
        (["record", "--interval", "10xs", "--", "scripts/prog.py"], "invalid interval '10xs'"),
        (["record", "--events", "cpu,nope", "--", "scripts/prog.py"], "unknown EventType 'nope'"),
        (["record", "--frobnicate", "--", "scripts/prog.py"], "unrecognized arguments: --frobnicate"),
        (["record", "--", "scripts/missing.py"], "cannot open script 'scripts/missing.py'"),
        (["record", "-o", "out.unknown", "--", "scripts/prog.py"], "unknown format"),
        (["record", "-o", "nodir/out.pprof", "--", "scripts/prog.py"], "folder 'nodir' does not exist"),
        (["record"], "nothing to run"),
        (["record", "-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
        (["report", "missing.pprof"], "cannot read 'missing.pprof'"),
        (["report", "scripts/prog.py", "--top", "0"], "--top must be at least 1"),
        (["convert", "scripts/prog.py", "x.pprof"], "scripts/prog.py"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_errors_are_one_line_on_stderr_with_exit_code_2(workdir, monkeypatch, capsys, args, message):
    # GIVEN a bad command line (run in-process: main() is what `python -m` calls)
    from ddprof_nb.__main__ import main

    monkeypatch.chdir(workdir)
    monkeypatch.setenv("REPORT", str(workdir / "report.json"))
    # WHEN it runs
    code = main(args)
    err = capsys.readouterr().err
    # THEN one line on stderr names the problem, exit code 2, and the script never ran
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert message in lines[0]
    assert not (workdir / "report.json").exists()


@pytest.mark.quick
def test_convert_and_report(workdir, monkeypatch, capsys):
    # GIVEN a recorded profile
    assert cli(["record", "-e", "cpu", "-o", "rec.pprof", "--", "scripts/prog.py"], workdir).returncode == 0
    from ddprof_nb.__main__ import main

    monkeypatch.chdir(workdir)
    # WHEN it is converted to speedscope, then to folded, and reported
    codes = [main(["convert", "rec.pprof", "rec.speedscope.json"]),
             main(["convert", "rec.speedscope.json", "cpu.folded"])]
    capsys.readouterr()
    codes.append(main(["report", "rec.pprof", "--top", "3"]))
    out = capsys.readouterr().out.splitlines()
    # THEN the conversions keep the samples and the report's first row is busy()
    assert codes == [0, 0, 0]
    original = ddprof_nb.load(workdir / "rec.pprof")
    assert ddprof_nb.load(workdir / "rec.speedscope.json").total("cpu") == original.total("cpu")
    assert "busy" in (workdir / "cpu.folded").read_text()
    assert out[0].startswith("ddprof [rec.pprof]: ")
    header = next(i for i, ln in enumerate(out) if ln.startswith("CPU time: top 3 functions"))
    assert out[header + 1].split()[0] == "self"
    assert "busy" in out[header + 2]


def test_record_no_native_alloc(workdir):
    # GIVEN a script making numpy arrays, recorded with -e alloc with and without --no-native-alloc
    (workdir / "scripts" / "arrays.py").write_text(
        "import numpy as np\narrays = [np.ones(1_000_000) for _ in range(20)]\n")
    leaves = {}
    for extra in ([], ["--no-native-alloc"]):
        r = cli(["record", "-e", "alloc", "-o", "a.pprof", *extra, "--", "scripts/arrays.py"], workdir)
        assert r.returncode == 0, r.stderr
        profile = ddprof_nb.load(workdir / "a.pprof")
        leaves[bool(extra)] = {profile.stack_frames(s)[-1].name for s in set(profile.stack.tolist())}
    # THEN the arrays' data is a [numpy] leaf by default, and absent with the flag
    assert "[numpy]" in leaves[False], leaves
    assert "[numpy]" not in leaves[True], leaves


# ---- every option of every subcommand ---------------------------------------------------
# One check per option (subcommand, dest), walked from the parsers themselves: an option
# added without a check here fails test_every_option_has_a_check.  Each check compares a
# run with the option against the run without it (``base``), so it could fail.

WALK = textwrap.dedent("""\
    import subprocess, sys, time

    def busy(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass

    def deep(n):
        return deep(n - 1) if n else busy(0.3)

    if __name__ == "__main__":
        blocks = [bytearray(100_000) for _ in range(200)]
        deep(8)
        subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.1\\n"
                        "while time.process_time() < end: pass"], check=True)
""")
# numpy's BLAS on two threads of its own (OPENBLAS_NUM_THREADS=2 in its environment: `record`
# imports numpy before the script runs): CPU on threads that run no Python
BLAS = textwrap.dedent("""\
    import time
    import numpy as np

    a = np.random.default_rng(0).random((400, 400))
    end = time.process_time() + 0.6
    while time.process_time() < end:
        a @ a
""")
TARGET = textwrap.dedent("""\
    import time

    def waiting_here():
        while True:
            time.sleep(0.01)

    print("ready", flush=True)
    waiting_here()
""")
# an example of each in-process option: refused with --pid, by name
IN_PROCESS_ONLY = {
    "alloc_rate": ["--alloc-rate", "64KiB"], "no_native_alloc": ["--no-native-alloc"],
    "engine": ["--engine", "python"], "asyncio": ["--asyncio", "off"], "max_depth": ["--max-depth", "3"],
    "children": ["--children"], "native": ["--native"], "native_threads": ["--native-threads", "raw"],
    "interpreter_frames": ["--native", "--interpreter-frames"],
}


class Runs:
    """The runs every check reads: made once for the module."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from ddprof_nb.__main__ import main

    d = tmp_path_factory.mktemp("walk")
    (d / "scripts").mkdir()
    (d / "scripts" / "walk.py").write_text(WALK)
    (d / "scripts" / "blas.py").write_text(BLAS)
    r = Runs()
    r.dir = d
    r.all = cli(["record", "-e", "cpu,wall,alloc", "-i", "5ms", "--alloc-rate", "64KiB", "--no-native-alloc",
                 "--asyncio", "off", "--max-depth", "3", "--children", "-l", "run=cli", "-o", "all.pprof",
                 "--folded", "folded", "--html", "all.html", "--", "scripts/walk.py"], d)
    r.base = cli(["record", "-o", "base.pprof", "--", "scripts/walk.py"], d)
    r.python = cli(["record", "--engine", "python", "-o", "py.pprof", "--", "scripts/walk.py"], d)
    r.native = cli(["record", "--native", "-e", "cpu", "-o", "native.pprof", "--", "scripts/walk.py"], d)
    r.interp = cli(["record", "--native", "--interpreter-frames", "-e", "cpu", "-o", "interp.pprof", "--",
                    "scripts/walk.py"], d)
    r.pools = cli(["record", "-e", "cpu", "-o", "pools.pprof", "--", "scripts/blas.py"], d,
                  env={"OPENBLAS_NUM_THREADS": "2"})
    r.no_pools = cli(["record", "--native-threads", "off", "-e", "cpu", "-o", "no_pools.pprof", "--", "scripts/blas.py"], d,
                     env={"OPENBLAS_NUM_THREADS": "2"})
    for run in (r.all, r.base, r.python, r.native, r.interp, r.pools, r.no_pools):
        assert run.returncode == 0, run.stderr
    r.p_all, r.p_base, r.p_python, r.p_native, r.p_interp, r.p_pools, r.p_no_pools = (
        ddprof_nb.load(d / f) for f in ("all.pprof", "base.pprof", "py.pprof", "native.pprof", "interp.pprof",
                                        "pools.pprof", "no_pools.pprof"))
    (d / "target.py").write_text(TARGET)
    target = subprocess.Popen([sys.executable, str(d / "target.py")], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"
        r.pid_run = cli(["record", "--pid", str(target.pid), "--duration", "0.6", "-e", "wall", "-i", "5ms",
                         "-l", "run=pid", "-o", "pid.pprof", "--folded", "pidfolded", "--html", "pid.html"], d)
        r.pid_base = cli(["record", "--pid", str(target.pid), "--duration", "0.3"], d)
        r.dump = cli(["dump", str(target.pid)], d)
    finally:
        target.kill()
        target.wait()
    assert r.pid_run.returncode == 0 and r.pid_base.returncode == 0, r.pid_run.stderr + r.pid_base.stderr
    r.p_pid, r.p_pid_base = ddprof_nb.load(d / "pid.pprof"), ddprof_nb.load(d / f"pid{target.pid}.pprof")
    r.out = {}
    cwd = os.getcwd()
    os.chdir(d)
    try:
        import contextlib
        import io

        for name, argv in {
            "convert": ["convert", "all.pprof", "all.speedscope.json"],
            "report": ["report", "all.pprof"], "top": ["report", "all.pprof", "--top", "2"],
            "event": ["report", "all.pprof", "-e", "wall"], "by": ["report", "all.pprof", "--by", "line"],
            "notes": ["report", "all.pprof", "--notes"],
        }.items():
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                assert main(argv) == 0, argv
            r.out[name] = out.getvalue()
    finally:
        os.chdir(cwd)
    return r


def _helps(command):
    """``-h`` of a subcommand (or of the program) prints its usage and exits 0."""
    from ddprof_nb.__main__ import main
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main([command, "-h"] if command else ["-h"])
    return exit_.value.code == 0 and "usage:" in out.getvalue()


def _events(p):
    return {e.label for e in p.events}


def _labels(p, key):
    """The values of label ``key`` over the profile's samples (None: a sample without it)."""
    return {p.labelsets[i].get(key) for i in set(p.labels.tolist())}


def _python_depth(p):
    return max(sum(1 for f in p.stack_frames(s) if f.kind.label == "python") for s in set(p.stack.tolist()))


def _native_under_python(p):
    """A native frame below a Python one (a pool thread's [library] frame, under [native threads], is not)."""
    return any(any(f.kind is FrameKind.NATIVE for f in fr[i:])
               for fr in map(p.stack_frames, set(p.stack.tolist()))
               for i, f in enumerate(fr) if f.kind is FrameKind.PYTHON)


def _pool_frames(p):
    """Frames that only threads running no Python give: [pool: ...] or [native threads]."""
    return {f.name for f in p.frames if f.name.startswith("[pool: ") or f.name == "[native threads]"}


def _table_rows(text):
    return [ln for ln in text.splitlines() if "%" in ln and not ln.lstrip().startswith("self")]


CHECKS = {
    ("", "help"): lambda r: _helps(""),
    ("", "command"): lambda r: r.out["report"] != r.out["convert"],
    ("record", "help"): lambda r: _helps("record"),
    ("record", "events"): lambda r: _events(r.p_all) >= {"cpu", "wall", "alloc"} and "alloc" not in _events(r.p_base),
    ("record", "interval"): lambda r: r.p_all.metadata.interval_ns == 5_000_000 != r.p_base.metadata.interval_ns,
    ("record", "alloc_rate"): lambda r: any("mean 64.0 KiB" in n for n in r.p_all.metadata.notes),
    ("record", "no_native_alloc"): lambda r: any("native_alloc=False" in n for n in r.p_all.metadata.notes),
    ("record", "engine"): lambda r: r.p_python.metadata.engine == "python" != r.p_base.metadata.engine,
    ("record", "asyncio"): lambda r: (not any(n.startswith("asyncio:") for n in r.p_all.metadata.notes)
                                      and any(n.startswith("asyncio:") for n in r.p_base.metadata.notes)),
    ("record", "max_depth"): lambda r: _python_depth(r.p_all) <= 3 < _python_depth(r.p_base),
    ("record", "native"): lambda r: _native_under_python(r.p_native) and not _native_under_python(r.p_base),
    ("record", "interpreter_frames"): lambda r: ("_PyEval_EvalFrameDefault" in {f.name for f in r.p_interp.frames}
                                                 and "_PyEval_EvalFrameDefault" not in {
                                                     f.name for f in r.p_native.frames}),
    ("record", "native_threads"): lambda r: (_pool_frames(r.p_pools) and not _pool_frames(r.p_no_pools)),
    ("record", "children"): lambda r: len(_labels(r.p_all, "pid") - {None}) == 2 and _labels(r.p_base, "pid") == {None},
    ("record", "label"): lambda r: (_labels(r.p_all, "run") == {"cli"} and _labels(r.p_pid, "run") == {"pid"}
                                    and _labels(r.p_base, "run") == {None}),
    ("record", "output"): lambda r: (r.dir / "all.pprof").is_file() and (r.dir / "pid.pprof").is_file(),
    ("record", "folded"): lambda r: ((r.dir / "folded" / "cpu.folded").is_file()
                                     and (r.dir / "pidfolded" / "wall.folded").is_file()),
    ("record", "html"): lambda r: (r.dir / "all.html").is_file() and (r.dir / "pid.html").is_file(),
    ("record", "pid"): lambda r: r.p_pid.metadata.engine == "remote" and "waiting_here" in {
        f.name for f in r.p_pid.frames},
    ("record", "duration"): lambda r: (0.5e9 < r.p_pid.metadata.duration_ns < 5e9
                                       and r.p_pid_base.metadata.duration_ns < r.p_pid.metadata.duration_ns),
    ("dump", "help"): lambda r: _helps("dump"),
    ("dump", "pid"): lambda r: r.dump.returncode == 0 and "waiting_here" in r.dump.stdout,
    ("convert", "help"): lambda r: _helps("convert"),
    ("convert", "input"): lambda r: ddprof_nb.load(r.dir / "all.speedscope.json").total("cpu") == r.p_all.total("cpu"),
    ("convert", "output"): lambda r: (r.dir / "all.speedscope.json").is_file(),
    ("report", "help"): lambda r: _helps("report"),
    ("report", "input"): lambda r: r.out["report"].startswith("ddprof [all.pprof]: native engine"),
    ("report", "top"): lambda r: len(_table_rows(r.out["top"])) == 2 * len(r.p_all.events) < len(
        _table_rows(r.out["report"])),
    ("report", "event"): lambda r: "Wall time: top" in r.out["event"] and "CPU time: top" not in r.out["event"],
    ("report", "by"): lambda r: "top 20 lines" in r.out["by"] and "top 20 lines" not in r.out["report"],
    ("report", "notes"): lambda r: (r.out["notes"].count("\nnote: ") >= 3 and "top 20" not in r.out["notes"]
                                    and "note: " not in r.out["report"]),
}


def _options():
    from ddprof_nb.__main__ import _parser, subcommands

    yield from (("", a.dest) for a in _parser()._actions)
    for name, parser in subcommands().items():
        yield from ((name, a.dest) for a in parser._actions)


def test_every_option_has_a_check():
    options = set(_options())
    assert ("record", "folded") in options and ("report", "notes") in options  # the walk reads the parsers
    assert options == set(CHECKS), f"no check: {options - set(CHECKS)}; stale: {set(CHECKS) - options}"


@pytest.mark.parametrize("option", sorted(CHECKS), ids=lambda o: f"{o[0] or 'prog'}:{o[1]}")
def test_every_option_does_what_it_says(runs, option):
    assert CHECKS[option](runs), option


def test_every_in_process_option_is_refused_with_pid_by_name(monkeypatch, capsys):
    from ddprof_nb.__main__ import PID_OPTIONS, main, subcommands

    record = {a.dest for a in subcommands()["record"]._actions}
    assert set(IN_PROCESS_ONLY) == record - PID_OPTIONS  # every record option is one or the other
    for dest, args in IN_PROCESS_ONLY.items():
        code = main(["record", "--pid", "1", *args])
        err = capsys.readouterr().err
        assert code == 2 and args[0] in err and "in-process sampler only" in err, (dest, err)


def test_record_ends_with_three_short_lines_and_the_path(runs):
    for run, path in ((runs.all, "all.pprof, folded/, all.html"), (runs.pid_run, "pid.pprof, pidfolded/, pid.html")):
        lines = [ln for ln in run.stderr.splitlines() if ln.startswith("ddprof_nb: ") and "sampling process" not in ln]
        assert 2 <= len(lines) <= 3 and all(len(ln) <= 300 for ln in lines), run.stderr
        assert lines[0].startswith("ddprof_nb: ") and " engine · " in lines[0]
        assert lines[-1] == f"ddprof_nb: wrote {path}"
    assert len([ln for ln in runs.all.stderr.splitlines() if ln.strip()]) <= 3, runs.all.stderr
