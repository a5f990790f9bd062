"""Soak test (not in CI): many start/stop cycles of every event type on a threaded,
allocating, locking workload.  Prints RSS, malloc'd bytes in use, open fds, live POSIX
timers (while sampling and between sessions) and threads over time; each should stay flat.

    python benchmarks/soak.py [--minutes 30] [--cycle 2.0] [--events cpu,wall,alloc,lock,park]

"malloc MiB" (glibc mallinfo2: bytes in use in every arena) separates a leak from
allocator fragmentation: RSS that creeps while it stays flat is free memory the
allocator keeps, not memory anyone holds.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import queue
import random
import threading
import time

import ddprof_nb


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def malloc_mib() -> float:
    """Bytes malloc'd and not freed (all glibc arenas, incl. mmapped chunks); -1 off glibc."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return -1.0
    fn.restype = _MallInfo2
    mi = fn()
    return (mi.uordblks + mi.hblkhd) / 2**20


def _malloc_trim() -> float | None:
    """RSS after glibc's malloc_trim(0) (None off glibc)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        return None
    return rss_mib()


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (minute, value) points."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    den = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / den if den else 0.0


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def posix_timers() -> int:
    try:
        with open("/proc/self/timers") as f:
            return sum(1 for line in f if line.startswith("ID:"))
    except OSError:
        return -1


def workload(stop: threading.Event) -> None:
    """Threads that allocate, contend on a lock, sleep and pass work through a queue."""
    lock = threading.Lock()
    q: queue.Queue = queue.Queue(maxsize=100)
    kept: list = []

    def producer():
        while not stop.is_set():
            q.put({"k": [random.random() for _ in range(50)]})

    def consumer():
        while not stop.is_set():
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                continue
            with lock:
                kept.append(item)
                if len(kept) > 2000:
                    del kept[:1000]
            time.sleep(0.0005)

    workers = [threading.Thread(target=producer, daemon=True)] + [
        threading.Thread(target=consumer, daemon=True) for _ in range(3)
    ]
    for t in workers:
        t.start()
    stop.wait()
    for t in workers:
        t.join(1)


def short_lived_threads(stop: threading.Event) -> None:
    """Threads that start and exit all the time (timer creation/deletion churn)."""
    while not stop.is_set():
        t = threading.Thread(target=lambda: sum(range(20000)))
        t.start()
        t.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--cycle", type=float, default=2.0, help="seconds per profiling session")
    ap.add_argument("--events", default="cpu,wall,alloc,lock,park")
    ap.add_argument("--report-every", type=float, default=60.0, help="seconds between table rows")
    args = ap.parse_args()

    stop = threading.Event()
    background = [threading.Thread(target=workload, args=(stop,), daemon=True),
                  threading.Thread(target=short_lived_threads, args=(stop,), daemon=True)]
    for t in background:
        t.start()
    time.sleep(1.0)
    print(f"{'minute':>7} {'cycles':>7} {'rss MiB':>8} {'malloc MiB':>10} {'fds':>4} {'timers run':>10} "
          f"{'timers idle':>11} {'threads':>7} {'cpu+wall samples':>16} {'dropped':>8}")
    start = time.monotonic()
    next_report = start
    cycles = samples = dropped = 0
    rows = []
    while time.monotonic() - start < args.minutes * 60:
        with ddprof_nb.profile(events=args.events, interval="10ms") as p:
            time.sleep(args.cycle / 2)
            running_timers = posix_timers()
            time.sleep(args.cycle / 2)
        cycles += 1
        samples += sum(int(p.profile.total(e, 0)) for e in ("cpu", "wall") if e in args.events)
        dropped += sum(p.profile.dropped.values())
        del p
        now = time.monotonic()
        if now >= next_report:
            minute = (now - start) / 60
            row = (minute, rss_mib(), malloc_mib(), open_fds(), running_timers, posix_timers(), threading.active_count())
            rows.append(row)
            print(f"{minute:7.1f} {cycles:7d} {row[1]:8.1f} {row[2]:10.2f} {row[3]:4d} {row[4]:10d} {row[5]:11d} "
                  f"{row[6]:7d} {samples:16d} {dropped:8d}", flush=True)
            next_report = now + args.report_every
    stop.set()
    first, last = rows[0], rows[-1]
    # the first fifth is warm-up (caches, allocator arenas, the first profiles' tables)
    warm = [r for r in rows if r[0] >= args.minutes / 5] or rows
    print(f"\nend: {cycles} cycles in {(time.monotonic() - start) / 60:.1f} min; "
          f"RSS {first[1]:.1f} -> {last[1]:.1f} MiB ({slope_per_min([(r[0], r[1]) for r in warm]):+.3f} MiB/min after warm-up), "
          f"malloc in use {first[2]:.2f} -> {last[2]:.2f} MiB ({slope_per_min([(r[0], r[2]) for r in warm]):+.3f} MiB/min), "
          f"fds {first[3]} -> {last[3]}, timers while sampling {min(r[4] for r in rows)}..{max(r[4] for r in rows)}, "
          f"timers between sessions max {max(r[5] for r in rows)} (0 expected), threads {first[6]} -> {last[6]}")
    # RSS growth the allocator gives back on request is free memory it kept, not a leak
    trimmed = _malloc_trim()
    if trimmed is not None:
        print(f"after malloc_trim(0): RSS {trimmed:.1f} MiB (free memory glibc had kept: {last[1] - trimmed:.1f} MiB)")

if __name__ == "__main__":
    main()
