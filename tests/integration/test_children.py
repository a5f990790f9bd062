"""children=True: child Python processes profile themselves and the parent merges them.

GIVEN a ProcessPoolExecutor under each start method (or a subprocess, or a killed child)
WHEN the parent profiles with children=True
THEN each worker's hot function appears under its pid/process labels, its CPU matches
the CPU time the worker's thread measured (within 10%), and a killed child is named in the notes.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

import ddprof_nb

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child profiling is tested on Linux")

HOT_S = 0.6


def child_hot(seconds: float):
    """Burn ``seconds`` of this thread's CPU; return (pid, the thread's CPU seconds spent here).

    The truth is the thread's own CPU clock, not the process's: the process clock also runs
    for the child's other threads (the profiler's wall and drain threads, the pool's queue
    threads), whose CPU is not child_hot's and grows with the machine's load."""
    t0 = time.thread_time()
    x = 0
    while time.thread_time() - t0 < seconds:
        for i in range(5000):
            x += i
    return os.getpid(), time.thread_time() - t0


def _sleeper(ready):
    ready.set()
    time.sleep(60)


def _check_workers(prof, results, expected_process_prefix):
    pids = {str(pid) for pid, _ in results}
    assert len(pids) == 2, results
    for pid, measured in results:
        sub = prof.filter(labels={"pid": str(pid)}, events="cpu")
        hot = sub.filter(focus="child_hot")
        names = {ls.get("process") for ls in sub.labelsets if ls.get("pid") == str(pid)}
        assert any(n and n.startswith(expected_process_prefix) for n in names), names
        got = hot.total("cpu") / 1e9
        assert got == pytest.approx(measured, rel=0.10), (pid, got, measured, prof.metadata.notes)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_process_pool_each_start_method(method):
    ctx = mp.get_context(method)
    prefix = {"fork": "ForkProcess", "spawn": "SpawnProcess", "forkserver": "ForkServerProcess"}[method]
    with ddprof_nb.profile(events="cpu", children=True) as p:
        with ProcessPoolExecutor(2, mp_context=ctx) as ex:
            # one task per worker: the first to start blocks until the other starts
            results = list(ex.map(child_hot, [HOT_S, HOT_S]))
    prof = p.profile
    if len({pid for pid, _ in results}) < 2:
        pytest.skip("one worker ran both tasks (machine too loaded to place them apart)")
    assert prof.metadata.extra.get("children") == "2", prof.metadata.notes
    _check_workers(prof, results, prefix)
    # the parent's own samples carry process=main
    assert any(ls.get("process") == "main" and ls.get("pid") == str(os.getpid()) for ls in prof.labelsets)


@pytest.mark.quick
def test_python_subprocess():
    code = "import sys; sys.path.insert(0, %r)\nfrom test_children import child_hot\nchild_hot(0.3)" % os.path.dirname(__file__)
    with ddprof_nb.profile(events="cpu", children=True) as p:
        proc = subprocess.run([sys.executable, "-c", code], check=True)
    prof = p.profile
    assert proc.returncode == 0
    hot = prof.filter(focus="child_hot")
    pids = {ls.get("pid") for ls in hot.labelsets if ls.get("process") == "python -c"}
    assert pids and str(os.getpid()) not in pids
    assert hot.total("cpu") / 1e9 == pytest.approx(0.3, rel=0.15)
    assert "DDPROF_NB_CHILD" not in os.environ  # the environment is restored


def test_killed_child_gives_partial_profile_and_names_it():
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    with ddprof_nb.profile(events="cpu", children=True) as p:
        victim = ctx.Process(target=_sleeper, args=(ready,), name="victim")
        victim.start()
        assert ready.wait(20)
        time.sleep(0.3)  # let it write its start marker
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()
        worker = ctx.Process(target=child_hot, args=(0.3,), name="survivor")
        worker.start()
        worker.join()
    prof = p.profile
    assert any(f"pid {victim.pid}" in n and "without writing" in n for n in prof.metadata.notes), prof.metadata.notes
    survivor = prof.filter(labels={"pid": str(worker.pid)}, focus="child_hot")
    assert survivor.total("cpu") > 0.2e9
    assert any(ls.get("process") == "survivor" for ls in survivor.labelsets)


def test_children_false_sees_no_children():
    with ddprof_nb.profile(events="cpu") as p:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert "children" not in p.profile.metadata.extra
    assert not any(ls.get("pid") for ls in p.profile.labelsets)


def test_child_watch_thread_is_not_sampled(tmp_path):
    # the child's own stop-watch thread polls every 0.2 s; under the native engine it is
    # excluded from sampling itself (no park records, no wall samples once it runs), not
    # only filtered out of the profile afterwards.  It excludes itself as its first step,
    # so a wall tick may land between its start and that step (a loaded machine delays
    # the step): those few samples are allowed; every one of its sleeps comes after the
    # step, so no park record is.
    code = f"""
import json, time
from ddprof_nb import children
from ddprof_nb.config import SamplerConfig
spec = {{"dir": {str(tmp_path)!r}, **SamplerConfig.make(events=("wall", "park"), engine="native").to_spec()}}
children._start_child(spec, "test")
time.sleep(0.5)
p = children._child.sampler.stop()
counts = {{}}
for sample in p.samples():
    key = f"{{sample.thread.name}} {{sample.event.label}}"
    counts[key] = counts.get(key, 0) + sample.values[0]
print("COUNTS " + json.dumps(counts))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("COUNTS ")]
    counts = json.loads(line[len("COUNTS "):])
    # THEN the main thread was sampled all along (~50 ticks in 0.5 s); the watch thread,
    # alive as long, only before it excluded itself, and it has no park record
    main = counts.get("MainThread wall", 0)
    assert main >= 10, counts
    assert counts.get("ddprof_nb-child wall", 0) * 4 < main, counts
    assert "ddprof_nb-child park" not in counts, counts
