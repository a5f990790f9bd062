"""One install reads every CPython 3.11 to 3.15: ``dump`` and ``record --pid`` run by this
interpreter name the functions of a target of another minor version (pyenv's 3.12 and 3.13,
the chroot's 3.14 and 3.15 as root), read with the target's own layout by the Python reader.

The target stops at a known stack in two threads: the main thread in
``Outer.method_waits`` -> ``middle_calls_leaf`` -> ``leaf_waits_ünïcode`` (a non-ASCII name:
a two-kind str), a thread named ``spinner-os`` spinning in ``worker_spins`` (on CPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ddprof_nb
from ddprof_nb import remote
from ddprof_nb.loading import load

try:
    from test_magics import run, shell  # noqa: F401 - the shared IPython shell fixture
except (ImportError, pytest.skip.Exception):  # no IPython: the magics test alone is skipped
    run = None

    @pytest.fixture
    def shell():
        pytest.skip("IPython is not installed")

REPO = str(Path(ddprof_nb.__file__).resolve().parent.parent)
CHROOT = Path(REPO) / "tools" / "pychroot.sh"
HERE = "%d.%d" % sys.version_info[:2]

TARGET = textwrap.dedent("""\
    import ctypes, threading, time
    stop = threading.Event()
    spinning = threading.Event()

    def leaf_waits_ünïcode():
        stop.wait(120)

    def middle_calls_leaf():
        leaf_waits_ünïcode()

    def worker_spins():
        ctypes.CDLL(None).prctl(15, b"spinner-os", 0, 0, 0)  # PR_SET_NAME: the OS thread name
        spinning.set()
        n = 0
        while not stop.is_set():
            n += 1

    class Outer:
        def method_waits(self):
            threading.Thread(target=worker_spins).start()
            spinning.wait()
            time.sleep(0.2)
            print("ready", flush=True)
            middle_calls_leaf()

    Outer().method_waits()
