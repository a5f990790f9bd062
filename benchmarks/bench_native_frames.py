"""Cost of native frames: symbolizing addresses, and walking native stacks from a signal.

    python benchmarks/bench_native_frames.py [--quick] [--pairs N] [--slice S] [--hz 100]

1. Symbolize: a new Symbolizer (every library read for the first time) resolves 10,000
   distinct addresses spread over every executable mapping of this process (numpy
   imported); median of --repeats.  Goal (issue: native frames): <= 0.5 s.
2. Walk: a C extension (built here with cffi, -O2 without frame pointers) recursing 3 or
   128 frames deep, then burning.  A CPU timer at --hz on the burning thread walks its
   native stack from its signal handler (ddp_test_unwind_*); reported: the median walk
   time, and adjacent pairs of --slice s of burn with the timer walking and without, order
   alternating, in one process: the median with/bare ratio of the thread's CPU time ± its
   standard error (0.93 x IQR / sqrt(pairs)).  Goal: <= +2 % at 100 Hz, 128 deep included.
3. Sessions: CPU + wall at --hz with native frames on against off (each slice its own
   session), on call-heavy Python (fib) and numpy matmul + sha256 (one BLAS thread): the
   median on/off ratio of the workload thread's CPU time ± its standard error.  Goal: <= +2 %.
--quick: 30 pairs of 0.1 s slices, 3 repeats; default 40 pairs of 0.2 s, 5 repeats.
"""

from __future__ import annotations

import argparse
import math
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one BLAS thread: its CPU is the timed thread's
import random
import signal
import statistics
import sys
import tempfile
import time

EXT = r"""
#include <stdint.h>
static volatile uint64_t sink;
__attribute__((noinline)) static uint64_t spin(uint64_t n)
{
    uint64_t a = 1, b = 2;
    for (uint64_t i = 0; i < n; i++) { a = a * 6364136223846793005ULL + b; b ^= a >> 7; }
    return a ^ b;
}
__attribute__((noinline)) uint64_t nf_deep(int depth, uint64_t n)
{
    volatile uint64_t pad[4];
    pad[0] = depth;
    uint64_t r = depth <= 1 ? spin(n) : nf_deep(depth - 1, n) + 1; /* +1: no tail call */
    sink = pad[0];
    return r;
}
"""


def build_ext(out: str):
    import cffi

    ffi = cffi.FFI()
    ffi.cdef("uint64_t nf_deep(int depth, uint64_t n);")
    ffi.set_source("_nf_bench", EXT, extra_compile_args=["-O2", "-fomit-frame-pointer"])
    ffi.compile(tmpdir=out, verbose=False)
    sys.path.insert(0, out)
    import _nf_bench

    return _nf_bench.lib


