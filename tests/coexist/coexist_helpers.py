"""Helpers of the coexistence suite (imported as ``coexist_helpers``).

Every scenario runs in a fresh interpreter (``run_snippet``): a deadlock, a fatal signal or
a segfault then fails one test, with its output, instead of hanging or killing pytest.  The
child is ``sys.executable`` with this process's environment, so a run under
scripts/test_sanitize.sh (LD_PRELOAD=libasan, ASAN_OPTIONS) runs the children sanitized too.

Snippets start with ``PRELUDE`` and report through ``emit(key=value, ...)``: each call
prints one ``RESULT {json}`` line, and the lines are merged into one dict (so a snippet
that dies half-way still shows what it had reported).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field

# libasan interposes sem_wait, pthread_cond_wait, ...: the GOT slots of the waits point at
# its interceptors, and the lock/park hooks are (rightly) refused there.
SANITIZED = "libasan" in os.environ.get("LD_PRELOAD", "")

HERE = os.path.dirname(os.path.abspath(__file__))

# the children import the shared workloads, checks and tools from coexist_tools.py
PRELUDE = f"""import sys; sys.path.insert(0, {HERE!r})
from coexist_tools import *
import collections, gc, os, signal, threading, time
"""


@dataclass
class Run:
    """What a snippet's interpreter did: exit code (None: killed after the timeout)."""

    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    result: dict = field(default_factory=dict)

    @property
    def how(self) -> str:
        """'exit N', 'killed by SIGxxx (description)' or 'HANG (timeout)', for messages."""
        if self.rc is None:
            return "HANG: no exit before the timeout (killed)"
        if self.rc == 1 and "Timeout (" in self.stderr and "Thread 0x" in self.stderr:
            return "HANG: the faulthandler watchdog fired (stacks in stderr)"
        if self.rc < 0:
            sig = signal.Signals(-self.rc)
            return f"killed by {sig.name} ({signal.strsignal(sig)})"
        return f"exit {self.rc}"

    def report(self) -> str:
        return (f"{self.how} after {self.seconds:.1f} s\nresult: {self.result}\n"
                f"--- stdout (tail) ---\n{self.stdout[-3000:]}\n--- stderr (tail) ---\n{self.stderr[-4000:]}")

    def ok(self) -> dict:
        """Assert a clean exit (code 0) and return the merged RESULT dict."""
        assert self.rc == 0, self.report()
        assert self.result, "the snippet reported nothing\n" + self.report()
        return self.result


def run_snippet(body: str, timeout: float = 60, *, prelude: bool = True, watchdog: bool = True,
                env: dict | None = None) -> Run:
    """Run ``PRELUDE + body`` in a fresh ``sys.executable`` and return a ``Run``.

    ``watchdog``: faulthandler dumps every thread's Python stack 5 s before the timeout (a
    hang then shows where each thread waits); off for snippets that use
    faulthandler.dump_traceback_later themselves (there is one such timer per process).
    ``env``: extra variables on top of this process's environment (kept whole: LD_PRELOAD).
    """
    code = textwrap.dedent(body)
    if prelude:
        code = PRELUDE + code
    if watchdog:
        code = (f"import faulthandler; faulthandler.dump_traceback_later({max(timeout - 5, 1)}, exit=True)\n"
                + code)
    # a real file, not -c: the lock/park leaves name locks from their source line (linecache)
    with tempfile.NamedTemporaryFile("w", suffix=".py", prefix="coexist_", delete=False) as f:
        f.write(code)
    full_env = dict(os.environ)
    full_env.update(env or {})
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen([sys.executable, f.name], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=full_env, start_new_session=True)
        try:
            if watchdog and timeout > 20:
                # its watchdog shows the Python stacks only: 10 s before it fires, the C stacks
                # (a deadlock on a lock of the loader or ours has no Python frame to show it)
                try:
                    out, err = proc.communicate(timeout=timeout - 10)
                except subprocess.TimeoutExpired:
                    from coexist_tools import print_native_stacks
                    print_native_stacks(proc.pid)
                    out, err = proc.communicate(timeout=10)
            else:
                out, err = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            # the whole process group: children forked by the snippet too
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            rc = None
    finally:
        os.unlink(f.name)
    result: dict = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            try:
                result.update(json.loads(line[len("RESULT "):]))
            except ValueError:
                pass
    return Run(rc, out, err, time.monotonic() - t0, result)


def installed(module: str) -> bool:
    """True when ``module`` imports in the children's interpreter (same venv as pytest)."""
    import importlib.util

    return importlib.util.find_spec(module) is not None
