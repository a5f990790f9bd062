"""Allocation sampling: accuracy (ALLOC split, LIVE share) and overhead beside tracemalloc and memray.

    python benchmarks/bench_alloc.py [--quick] [--overhead-only] [--pairs N] [--slice S] [--rate 512KiB] [--callgrind [N]]

Accuracy (strict bounds; tests/native/test_alloc.py has the loose ones):
  - two functions allocating bytes objects in a 3:1 ratio, 2 GB in all (with pauses for the drain): ALLOC split within
    +-2 points of 75/25, and the estimated total within 5% of the truth;
  - one function keeping 50 MB in a list beside one allocating and freeing 50 MB: the
    keeper holds >= 95% of LIVE and LIVE is within 3 standard deviations of 50 MB
    (~10% at the default rate: only ~90 of the 500 blocks are sampled).
Overhead: an allocation-heavy workload (many small dicts, tuples and strings) cut into
slices of ~0.5 s of CPU (--slice), timed in adjacent pairs in ONE process (one slice with a tool, one
bare, order alternating), 150 pairs for ddprof_nb's rows (--pairs) and 30 for the others
(--other-pairs), never under 30: pairs run in rounds of one pair per tool (the others join every
5th round), tools in an order rotating across rounds, so all tools see the same spells of machine
load.  Tools' start/stop lie outside the timed slice, and so does the cache eviction of the
start (a gc.collect() between start and slice walks the heap back into the caches).  ddprof_nb's slices end with one drain
inside the timing (the engine's background drain is turned off for them): the Python work its
drain thread does under the GIL is charged to the workload thread, instead of being left to the
untimed stop.  One drain per slice is what the engine does: it drains once a second, or when its
buffer is a quarter full, which this churn (~1,700 samples/s) fills every ~0.6 s (9 drains in a
5 s run).  A drain after churn runs with cold caches (~0.55 ms after 0.1 s of it, 0.06 ms warm),
so the 0.1 s slices used before charged it ~6 times as often as the engine runs it.  Reported per tool: the median ratio ± its standard
error (0.93 x IQR / sqrt(pairs), as in bench_cpu.py) and the IQR, of wall time (the goal), of
wall minus this thread's run-queue wait (what an idle machine would show), of the process's
CPU time (all threads) and of the workload thread's CPU time.  The load average is printed
before and after.
Tools: ddprof_nb at the given rate (alloc only), the same with sampling never firing (the
hook's own cost), tracemalloc (1 frame, its default), memray (memray.Tracker writing to a
temporary file, in-process).
Instruction counts (``--callgrind [N]``): wall-clock on a shared box is noisy, so the
workload also runs under valgrind's callgrind with PYTHONHASHSEED=0, counting only the
workload thread inside the workload (no hook / a foreign pass-through allocator / our hook
with sampling ~never firing / our hook at 512 KiB / the same plus one drain of the run's
records, after warm-up drains) and reporting instructions per iteration, extra instructions
per allocator call and per sample (in C; in the drain).  Use N >= 300000 (~170 samples).
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

from clocks import run_queue_wait
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
        # no background drain: end_slice drains, inside the timing (see the module docstring)
        self.e = NativeEngine(SamplerConfig.make(events=("alloc",), alloc_rate=self.rate), drain_interval=1e6)
        self.e.start()

    def end_slice(self):
        self.e._drain_once()

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


def slice_times(tool, n):
    """(wall, wall - run-queue wait, process CPU, thread CPU) of one slice, with ``tool`` or bare."""
    if tool is not None:
        tool.start()
    # after the start: its side effects stay outside the slice too (a start's cache footprint:
    # ddprof_nb's ring is mapped fresh and prefaulted ~800 KB ahead of its writers, see ring.c)
    gc.collect()
    q, c, pc, t = run_queue_wait() or 0.0, time.thread_time(), time.process_time(), time.perf_counter()
    workload(n)
    if tool is not None and hasattr(tool, "end_slice"):
        tool.end_slice()
    wall = time.perf_counter() - t
    out = (wall, wall - ((run_queue_wait() or 0.0) - q), time.process_time() - pc, time.thread_time() - c)
    if tool is not None:
        tool.stop()
    return out


MEASURES = ("wall", "wall - run-queue wait", "process CPU", "workload CPU")


def overhead(tools, n, rounds, every=None):
    """{tool name: {measure: [with/without ratio per pair]}}: each round times one adjacent pair
    (bare slice, slice with the tool; order alternating by round) per tool, tools in an order
    rotating across rounds, so every tool sees the same spells of machine load.  ``every``:
    {tool name: k}, a tool that joins every k-th round only (spread over the whole run)."""
    every = every or {}
    ratios = {t.name: {m: [] for m in MEASURES} for t in tools}
    failed = {}
    for i in range(rounds):
        k = i % len(tools)
        for tool in tools[k:] + tools[:k]:
            if tool.name in failed or i % every.get(tool.name, 1):
                continue
            try:
                pair = [slice_times(x, n) for x in ((tool, None) if i % 2 == 0 else (None, tool))]
            except Exception as exc:  # noqa: BLE001 - report and go on without it
                failed[tool.name] = f"{type(exc).__name__}: {exc}"
                continue
            with_, bare = pair if i % 2 == 0 else pair[::-1]
            for m, a, b in zip(MEASURES, with_, bare):
                ratios[tool.name][m].append(a / b)
    return ratios, failed


def median_se(r):
    """(median, standard error of the median from the IQR: 0.93 x IQR / sqrt(n), q1, q3)."""
    q = statistics.quantiles(r, n=4)
    return statistics.median(r), 0.93 * (q[2] - q[0]) / math.sqrt(len(r)), q[0], q[2]


def load():
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# -- instruction counts (callgrind): deterministic, unlike wall-clock on a shared box -------------
CG_MODES = ("none", "pass", "hook-rare", "hook", "hook+drain")
_ALLOC_FNS = ("_PyObject_Malloc", "_PyObject_Calloc", "_PyObject_Realloc", "_PyObject_Free")


def cg_child(mode, n):
    """One run of the churn workload under ``mode``; only the workload itself is counted (it
    runs inside functools.reduce, the one C function callgrind is told to collect in).
    "hook+drain" also counts one drain of the run's records (the Python side, under the GIL)."""
    import functools

    from ddprof_nb.engines.native.alloc import AllocTracker

    workload(200)  # warm caches/specialisation identically in every mode
    run = lambda: functools.reduce(lambda a, _: workload(n), [0], 0)  # noqa: E731
    if mode == "pass":
        from ddprof_nb.engines.native import binding as _binding

        _binding.lib.ddp_alloc_test_foreign(1)
        run()
        _binding.lib.ddp_alloc_test_foreign(0)
    elif mode in ("hook", "hook-rare", "hook+drain"):
        # no background drain at all (nor its early wakes for new code): the counted thread
        # drains every record itself, and no GIL hand-off lands at a timing-dependent point
        e = NativeEngine(SamplerConfig.make(events=("alloc",), alloc_rate="512KiB" if mode != "hook-rare" else str(1 << 40)),
                         drain_interval=1e6, drain_early=False, drain_new_code=False)
        e.start()
        warm = 0
        if mode == "hook+drain":  # drains outside the count resolve the code objects (once per session)
            for _ in range(3):
                workload(n // 3)
                e._drain_once()
            warm = AllocTracker.stats()["sampled"]
            functools.reduce(lambda a, _: (workload(n), e._drain_once()), [0], 0)
        else:
            run()
        e.stop()
        print("SAMPLES", AllocTracker.stats()["sampled"] - warm)
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
        p = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--separate-threads=yes",
                            "--collect-atstart=no", "--toggle-collect=functools_reduce", py, __file__,
                            "--cg-child", mode, str(k)], check=True, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, env=env, text=True)
        files = sorted(glob.glob(out + "-*"))
        res = _cg_totals(files[0])  # thread 1: the workload's
        for f in files + [out]:
            if os.path.exists(f):
                os.unlink(f)
        samples = [int(line.split()[1]) for line in p.stdout.splitlines() if line.startswith("SAMPLES ")]
        return res + (samples[0] if samples else 0,)

    rows, samples = {}, {}
    for mode in CG_MODES:
        total, _, samples[mode] = one(mode, n)
        rows[mode] = total
        print(f"  {mode:<10} {rows[mode]:>14,} Ir in the workload ({n} iterations, {samples[mode]} samples)", flush=True)
    (_, c1, _), (_, c2, _) = one("none", n), one("none", 2 * n)
    per_fn = {f: (c2[f] - c1[f]) / n for f in _ALLOC_FNS}
    per_it = sum(per_fn.values())
    print(f"  allocator calls per iteration: {per_it:.2f} "
          f"({', '.join(f'{f[10:]} {v:.2f}' for f, v in per_fn.items())})")
    if samples["hook"] and samples["hook+drain"]:
        print(f"  per sample: {(rows['hook'] - rows['hook-rare']) / samples['hook']:,.0f} Ir in C (the sampled "
              f"allocation's slow path), {(rows['hook+drain'] - rows['hook']) / samples['hook+drain']:,.0f} Ir "
              "in the drain (Python, steady state: one drain per run, its fixed cost included)")
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
    ap.add_argument("--pairs", type=int, default=150,
                    help="pairs for ddprof_nb's two rows (see main: per-pair noise here is +-4-6 %%)")
    ap.add_argument("--other-pairs", type=int, default=30,
                    help="pairs for tracemalloc and memray (7x and 1.7x slower, far from the goal)")
    ap.add_argument("--rate", default="512KiB")
    ap.add_argument("--slice", type=float, default=0.5,
                    help="seconds of CPU per slice; one drain ends each ddprof_nb slice (see the docstring)")
    ap.add_argument("--no-freeze", dest="freeze", action="store_false",
                    help="leave the heap unfrozen before the overhead slices (noisier: see main)")
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
    n = calibrate(args.slice)
    if min(args.pairs, args.other_pairs) < 30:
        ap.error("--pairs, --other-pairs: at least 30 (the overhead goal is a median of >= 30 pairs)")
    rounds = max(args.pairs, args.other_pairs)
    print(f"\noverhead: ~{args.slice:g} s CPU slices ({n} iterations of dict/tuple/str churn), {args.pairs} pairs "
          f"for ddprof_nb, {args.other_pairs} for the others")
    tools = [DDProf(args.rate), DDProf(str(1 << 40), "ddprof_nb hook only"), Tracemalloc()]
    try:
        tools.append(Memray())
    except ImportError:
        print("memray: not installed (pip install memray, or the bench extra)")
    if args.freeze:
        # The heap before the slices (numpy, the tools' modules...) goes to the permanent
        # generation: this churn triggers collections constantly, and a full one walks that
        # heap, landing in one slice of a pair at random (A/A runs of bare slices: IQR
        # -12.6..+5.1 % and -4.6..+3.2 %; frozen -1.2..+1.4 % and -2.4..+2.9 %).  What the
        # slices and the tools allocate is still collected as usual.
        gc.collect()
        gc.freeze()
    print(f"{load()} (before){'' if args.freeze else ', heap not frozen'}")
    # Per-pair noise on this shared 2-core VM is +-4-6 % (IQR of bare-versus-bare pairs up to
    # -2..+7 %), so 40 pairs left the median's standard error at 1-1.6 points, and runs of the
    # same build read +2.6 to +4.7 %; 150 pairs bring it to ~0.6.  tracemalloc and memray are far
    # from the goal, and their slices long: fewer pairs, spread over the same rounds.
    every = {t.name: rounds // (args.pairs if t.name.startswith("ddprof_nb") else args.other_pairs) for t in tools}
    ratios, failed = overhead(tools, n, rounds, every)
    print(f"{load()} (after)")
    print("median slowdown ± standard error (IQR) over the pairs; goal: ddprof_nb alloc wall <= +5%")
    w = max(len(m) for m in MEASURES)
    print(f"{'tool':<20}  " + "  ".join(f"{m:>{max(w, 27)}}" for m in MEASURES) + "  goal")
    for tool in tools:
        if tool.name in failed:
            print(f"{tool.name:<20}  failed: {failed[tool.name]}")
            continue
        cells, wall = [], None
        for m in MEASURES:
            med, se, q1, q3 = median_se(ratios[tool.name][m])
            wall = wall or (med, se)
            cells.append(f"{100 * (med - 1):+.1f}% ±{100 * se:.1f} ({100 * (q1 - 1):+.0f}..{100 * (q3 - 1):+.0f})")
        goal = ""
        if tool.name == "ddprof_nb alloc":
            ok = wall[0] <= 1.05
            goal = f"<= 5%: {'yes' if ok else 'NO'}" + ("" if abs(wall[0] - 1.05) > 2 * wall[1] else " (within 2 SE)")
        print(f"{tool.name:<20}  " + "  ".join(f"{c:>{max(w, 27)}}" for c in cells) + f"  {goal}", flush=True)


if __name__ == "__main__":
    main()
