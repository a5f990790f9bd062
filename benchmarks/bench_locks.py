"""Lock-contention and park events: accuracy against ground truth, and their cost.

    python benchmarks/bench_locks.py [--quick]

Accuracy: workloads time their own waits (perf_counter around acquire / sleep / wait) and
the profile's LOCK/PARK totals at the named leaf are compared with that truth.
Cost:
  * an uncontended ``with lock: pass`` loop with lock/park profiling on vs off (an
    uncontended acquire never waits, so no hook runs: goal <= 2x);
  * a realistic threaded workload (queue producer/consumers + a shared lock + some CPU):
    fixed slices timed in pairs in ONE process, profiled and not (order alternating,
    start/stop excluded), median ratio over >= 30 pairs (goal <= 2% slowdown);
  * lock and sleep costs before the first start and after stop (the GOT slots are back:
    goal within 3%, best of several runs).
"""

from __future__ import annotations

import argparse
import collections
import platform
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddprof_nb.config import SamplerConfig  # noqa: E402
from ddprof_nb.engines.native import NativeEngine  # noqa: E402
from ddprof_nb.events import EventType  # noqa: E402

ROWS: list[tuple[str, str, str, str, str]] = []


def row(what, measured, truth, goal, ok):
    ROWS.append((what, measured, truth, goal, "ok" if ok else "MISS"))


def engine(**kw):
    return NativeEngine(SamplerConfig.make(events=("lock", "park")), **kw)


def leaf_totals(p, event):
    out = collections.Counter()
    for s in p.samples():
        if s.event is event:
            out[s.stack[-1].name] += s.values[1]
    return out


# -- accuracy -----------------------------------------------------------------------------------
L_OLD = threading.Lock()  # created before any profiling


def acc_lock(rounds=8):
    measured = []
    mlock = threading.Lock()

    def worker():
        mine = 0.0
        for _ in range(rounds):
            t0 = time.perf_counter()
            L_OLD.acquire()
            mine += time.perf_counter() - t0
            try:
                time.sleep(0.010)
            finally:
                L_OLD.release()
        with mlock:
            measured.append(mine)

    e = engine()
    e.start()
    ts = [threading.Thread(target=worker) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    p = e.stop()
    got = leaf_totals(p, EventType.LOCK).get("[Lock L_OLD]", 0) / 1e9
    truth = sum(measured)
    err = got / truth - 1
    row("4 threads x 8 x 10 ms on one (pre-existing) lock: LOCK [Lock L_OLD]", f"{got:.3f} s", f"{truth:.3f} s",
        "+-10%", abs(err) <= 0.10)


def acc_park():
    ev = threading.Event()
    truth = {}

    def sleeper():
        t0 = time.perf_counter()
        time.sleep(1.0)
        truth["[sleep]"] = time.perf_counter() - t0

    def waiter():
        t0 = time.perf_counter()
        ev.wait(2.0)
        truth["[Event.wait]"] = time.perf_counter() - t0

    e = engine()
    e.start()
    ts = [threading.Thread(target=sleeper), threading.Thread(target=waiter)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    p = e.stop()
    got = collections.Counter()
    for s in p.samples():
        if s.event is EventType.PARK and s.thread.tid in (ts[0].native_id, ts[1].native_id):
            got[s.stack[-1].name] += s.values[1]
    for leaf in ("[sleep]", "[Event.wait]"):
        g, t = got.get(leaf, 0) / 1e9, truth[leaf]
        row(f"PARK {leaf}", f"{g:.3f} s", f"{t:.3f} s", "+-5%", abs(g / t - 1) <= 0.05)


# -- cost ---------------------------------------------------------------------------------------
def uncontended_loop(n=1_000_000):
    lk = threading.Lock()
    t0 = time.perf_counter()
    for _ in range(n):
        with lk:
            pass
    return (time.perf_counter() - t0) / n


def sleep0_loop(n=20_000):
    t0 = time.perf_counter()
    for _ in range(n):
        time.sleep(0)
    return (time.perf_counter() - t0) / n


def best(f, k=5):
    return min(f() for _ in range(k))


def workload_slice(seconds=0.15):
    """Producer/consumers over a Queue, a shared counter lock, a little CPU: work done in a fixed time."""
    q: queue.Queue = queue.Queue(maxsize=64)
    lk = threading.Lock()
    done = [0]
    stop = time.perf_counter() + seconds

    def producer():
        i = 0
        while time.perf_counter() < stop:
            q.put(i)
            i += 1
        for _ in range(3):
            q.put(None)

    def consumer():
        while True:
            item = q.get()
            if item is None:
                return
            x = sum(range(200))
            with lk:
                done[0] += 1 + (x & 0)

    ts = [threading.Thread(target=producer)] + [threading.Thread(target=consumer) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return done[0]


def cost(pairs):
    # before any profiling
    lock_before, sleep_before = best(uncontended_loop), best(sleep0_loop)
    e = engine()
    e.start()
    lock_on = best(uncontended_loop)
    sleep_on = best(sleep0_loop)
    e.stop()
    lock_after, sleep_after = best(uncontended_loop), best(sleep0_loop)
    row("uncontended `with lock: pass`, profiling on vs off", f"{lock_on * 1e9:.1f} ns",
        f"{lock_before * 1e9:.1f} ns", "<= 2x", lock_on <= 2 * lock_before)
    row("time.sleep(0), profiling on vs off", f"{sleep_on * 1e9:.0f} ns", f"{sleep_before * 1e9:.0f} ns",
        "(info)", True)
    row("uncontended lock after stop vs before start", f"{lock_after * 1e9:.1f} ns", f"{lock_before * 1e9:.1f} ns",
        "<= 3%", abs(lock_after / lock_before - 1) <= 0.03)
    row("time.sleep(0) after stop vs before start", f"{sleep_after * 1e9:.0f} ns", f"{sleep_before * 1e9:.0f} ns",
        "<= 3%", abs(sleep_after / sleep_before - 1) <= 0.03)

    ratios = []
    workload_slice()  # warm up
    for i in range(pairs):
        res = {}
        for profiled in ((True, False) if i % 2 == 0 else (False, True)):
            if profiled:
                e = engine()
                e.start()
                res[True] = workload_slice()
                e.stop()
            else:
                res[False] = workload_slice()
        ratios.append(res[False] / max(1, res[True]))  # work units: slowdown = base / profiled
    med = statistics.median(ratios)
    q = statistics.quantiles(ratios, n=4)
    row(f"threaded queue+lock workload, {pairs} alternating slice pairs: median slowdown",
        f"{(med - 1) * 100:+.1f}% (IQR {(q[0] - 1) * 100:+.1f}..{(q[2] - 1) * 100:+.1f}%)", "0%", "<= 2%",
        med - 1 <= 0.02)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(f"# bench_locks — CPython {platform.python_version()}, {platform.machine()}")
    acc_lock()
    acc_park()
    cost(30 if not args.quick else 10)
    widths = [max(len(r[i]) for r in ROWS + [("what", "measured", "truth/base", "goal", "ok")]) for i in range(5)]
    hdr = ("what", "measured", "truth/base", "goal", "ok")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(hdr, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in ROWS:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")


if __name__ == "__main__":
    main()
