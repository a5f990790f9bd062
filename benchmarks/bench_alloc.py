"""Allocation sampling: accuracy (ALLOC split, LIVE share) and overhead beside tracemalloc and memray.

    python benchmarks/bench_alloc.py [--quick] [--overhead-only] [--pairs N] [--rate 512KiB] [--callgrind [N]]

Accuracy (strict bounds; tests/native/test_alloc.py has the loose ones):
  - two functions allocating bytes objects in a 3:1 ratio, 2 GB in all (with pauses for the drain): ALLOC split within
    +-2 points of 75/25, and the estimated total within 5% of the truth;
  - one function keeping 50 MB in a list beside one allocating and freeing 50 MB: the
    keeper holds >= 95% of LIVE and LIVE is within 3 standard deviations of 50 MB
    (~10% at the default rate: only ~90 of the 500 blocks are sampled).
Overhead: an allocation-heavy workload (many small dicts, tuples and strings) cut into
slices of ~0.1 s of CPU, timed in pairs in ONE process, one slice with the tool running and
one without (order alternating), the tool's start/stop excluded; the median with/without
ratio over >= 30 pairs (--pairs), with its interquartile range, of wall time (the goal:
it includes the profiler's other threads, which hold the GIL while they work), of the
process's CPU time (all threads; steadier than wall on a shared machine) and of the
workload thread's CPU time.  The load average is printed
before and after: wall-clock ratios on a loaded 2-core box swing by several points.
Tools: ddprof_nb at the given rate (alloc only), the same with sampling never firing (the
hook's own cost), tracemalloc (1 frame, its default), memray (memray.Tracker writing to a
temporary file, in-process).
Instruction counts (``--callgrind [N]``): wall-clock on a shared box is noisy, so the
workload also runs under valgrind's callgrind with PYTHONHASHSEED=0, counting only the
workload thread inside the workload (no hook / a foreign pass-through allocator / our hook
with sampling ~never firing / our hook at --rate) and reporting instructions per iteration
and extra instructions per allocator call.
"""

from __future__ import annotations

import argparse
import collections
import gc
import math
import os
import platform
import statistics
import sys
import tempfile
import time

from ddprof_nb.config import SamplerConfig
from ddprof_nb.engines.native import NativeEngine
from ddprof_nb.events import EventType, FrameKind


def py_leaf(s):
    for f in reversed(s.stack):
        if f.kind is FrameKind.PYTHON:
            return f.name
    return "?"


def leaf_totals(p, event):
    out = collections.Counter()
    for s in p.samples():
        if s.event is event:
            out[py_leaf(s)] += s.values[1]
    return out


def engine(rate):
    return NativeEngine(SamplerConfig.make(events=("alloc",), alloc_rate=rate))


# -- accuracy ---------------------------------------------------------------------------------
def three(n):
    for _ in range(n):
        x = b"a" * 20000  # noqa: F841


def one(n):
    for _ in range(n):
        x = b"a" * 20000  # noqa: F841


KEPT = []


def keeper():
    for _ in range(500):
        KEPT.append(bytes(100_000))


def churner():
    for _ in range(500):
        x = bytes(100_000)  # noqa: F841


