"""Threads that run no Python, in real wheels from PyPI: numpy's BLAS, a polars group-by, a
DuckDB query and a numexpr expression (whose threads block every signal, SIGPROF too) run on
their libraries' own worker threads while the calling Python line waits.  By default (``native_threads="attribute"``) the CPU profile holds that CPU, under
the line that asked for it.

Each case runs in a fresh interpreter (the pools' sizes are set by the environment before
import) and measures the process's CPU over the block from inside it, less the profiler's
own threads (``ddprof_nb-*``: the sampler and the drain, left out of every profile)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""\
    import json, sys
    import numpy as np
    import ddprof_nb
    from ddprof_nb.engines.native import process_cpu

    CASE = sys.argv[1]
    if CASE == "numpy":
        a = np.random.default_rng(0).random((1200, 1200))
        def work():
            for _ in range(5):
                a @ a
    elif CASE == "polars":
        import polars as pl
        n = 4_000_000
        rng = np.random.default_rng(0)
        df = pl.DataFrame({"k": rng.integers(0, 100_000, n), "v": rng.random(n)})
        def work():
            for _ in range(3):
                df.group_by("k").agg(pl.col("v").sum().alias("s"), pl.col("v").std().alias("d"))
    elif CASE == "numexpr":
        import numexpr
        numexpr.set_num_threads(2)
        rng = np.random.default_rng(0)
        x, y = rng.random(4_000_000), rng.random(4_000_000)
        def work():
            for _ in range(8):
                numexpr.evaluate("sin(x) * cos(y) + sqrt(x * y)")
    else:
        import duckdb
        con = duckdb.connect()
        con.execute("SET threads = 2")
        con.execute("CREATE TABLE t AS SELECT (random() * 100000)::INT k, random() v FROM range(6000000)")
        def work():
            for _ in range(3):
                con.execute("SELECT k, sum(v), stddev(v) FROM t GROUP BY k").fetchall()

    work()  # warm: the pools exist before the session, as in a notebook's second cell
    with ddprof_nb.profile(events=("cpu",)) as h:
        start = process_cpu.snapshot(names=True)
        work()
        stop = process_cpu.snapshot(names=True)
    own = sum(ns - start.threads.get(tid, (name, 0))[1] for tid, (name, ns) in stop.threads.items()
              if name.startswith("ddprof_nb-"))
    p = h.profile
    cpu = [s for s in p.samples() if s.event.label == "cpu"]
    print("RESULT " + json.dumps({
        "process": stop.process_ns - start.process_ns - own,
        "profile": sum(s.values[1] for s in cpu),
        "under_work": sum(s.values[1] for s in cpu if any(f.name == "work" for f in s.stack)),
        "pool_frames": sorted({f.name for s in cpu for f in s.stack if f.name.startswith("[pool: ")}),
    }))
""")


@pytest.mark.parametrize("case,module", [("numpy", "numpy"), ("polars", "polars"), ("duckdb", "duckdb"),
                                         ("numexpr", "numexpr")])
def test_a_librarys_worker_threads_cpu_is_in_the_profile_under_the_calling_line(tmp_path, case, module):
    pytest.importorskip(module)  # (the pools extra: scripts/test.sh installs it for 3.11)
    # GIVEN a block whose work runs on the library's own 2 worker threads
    script = tmp_path / "pools.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="2", POLARS_MAX_THREADS="2")
    # WHEN it is profiled with the defaults (events=cpu)
    out = subprocess.run([sys.executable, str(script), case], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr
    r = json.loads(next(line[7:] for line in out.stdout.splitlines() if line.startswith("RESULT ")))
    # THEN the profile holds the process's CPU within 5 % (not the calling thread's share:
    #   half or less of it without the pools), part of it through a [pool: <thread>] frame
    assert abs(r["profile"] - r["process"]) <= 0.05 * r["process"], r
    assert r["pool_frames"], r
    # AND at least 90 % of it is under the line that asked, work()
    assert r["under_work"] >= 0.9 * r["profile"], r
