"""Soak test (not in CI): many start/stop cycles of every event type on a threaded,
allocating, locking workload.  Prints RSS, open fds, live POSIX timers and threads over
time; each should stay flat.

    python benchmarks/soak.py [--minutes 30] [--cycle 2.0] [--events cpu,wall,alloc,lock,park]
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import threading
import time

import ddprof_nb


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


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
    print(f"{'minute':>7} {'cycles':>7} {'rss MiB':>9} {'fds':>5} {'timers':>7} {'threads':>8} {'samples':>9} {'dropped':>8}")
    start = time.monotonic()
    next_report = start
    cycles = samples = dropped = 0
    first = None
    while time.monotonic() - start < args.minutes * 60:
        with ddprof_nb.profile(events=args.events, interval="10ms") as p:
            time.sleep(args.cycle)
        cycles += 1
        samples += int(p.profile.values[:, 0].sum())
        dropped += sum(p.profile.dropped.values())
        now = time.monotonic()
        if now >= next_report:
            row = (rss_mib(), open_fds(), posix_timers(), threading.active_count())
            first = first or row
            print(f"{(now - start) / 60:7.1f} {cycles:7d} {row[0]:9.1f} {row[1]:5d} {row[2]:7d} {row[3]:8d} {samples:9d} {dropped:8d}",
                  flush=True)
            next_report = now + args.report_every
    stop.set()
    last = (rss_mib(), open_fds(), posix_timers(), threading.active_count())
    print(f"\nend: {cycles} cycles; RSS {first[0]:.1f} -> {last[0]:.1f} MiB, fds {first[1]} -> {last[1]}, "
          f"timers while idle {last[2]} (0 expected), threads {first[3]} -> {last[3]}")


if __name__ == "__main__":
    main()