def accuracy(rate, quick):
    rows = []
    n = 25_000 if quick else 100_000  # n bytes objects of 20 kB split 3:1: 2 GB (0.5 GB quick)
    e = engine(rate)
    e.start()
    for _ in range(20):  # interleaved, so time-varying effects hit both
        three(3 * n // 80)
        one(n // 80)
        # bytes(20000) is allocated at up to ~50 GB/s here; a pause lets the 10 Hz drain
        # empty the 4096-record buffer (bursts over ~2 GB per 100 ms at 512 KiB overflow it)
        time.sleep(0.03)
    p = e.stop()
    t = leaf_totals(p, EventType.ALLOC)
    share = t["three"] / max(1, t["three"] + t["one"])
    truth = 20 * (3 * n // 80 + n // 80) * sys.getsizeof(b"a" * 20000)
    est = (t["three"] + t["one"]) / truth
    rows.append(("ALLOC split 3:1", f"{100 * share:.1f}% / {100 - 100 * share:.1f}%", "75.0% / 25.0%",
                 f"{100 * (share - 0.75):+.1f} pts", "+-2 pts", abs(share - 0.75) <= 0.02))
    rows.append(("ALLOC total", f"{(t['three'] + t['one']) / 1e9:.3f} GB", f"{truth / 1e9:.3f} GB",
                 f"{100 * (est - 1):+.1f}%", "+-5%", abs(est - 1) <= 0.05))
    e = engine(rate)
    e.start()
    keeper()
    churner()
    p = e.stop()
    live = leaf_totals(p, EventType.LIVE)
    share = live["keeper"] / max(1, sum(live.values()))
    truth = 500 * sys.getsizeof(bytes(100_000))
    rows.append(("LIVE keeper share", f"{100 * share:.1f}%", "100%", f"{100 * (share - 1):+.1f} pts", ">= 95%",
                 share >= 0.95))
    # 500 blocks of 100 kB at R = 512 KiB: p = 1 - exp(-s/R) ~ 0.17, so the estimate's relative
    # standard deviation is sqrt((1 - p) / (p * 500)) ~ 10%: the goal is 3 sigma
    p_s = 1 - math.exp(-sys.getsizeof(bytes(100_000)) / SamplerConfig.make(alloc_rate=rate).alloc_rate)
    sd = math.sqrt((1 - p_s) / (p_s * 500))
    rows.append(("LIVE keeper bytes", f"{live['keeper'] / 1e6:.1f} MB", f"{truth / 1e6:.1f} MB",
                 f"{100 * (live['keeper'] / truth - 1):+.1f}%", f"+-{300 * sd:.0f}%",
                 abs(live["keeper"] / truth - 1) <= 3 * sd))
    KEPT.clear()
    return rows


# -- overhead ---------------------------------------------------------------------------------
def workload(n):
    """Many small, short-lived objects: dicts, tuples, strings (and a few kept a while)."""
    keep = collections.deque(maxlen=1000)
    for i in range(n):
        d = {"k": i, "s": str(i), "t": (i, i + 1, "x")}
        s = f"item-{i}-{d['s']}"
        keep.append((d, s))
    return len(keep)


def calibrate(target_s=0.1):
    """Iterations for ~target_s of CPU (thread CPU time: wall time on a loaded box is not it)."""
    n = 2000
    while True:
        t = time.thread_time()
        workload(n)
        dt = time.thread_time() - t
        if dt > 0.02:
            return max(1000, int(n * target_s / dt))
        n *= 4


class DDProf:
    def __init__(self, rate, name="ddprof_nb alloc"):
        self.rate = rate
        self.name = name

    def start(self):
        self.e = engine(self.rate)
        self.e.start()

    def stop(self):
        self.e.stop()


class Tracemalloc:
    name = "tracemalloc"

    def start(self):
        import tracemalloc

        tracemalloc.start()

    def stop(self):
        import tracemalloc

        tracemalloc.stop()


class Memray:
    name = "memray (Tracker)"

    def __init__(self):
        import memray

        self.memray = memray
        self.dir = tempfile.mkdtemp(prefix="bench_alloc_")
        self.i = 0

    def start(self):
        self.i += 1
        path = os.path.join(self.dir, f"t{self.i}.bin")
        self.t = self.memray.Tracker(path)
        self.t.__enter__()
        self.path = path

    def stop(self):
        self.t.__exit__(None, None, None)
        os.unlink(self.path)


def overhead(tool, n, pairs):
    """(median, q1, q3) of the with/without ratio of wall time, of the process's CPU time (every
    thread: the profiler's own too) and of the workload thread's CPU time."""
    wall, proc, cpu = [], [], []
    for i in range(pairs):
        times = {}
        for with_tool in ((True, False) if i % 2 == 0 else (False, True)):
            gc.collect()
            if with_tool:
                tool.start()
            c, pc, t = time.thread_time(), time.process_time(), time.perf_counter()
            workload(n)
            times[with_tool] = (time.perf_counter() - t, time.process_time() - pc, time.thread_time() - c)
            if with_tool:
                tool.stop()
        wall.append(times[True][0] / times[False][0])
        proc.append(times[True][1] / times[False][1])
        cpu.append(times[True][2] / times[False][2])

    def summary(r):
        q = statistics.quantiles(r, n=4)
        return statistics.median(r), q[0], q[2]

    return summary(wall), summary(proc), summary(cpu)


def load():
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# -- instruction counts (callgrind): deterministic, unlike wall-clock on a shared box -------------
CG_MODES = ("none", "pass", "hook-rare", "hook")
_ALLOC_FNS = ("_PyObject_Malloc", "_PyObject_Calloc", "_PyObject_Realloc", "_PyObject_Free")


def cg_child(mode, n):
    """One run of the churn workload under ``mode``; only the workload itself is counted (it
    runs inside functools.reduce, the one C function callgrind is told to collect in)."""
    import functools

    workload(200)  # warm caches/specialisation identically in every mode
    run = lambda: functools.reduce(lambda a, _: workload(n), [0], 0)  # noqa: E731
    if mode == "pass":
        from ddprof_nb import _binding

        _binding.lib.ddp_alloc_test_foreign(1)
        run()
        _binding.lib.ddp_alloc_test_foreign(0)
    elif mode in ("hook", "hook-rare"):
        e = engine("512KiB" if mode == "hook" else str(1 << 40))
        e.start()
        run()
        e.stop()
    else:
        run()


def _cg_totals(path):
    """(total Ir, {function: calls}) from a callgrind out file (name compression handled)."""
    names, calls, total = {}, collections.Counter(), 0
    cfn = None
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
            elif line.startswith(("fn=", "cfn=")):
                rest = line.split("=", 1)[1].strip()
                if rest.startswith("("):
                    i = rest.index(")")
                    key, nm = rest[1:i], rest[i + 1:].strip()
                    if nm:
                        names[key] = nm
                    rest = names.get(key, key)
                if line.startswith("cfn="):
                    cfn = rest
            elif line.startswith("calls="):
                calls[cfn] += int(line[6:].split()[0])
    return total, calls


def callgrind(n, py):
    """Main-thread instructions inside the workload, per mode (deterministic: hash seed fixed).

    Instructions are collected only inside the workload; callgrind's call counts are not
    (they cover the whole run), so allocator calls per iteration come from two runs without
    a hook, at n and 2n iterations."""
    import glob
    import subprocess

    env = dict(os.environ, PYTHONHASHSEED="0")

    def one(mode, k):
        out = tempfile.mktemp(prefix=f"cg_{mode}_", suffix=".out")
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--separate-threads=yes",
                        "--collect-atstart=no", "--toggle-collect=functools_reduce", py, __file__,
                        "--cg-child", mode, str(k)], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=env)
        files = sorted(glob.glob(out + "-*"))
        res = _cg_totals(files[0])  # thread 1: the workload's
        for f in files + [out]:
            if os.path.exists(f):
                os.unlink(f)
        return res

    rows = {}
    for mode in CG_MODES:
        rows[mode] = one(mode, n)[0]
        print(f"  {mode:<10} {rows[mode]:>14,} Ir in the workload ({n} iterations)", flush=True)
    (_, c1), (_, c2) = one("none", n), one("none", 2 * n)
    per_fn = {f: (c2[f] - c1[f]) / n for f in _ALLOC_FNS}
    per_it = sum(per_fn.values())
    print(f"  allocator calls per iteration: {per_it:.2f} "
          f"({', '.join(f'{f[10:]} {v:.2f}' for f, v in per_fn.items())})")
    base = rows["none"]
    print(f"\n{'mode':<10}  {'Ir/iteration':>12}  {'vs none':>8}  {'extra Ir per allocator call':>28}")
    for mode in CG_MODES:
        ir = rows[mode]
        print(f"{mode:<10}  {ir / n:>12.1f}  {100 * (ir / base - 1):>+7.2f}%  {(ir - base) / n / per_it:>28.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cg-child", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--callgrind", type=int, metavar="N", nargs="?", const=20000,
                    help="instruction counts per allocator call under valgrind (no hook, pass-through, "
                         "hook with sampling ~never firing, hook at --rate); N churn iterations")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--overhead-only", action="store_true", help="skip the accuracy checks")
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--rate", default="512KiB")
    args = ap.parse_args()
    if args.cg_child:
        return cg_child(args.cg_child[0], int(args.cg_child[1]))
    if args.callgrind:
        print(f"Python {platform.python_version()}: callgrind, {args.callgrind} vs {2 * args.callgrind} iterations")
        return callgrind(args.callgrind, sys.executable)
    print(f"Python {platform.python_version()}, {os.cpu_count()} CPUs, alloc_rate={args.rate}\n")
    if not args.overhead_only:
        rows = accuracy(args.rate, args.quick)
        w = max(len(r[0]) for r in rows)
        print(f"{'check':<{w}}  {'measured':>18}  {'truth':>16}  {'error':>10}  {'goal':>8}  ok")
        for check, measured, truth, err, goal, ok in rows:
            print(f"{check:<{w}}  {measured:>18}  {truth:>16}  {err:>10}  {goal:>8}  {'yes' if ok else 'NO'}")
    n = calibrate()
    print(f"\noverhead: {args.pairs} alternating pairs of ~0.1 s CPU slices ({n} iterations of dict/tuple/str churn)")
    tools = [DDProf(args.rate), DDProf(str(1 << 40), "ddprof_nb hook only"), Tracemalloc()]
    try:
        tools.append(Memray())
    except ImportError:
        print("memray: not installed (pip install memray, or the bench extra)")
    print(f"{load()} (before)")
    pct = lambda m: f"{100 * (m[0] - 1):+.1f}% ({100 * (m[1] - 1):+.1f}..{100 * (m[2] - 1):+.1f})"  # noqa: E731
    print(f"{'tool':<20}  {'wall: median (IQR)':>26}  {'process CPU: median (IQR)':>27}  "
          f"{'workload CPU: median (IQR)':>28}  goal (wall)")
    for tool in tools:
        try:
            wall, proc, cpu = overhead(tool, n, args.pairs)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"{tool.name:<20}  failed: {type(exc).__name__}: {exc}")
            continue
        goal = ("<= 5%: " + ("yes" if wall[0] <= 1.05 else "NO")) if tool.name == "ddprof_nb alloc" else ""
        print(f"{tool.name:<20}  {pct(wall):>26}  {pct(proc):>27}  {pct(cpu):>28}  {goal}", flush=True)
    print(f"{load()} (after)")


if __name__ == "__main__":
    main()
