"""``python -m ddprof_nb dump PID``: another process's threads, stacks and states, from outside.

The target is a child of the test (ptrace rights under Yama ptrace_scope 1 too) stopped at
a known stack in three threads: the main thread waits in ``main_waits_in_gamma``, one
thread blocks in ``alpha_blocked_on_event`` (its OS name set to ``alpha-os``), one spins in
``delta_spins_holding_gil`` (on CPU, holding the GIL)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import ddprof_nb
from ddprof_nb import remote
from ddprof_nb.engines.native.binding import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=f"native engine: {unavailable_reason()}")

REPO = str(Path(ddprof_nb.__file__).resolve().parent.parent)

TARGET = textwrap.dedent("""\
    import ctypes, sys, threading, time
    stop = threading.Event()
    spinning = threading.Event()

    def alpha_blocked_on_event():
        ctypes.CDLL(None).prctl(15, b"alpha-os", 0, 0, 0)  # PR_SET_NAME: the OS thread name
        stop.wait()

    def delta_spins_holding_gil():
        spinning.set()
        n = 0
        while not stop.is_set():
            n += 1

    def main_waits_in_gamma():
        threads = [threading.Thread(target=alpha_blocked_on_event), threading.Thread(target=delta_spins_holding_gil)]
        for t in threads:
            t.start()
        spinning.wait()
        time.sleep(0.2)
        print("ready", flush=True)
        stop.wait(120)

    main_waits_in_gamma()
""")


def _env(**extra):
    return dict(os.environ, PYTHONPATH=REPO, **extra)


def start_target(tmp_path, python=sys.executable, source=TARGET):
    script = tmp_path / "target.py"
    script.write_text(source)
    proc = subprocess.Popen([python, str(script)], stdout=subprocess.PIPE, text=True, env=_env())
    assert proc.stdout.readline().strip() == "ready"
    return proc


def stop(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


def run_dump(pid, python=sys.executable, **env):
    return subprocess.run([python, "-m", "ddprof_nb", "dump", str(pid)], capture_output=True, text=True,
                          timeout=120, env=_env(**env))


def threads_of(text):
    """{header line: [function names, innermost first]} of a dump."""
    out, current = {}, None
    for line in text.splitlines():
        if line.startswith("Thread "):
            current = out.setdefault(line, [])
        elif line.startswith("    ") and current is not None:
            current.append(line.strip().split(" (")[0])
    return out


def check_dump(text, pid):
    threads = threads_of(text)
    assert len(threads) == 3, text
    assert "innermost call first" in text
    by_func = {}
    for header, funcs in threads.items():
        for name in ("main_waits_in_gamma", "alpha_blocked_on_event", "delta_spins_holding_gil"):
            if name in funcs:
                by_func[name] = (header, funcs)
    assert set(by_func) == {"main_waits_in_gamma", "alpha_blocked_on_event", "delta_spins_holding_gil"}, text
    header, funcs = by_func["main_waits_in_gamma"]
    assert header.startswith(f"Thread {pid} ") and "main thread" in header
    assert funcs[-1] == "<module>" and funcs[-2] == "main_waits_in_gamma"  # innermost first: the root is last
    assert funcs[0] == "Condition.wait"
    header, funcs = by_func["alpha_blocked_on_event"]
    assert '"alpha-os"' in header and "off CPU" in header
    assert funcs.index("alpha_blocked_on_event") < funcs.index("Thread.run")
    header, funcs = by_func["delta_spins_holding_gil"]
    assert funcs[0] == "delta_spins_holding_gil"
    # the spinner is the only thread that wants the GIL: it holds it at nearly every look
    assert "holds the GIL" in header and "on CPU" in header, text
    assert sum("holds the GIL" in h for h in threads) <= 1


def test_dump_names_every_thread_stack(tmp_path):
    proc = start_target(tmp_path)
    try:
        result = run_dump(proc.pid)
        assert result.returncode == 0, result.stderr
        for attempt in range(5):  # the spinner may lose the GIL or the CPU at the instant of a look
            try:
                check_dump(result.stdout, proc.pid)
                break
            except AssertionError:
                if attempt == 4:
                    raise
                result = run_dump(proc.pid)
        assert f"Python {'.'.join(map(str, sys.version_info[:3]))}" in result.stdout
    finally:
        stop(proc)


def test_dump_through_the_api_gives_frames_with_lines(tmp_path):
    proc = start_target(tmp_path)
    try:
        # "ready" is printed just before the wait: until the main thread is in it, a look may
        # still see it at the print
        for _ in range(50):
            with remote.Target(proc.pid) as target:
                threads = target.dump()
            main = threads[0]
            if main.frames and main.frames[0].name == "Condition.wait":
                break
            time.sleep(0.1)
        assert main.main and main.tid == proc.pid
        assert main.frames[0].name == "Condition.wait", main.frames
        gamma = next(f for f in main.frames if f.name == "main_waits_in_gamma")
        assert gamma.filename == str(tmp_path / "target.py")
        assert TARGET.splitlines()[gamma.line - 1].strip() == "stop.wait(120)"
    finally:
        stop(proc)


def _other_versions():
    """Interpreters of other minor versions next to this one (sibling virtualenvs)."""
    here = Path(sys.executable).parent.parent
    out = {}
    for py in sorted(here.parent.glob("*/bin/python")):
        if py.parent.parent == here:
            continue
        got = subprocess.run([str(py), "-c", "import sys, sysconfig; print('%d.%d' % sys.version_info[:2], "
                              "bool(sysconfig.get_config_var('Py_GIL_DISABLED')))"],
                             capture_output=True, text=True)
        ver, _, ft = got.stdout.strip().partition(" ")
        if got.returncode == 0 and ver != "%d.%d" % sys.version_info[:2] and ft == "False":
            out.setdefault(ver, str(py))
    return out


def test_dump_of_another_version_is_read_from_here_without_its_interpreter(tmp_path):
    others = _other_versions()
    if not others:
        pytest.skip("no interpreter of another Python version next to this one")
    ver, python = next(iter(others.items()))
    proc = start_target(tmp_path, python=python)
    try:
        result = run_dump(proc.pid)
        assert result.returncode == 0, result.stderr
        assert f"Python {ver}." in result.stdout and "Python reader" in result.stdout, result.stdout
        assert "alpha_blocked_on_event" in result.stdout and "main_waits_in_gamma" in result.stdout
    finally:
        stop(proc)


def other_version_with_native():
    """(version, interpreter) of the first other version whose ddprof_nb native module is
    usable, or None.  One is enough: the hand-over to the target's interpreter is the same
    code whichever version it is, and each version's own reading of its frames is tested in
    that version's phase (test_dump_names_every_thread_stack)."""
    probe = "import sys, ddprof_nb.engines.native.binding as b; sys.exit(b.unavailable_reason() is not None)"
    for ver, python in _other_versions().items():
        if subprocess.run([python, "-c", probe], env=_env(), capture_output=True).returncode == 0:
            return ver, python
    return None


