"""``%load_ext ddprof_nb`` and ``%%ddprof`` in a real IPython kernel (jupyter_client).

One kernel (~2-4 s to start) runs the cells a notebook would: it checks what reaches
the frontend — the explorer's widget view with its text/plain and text/html fallbacks
(or the static bundle), the status line, the cell's value — and that a failing cell
still fails after its profile was shown, and that top-level await works inside the
kernel's running event loop."""

from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("ipykernel")
jupyter_client = pytest.importorskip("jupyter_client")

from jupyter_client.manager import start_new_kernel  # noqa: E402

BUSY_CELL = """%%ddprof -l where=kernel
import time
def busy(seconds=0.3):
    end = time.process_time() + seconds
    n = 0
    while time.process_time() < end:
        n += 1
    return n
busy()
21 * 2
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    ipython_dir = tmp_path_factory.mktemp("ipython")
    env = dict(os.environ, IPYTHONDIR=str(ipython_dir), PYDEVD_DISABLE_FILE_VALIDATION="1")
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60, env=env)
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def execute(kc, code):
    """Run ``code``; returns (reply content, iopub messages of this execution)."""
    messages = []
    reply = kc.execute_interactive(code, timeout=60, output_hook=messages.append)
    return reply["content"], messages


def outputs(messages, kind):
    return [m["content"] for m in messages if m["msg_type"] == kind]


def test_ddprof_cell_in_a_real_kernel(kernel):
    # GIVEN a kernel with the extension loaded
    reply, _ = execute(kernel, "%load_ext ddprof_nb")
    assert reply["status"] == "ok"
    # WHEN a cell with a busy loop runs under %%ddprof
    reply, messages = execute(kernel, BUSY_CELL)
    # THEN it succeeded and its last value is the cell's result
    assert reply["status"] == "ok", reply
    count = reply["execution_count"]
    results = outputs(messages, "execute_result")
    assert [r["data"]["text/plain"] for r in results] == ["42"]
    # AND the status line was printed
    stdout = "".join(s["text"] for s in outputs(messages, "stream") if s["name"] == "stdout")
    assert f"ddprof [{count}]: " in stdout and " · cpu " in stdout and " samples" in stdout
    # AND the profile is shown: the widget view where a widget frontend runs (after a
    # static flame graph output, for a notebook reopened without its kernel), or one
    # static display; text/plain and text/html fallbacks name the hot function
    shown = [m["data"] for m in outputs(messages, "display_data")]
    data = dict(shown[-1], **shown[0]) if len(shown) == 2 else shown[0]
    assert len(shown) in (1, 2) and "text/plain" in data and "text/html" in data
    assert "busy" in data["text/plain"] and "busy" in data["text/html"]
    explorer_present = "application/vnd.jupyter.widget-view+json" in shown[-1]
    if len(shown) == 2:
        assert explorer_present and "ddprof-static-fallback" in shown[0]["text/html"]
    if explorer_present:
        assert any(m["msg_type"] == "comm_open" for m in messages)
    # AND the profile in the kernel's history has busy() on top, rooted at the cell
    check = (
        "import ddprof_nb, threading\n"
        f"p = ddprof_nb.history['{count}']\n"
        "tid = threading.get_native_id()\n"
        "mine = [i for i, t in enumerate(p.threads) if t.tid == tid]\n"
        "roots = {p.stack_frames(int(s))[0].filename for s, t in zip(p.stack, p.thread) if t in mine}\n"
        "print(p.top('cpu', n=1)[0].name, sorted(roots), sorted({ls.get('where') for ls in p.labelsets if len(ls)}))\n"
    )
    reply, messages = execute(kernel, check)
    assert reply["status"] == "ok", reply
    text = "".join(s["text"] for s in outputs(messages, "stream"))
    assert text.strip() == f"busy ['Cell In[{count}]'] ['kernel']"


def test_failing_cell_and_top_level_await_in_a_real_kernel(kernel):
    execute(kernel, "%load_ext ddprof_nb")
    # GIVEN a profiled cell that raises
    reply, messages = execute(kernel, "%%ddprof -o failing\nx = sum(range(10**5))\nraise KeyError('missing key')\n")
    # THEN the cell fails as usual (the frontend sees an error reply and traceback),
    # after the profile was stored and displayed
    assert reply["status"] == "error" and reply["ename"] == "KeyError"
    kinds = [m["msg_type"] for m in messages if m["msg_type"] in ("display_data", "error")]
    assert kinds[-1] == "error" and set(kinds[:-1]) == {"display_data"} and len(kinds) in (2, 3)
    traceback = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(outputs(messages, "error")[0]["traceback"]))
    assert "Cell In[" in traceback and "KeyError: 'missing key'" in traceback
    # GIVEN a cell that awaits at top level inside the kernel's running loop
    reply, messages = execute(kernel, "%%ddprof --no-show -o awaited\nimport asyncio\nawait asyncio.sleep(0.2)\n'done'\n")
    # THEN it runs and returns its value; its wait is charged to the cell
    assert reply["status"] == "ok", reply
    assert [r["data"]["text/plain"] for r in outputs(messages, "execute_result")] == ["'done'"]
    reply, messages = execute(kernel, (
        "import ddprof_nb\n"
        "p = ddprof_nb.history['awaited']\n"
        "w = {r.name: r.total for r in p.top('wall', n=None)}\n"
        "print(w.get('[await]', 0) >= 0.1e9, sorted(ddprof_nb.history.list()))\n"
    ))
    text = "".join(s["text"] for s in outputs(messages, "stream"))
    assert text.startswith("True ") and "'awaited'" in text and "'failing'" in text, text
