"""``%ddprof kernels``, ``%ddprof dump KERNEL`` and ``%ddprof allow-attach``, through the magic.

The "other kernel" is a kernel-like child process: started, as Jupyter starts kernels,
with ``-f <runtime dir>/kernel-<id>.json``, blocked in ``kernel_like_handles_request``."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("IPython")

import ddprof_nb  # noqa: E402
from ddprof_nb import kernels  # noqa: E402
from ddprof_nb.engines.native.binding import unavailable_reason  # noqa: E402
from test_magics import run, shell  # noqa: E402,F401 - the shared fixture

REPO = str(Path(ddprof_nb.__file__).resolve().parent.parent)
KERNEL_ID = "5e1f0c2a-7b1d-4c55-9a0e-d00dfeed0001"

KERNEL_LIKE = textwrap.dedent("""\
    import sys, threading, time
    busy = "--busy" in sys.argv

    def kernel_like_handles_request():
        if busy:
            end = time.time() + 120
            while time.time() < end:
                pass
        threading.Event().wait(120)

    print("ready", flush=True)
    kernel_like_handles_request()
""")


@pytest.fixture
def kernel_like(tmp_path, monkeypatch):
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    conn = runtime / f"kernel-{KERNEL_ID}.json"
    conn.write_text("{}")
    script = tmp_path / "kernel_like.py"
    script.write_text(KERNEL_LIKE)
    procs = []

    def start(*extra):
        proc = subprocess.Popen([sys.executable, str(script), "-f", str(conn), *extra], stdout=subprocess.PIPE,
                                text=True, env=dict(os.environ, PYTHONPATH=REPO))
        assert proc.stdout.readline().strip() == "ready"
        procs.append(proc)
        return proc

    yield start
    for p in procs:
        p.kill()
        p.wait()


@pytest.mark.quick
def test_kernels_lists_the_kernel_with_its_pid_and_state(shell, kernel_like, capsys):
    proc = kernel_like()
    res, _ = run(shell, "%ddprof kernels")
    assert res.success
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith(KERNEL_ID))
    assert line.split()[1] == str(proc.pid) and line.split()[2] == "idle", out


def test_kernels_tells_a_busy_kernel(kernel_like):
    proc = kernel_like("--busy")
    found = {k.kernel_id: k for k in kernels.list_kernels(look_s=0.5)}
    assert found[KERNEL_ID].pid == proc.pid and found[KERNEL_ID].state == "busy"


@pytest.mark.skipif(unavailable_reason() is not None, reason=f"native engine: {unavailable_reason()}")
@pytest.mark.quick
def test_dump_by_kernel_id_prefix_and_by_pid(shell, kernel_like, capsys):
    proc = kernel_like()
    for spec in (KERNEL_ID[:6], str(proc.pid)):
        res, _ = run(shell, f"%ddprof dump {spec}")
        assert res.success
        out = capsys.readouterr().out
        assert f"Process {proc.pid}:" in out
        lines = [ln.strip() for ln in out.splitlines()]
        main = lines.index(next(ln for ln in lines if ln.startswith(f"Thread {proc.pid} ")))
        funcs = [ln.split(" (")[0] for ln in lines[main + 1:]]
        funcs = funcs[:funcs.index("")] if "" in funcs else funcs
        assert funcs[-3:] == ["Event.wait", "kernel_like_handles_request", "<module>"], out


def test_dump_of_an_unknown_kernel_says_so(shell, kernel_like, capsys):
    kernel_like()
    res, _ = run(shell, "%ddprof dump ffffff")
    assert res.success
    err = capsys.readouterr().err
    assert "no running kernel has an id starting with 'ffffff'" in err


@pytest.mark.quick
def test_allow_attach_sets_and_clears_the_ptracer(shell, capsys):
    res, _ = run(shell, "%ddprof allow-attach -h")
    assert res.success and "Trade-off" in capsys.readouterr().out
    res, _ = run(shell, "%ddprof allow-attach")
    assert res.success
    out = capsys.readouterr().out
    libc = ctypes.CDLL(None, use_errno=True)
    yama = os.path.exists("/proc/sys/kernel/yama/ptrace_scope")
    if yama:
        assert "may now read this kernel" in out
    else:
        # no Yama: PR_SET_PTRACER does not exist, the kernel says EINVAL, and the magic says why
        assert libc.prctl(0x59616D61, ctypes.c_ulong(0), 0, 0, 0) == -1 and ctypes.get_errno() == 22
        assert "no Yama ptrace restriction" in out
    res, _ = run(shell, "%ddprof allow-attach off")
    assert res.success
    out = capsys.readouterr().out
    assert ("may read it again" in out) if yama else ("nothing was changed" in out)
    res, _ = run(shell, "%ddprof allow-attach sometimes")
    assert not res.success


@pytest.mark.skipif(unavailable_reason() is not None, reason=f"native engine: {unavailable_reason()}")
@pytest.mark.quick
def test_attach_samples_another_kernel_into_the_history(shell, kernel_like, capsys):
    from ddprof_nb.events import EventType
    from ddprof_nb.history import history

    proc = kernel_like("--busy")
    res, _ = run(shell, f"%ddprof attach {KERNEL_ID[:8]} -d 1 -o other")
    assert res.success
    profile = history["other"]
    assert profile.metadata.pid == proc.pid and profile.metadata.engine == "remote"
    walls = [s for s in profile.samples() if s.event is EventType.WALL]
    assert walls and all(s.stack[-1].name == "kernel_like_handles_request" for s in walls)
    # a busy loop: its wall is on CPU, and it has CPU samples
    assert sum(s.values[1] for s in walls if s.labels.get("state") == "cpu") >= 0.8 * sum(s.values[1] for s in walls)
    assert any(s.event is EventType.CPU for s in profile.samples())
    res, _ = run(shell, "%ddprof attach nosuchkernel")
    assert not res.success


@pytest.mark.skipif(unavailable_reason() is not None, reason=f"native engine: {unavailable_reason()}")
def test_dump_and_attach_of_a_kernel_of_another_python_version(shell, tmp_path, monkeypatch, capsys):
    from test_remote_dump import other_version_with_native

    from ddprof_nb.history import history

    other = other_version_with_native()
    if other is None:
        pytest.skip("no interpreter of another Python version with ddprof_nb's native module built")
    monkeypatch.setenv("PYTHONPATH", REPO)  # the hand-over to the target's interpreter finds this ddprof_nb
    script = tmp_path / "kernel_like.py"
    script.write_text(KERNEL_LIKE)
    proc = subprocess.Popen([other[1], str(script)], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO))
    try:
        assert proc.stdout.readline().strip() == "ready"
        res, _ = run(shell, f"%ddprof dump {proc.pid}")
        assert res.success
        assert "kernel_like_handles_request" in capsys.readouterr().out
        res, _ = run(shell, f"%ddprof attach {proc.pid} -d 0.5 -o older")
        assert res.success
        walls = [s for s in history["older"].samples() if s.stack]
        assert walls and all("kernel_like_handles_request" in [f.name for f in s.stack] for s in walls)
        assert history["older"].metadata.python_version != ".".join(map(str, sys.version_info[:3]))
    finally:
        proc.kill()
        proc.wait()


def test_kernels_names_notebooks_and_states_a_jupyter_server_knows(shell, kernel_like, capsys, tmp_path):
    import http.server
    import json
    import threading

    proc = kernel_like()  # idle by its CPU time; the server says busy (a cell blocked in a sleep, say)
    token = "s3cret"
    seen = []

    class Sessions(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path != "/api/sessions" or self.headers.get("Authorization") != f"token {token}":
                self.send_response(403)
                self.end_headers()
                return
            body = json.dumps([{"id": "s1", "path": "work/analysis.ipynb", "type": "notebook",
                                "kernel": {"id": KERNEL_ID, "name": "python3", "execution_state": "busy"}}]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Sessions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        runtime = Path(os.environ["JUPYTER_RUNTIME_DIR"])
        (runtime / "jpserver-4242.json").write_text(json.dumps(
            {"url": f"http://127.0.0.1:{server.server_port}/", "token": token, "pid": 4242}))
        (runtime / "jpserver-4243.json").write_text(json.dumps({"url": "http://127.0.0.1:9/", "token": "x"}))  # gone
        res, _ = run(shell, "%ddprof kernels")
        assert res.success
        out = capsys.readouterr().out
        line = next(ln for ln in out.splitlines() if ln.startswith(KERNEL_ID))
        assert line.split()[1:] == [str(proc.pid), "busy", "work/analysis.ipynb"], out
        assert seen == [("/api/sessions", f"token {token}")]
    finally:
        server.shutdown()
