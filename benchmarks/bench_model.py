"""Profile model benchmark: ingest 1,000,000 synthetic samples over 50,000 unique stacks,
then time a focus filter, a top table, a merge and a trim of the stop pipeline (every stack
re-interned), a pprof export, and loading that profile back with
``ddprof_nb.load`` from pprof, speedscope and folded files.  Prints a table.

    python benchmarks/bench_model.py [--samples 1000000] [--stacks 50000] [--no-load]

Goals: ingest >= 1 M samples/s; filter + top < 0.5 s.  Loading (goal
"every profile opens"): a 1 M-sample pprof in <= 5 s.  Load rows give wall and process CPU
time (on a shared machine CPU time is the steadier one).
Peak memory is the process's peak RSS growth over the run (ru_maxrss).
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import tempfile
import time

import numpy as np

from ddprof_nb.model import Frame, Metadata, ProfileBuilder


def synthetic_stacks(builder: ProfileBuilder, n_stacks: int, rng) -> None:
    """Tree-shaped stacks: 20 modules x 100 functions, depth 8-40, shared prefixes."""
    frames = [builder.frame_id(Frame(f"mod{m}.func{f}", f"/src/mod{m}.py", 10 + f, 10 + f))
              for m in range(20) for f in range(100)]
    roots = [frames[i] for i in rng.choice(len(frames), 50, replace=False)]
    while len(builder._stacks) < n_stacks:
        depth = int(rng.integers(8, 41))
        stack = [roots[int(rng.integers(0, len(roots)))]]
        stack += [frames[int(i)] for i in rng.integers(0, len(frames), depth - 1)]
        builder.stack_id(stack)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--stacks", type=int, default=50_000)
    ap.add_argument("--no-load", action="store_true", help="skip the load rows (writing the files takes ~30 s)")
    args = ap.parse_args()
    rng = np.random.default_rng(42)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    duration = 60 * 10**9
    builder = ProfileBuilder(Metadata(start_ns=0, end_ns=duration, interval_ns=10_000_000, engine="synthetic"))
    synthetic_stacks(builder, args.stacks, rng)
    for t in range(8):
        builder.thread_id(1000 + t, f"thread-{t}")
    n = args.samples
    events = rng.integers(0, 2, n)  # cpu and wall
    stacks = (rng.zipf(1.3, n) - 1) % args.stacks  # skewed like real profiles
    threads = rng.integers(0, 8, n)
    times = np.sort(rng.integers(0, duration, n))
    values = np.column_stack([np.ones(n, np.int64), np.full(n, 10_000_000, np.int64)])

    t0 = time.perf_counter()
    # engines hand over batches (one drain = one batch); 10k samples per batch
    for i in range(0, n, 10_000):
        builder.add_many(events[i:i + 10_000], stacks[i:i + 10_000], threads[i:i + 10_000], 0,
                         times[i:i + 10_000], values[i:i + 10_000])
    profile = builder.build()
    t_ingest = time.perf_counter() - t0

    t0 = time.perf_counter()
    focused = profile.filter(events=["cpu"], focus=r"mod3\.func(1|2)\d")
    t_focus = time.perf_counter() - t0

    t0 = time.perf_counter()
    rows = focused.top("cpu", n=50)
    t_top = time.perf_counter() - t0

    # the stop pipeline's re-interning steps (every stack of the profile, each once)
    from ddprof_nb.model import rooting, selection
    t0 = time.perf_counter()
    selection.merge(profile, focused)
    t_merge = time.perf_counter() - t0
    root = profile.frames[profile.stacks[0][0]]
    t0 = time.perf_counter()
    rooting.trim_prefix(profile, 1000, [(root.name, root.filename, root.first_line)], keep_last=False)
    t_trim = time.perf_counter() - t0

    t_pprof = float("nan")
    try:
        from ddprof_nb.exporters import pprof
    except ImportError:
        pprof = None
    if pprof is not None:
        t0 = time.perf_counter()
        buf = io.BytesIO()
        pprof.write(profile, buf)
        t_pprof = time.perf_counter() - t0
    peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024

    print(f"{'measure':<34}{'value':>16}   goal")
    print(f"{'-' * 34}{'-' * 16}   ----")
    print(f"{'samples ingested':<34}{n:>16,}")
    print(f"{'unique stacks':<34}{len(profile.stacks):>16,}")
    print(f"{'aggregated rows':<34}{len(profile):>16,}")
    print(f"{'ingest rate (samples/s)':<34}{n / t_ingest:>16,.0f}   >= 1,000,000")
    print(f"{'focus filter (s)':<34}{t_focus:>16.3f}")
    print(f"{'top table (s)':<34}{t_top:>16.3f}")
    print(f"{'filter + top (s)':<34}{t_focus + t_top:>16.3f}   < 0.5")
    print(f"{'merge with the focused view (s)':<34}{t_merge:>16.3f}")
    print(f"{'trim a root frame (s)':<34}{t_trim:>16.3f}")
    print(f"{'pprof export (s)':<34}{t_pprof:>16.3f}")
    print(f"{'peak RSS growth (MiB)':<34}{peak_mb:>16.1f}")
    print(f"top function: {rows[0].name if rows else '-'}")
    if not args.no_load:
        load_rows(args.samples, args.stacks)


def load_rows(n_samples: int, n_stacks: int) -> None:
    """Save bench_explorer's profile (samples at distinct times, so a 1 M-sample file holds
    ~0.93 M samples after aggregation, where the one above aggregates to ~0.38 M) in each
    format, then time ``ddprof_nb.load`` of each file."""
    from bench_explorer import synthetic_profile

    from ddprof_nb import load
    from ddprof_nb.exporters import folded, pprof, speedscope

    profile = synthetic_profile(n_samples, n_stacks)
    print(f"\n{'load of ' + format(len(profile), ',') + ' rows':<34}"
          f"{'wall (s)':>10}{'CPU (s)':>10}{'MB':>8}   goal  (load average {os.getloadavg()[0]:.1f})")
    with tempfile.TemporaryDirectory() as d:
        for label, path, writer in (("pprof", os.path.join(d, "p.pprof"), pprof.write),
                                    ("speedscope", os.path.join(d, "p.speedscope.json"), speedscope.write),
                                    ("folded (directory)", os.path.join(d, "folded"), folded.write)):
            writer(profile, path)
            size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) \
                if os.path.isdir(path) else os.path.getsize(path)
            c0, t0 = time.process_time(), time.perf_counter()
            back = load(path)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            assert int(back.values[:, 1].sum()) == int(profile.values[:, 1].sum())
            goal = "<= 5" if label == "pprof" else ""
            print(f"{'load ' + label:<34}{wall:>10.2f}{cpu:>10.2f}{size / 1e6:>8.1f}   {goal}")


if __name__ == "__main__":
    main()
