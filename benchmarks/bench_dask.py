"""Overhead of ``ddprof_nb.profile(dask=client)`` on a two-worker dask job.

    python benchmarks/bench_dask.py [--pairs 30] [--tasks 8] [--work 2000000] [--events cpu,wall]

One LocalCluster (2 worker processes, 1 thread each) serves every run.  A job is
``--tasks`` tasks of fixed pure-Python work (``--work`` loop iterations each), spread
over both workers.  Runs alternate base / profiled (order flipped every pair) and each
pair gives a ratio; the table shows the median ratio over >= 30 pairs and its IQR for:

- job: the job alone, timed inside the profiled block (the sampling cost on the workers);
- worker CPU: CPU time the two worker processes spent during the job (process_time,
  sampler threads included) — far less sensitive to other load on the machine than wall;
- end-to-end: the whole ``with profile(dask=client)`` block, so the start/stop round
  trips, the workers' pprof encoding and the merge are included.

Goal: job overhead <= 2%.  Machine load (other processes) widens the IQR; read it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import ddprof_nb


def work(n: int) -> int:
    """Fixed pure-Python work: ``n`` loop iterations."""
    x = 0
    for i in range(n):
        x = (x + i * i) % 1_000_003
    return x


def job(client, tasks: int, n: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds the worker processes spent) for one job."""
    c0 = client.run(time.process_time)
    t0 = time.perf_counter()
    futures = [client.submit(work, n + i, pure=False) for i in range(tasks)]  # n+i: no caching
    client.gather(futures)
    wall = time.perf_counter() - t0
    c1 = client.run(time.process_time)
    return wall, sum(c1[a] - c0[a] for a in c0 if a in c1)


def quartiles(xs):
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--work", type=int, default=1_000_000, help="loop iterations per task")
    ap.add_argument("--events", default="cpu,wall")
    args = ap.parse_args(argv)
    if args.pairs < 4:
        ap.error("--pairs must be at least 4")
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        print("bench_dask: dask.distributed is not installed (pip install 'dask[distributed]')", file=sys.stderr)
        return 2

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        job(client, args.tasks, args.work // 10)  # warm up: imports, connections
        with ddprof_nb.profile(events=args.events, dask=client):  # warm up the workers' sampler imports
            job(client, 2, args.work // 10)
        job_ratio, e2e_ratio, cpu_ratio, base_s, prof_s = [], [], [], [], []
        notes = set()
        for i in range(args.pairs):
            pair = {}
            for profiled in ((False, True) if i % 2 == 0 else (True, False)):
                if profiled:
                    t0 = time.perf_counter()
                    with ddprof_nb.profile(events=args.events, dask=client) as p:
                        inner = job(client, args.tasks, args.work)
                    outer = time.perf_counter() - t0
                    notes.update(n for n in p.profile.metadata.notes if "dask" in n)
                    if p.profile.metadata.extra.get("dask_workers") != "2":
                        notes.add(f"pair {i}: only {p.profile.metadata.extra.get('dask_workers')} worker profiles")
                    pair["prof"] = (inner, outer)
                else:
                    pair["base"] = job(client, args.tasks, args.work)
            base, base_cpu = pair["base"]
            (inner, inner_cpu), outer = pair["prof"]
            cpu_ratio.append(inner_cpu / base_cpu)
            base_s.append(base)
            prof_s.append(inner)
            job_ratio.append(inner / base)
            e2e_ratio.append(outer / base)

    print(f"bench_dask: Python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; 2 workers x 1 thread; {args.tasks} tasks x {args.work:,} iterations; "
          f"events {args.events}; {args.pairs} alternating pairs")
    print()
    print(f"{'measure':<28} {'base median':>12} {'profiled median':>16} {'ratio median':>13} {'ratio IQR':>17}  goal")
    q1, med, q3 = quartiles(job_ratio)
    print(f"{'job (sampling on workers)':<28} {statistics.median(base_s):>11.3f}s {statistics.median(prof_s):>15.3f}s "
          f"{(med - 1) * 100:>+12.1f}% {(q1 - 1) * 100:>+7.1f}..{(q3 - 1) * 100:+.1f}%  <= +2% "
          f"{'OK' if med <= 1.02 else 'MISSED'}")
    q1, med, q3 = quartiles(cpu_ratio)
    print(f"{'worker CPU (process_time)':<28} {'':>12} {'':>16} "
          f"{(med - 1) * 100:>+12.1f}% {(q1 - 1) * 100:>+7.1f}..{(q3 - 1) * 100:+.1f}%  <= +2% "
          f"{'OK' if med <= 1.02 else 'MISSED'}")
    q1, med, q3 = quartiles(e2e_ratio)
    print(f"{'end-to-end (+start/stop)':<28} {statistics.median(base_s):>11.3f}s {'':>16} "
          f"{(med - 1) * 100:>+12.1f}% {(q1 - 1) * 100:>+7.1f}..{(q3 - 1) * 100:+.1f}%  (informational)")
    for n in sorted(notes):
        print("note:", n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