""")
LEAF_LINE = TARGET.splitlines().index("    stop.wait(120)") + 1


def _pyenv_python(minor: str) -> str | None:
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = sorted(Path(root).glob(f"versions/{minor}.*/bin/python3"))
    return str(found[0]) if found else None


def _target_argv(minor: str, script: Path) -> list[str]:
    if minor in ("3.14", "3.15"):
        if os.geteuid() != 0:
            pytest.skip(f"CPython {minor} runs in the chroot of tools/pychroot.sh, which needs root")
        # the chroot sees its own file system: the script goes in as a -c string
        return [str(CHROOT), "run", minor, "--", f"python{minor}", "-c", script.read_text()]
    python = _pyenv_python(minor)
    if python is None:
        pytest.skip(f"no CPython {minor} from pyenv here (CI has it)")
    return [python, str(script)]


@pytest.fixture
def target(request, tmp_path):
    minor = request.param
    if minor == HERE:
        pytest.skip(f"CPython {minor} is this interpreter: the native walker reads it (test_remote_dump)")
    script = tmp_path / "target.py"
    script.write_text(TARGET, encoding="utf-8")
    proc = subprocess.Popen(_target_argv(minor, script), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYCHROOT_QUIET="1"), start_new_session=True)
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        err = proc.stderr.read()
        if minor in ("3.14", "3.15") and "pychroot" in err:
            pytest.skip(f"the chroot does not run here: {err.strip()[-300:]}")
        raise AssertionError(f"the {minor} target did not start: {err}")
    pid = _python_pid(proc.pid, minor)
    yield minor, pid
    os.killpg(proc.pid, 9)
    proc.wait(timeout=30)


def _python_pid(pid: int, minor: str) -> int:
    """The target interpreter's pid: the chroot's runner starts it as a descendant."""
    todo = [pid]
    while todo:
        p = todo.pop()
        exe = os.path.basename(os.path.realpath(f"/proc/{p}/exe"))
        if exe.startswith(f"python{minor}"):
            return p
        children = Path(f"/proc/{p}/task/{p}/children")
        todo += [int(c) for c in children.read_text().split()] if children.exists() else []
    raise AssertionError(f"no python{minor} process under {pid}")


VERSIONS = ["3.12", "3.13", *(pytest.param(m, marks=[pytest.mark.slow, pytest.mark.chroot]) for m in ("3.14", "3.15"))]


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddprof_nb", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=REPO))


@pytest.mark.parametrize("target", VERSIONS, indirect=True)
def test_dump_names_the_functions_of_another_version(target):
    minor, pid = target
    done = _cli("dump", str(pid))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(rf"^Python {re.escape(minor)}\.\d+ .*Python reader", out, re.M), out
    main = out.split("Thread ")[1]
    assert "main thread" in main
    names = re.findall(r"^    (\S+) \(", main, re.M)
    inner = [n for n in names if n in ("leaf_waits_ünïcode", "middle_calls_leaf", "Outer.method_waits")]
    assert inner == ["leaf_waits_ünïcode", "middle_calls_leaf", "Outer.method_waits"], out
    assert re.search(rf"^    leaf_waits_ünïcode \((\S*target\.py|<string>):{LEAF_LINE}\)$", main, re.M), out
    spinner = [t for t in out.split("Thread ")[2:] if '"spinner-os"' in t]
    assert spinner and "worker_spins" in spinner[0], out


@pytest.mark.parametrize("target", VERSIONS, indirect=True)
def test_record_pid_samples_another_version(target, tmp_path):
    minor, pid = target
    out = tmp_path / "p.pprof"
    done = _cli("record", "--pid", str(pid), "--duration", "1", "-o", str(out))
    assert done.returncode == 0, done.stderr
    profile = load(str(out))
    assert profile.metadata.python_version.startswith(minor + ".")
    stacks = [[f.name for f in s.stack] for s in profile.samples() if s.stack]
    calls = ["Outer.method_waits", "middle_calls_leaf", "leaf_waits_ünïcode"]  # root first
    assert any(st[i:i + 3] == calls for st in stacks for i in range(len(st))), stacks
    assert any("worker_spins" in st for st in stacks), stacks
    assert any("Python reader" in n for n in profile.metadata.notes), profile.metadata.notes


def test_a_version_it_cannot_read_is_refused_by_name(tmp_path):
    python = _pyenv_python("3.10")
    if python is None:
        pytest.skip("no CPython 3.10 from pyenv here")
    script = tmp_path / "old.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([python, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        done = _cli("dump", str(proc.pid))
        assert done.returncode == 2
        assert "CPython 3.10" in done.stderr and "3.11 and later" in done.stderr, done.stderr
        with pytest.raises(remote.RemoteError, match="3.10"):
            remote.Target(proc.pid)
    finally:
        proc.kill()
        proc.wait()



@pytest.mark.parametrize("target", ["3.12"], indirect=True)
def test_magics_dump_and_attach_read_another_version(target, shell, capsys):
    from ddprof_nb.history import history

    minor, pid = target
    res, _ = run(shell, f"%ddprof dump {pid}")
    assert res.success
    out = capsys.readouterr()
    assert "leaf_waits_ünïcode" in out.out and "Python reader" in out.out, out
    res, _ = run(shell, f"%ddprof attach {pid} -d 0.5 -o anyversion")
    assert res.success
    profile = history["anyversion"]
    assert profile.metadata.python_version.startswith(minor + ".")
    assert any("middle_calls_leaf" in [f.name for f in s.stack] for s in profile.samples())


@pytest.mark.parametrize("target", ["3.12", "3.13"], indirect=True)
def test_hostile_addresses_are_torn_reads_never_errors(target):
    """Every pointer is checked: a walk started anywhere inside the target's live structures
    (its interpreter, thread states, frames, code objects) ends with a stack or ``Torn``,
    a code object resolved at a wrong address with ``None``; nothing else escapes."""
    from ddprof_nb.remote_walk import Torn

    _minor, pid = target
    with remote.Target(pid) as tg:
        reader = tg._py
        assert reader is not None
        starts = []
        for tstate, tid in tg.threads():
            frames, _ = reader.walk(tstate, tid, 64)
            starts += [tstate, reader.interp] + [code for code, *_ in frames]
        outcomes = {"stack": 0, "torn": 0}
        for base in starts:
            for delta in range(-64, 256, 8):
                reader._top_frame = lambda _ts, _tid, at=base + delta: at
                try:
                    reader.walk(0, 0, 64)
                    outcomes["stack"] += 1
                except Torn:
                    outcomes["torn"] += 1
                assert reader.code(base + delta, 12345) is None
        assert outcomes["torn"] > 0 and sum(outcomes.values()) == len(starts) * 40
