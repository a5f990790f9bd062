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


def cli(args, cwd, busy="0.3", timeout=120):
    env = dict(os.environ, REPORT=str(cwd / "report.json"), BUSY=busy, PYTHONPATH="")
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
