"""Helpers for the native-sampler tests (imported as ``nhelpers``).

Risky scenarios run in a subprocess (``run_script``), so a crash of the sampler shows up
as a failed test with its output instead of killing pytest.  Scripts start with
``PRELUDE`` and print one JSON line as their result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap


PRELUDE = textwrap.dedent(
    '''
    import json, os, sys, time, threading, collections
    from ddprof_nb.config import SamplerConfig
    from ddprof_nb.engines.native import NativeEngine
    from ddprof_nb.events import EventType, FrameKind

    def burn(sec):
        t = time.thread_time()
        while time.thread_time() - t < sec:
            pass

    def engine(interval="10ms", events=("cpu", "wall"), max_depth=128, **kw):
        return NativeEngine(SamplerConfig.make(events=events, interval=interval, max_depth=max_depth), **kw)

    def totals(p, event, key):
        out = collections.Counter()
        for s in p.samples():
            if s.event is event:
                out[key(s)] += s.values[1]
        return out

    def py_leaf(s):
        for f in reversed(s.stack):
            if f.kind is FrameKind.PYTHON:
                return f.name
        return s.stack[-1].name

    def timers_of_ours():
        """SIGPROF (27) POSIX timers of this process, from /proc/self/timers."""
        try:
            text = open("/proc/self/timers").read()
        except OSError:
            return -1
        return text.count("signal: 27/")

    def emit(**result):
        print("RESULT " + json.dumps(result))
    '''
)


def run_script(body: str, timeout: float = 60, env: dict | None = None) -> dict:
    """Run PRELUDE + body in a fresh interpreter; return its RESULT json (asserts exit 0).
    ``env``: variables set for it (e.g. a BLAS's thread count: PRELUDE imports numpy, whose
    BLAS reads it at load, before the body runs)."""
    # a hang shows every thread's Python stack instead of a bare timeout
    watchdog = f"import faulthandler; faulthandler.dump_traceback_later({max(timeout - 5, 1)}, exit=True)\n"
    code = watchdog + PRELUDE + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no RESULT line\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])
