"""CPU attribution against a measured ground truth, for every engine that can run here.

The workloads are benchmarks/workloads.py's (truth = time.thread_time around each call or
inside each thread); the bounds are looser than bench_cpu.py's (±8 points instead of ±3)
so a noisy shared machine does not make the suite flaky.  The native engine runs whenever
``NativeEngine.unavailable_reason()`` is None; it is skipped, with the reason, only when
it cannot be imported or says it cannot run here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import ddprof_nb

TOL = 0.08  # ±8 points
SLEEPER_MAX = 0.03  # the sleeping main thread's CPU share (bench_cpu.py: < 1%)

_WORKLOADS = Path(__file__).resolve().parents[2] / "benchmarks" / "workloads.py"
_spec = importlib.util.spec_from_file_location("ddprof_bench_workloads", _WORKLOADS)
workloads = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workloads)


def _engines():
    params = [pytest.param("python", id="python")]
    try:
        from ddprof_nb.engines.native import NativeEngine
    except Exception as exc:  # noqa: BLE001 - any import failure means "not importable"
        params.append(pytest.param("native", id="native", marks=pytest.mark.skip(
            reason=f"native engine not importable: {type(exc).__name__}: {exc}")))
        return params
    reason = NativeEngine.unavailable_reason()
    marks = [pytest.mark.skip(reason=f"native engine unavailable here: {reason}")] if reason else []
    params.append(pytest.param("native", id="native", marks=marks))
    return params


ENGINES = _engines()
# shares within a few points of the thread CPU clocks: other processes on the CPUs move them
pytestmark = pytest.mark.alone


def _shares(values: dict) -> dict:
    total = sum(values.values())
    return {k: v / total for k, v in values.items()}


def _report(measured: dict, truth: dict) -> str:
    return ", ".join(f"{k}: measured {100 * measured[k]:.1f}% truth {100 * truth[k]:.1f}%" for k in truth)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.quick
def test_cpu_split_between_three_functions_matches_thread_time(engine):
    # GIVEN three functions burning CPU 60/30/10 in shuffled rounds of random length
    # (5 ms: enough samples in 0.6 CPU-s; CPU time, not wall, sets the length, and a busy
    # machine stretches it, hence the short run)
    with ddprof_nb.profile(events=("cpu", "wall"), interval="5ms", engine=engine) as h:
        truth = workloads.cpu_functions(total_cpu_s=0.6, rounds=4)
    prof = h.profile
    # WHEN we take each function's CPU (total) from the profile
    assert prof.metadata.engine == engine
    tops = {r.name: r.total for r in prof.top("cpu", n=None)}
    measured = {name: tops.get(name, 0) for name in workloads.CPU_SHARES}
    true_cpu = sum(truth["cpu_s"].values())
    # THEN the profile holds (most of) the CPU burnt, split like the truth within ±8 points
    assert sum(measured.values()) / 1e9 > 0.7 * true_cpu, (measured, true_cpu)
    m, t = _shares(measured), _shares(truth["cpu_s"])
    assert all(abs(m[k] - t[k]) <= TOL for k in t), _report(m, t)


@pytest.mark.parametrize("engine", ENGINES)
def test_cpu_split_between_gil_releasing_threads_beside_a_sleeper(engine):
    # GIVEN two threads burning CPU 2:1 in sha256 / zlib (GIL released) and a sleeping main
    with ddprof_nb.profile(events=("cpu", "wall"), interval="5ms", engine=engine) as h:
        truth = workloads.threads_workload(unit_s=0.2, gap_s=0.05)
    prof = h.profile
    threads = truth["threads"]
    # WHEN we take each thread's CPU from the profile
    measured = {k: prof.filter(threads=[v["tid"]]).total("cpu") for k, v in threads.items()}
    # THEN both workers were seen (they started after the profiler), the split matches the
    # truth within ±8 points and the sleeper has next to no CPU
    assert measured["hash_worker"] > 0 and measured["compress_worker"] > 0, measured
    m, t = _shares(measured), _shares({k: v["cpu_s"] for k, v in threads.items()})
    assert all(abs(m[k] - t[k]) <= TOL for k in t), _report(m, t)
    assert m["main"] < SLEEPER_MAX, _report(m, t)
