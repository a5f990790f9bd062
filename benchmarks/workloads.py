"""Workloads with a measured ground truth, shared by ``bench_cpu.py`` and
``tests/integration/test_accuracy.py``.

Every accuracy workload measures its own truth while it runs (``time.thread_time``
around each call, ``time.perf_counter`` around each thread's life) and returns it, so a
profiler is compared with what actually happened in that run, never with an assumed
ratio.  Run as a script it writes that truth as JSON: that is how out-of-process
profilers (py-spy) sample the very same code::

    python benchmarks/workloads.py cpu3 --cpu 2.0 --json truth.json
    python benchmarks/workloads.py threads --unit 1.0 --json truth.json

Functions that a profiler must find by name (``burn_sixty``, ``hash_worker``...) keep
their work inline, so their self time is their total time in every tool.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import threading
import time
import zlib

# -- (a) three functions burning CPU 60/30/10 ---------------------------------------------

CPU_SHARES = {"burn_sixty": 0.6, "burn_thirty": 0.3, "burn_ten": 0.1}


def burn_sixty(cpu_s: float) -> int:
    end = time.thread_time() + cpu_s
    x = 0
    while time.thread_time() < end:
        for i in range(2000):
            x += i * i
    return x


def burn_thirty(cpu_s: float) -> int:
    end = time.thread_time() + cpu_s
    x = 0
    while time.thread_time() < end:
        for i in range(2000):
            x += i * i
    return x


def burn_ten(cpu_s: float) -> int:
    end = time.thread_time() + cpu_s
    x = 0
    while time.thread_time() < end:
        for i in range(2000):
            x += i * i
    return x


_BURNERS = {"burn_sixty": burn_sixty, "burn_thirty": burn_thirty, "burn_ten": burn_ten}


def cpu_functions(total_cpu_s: float = 2.0, rounds: int = 10, seed: int = 1) -> dict:
    """Run the three burners for ~``total_cpu_s`` CPU seconds in ``rounds`` rounds.

    Round lengths are random (seeded) and the call order is shuffled per round, so the
    workload has no period a 100 Hz sampler could lock onto.  Returns
    ``{"cpu_s": {name: measured thread CPU seconds}, "tid": native id}``.
    """
    rng = random.Random(seed)
    weights = [rng.uniform(0.5, 1.5) for _ in range(rounds)]
    scale = total_cpu_s / sum(weights)
    truth = dict.fromkeys(_BURNERS, 0.0)
    for w in weights:
        names = list(_BURNERS)
        rng.shuffle(names)
        for name in names:
            c0 = time.thread_time()
            _BURNERS[name](CPU_SHARES[name] * w * scale)
            truth[name] += time.thread_time() - c0
    return {"cpu_s": truth, "tid": threading.get_native_id()}


# -- (b)+(c) two GIL-releasing workers (2:1 CPU) beside a sleeping main thread --------------

_HASH_BUF = bytes(range(256)) * 4096  # 1 MiB: sha256 releases the GIL above 2 KiB
_ZLIB_BUF = random.Random(7).randbytes(64 * 1024)  # incompressible: zlib works hard


def hash_worker(cpu_s: float, out: dict) -> None:
    """Burn ``cpu_s`` CPU seconds in hashlib.sha256 (GIL released); record truth in ``out``."""
    t0, c0 = time.perf_counter(), time.thread_time()
    while time.thread_time() - c0 < cpu_s:
        hashlib.sha256(_HASH_BUF).digest()
    out["hash_worker"] = {"tid": threading.get_native_id(), "cpu_s": time.thread_time() - c0,
                          "alive_s": time.perf_counter() - t0}


def compress_worker(cpu_s: float, out: dict) -> None:
    """Burn ``cpu_s`` CPU seconds in zlib.compress (GIL released); record truth in ``out``."""
    t0, c0 = time.perf_counter(), time.thread_time()
    while time.thread_time() - c0 < cpu_s:
        zlib.compress(_ZLIB_BUF, 6)
    out["compress_worker"] = {"tid": threading.get_native_id(), "cpu_s": time.thread_time() - c0,
                              "alive_s": time.perf_counter() - t0}


def threads_workload(unit_s: float = 1.0, gap_s: float = 0.15) -> dict:
    """Main sleeps ``gap_s``, starts hash_worker (2 units of CPU), sleeps ``gap_s``, starts
    compress_worker (1 unit), sleeps until both end, joins them, sleeps ``gap_s``.

    Returns per-thread truth: ``{"threads": {name: {"tid", "cpu_s", "alive_s"}}, "elapsed_s"}``
    where main's ``alive_s`` is the whole elapsed time (it lives throughout).
    """
    t0, c0 = time.perf_counter(), time.thread_time()
    out: dict = {}
    a = threading.Thread(target=hash_worker, args=(2 * unit_s, out), name="hash-worker")
    b = threading.Thread(target=compress_worker, args=(unit_s, out), name="compress-worker")
    time.sleep(gap_s)
    a.start()
    time.sleep(gap_s)
    b.start()
    while a.is_alive() or b.is_alive():
        time.sleep(0.02)
    a.join()
    b.join()
    time.sleep(gap_s)
    elapsed = time.perf_counter() - t0
    out["main"] = {"tid": threading.get_native_id(), "cpu_s": time.thread_time() - c0, "alive_s": elapsed}
    return {"threads": out, "elapsed_s": elapsed}


# -- overhead workloads: fixed amounts of work, timed by the caller -------------------------

def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def call_heavy(units: int) -> None:
    """Pure Python, ~29k small calls per unit (recursive fib(20))."""
    for _ in range(units):
        fib(20)


class Numeric:
    """numpy matmul on modest arrays plus sha256 of 256 KiB per unit (both release the GIL)."""

    def __init__(self, size: int = 160, seed: int = 3):
        import numpy as np

        rng = np.random.default_rng(seed)
        self.a = rng.random((size, size))
        self.b = rng.random((size, size))
        self.buf = rng.bytes(256 * 1024)

    def __call__(self, units: int) -> None:
        a, b, buf = self.a, self.b, self.buf
        for _ in range(units):
            c = a @ b
            hashlib.sha256(buf).digest()
            a = c * 1e-3 + self.a  # keep values bounded, depend on the previous product


def calibrate(work, target_s: float) -> int:
    """Units of ``work`` that take about ``target_s`` seconds (measured, not assumed)."""
    work(1)  # warm caches and lazy imports
    units, spent = 1, 0.0
    while True:
        t0 = time.perf_counter()
        work(units)
        spent = time.perf_counter() - t0
        if spent > 0.05:
            break
        units *= 2
    return max(1, round(units * target_s / spent))


# -- command line: the same workloads in a child process (for py-spy) -------------------------

def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="run a ground-truth workload, write its truth as JSON")
    ap.add_argument("workload", choices=["cpu3", "threads", "call_heavy", "numeric"])
    ap.add_argument("--cpu", type=float, default=2.0, help="cpu3: total CPU seconds")
    ap.add_argument("--rounds", type=int, default=10, help="cpu3: rounds")
    ap.add_argument("--unit", type=float, default=1.0, help="threads: CPU seconds of one unit")
    ap.add_argument("--gap", type=float, default=0.15, help="threads: main's sleeps")
    ap.add_argument("--units", type=int, default=100, help="call_heavy/numeric: units of work")
    ap.add_argument("--json", help="write the truth here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.workload == "cpu3":
        truth = cpu_functions(args.cpu, args.rounds)
    elif args.workload == "threads":
        truth = threads_workload(args.unit, args.gap)
    elif args.workload == "call_heavy":
        call_heavy(args.units)
        truth = {}
    else:
        Numeric()(args.units)
        truth = {}
    truth["run_s"] = time.perf_counter() - t0
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(truth, fh)


if __name__ == "__main__":
    main()
