"""Clock helpers shared by the benchmarks."""

from __future__ import annotations


def run_queue_wait() -> float | None:
    """Seconds this thread has spent runnable but waiting for a CPU (schedstat field 2),
    or None where the kernel does not say.  Wall minus this is what an idle machine shows."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
