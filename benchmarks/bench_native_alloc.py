"""Cost of sampling C-extension allocations (native_alloc) on numpy and pandas workloads.

    python benchmarks/bench_native_alloc.py [--quick] [--pairs N] [--slice S] [--rate 512KiB]
                                            [--workloads numpy,frame] [--tools ...]

Three workloads, each cut into slices of ~--slice seconds (of the calling thread's CPU; of wall
time for the third):
  - numpy churn: arrays of 1 KB-10 MB (log-uniform, seeded), filled and dropped;
  - frame: a pandas pipeline on a 20,000-row frame (build from columns, a derived column, a
    groupby sum, a merge back, a sort); without pandas, a numpy stand-in doing the same
    steps on column arrays (the header says which ran);
  - native (--workloads native; not by default: it compiles a C extension with cffi): malloc-heavy
    threads that run no Python: each call starts 2 pthreads that malloc, touch and free blocks of
    1 KB-1 MB (log-uniform, seeded), filled, while the caller waits in pthread_join.  Its tools: alloc+live
    with native_threads="attribute" against the same with native_threads off (the hooks still run
    on those threads, their samples are dropped), each against bare slices and paired directly;
    measured: wall and the process's CPU (every thread's, the profiler's own included), and the
    cost per malloc of the native threads (the paired wall difference over the mallocs).
Tools: ddprof_nb alloc+live with native_alloc on, the same with it off (what alloc cost
before C allocations were sampled), tracemalloc (1 frame) and memray (memray.Tracker,
in-process, writing to a temporary file) where importable.
Method (as bench_alloc.py): adjacent pairs of slices in ONE process, one with a tool and one
bare, order alternating; one round times one pair per tool, tools in an order rotating
across rounds so all see the same spells of machine load; the heap before the slices is
frozen (gc.freeze) so a full collection of it does not land in one slice of a pair at
random; tools' start/stop lie outside the timed slice, ddprof_nb's slices end with one drain
inside it (its background drain is off).  Reported per tool and workload: the median
with/bare ratio ± its standard error (0.93 x IQR / sqrt(pairs)) and the IQR, of wall time,
wall minus run-queue wait, and the workload thread's CPU; ddprof_nb's samples per second of
slice.  The goal: native_alloc on costs <= 5 points of wall time more than off
(the difference of the two medians, its standard error from theirs).
Accuracy (--frame-gb, default 1; --quick 0.25; 0 skips): a 1 GB DataFrame (20 float64
columns, an int64 id, unique strings) built in one statement inside an alloc+live session:
LIVE at that line against df.memory_usage(deep=True).sum() (goal: within 5 %), and how it
splits between the calls below the line (pandas' DataFrame construction, the strings' list).
It needs ~2.5x the frame in free memory (the columns, then pandas' consolidated copy).
--quick (CI): 30 pairs of 0.05 s slices; default 40 pairs of 0.1 s (CPU time ~1 and ~2 min).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import sys
import time

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # no BLAS threads fighting the tools for the cores

import numpy as np  # noqa: E402

from bench_alloc import Memray, Tracemalloc, load, median_se  # noqa: E402
from clocks import run_queue_wait  # noqa: E402
from ddprof_nb.engines.native.alloc import AllocTracker  # noqa: E402
from ddprof_nb.config import SamplerConfig  # noqa: E402
from ddprof_nb.engines.native import NativeEngine  # noqa: E402

try:
    import pandas as pd
except ImportError:  # the numpy stand-in runs instead (the header says so)
    pd = None


# -- workloads ----------------------------------------------------------------------------------
_rng = np.random.default_rng(22)
SIZES = np.exp(_rng.uniform(math.log(1e3), math.log(1e7), 4096)).astype(np.int64) // 8  # float64 elements


def numpy_churn(n):
    """n arrays of 1 KB-10 MB, each filled (its pages touched, as real data is) and dropped."""
    s = 0.0
    for i in range(n):
        a = np.ones(int(SIZES[i % len(SIZES)]))
        s += a[-1]
    return s


ROWS = 20_000
KEYS = _rng.integers(0, 500, ROWS)
X = _rng.random(ROWS)
Y = _rng.integers(0, 1000, ROWS)


def frame_pandas(n):
    out = 0.0
    for _ in range(n):
        df = pd.DataFrame({"k": KEYS, "x": X, "y": Y})
        df["z"] = df["x"] * 2 + df["y"]
        g = df.groupby("k", sort=False)["z"].sum().rename("zs")
        m = df.merge(g, left_on="k", right_index=True)
        out += float(m.sort_values("zs")["zs"].iloc[-1])
    return out


def frame_numpy(n):
    """The same steps on plain column arrays (stand-in when pandas is not installed)."""
    out = 0.0
    for _ in range(n):
        cols = {"k": KEYS.copy(), "x": X.copy(), "y": Y.copy()}
        cols["z"] = cols["x"] * 2 + cols["y"]
        uk, inv = np.unique(cols["k"], return_inverse=True)
        zs = np.bincount(inv, weights=cols["z"], minlength=len(uk))
        merged = np.column_stack([cols["k"], cols["x"], cols["y"], cols["z"], zs[inv]])
        out += float(merged[np.argsort(merged[:, 4], kind="stable")][-1, 4])
    return out


# threads that run no Python: a C extension's pthreads (built at first use, cffi)
NATIVE_SOURCE = r"""
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
static size_t sizes[4096];
static long per_thread;
static void *churn(void *arg)
{
    size_t k = (size_t)arg * 1031;
    for (long i = 0; i < per_thread; i++, k++) {
        size_t n = sizes[k & 4095];
        char *p = malloc(n);
        if (!p)
            continue;
        memset(p, (int)i, n); /* filled, as real data is */
        __asm__ volatile("" : : "r"(p) : "memory"); /* (the fill is used: not elided before free) */
        free(p);
    }
    return NULL;
}
void set_size(int i, size_t n) { sizes[i & 4095] = n; }
/* 2 pthreads started for this call, n mallocs each; the caller waits (the GIL released) */
void native_churn(long n)
{
    pthread_t th[2];
    per_thread = n;
    for (long i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, churn, (void *)i);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
}
"""
_native_lib = None


def native_churn(n):
    """n mallocs (1 KB-1 MB, filled, freed) on each of 2 pthreads started for the call."""
    global _native_lib
    if _native_lib is None:
        import tempfile

        import cffi

        ffi = cffi.FFI()
        ffi.cdef("void set_size(int i, size_t n); void native_churn(long n);")
        ffi.set_source("_bench_native_churn", NATIVE_SOURCE, libraries=["pthread"])
        out = tempfile.mkdtemp(prefix="ddprof_bench_")
        ffi.compile(tmpdir=out, verbose=False)
        sys.path.insert(0, out)
        from _bench_native_churn import lib
        sizes = np.exp(_rng.uniform(math.log(1e3), math.log(1e6), 4096)).astype(np.int64)
        for i, v in enumerate(sizes.tolist()):
            lib.set_size(i, v)
        _native_lib = lib
    _native_lib.native_churn(int(n))
    return 2 * n


WORKLOADS = {"numpy": ("numpy churn (1 KB-10 MB arrays)", numpy_churn),
             "frame": ("pandas frame pipeline" if pd is not None else "frame pipeline, numpy stand-in (no pandas)",
                       frame_pandas if pd is not None else frame_numpy),
             "native": ("malloc-heavy threads that run no Python (2 pthreads, 1 KB-1 MB blocks)", native_churn)}


def calibrate(fn, target_s, clock=time.thread_time, n=1):
    """Iterations of fn (from ``n``) for ~target_s of this thread's CPU (``clock``).  The first calls of the
    churn fault in fresh pages until glibc's mmap threshold has grown (~20x slower than later calls), so
    the first estimate is timed again, twice, at its own size."""
    while True:
        t = clock()
        fn(n)
        dt = clock() - t
        if dt > 0.03:
            break
        n *= 4
    for _ in range(2):
        n = max(1, round(n * target_s / max(dt, 1e-6)))
        t = clock()
        fn(n)
        dt = clock() - t
    return n


# -- accuracy: a DataFrame's memory at the line that built it ---------------------------------------
def build_frame(n, rng):
    return pd.DataFrame({"id": np.arange(n), **{f"x{i}": rng.random(n) for i in range(20)}, "name": [f"user-{i:09d}" for i in range(n)]})  # noqa: E501


def frame_accuracy(gb, rate):
    """(rows of the LIVE split below the building line, live at the line, truth, seconds)."""
    n = int(gb * 1e9 / (22 * 8 + 66))  # bytes per row: 21 numeric columns, a pointer and a ~58-byte str
    line = build_frame.__code__.co_firstlineno + 1
    e = NativeEngine(SamplerConfig.make(events=("alloc", "live"), alloc_rate=rate))
    e.start()
    t = time.perf_counter()
    df = build_frame(n, np.random.default_rng(0))
    dt = time.perf_counter() - t
    p = e.stop()
    truth = int(df.memory_usage(deep=True).sum())
    at_line, below = 0, {}
    for s in p.samples():
        if s.event.name != "LIVE":
            continue
        i = max((k for k, f in enumerate(s.stack) if f.name == "build_frame"), default=-1)
        if i < 0 or s.stack[i].line != line:
            continue
        at_line += s.values[1]
        callee = s.stack[i + 1].name if i + 1 < len(s.stack) else "(the line itself)"
        key = f"{callee} -> {s.stack[-1].name}"
        below[key] = below.get(key, 0) + s.values[1]
    del df
    return sorted(below.items(), key=lambda kv: -kv[1]), at_line, truth, dt


# -- tools -------------------------------------------------------------------------------------
class DDProf:
    def __init__(self, rate, native, threads=None):
        """``threads``: None (the option left at its default), True or False: native_threads on/off."""
        self.rate, self.native, self.threads = rate, native, threads
        self.name = f"ddprof_nb native {'on' if native else 'off'}" + (
            "" if threads is None else f", threads {'on' if threads else 'off'}")
        self.samples, self.seconds = 0, 0.0

    def start(self):
        cfg = SamplerConfig.make(events=("alloc", "live"), alloc_rate=self.rate, native_alloc=self.native,
                                 native_threads="attribute" if self.threads else "off")
        self.e = NativeEngine(cfg, drain_interval=1e6)  # end_slice drains, inside the timing
        self.e.start()
        self._t = time.perf_counter()

    def end_slice(self):
        self.e._drain_once()

    def stop(self):
        self.seconds += time.perf_counter() - self._t
        self.samples += AllocTracker.stats()["sampled"] + AllocTracker.native_stats()["sampled"]
        self.e.stop()


MEASURES = ("wall", "wall - run-queue wait", "workload CPU")
NATIVE_MEASURES = ("wall", "process CPU")  # the native workload's: its caller only waits
ON_VS_OFF = "ddprof_nb native on (vs off)"
THREADS_ON_VS_OFF = "ddprof_nb native threads on (vs off)"


def slice_times(tool, fn, n, native=False):
    if tool is not None:
        tool.start()
    gc.collect()  # the start's side effects stay outside the slice
    q, c, pc, t = run_queue_wait() or 0.0, time.thread_time(), time.process_time(), time.perf_counter()
    fn(n)
    if tool is not None and hasattr(tool, "end_slice"):
        tool.end_slice()
    wall = time.perf_counter() - t
    if native:
        out = (wall, time.process_time() - pc)
    else:
        out = (wall, wall - ((run_queue_wait() or 0.0) - q), time.thread_time() - c)
    if tool is not None:
        tool.stop()
    return out


def overhead(rows, fn, n, pairs, native=False):
    """rows: [(label, tool, baseline tool or None for bare)]; {label: {measure: [ratios]}}."""
    measures = NATIVE_MEASURES if native else MEASURES
    ratios = {r[0]: {m: [] for m in measures} for r in rows}
    failed = {}
    for i in range(pairs):
        k = i % len(rows)
        for label, tool, base in rows[k:] + rows[:k]:
            if label in failed:
                continue
            try:
                pair = [slice_times(x, fn, n, native) for x in ((tool, base) if i % 2 == 0 else (base, tool))]
            except Exception as exc:  # noqa: BLE001 - report and go on without it
                failed[label] = f"{type(exc).__name__}: {exc}"
                continue
            with_, bare = pair if i % 2 == 0 else pair[::-1]
            for m, a, b in zip(measures, with_, bare):
                ratios[label][m].append(a / b)
            if native:  # (the paired wall difference, for the cost per malloc)
                ratios[label].setdefault("wall diff", []).append(with_[0] - bare[0])
    return ratios, failed


def make_tools(names, rate):
    tools, missing = [], []
    for name in names:
        if name == "on":
            tools.append(DDProf(rate, True))
        elif name == "off":
            tools.append(DDProf(rate, False))
        elif name == "tracemalloc":
            tools.append(Tracemalloc())
        elif name == "memray":
            try:
                tools.append(Memray())
            except ImportError:
                missing.append("memray: not installed (the bench extra has it)")
        else:
            raise SystemExit(f"unknown tool {name!r}: choose from on, off, tracemalloc, memray")
    return tools, missing


def native_rows(rate):
    """The native workload's rows and tools: native_threads on and off, each against bare
    slices, and on against off."""
    on, off = DDProf(rate, True, threads=True), DDProf(rate, True, threads=False)
    return [(on.name, on, None), (off.name, off, None), (THREADS_ON_VS_OFF, on, off)], [on, off]


def report(rows, ratios, failed, measures=MEASURES):
    w, lw = 27, 40
    print(f"| {'tool (vs baseline)':<{lw}} | " + " | ".join(f"{m:>{w}}" for m in measures) + " | samples/s |")
    print("|" + "-" * (lw + 2) + "|" + "|".join("-" * (w + 2) for _ in measures) + "|-----------|")
    walls = {}
    for label, tool, base in rows:
        if label in failed:
            print(f"| {label:<{lw}} | failed: {failed[label]} |")
            continue
        cells = []
        for m in measures:
            med, se, q1, q3 = median_se(ratios[label][m])
            if m == "wall":
                walls[label] = (med, se)
            cells.append(f"{100 * (med - 1):+.1f}% ±{100 * se:.1f} ({100 * (q1 - 1):+.0f}..{100 * (q3 - 1):+.0f})")
        rate = f"{tool.samples / tool.seconds:,.0f}" if base is None and isinstance(tool, DDProf) and tool.seconds else ""
        print(f"| {label:<{lw}} | " + " | ".join(f"{c:>{w}}" for c in cells) + f" | {rate:>9} |")
    if ON_VS_OFF in walls:
        d, se = walls[ON_VS_OFF][0] - 1, walls[ON_VS_OFF][1]
        verdict = "yes" if d <= 0.05 else "NO"
        if abs(d - 0.05) <= 2 * se:
            verdict += " (within 2 SE)"
        print(f"\nnative_alloc on vs off, paired (wall): {100 * d:+.1f}% ±{100 * se:.1f}; goal <= 5 %: {verdict}")
    return walls


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="30 pairs of 0.05 s slices (~1.5 min)")
    ap.add_argument("--pairs", type=int, help="pairs per tool and workload (default 40; --quick 30)")
    ap.add_argument("--slice", type=float, help="seconds of CPU per slice (default 0.1; --quick 0.05)")
    ap.add_argument("--rate", default="512KiB")
    ap.add_argument("--workloads", default="numpy,frame")
    ap.add_argument("--tools", default="on,off,tracemalloc,memray")
    ap.add_argument("--frame-gb", type=float, help="the DataFrame of the accuracy check, GB (default 1; --quick 0.25; 0 skips)")
    args = ap.parse_args()
    pairs = args.pairs or (30 if args.quick else 40)
    slice_s = args.slice or (0.05 if args.quick else 0.1)
    if pairs < 30:
        ap.error("--pairs: at least 30 (the goal is a median of >= 30 pairs)")
    names = [w for w in args.workloads.split(",") if w]
    for w in names:
        if w not in WORKLOADS:
            ap.error(f"--workloads: unknown {w!r} (choose from {', '.join(WORKLOADS)})")
    tools, missing = make_tools([t for t in args.tools.split(",") if t], args.rate)
    print(f"Python {platform.python_version()}, {os.cpu_count()} CPUs, numpy {np.__version__}, "
          f"pandas {pd.__version__ if pd is not None else 'not installed'}, alloc_rate={args.rate}, "
          f"{pairs} pairs of ~{slice_s:g} s CPU slices per tool and workload")
    for m in missing:
        print(m)
    rows = [(t.name, t, None) for t in tools]
    by_name = {t.name: t for t in tools}
    if "ddprof_nb native on" in by_name and "ddprof_nb native off" in by_name:
        # the goal's measure, paired directly: one slice with native_alloc, one without
        rows.append((ON_VS_OFF, by_name["ddprof_nb native on"], by_name["ddprof_nb native off"]))
    t0 = time.perf_counter()
    frame_gb = args.frame_gb if args.frame_gb is not None else (0.25 if args.quick else 1.0)
    if frame_gb > 0 and pd is None:
        print("\naccuracy: skipped (needs pandas)")
    elif frame_gb > 0:
        below, at_line, truth, dt = frame_accuracy(frame_gb, args.rate)
        err = at_line / truth - 1
        print(f"\n### accuracy: a {truth / 2**30:.2f} GiB DataFrame built in one statement ({dt:.1f} s)\n")
        print("| LIVE at the building line, by call below it -> leaf | MiB | share |\n|---|---|---|")
        for key, v in below:
            print(f"| {key} | {v / 2**20:,.1f} | {100 * v / max(1, at_line):.1f}% |")
        print(f"| **total at the line** vs memory_usage(deep=True) {truth / 2**20:,.1f} MiB | {at_line / 2**20:,.1f} | "
              f"error {100 * err:+.1f}%; goal +-5%: {'yes' if abs(err) <= 0.05 else 'NO'} |")
        gc.collect()
    for w in names:
        title, fn = WORKLOADS[w]
        native = w == "native"
        w_rows, w_tools = (native_rows(args.rate) if native else (rows, tools))
        fn(1)  # imports, caches, specialisation: before the freeze and the timing
        # (native: wall time, from calls long enough that starting two threads is not what is timed)
        n = calibrate(fn, slice_s, time.perf_counter, 256) if native else calibrate(fn, slice_s)
        for t in w_tools:
            if isinstance(t, DDProf):
                t.samples, t.seconds = 0, 0.0
        gc.collect()
        gc.freeze()
        print(f"\n### {title}: {n} iterations per slice; {load()} (before)")
        ratios, failed = overhead(w_rows, fn, n, pairs, native)
        print(f"{load()} (after); median slowdown vs the baseline (no profiler unless named) ± standard error (IQR)\n")
        report(w_rows, ratios, failed, NATIVE_MEASURES if native else MEASURES)
        if native and THREADS_ON_VS_OFF not in failed:
            diff = sorted(ratios[THREADS_ON_VS_OFF]["wall diff"])
            per_malloc = 1e9 * diff[len(diff) // 2] / (2 * n)
            print(f"\nnative_threads on vs off, paired: {per_malloc:+.0f} ns of wall per malloc "
                  f"of the native threads (median of {len(diff)} pairs; {2 * n} mallocs a slice)")
        gc.unfreeze()
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