def test_dump_of_another_version_runs_with_its_interpreter(tmp_path):
    other = other_version_with_native()
    if other is None:
        pytest.skip("no interpreter of another Python version with ddprof_nb's native module built")
    ver, python = other
    proc = start_target(tmp_path, python=python)
    try:
        result = run_dump(proc.pid)
        assert result.returncode == 0, result.stderr
        assert f"Python {ver}." in result.stdout
        assert "alpha_blocked_on_event" in result.stdout and "main_waits_in_gamma" in result.stdout
    finally:
        stop(proc)


def test_dump_of_a_process_that_is_not_python():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        result = run_dump(proc.pid)
        assert result.returncode == 2
        assert f"process {proc.pid}" in result.stderr and "is not a CPython process" in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        stop(proc)


def test_dump_of_no_such_process():
    proc = subprocess.Popen(["true"])
    proc.wait()  # reaped: its pid names no process now (until reused, which takes a while)
    result = run_dump(proc.pid)
    assert result.returncode == 2
    assert result.stderr.strip().endswith(f"no process with id {proc.pid}")


def test_a_process_exiting_between_open_and_dump_is_named(tmp_path):
    proc = start_target(tmp_path)
    target = remote.Target(proc.pid)
    stop(proc)
    with pytest.raises(remote.RemoteError, match=f"process {proc.pid} exited"):
        target.dump()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_no_ptrace_rights_is_said(tmp_path):
    # a non-dumpable target may only be read with CAP_SYS_PTRACE: drop it from the reader
    source = TARGET.replace("import ctypes, sys, threading, time\n",
                            "import ctypes, sys, threading, time\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n")
    proc = start_target(tmp_path, source=source)
    try:
        result = subprocess.run(["setpriv", "--bounding-set=-sys_ptrace", sys.executable, "-m", "ddprof_nb", "dump",
                                 str(proc.pid)], capture_output=True, text=True, timeout=120, env=_env())
        assert result.returncode == 2
        assert f"no permission to read process {proc.pid}" in result.stderr, result.stderr
        assert proc.poll() is None  # the target is unharmed
    finally:
        stop(proc)


def test_permission_help_names_yama_and_the_way_out(monkeypatch):
    monkeypatch.setattr(remote, "_yama_scope", lambda: 1)
    text = remote.permission_help(os.getpid())
    assert "ptrace_scope is 1" in text and "%ddprof allow-attach" in text and "kernel.yama.ptrace_scope=0" in text
    monkeypatch.setattr(remote, "_yama_scope", lambda: 2)
    assert "sudo" in remote.permission_help(os.getpid())
    monkeypatch.setattr(remote, "_yama_scope", lambda: 3)
    assert "reboot" in remote.permission_help(os.getpid())


def test_the_target_survives_a_dump(tmp_path):
    proc = start_target(tmp_path)
    try:
        for _ in range(3):
            assert run_dump(proc.pid).returncode == 0
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        stop(proc)


