"""Two real IPython kernels (jupyter_client): one stuck in a long cell, the other asks
``%ddprof kernels`` and ``%ddprof dump`` / ``%ddprof attach`` about it.

The kernels are siblings (both children of the test), so under Yama ptrace_scope 1 the
stuck one must allow it first: it runs ``%ddprof allow-attach``, as a user would."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("ipykernel")
pytest.importorskip("jupyter_client")

from jupyter_client.manager import KernelManager  # noqa: E402

import ddprof_nb  # noqa: E402
from ddprof_nb.engines.native.binding import unavailable_reason  # noqa: E402

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=f"native engine: {unavailable_reason()}")

REPO = str(Path(ddprof_nb.__file__).resolve().parent.parent)


def _text(kc, code, timeout=60):
    out = []

    def hook(msg):
        c = msg["content"]
        if msg["msg_type"] == "stream":
            out.append(c["text"])
        elif msg["msg_type"] in ("execute_result", "display_data"):
            out.append(c["data"].get("text/plain", ""))
        elif msg["msg_type"] == "error":
            out.append("\n".join(c["traceback"]))

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return reply["content"]["status"], "".join(out)


@pytest.fixture
def two_kernels(tmp_path, monkeypatch):
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    env = dict(os.environ, IPYTHONDIR=str(tmp_path / "ipython"), PYTHONPATH=REPO, JUPYTER_RUNTIME_DIR=str(runtime),
               PYDEVD_DISABLE_FILE_VALIDATION="1")
    started = []
    try:
        for _ in range(2):
            # named as a Jupyter server names them: kernel-<id>.json in the runtime folder
            km = KernelManager(kernel_name="python3", connection_file=str(runtime / f"kernel-{uuid.uuid4()}.json"))
            km.start_kernel(env=env)
            kc = km.client()
            kc.start_channels()
            started.append((km, kc))
            kc.wait_for_ready(timeout=90)
        yield started
    finally:
        for km, kc in started:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def test_a_kernel_dumps_and_attaches_to_a_kernel_stuck_in_a_long_cell(two_kernels):
    (km_a, kc_a), (_km_b, kc_b) = two_kernels
    kernel_id = Path(km_a.connection_file).name[len("kernel-"):-len(".json")]
    status, out = _text(kc_a, "%load_ext ddprof_nb\n%ddprof allow-attach")
    assert status == "ok", out
    # kernel A: a long cell (not waited for: the kernel stays busy)
    kc_a.execute("import time\ndef stuck_in_a_long_cell():\n    time.sleep(120)\nstuck_in_a_long_cell()\n")
    status, out = _text(kc_b, "%load_ext ddprof_nb")
    assert status == "ok", out
    status, out = _text(kc_b, "%ddprof kernels")
    assert status == "ok" and kernel_id in out, out
    pid_a = int(next(ln for ln in out.splitlines() if ln.startswith(kernel_id)).split()[1])
    deadline = time.monotonic() + 60
    while True:
        status, out = _text(kc_b, f"%ddprof dump {kernel_id[:8]}")
        assert status == "ok", out
        if "stuck_in_a_long_cell" in out or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert f"Process {pid_a}:" in out and "stuck_in_a_long_cell" in out, out
    main = out[out.index(f"Thread {pid_a} "):]
    main = main[:main.index("\n\n")] if "\n\n" in main else main
    assert "stuck_in_a_long_cell" in main  # the cell runs on the kernel's main thread
    status, out = _text(kc_b, f"%ddprof attach {kernel_id[:8]} -d 1 -o stuck\n"
                              "from ddprof_nb import history\n"
                              "p = history['stuck']\n"
                              "print('STUCK', sum(s.values[1] for s in p.samples() if s.event.label == 'wall' and "
                              "'stuck_in_a_long_cell' in [f.name for f in s.stack]) / 1e9)")
    assert status == "ok", out
    stuck_s = float(out.split("STUCK", 1)[1].split()[0])
    assert 0.7 <= stuck_s <= 1.5, out  # ~1 s of the main thread's wall, in the stuck cell
