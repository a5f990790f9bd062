"""Nothing lost under load: many threads that want the GIL, beside a drain that needs it.

    python benchmarks/bench_load.py [--seconds 10] [--rows NAME,...] [--pairs 30]

Each row runs one workload for `--seconds` in one native session (cpu+wall at the row's
interval; every worker thread lives from before the start to after the stop) and compares
what the profile recorded with the threads' own clocks, read right before the start and
right after the stop:

- dropped: samples lost (buffer full, torn reads), from the profile's metadata;
- thinned: samples whose time went to their thread's previous or next record because a
  buffer was full (totals kept, the split between stacks thinned);
- CPU: recorded CPU of the workers / the workers' CPU clocks (pthread_getcpuclockid); the
  profile takes each thread's total from its clock at stop, so "timers" also shows what the
  timer signals alone had accounted, before that (all threads with a timer at stop);
- wall: recorded wall of the workers / workers x the session's length;
- split: the largest difference, in points, between a worker's share of the recorded CPU
  and its share of the clocks' CPU;
- drain CPU: the drain thread's CPU, and the time the native wall thread spent in its ticks
  (sampling, and moving records into the aggregates), in % of the session;
- RSS: the process's resident memory at the end, and its growth over the row.

Goal (nothing lost under load): every row 0 dropped; CPU and wall within 3 % of
the clocks; split within 3 points.  Rows (the goal's table, then two more):

    py8_10ms     8 pure-Python threads, 10 ms
    py8_1ms      8 pure-Python threads, 1 ms
    py64_10ms    64 pure-Python threads, 10 ms
    sleep64      64 threads sleeping 5 ms in a loop + 1 burner, 10 ms
    py32_1ms     32 pure-Python threads, 1 ms
    py256_10ms   256 pure-Python threads, 10 ms

Then rows with threads that run no Python (native_threads="attribute", cpu at 100 Hz): a C
pool (built here with cffi) whose N pthreads, started per call, each do a fixed number of
iterations while the caller waits.  In-process alternating pairs, the order flipped every
pair: the call alone, then the call inside a session (started before it, stopped after: its
start and stop are not timed).  Overhead: the median over the pairs of the call's wall time
with / without, and of the process's CPU over the call, with / without; "dropped" sums
the sessions' dropped samples; "in profile": the median session's CPU over the process's.
Goal: 0 dropped, overhead <= 2 %.

    native8      8 native threads, 10 ms
    native32     32 native threads, 10 ms
    native8_wall, native32_wall   the same, cpu+wall (their WALL samples every 5th tick too)
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

ROWS = {
    "py8_10ms": (8, "10ms", "spin"),
    "py8_1ms": (8, "1ms", "spin"),
    "py64_10ms": (64, "10ms", "spin"),
    "sleep64": (64, "10ms", "sleep"),
    "py32_1ms": (32, "1ms", "spin"),
    "py256_10ms": (256, "10ms", "spin"),
}


def _spin(go: threading.Event, stop: threading.Event, pause: threading.Event, paused: threading.Semaphore) -> None:
    go.wait()
    x = 0
    while not pause.is_set():
        x += 1
    paused.release()
    stop.wait()


def _sleeper(go: threading.Event, stop: threading.Event, pause: threading.Event, paused: threading.Semaphore) -> None:
    go.wait()
    while not pause.is_set():
        time.sleep(0.005)
    paused.release()
    stop.wait()


def _cpu_of(thread: threading.Thread) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run_row(name: str, seconds: float) -> dict:
    from ddprof_nb.engines.native import binding as _binding, session as _session
    from ddprof_nb.config import SamplerConfig
    from ddprof_nb.engines.native import NativeEngine
    from ddprof_nb.events import EventType

    n, interval, kind = ROWS[name]
    # workers block until `go` (after the start) and from `pause` (before the stop): the CPU
    # their clocks count between the two readings lies inside the session, while every worker
    # lives through all of it (beside dozens of spinning threads, starting and stopping a
    # session takes seconds: each GIL hand-back to this thread waits for all of them)
    go, stop, pause, paused = threading.Event(), threading.Event(), threading.Event(), threading.Semaphore(0)
    args = (go, stop, pause, paused)
    workers = [threading.Thread(target=_spin if kind == "spin" else _sleeper, args=args, name=f"w{i}")
               for i in range(n)]
    if kind == "sleep":
        workers.append(threading.Thread(target=_spin, args=args, name="burner"))
    rss0 = _rss_mb()
    for t in workers:
        t.start()
    engine = NativeEngine(SamplerConfig.make(events=("cpu", "wall"), interval=interval))
    # (no file I/O in this thread while the workers run: each read gives up the GIL, and
    # getting it back beside dozens of spinning threads takes up to a third of a second)
    cpu0 = {t.native_id: _cpu_of(t) for t in workers}
    engine.start()
    drain = next(t for t in threading.enumerate() if t.name == "ddprof_nb-drain")
    drain0 = _cpu_of(drain)
    go.set()
    time.sleep(seconds)
    pause.set()
    for _ in workers:
        paused.acquire()
    cpu1 = {t.native_id: _cpu_of(t) for t in workers}
    drain_cpu = _cpu_of(drain) - drain0
    profile = engine.stop()
    st = _session.Session.stats()
    wall_busy = st["wall_ns"] / 1e9
    timers = st["cpu_sampled_ns"] / max(st["cpu_used_ns"], 1)
    length = profile.metadata.duration_ns / 1e9
    stop.set()
    for t in workers:
        t.join()
    truth = {tid: cpu1[tid] - cpu0[tid] for tid in cpu0}
    rec_cpu = dict.fromkeys(truth, 0)
    rec_wall = dict.fromkeys(truth, 0)
    for s in profile.samples():
        if s.thread.tid in rec_cpu:
            if s.event is EventType.CPU:
                rec_cpu[s.thread.tid] += s.values[1] / 1e9
            elif s.event is EventType.WALL:
                rec_wall[s.thread.tid] += s.values[1] / 1e9
    tot_truth, tot_cpu = sum(truth.values()), sum(rec_cpu.values())
    split = max(abs(rec_cpu[t] / max(tot_cpu, 1e-9) - truth[t] / max(tot_truth, 1e-9)) for t in truth) * 100
    thinned = 0
    for note in profile.metadata.notes:
        if "found the sample buffer full" in note or "found the native aggregate full" in note:
            thinned += int(note.split()[0 if note[0].isdigit() else 1])
    return {
        "row": name, "threads": len(workers), "interval": interval,
        "dropped": sum(profile.metadata.dropped.values()), "thinned": thinned,
        "cpu": tot_cpu / max(tot_truth, 1e-9), "cpu_truth": tot_truth, "timers": timers,
        "wall": sum(rec_wall.values()) / (len(workers) * length), "split": split,
        "drain": 100 * drain_cpu / length, "wallthread": 100 * wall_busy / length,
        "rss": _rss_mb(), "rss_growth": _rss_mb() - rss0,
    }


NATIVE_ROWS = {"native8": (8, ("cpu",)), "native32": (32, ("cpu",)),
               "native8_wall": (8, ("cpu", "wall")), "native32_wall": (32, ("cpu", "wall"))}
_POOL = r"""
#include <pthread.h>
static long iters;
static void *work(void *arg)
{
    (void)arg;
    volatile double x = 0;
    for (long i = 0; i < iters; i++)
        x += i * 0.5;
    return NULL;
}
void pool_work(int n, long each)
{
    pthread_t th[64];
    iters = each;
    for (int i = 0; i < n && i < 64; i++)
        pthread_create(&th[i], NULL, work, NULL);
    for (int i = 0; i < n && i < 64; i++)
        pthread_join(th[i], NULL);
}
"""


def _native_pool():
    import tempfile

    import cffi

    out = tempfile.mkdtemp(prefix="ddp_bench_pool")
    ffi = cffi.FFI()
    ffi.cdef("void pool_work(int n, long each);")
    ffi.set_source("_ddp_bench_pool", _POOL, libraries=["pthread"])
    ffi.compile(tmpdir=out, verbose=False)
    sys.path.insert(0, out)
    from _ddp_bench_pool import lib

    return lib


def run_native_row(name: str, pairs: int, call_s: float = 0.4) -> dict:
    import statistics

    from ddprof_nb.config import SamplerConfig
    from ddprof_nb.engines.native import NativeEngine
    from ddprof_nb.events import EventType

    n, events = NATIVE_ROWS[name]
    pool = _native_pool()
    t = time.perf_counter()
    pool.pool_work(n, 2_000_000)
    each = max(1, int(2_000_000 * call_s / max(time.perf_counter() - t, 1e-3)))  # a call of ~call_s
    config = SamplerConfig.make(events=events, interval="10ms", native_threads="attribute")

    def once(profiled: bool):
        engine = NativeEngine(config) if profiled else None
        if engine:
            engine.start()
        c0, w0 = time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID), time.perf_counter()
        pool.pool_work(n, each)
        w1, c1 = time.perf_counter(), time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)
        if not engine:
            return w1 - w0, c1 - c0, 0, 0.0
        p = engine.stop()
        return w1 - w0, c1 - c0, sum(p.metadata.dropped.values()), p.total(EventType.CPU) / max(c1 - c0, 1)

    once(True)  # (the unwind tables of the objects loaded: built once, by the first session)
    walls, cpus, held, dropped = [], [], [], 0
    for i in range(pairs):
        first = i % 2 == 0
        a = once(first)
        b = once(not first)
        on, off = (a, b) if first else (b, a)
        walls.append(on[0] / off[0])
        cpus.append(on[1] / off[1])
        held.append(on[3])
        dropped += on[2]
    return {"row": name, "threads": n, "pairs": pairs, "dropped": dropped, "wall": statistics.median(walls),
            "cpu": statistics.median(cpus), "held": statistics.median(held)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rows", default=",".join([*ROWS, *NATIVE_ROWS]))
    ap.add_argument("--pairs", type=int, default=30, help="alternating pairs per native-threads row")
    args = ap.parse_args(argv)
    from ddprof_nb.engines.native import binding as _binding, session as _session

    reason = _binding.unavailable_reason()
    if reason:
        print(f"native engine unavailable: {reason}")
        return 2
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
          f"{args.seconds:.0f} s per row")
    print()
    print("| row | threads | interval | dropped | thinned | CPU rec/clocks (timers) | wall rec/(threads x s) | "
          "split err (pt) | drain CPU | wall-thread busy | RSS MB (growth) | goals |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    names = args.rows.split(",")
    for name in [n for n in names if n in ROWS]:
        r = run_row(name, args.seconds)
        ok = r["dropped"] == 0 and abs(r["cpu"] - 1) <= 0.03 and abs(r["wall"] - 1) <= 0.03 and r["split"] <= 3
        print(f"| {r['row']} | {r['threads']} | {r['interval']} | {r['dropped']} | {r['thinned']} | "
              f"{r['cpu']:.3f} ({r['timers']:.3f}; {r['cpu_truth']:.1f} s) | {r['wall']:.3f} | {r['split']:.1f} | {r['drain']:.2f} % | "
              f"{r['wallthread']:.2f} % | {r['rss']:.0f} ({r['rss_growth']:+.0f}) | {'met' if ok else 'MISSED'} |",
              flush=True)
    natives = [n for n in names if n in NATIVE_ROWS]
    if natives:
        print()
        print("| row | native threads | pairs | dropped | wall with/without (median) | process CPU with/without "
              "(median) | in profile / process CPU | goals |")
        print("|---|---|---|---|---|---|---|---|")
    for name in natives:
        r = run_native_row(name, args.pairs)
        ok = r["dropped"] == 0 and r["wall"] <= 1.02 and r["cpu"] <= 1.02
        print(f"| {r['row']} | {r['threads']} | {r['pairs']} | {r['dropped']} | {r['wall']:.4f} | {r['cpu']:.4f} | "
              f"{r['held']:.3f} | {'met' if ok else 'MISSED'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