CHURN = textwrap.dedent("""\
    import threading, time

    def deep(n):
        if n:
            return deep(n - 1)
        time.sleep(0.001)

    def short_lived():
        deep(50)

    def churn():
        # threads start and end, code objects are made and freed, stacks grow and shrink
        i = 0
        while True:
            t = threading.Thread(target=short_lived)
            t.start()
            ns = {}
            exec(f"def made_{i % 7}(k):\\n    return sum(range(k))", ns)
            ns[f"made_{i % 7}"](1000)
            deep(i % 300)
            t.join()
            i += 1

    for _ in range(3):
        threading.Thread(target=churn, daemon=True).start()
    print("ready", flush=True)
    time.sleep(120)
""")


def test_dumps_and_records_of_a_churning_process_never_crash_either_side(tmp_path):
    proc = start_target(tmp_path, source=CHURN)
    try:
        for _ in range(3):  # the command line, as a user runs it
            result = run_dump(proc.pid)
            assert result.returncode in (0, 2), result.stderr
            assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
            if result.returncode == 0:
                assert "Thread " in result.stdout
            else:  # a stack that kept changing is said, never guessed
                assert result.stderr.startswith("python -m ddprof_nb"), result.stderr
        # many more reads in one reading process (one interpreter start-up instead of one a
        # read): it must end normally, each read a dump or the error that says the stack changed
        reads = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            from ddprof_nb import remote
            done = changed = 0
            for _ in range(30):
                try:
                    text = remote.dump_text({proc.pid})
                except remote.RemoteError as exc:  # said, never guessed
                    assert isinstance(exc, remote.TornRead) or "kept changing" in str(exc), exc
                    changed += 1
                else:
                    assert "Thread " in text, text
                    done += 1
            print("reads", done, changed)
            """)], capture_output=True, text=True, timeout=120, env=_env())
        assert reads.returncode == 0 and "Traceback" not in reads.stderr, reads.stderr
        print(reads.stdout.strip(), "(dumps, stacks that kept changing)")
        done, changed = map(int, reads.stdout.split()[1:3])
        assert done + changed == 30 and done > 0, reads.stdout
        out = tmp_path / "churn.pprof"
        rec = subprocess.run([sys.executable, "-m", "ddprof_nb", "record", "--pid", str(proc.pid), "--duration", "1",
                              "-o", str(out)], capture_output=True, text=True, timeout=120, env=_env())
        assert rec.returncode == 0, rec.stderr
        assert out.stat().st_size > 0
        assert proc.poll() is None
    finally:
        stop(proc)


def test_interpreter_names_give_version_and_build():
    assert remote._version_in_name("/usr/lib/x86_64-linux-gnu/libpython3.12.so.1.0") == (3, 12)
    assert remote._version_in_name("/opt/py/lib/libpython3.6m.so.1.0") == (3, 6)
    assert remote._version_in_name("/usr/bin/python3.13t") == (3, 13)
    assert remote._version_in_name("/usr/bin/sleep") is None
    assert remote._free_threaded_name("/opt/py/lib/libpython3.13t.so.1.0")
    assert remote._free_threaded_name("/usr/bin/python3.14t")
    assert not remote._free_threaded_name("/opt/py/lib/libpython3.13.so.1.0")
    assert not remote._free_threaded_name("/usr/bin/python3.13")


def test_dump_of_a_python_older_than_3_11_names_its_version():
    # an older CPython installed next to this one (pyenv, /opt/python...), if any
    installs = Path(sys.base_prefix).parent
    old = None
    for py in sorted(installs.glob("*/bin/python[23].*")):
        if not re.fullmatch(r"python\d\.\d+", py.name) or not os.access(py, os.X_OK):
            continue
        major, minor = map(int, py.name[len("python"):].split("."))
        if (major, minor) < (3, 11):
            old = (py, f"{major}.{minor}")
            break
    if old is None:
        pytest.skip("no CPython older than 3.11 installed next to this one")
    proc = subprocess.Popen([str(old[0]), "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        result = run_dump(proc.pid)
        assert result.returncode == 2
        assert f"runs CPython {old[1]} " in result.stderr and "3.11 and later" in result.stderr, result.stderr
    finally:
        stop(proc)


def test_dump_of_a_static_python_finds_its_symbols_in_the_executable(tmp_path):
    # distributions' /usr/bin/python3.X often link libpython in: _PyRuntime is the executable's
    want = "python%d.%d" % sys.version_info[:2]
    candidates = [p for d in ("/usr/bin", "/usr/local/bin") for p in [Path(d) / want] if p.exists()]
    for python in candidates:
        proc = start_target(tmp_path, python=str(python))
        try:
            with open(f"/proc/{proc.pid}/maps") as f:
                if "libpython" in f.read():
                    continue  # a shared build: not what this test is about
            result = run_dump(proc.pid)
            assert result.returncode == 0, result.stderr
            assert f"({os.path.realpath(python)})" in result.stdout.splitlines()[1]
            assert "alpha_blocked_on_event" in result.stdout and "main_waits_in_gamma" in result.stdout
            return
        finally:
            stop(proc)
    pytest.skip(f"no statically linked {want} in /usr/bin or /usr/local/bin")