def median_se(xs):
    xs = sorted(xs)
    q1, q3 = xs[len(xs) // 4], xs[(3 * len(xs)) // 4]
    return statistics.median(xs), 0.93 * (q3 - q1) / math.sqrt(len(xs))


def bench_symbolize(repeats: int) -> list[float]:
    import numpy  # noqa: F401  (its libraries are mapped: more, and bigger, symbol tables)

    from ddprof_nb import elfsyms, nativesyms
    from ddprof_nb.nativesyms import Symbolizer

    maps = [m for m in elfsyms.mappings(os.getpid()) if "x" in m.perms and m.path.startswith("/")]
    out = []
    for r in range(repeats):
        rng = random.Random(r)
        addrs: set[int] = set()
        while len(addrs) < 10_000:
            m = rng.choice(maps)
            addrs.add(rng.randrange(m.start, m.end))
        nativesyms._read.clear()  # (cold: every library's symbols read, as in a process's first session)
        t = time.perf_counter()
        sym = Symbolizer()
        for a in addrs:
            sym.resolve(a)
        out.append(time.perf_counter() - t)
    return out


def bench_walk(ext, depth: int, pairs: int, slice_s: float, hz: int):
    from ddprof_nb import _native

    lib, ffi = _native.lib, _native.ffi
    n = 1_000_000
    t = time.thread_time()
    ext.nf_deep(depth, n)
    per_n = (time.thread_time() - t) / n
    n = max(1000, int(slice_s / per_n))
    ratios, walk_ns = [], []
    pcs, fl, ns = ffi.new("uint64_t[]", 256), ffi.new("int32_t*"), ffi.new("int64_t*")
    depths = []

    def timed(walking: bool) -> float:
        if walking:
            assert lib.ddp_test_unwind_start(signal.SIGPROF, 1_000_000_000 // hz, 256) == 0
        t0 = time.thread_time()
        ext.nf_deep(depth, n)
        dt = time.thread_time() - t0
        if walking:
            taken = lib.ddp_test_unwind_stop()
            for i in range(taken):
                depths.append(lib.ddp_test_unwind_get(i, pcs, 256, fl, ns))
                walk_ns.append(ns[0])
            lib.ddp_test_unwind_free()
        return dt

    for p in range(pairs):
        if p % 2:
            w, b = timed(True), timed(False)
        else:
            b, w = timed(False), timed(True)
        ratios.append(w / b)
    return ratios, walk_ns, depths


def bench_sessions(pairs: int, slice_s: float, hz: int) -> dict:
    """Sessions with native frames on against off: per workload, the with/without ratios of
    the workload thread's CPU time over adjacent slices, each slice inside its own session
    (start and stop outside the timed part), order alternating."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from workloads import Numeric, calibrate, call_heavy

    from ddprof_nb.config import SamplerConfig
    from ddprof_nb.engines.native import NativeEngine

    interval = f"{1000 // hz}ms"
    out = {}
    for label, work in (("call-heavy Python (fib)", call_heavy), ("numpy matmul + sha256", Numeric())):
        units = calibrate(work, slice_s)

        def timed(native: bool) -> float:
            e = NativeEngine(SamplerConfig.make(events=("cpu", "wall"), interval=interval, native=native))
            e.start()
            t0 = time.thread_time()
            work(units)
            dt = time.thread_time() - t0
            e.stop()
            return dt

        ratios = []
        for p in range(pairs):
            if p % 2:
                on, off = timed(True), timed(False)
            else:
                off, on = timed(False), timed(True)
            ratios.append(on / off)
        out[label] = ratios
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pairs", type=int)
    ap.add_argument("--slice", type=float)
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--hz", type=int, default=100)
    a = ap.parse_args(argv)
    pairs = a.pairs or (30 if a.quick else 40)
    slice_s = a.slice or (0.1 if a.quick else 0.2)
    repeats = a.repeats or (3 if a.quick else 5)
    print(f"# bench_native_frames  python {sys.version.split()[0]}  pairs={pairs} slice={slice_s}s hz={a.hz}")
    sym = bench_symbolize(repeats)
    print(f"symbolize 10,000 distinct addresses (cold): median {statistics.median(sym):.3f} s "
          f"(min {min(sym):.3f}, max {max(sym):.3f}; goal <= 0.5 s)")
    for label, ratios in bench_sessions(pairs, slice_s, a.hz).items():
        med, se = median_se(ratios)
        print(f"session, native on vs off, {label}: CPU {(med - 1) * 100:+.2f} % ± {se * 100:.2f} "
              f"over {len(ratios)} pairs (goal <= +2 %)")
    with tempfile.TemporaryDirectory() as tmp:
        ext = build_ext(tmp)
        for depth in (3, 128):
            ratios, walk_ns, depths = bench_walk(ext, depth, pairs, slice_s, a.hz)
            med, se = median_se(ratios)
            wn = statistics.median(walk_ns) if walk_ns else float("nan")
            dd = statistics.median(depths) if depths else 0
            print(f"walk, {depth:3d} C frames deep: median walk {wn / 1000:.1f} us over {len(walk_ns)} walks "
                  f"(median depth {dd:.0f}); CPU with/bare {(med - 1) * 100:+.2f} % ± {se * 100:.2f} "
                  f"(goal <= +2 %)")


if __name__ == "__main__":
    main()
