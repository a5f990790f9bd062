"""Overhead of ``ddprof_nb.profile(dask=client)`` on a two-worker dask job.

    python benchmarks/bench_dask.py [--pairs 30] [--tasks 8] [--work 1000000] [--events cpu,wall]

One LocalCluster (2 worker processes, 1 thread each) serves every run.  A job is
``--tasks`` tasks of fixed pure-Python work (``--work`` loop iterations each), spread
over both workers.  Runs alternate base / profiled (order flipped every pair); each pair
gives a ratio, and the table shows the median over >= 30 pairs with its IQR:

- worker CPU: CPU time the two worker processes spent during the job (process_time,
  profiler threads included) -- the goal's measure, far less sensitive than wall time to
  other load on this shared machine;
- job wall: the job alone, timed inside the profiled block;
- where the workers' extra CPU goes (profiled minus base, ms per job, both workers):
  the drain thread (converts native records in Python every 100 ms), the native
  sampler thread (wall ticks, thread scans), and every other thread (the task thread's
  CPU-timer signal handler, the event loop);
- per-profile fixed cost: worker CPU of the start and stop round trips (sampler start,
  final drain, profile build, pprof encoding), and the end-to-end wall ratio.

The profiler's per-second costs (wall ticks, drain) scale with the job's wall time, not
its CPU time: on a loaded machine the job's wall time stretches and the CPU ratio grows.
So the table also gives the extra CPU per worker per second of job wall, which is the
overhead of a fully busy worker (what an unloaded machine would show).  Quote the load
average printed with the table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time

import ddprof_nb


def work(n: int) -> int:
    """Fixed pure-Python work: ``n`` loop iterations."""
    x = 0
    for i in range(n):
        x = (x + i * i) % 1_000_003
    return x


def cpu_snapshot() -> dict:
    """Runs on a worker: process CPU and CPU by thread kind (seconds)."""
    by_tid = {t.native_id: t.name for t in threading.enumerate()}
    kinds = {"drain": 0.0, "native": 0.0, "other": 0.0}
    for d in os.listdir("/proc/self/task"):
        tid = int(d)
        try:
            s = time.clock_gettime(((~tid) << 3) | 6)  # that thread's CPU clock (CPUCLOCK_SCHED|PERTHREAD)
        except OSError:  # exited meanwhile
            continue
        name = by_tid.get(tid)
        kinds["drain" if name == "ddprof_nb-drain" else "native" if name is None else "other"] += s
    return {"proc": time.process_time(), **kinds}


def delta(a: dict, b: dict) -> dict:
    """Sum over workers of ``b - a`` per key."""
    out: dict[str, float] = {}
    for addr in a:
        if addr in b:
            for k in a[addr]:
                out[k] = out.get(k, 0.0) + b[addr][k] - a[addr][k]
    return out


def job(client, tasks: int, n: int) -> tuple[float, dict]:
    """(wall seconds, worker CPU deltas) for one job."""
    c0 = client.run(cpu_snapshot)
    t0 = time.perf_counter()
    futures = [client.submit(work, n + i, pure=False) for i in range(tasks)]  # n+i: no caching
    client.gather(futures)
    wall = time.perf_counter() - t0
    return wall, delta(c0, client.run(cpu_snapshot))


def quartiles(xs):
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def run(client, args) -> dict:
    """Alternating pairs; lists of per-pair measures."""
    m: dict[str, list] = {k: [] for k in ("cpu_ratio", "wall_ratio", "e2e_ratio", "base_cpu", "prof_cpu", "base_wall",
                                           "prof_wall", "x_drain", "x_native", "x_other", "fixed_cpu")}
    notes = set()
    for i in range(args.pairs):
        pair = {}
        for profiled in ((False, True) if i % 2 == 0 else (True, False)):
            o0 = client.run(cpu_snapshot)
            t0 = time.perf_counter()
            if profiled:
                with ddprof_nb.profile(events=args.events, dask=client) as p:
                    wall, cpu = job(client, args.tasks, args.work)
                notes.update(n for n in p.profile.metadata.notes if n.startswith("dask"))
                if p.profile.metadata.extra.get("dask_workers") != "2":
                    notes.add(f"pair {i}: only {p.profile.metadata.extra.get('dask_workers')} worker profiles")
            else:
                wall, cpu = job(client, args.tasks, args.work)
            outer = time.perf_counter() - t0
            pair[profiled] = (wall, cpu, outer, delta(o0, client.run(cpu_snapshot))["proc"])
        (bw, bc, bo, bproc), (pw, pc, po, pproc) = pair[False], pair[True]
        m["cpu_ratio"].append(pc["proc"] / bc["proc"])
        m["wall_ratio"].append(pw / bw)
        m["e2e_ratio"].append(po / bo)
        m["base_cpu"].append(bc["proc"])
        m["prof_cpu"].append(pc["proc"])
        m["base_wall"].append(bw)
        m["prof_wall"].append(pw)
        for k in ("drain", "native", "other"):
            m["x_" + k].append(pc[k] - bc[k])
        m["fixed_cpu"].append((pproc - pc["proc"]) - (bproc - bc["proc"]))  # start/stop outside the job
    m["notes"] = sorted(notes)
    return m


def report(m: dict, args, load0: float) -> None:
    print(f"bench_dask: Python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
          f"{load0:.1f} at start, {os.getloadavg()[0]:.1f} at end; 2 workers x 1 thread; {args.tasks} tasks x "
          f"{args.work:,} iterations; events {args.events}; {args.pairs} alternating pairs (medians, IQR)")
    print()
    print(f"{'measure':<44} {'base':>9} {'profiled':>9} {'ratio':>8} {'IQR':>16}  goal")

    def ratio_row(name, base, prof, ratios, unit, goal):
        q1, med, q3 = quartiles(ratios)
        verdict = f"<= +2% {'OK' if med <= 1.02 else 'MISSED'}" if goal else "(info)"
        print(f"{name:<44} {statistics.median(base):>8.3f}{unit} {statistics.median(prof):>8.3f}{unit} "
              f"{(med - 1) * 100:>+7.1f}% {(q1 - 1) * 100:>+7.1f}..{(q3 - 1) * 100:+.1f}%  {verdict}")

    ratio_row("worker CPU during the job (both workers)", m["base_cpu"], m["prof_cpu"], m["cpu_ratio"], "s", True)
    ratio_row("job wall", m["base_wall"], m["prof_wall"], m["wall_ratio"], "s", False)
    ratio_row("end-to-end wall (+ start/stop round trips)", m["base_wall"], m["prof_wall"], m["e2e_ratio"], "s", False)
    print()
    extra = [p - b for p, b in zip(m["prof_cpu"], m["base_cpu"])]
    print(f"{'extra worker CPU per job (both workers)':<44} {'ms':>9} {'% of base':>10} {'IQR ms':>16}")
    base = statistics.median(m["base_cpu"])
    for name, xs in (("total", extra), ("  drain thread (Python record conversion)", m["x_drain"]),
                     ("  native sampler thread (wall ticks, scans)", m["x_native"]),
                     ("  other threads (signal handler, loop, ...)", m["x_other"]),
                     ("start + stop, outside the job (fixed)", m["fixed_cpu"])):
        q1, med, q3 = quartiles(xs)
        print(f"{name:<44} {med * 1e3:>9.1f} {med / base * 100:>+9.1f}% {q1 * 1e3:>7.1f}..{q3 * 1e3:.1f}")
    # per-second costs: the profiler's extra CPU per worker per second of job wall; at full
    # worker utilisation (an unloaded machine, a CPU-bound job) that is the overhead
    per_s = [(p - b) / (2 * w) for p, b, w in zip(m["prof_cpu"], m["base_cpu"], m["prof_wall"])]
    util = [b / (2 * w) for b, w in zip(m["base_cpu"], m["base_wall"])]
    q1, med, q3 = quartiles(per_s)
    print()
    print(f"worker utilisation during the base job (CPU / wall): {statistics.median(util) * 100:.0f}% "
          "(below 100%: the machine is loaded and the per-second costs weigh more than on an idle one)")
    print(f"extra CPU per worker per second of job wall: {med * 1e3:.1f} ms/s (IQR {q1 * 1e3:.1f}..{q3 * 1e3:.1f}) "
          f"= {med * 100:+.1f}% for a fully busy worker  <= +2% {'OK' if med <= 0.02 else 'MISSED'}")
    for n in m["notes"]:
        print("note:", n)


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
    load0 = os.getloadavg()[0]
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        job(client, args.tasks, args.work // 10)  # warm up: imports, connections
        with ddprof_nb.profile(events=args.events, dask=client):  # warm up the workers' sampler imports
            job(client, 2, args.work // 10)
        m = run(client, args)
    report(m, args, load0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
