"""Asyncio, for job 2: what the task sampler's ticks cost and what went wrong in them
(``TickStats``), told in the profile's notes."""

from __future__ import annotations

from ..render.format import format_count, format_duration


class TickStats:
    """Counts kept by the ticks (under the task sampler's lock)."""

    def __init__(self):
        self.ticks = 0
        self.tick_ns = 0
        self.tick_cpu_ns = 0  # the ticks' own CPU time: their wall time adds preemption and GIL waits
        self.subsampled = 0  # ticks that drew a subset of the pending tasks
        self.errors: dict[str, int] = {}  # message -> times

    def error(self, exc: BaseException) -> None:
        """An exception a tick caught (it never reaches the user's loop): at most 5
        distinct messages are kept, each with its count."""
        msg = f"{type(exc).__name__}: {exc}"[:200]
        if msg in self.errors or len(self.errors) < 5:
            self.errors[msg] = self.errors.get(msg, 0) + 1

    def tick(self, took_ns: int, cpu_ns: int) -> None:
        self.tick_ns += took_ns
        self.tick_cpu_ns += cpu_ns
        self.ticks += 1

    def notes(self, loops: int, secs: float, want_park: bool, max_tasks: int, budget_ns: int) -> list[str]:
        """How often the ticks ran and what they cost; whether some drew a subset."""
        per_tick = self.tick_ns / max(1, self.ticks)
        per_tick_cpu = self.tick_cpu_ns / max(1, self.ticks)
        notes = [
            f"asyncio: {self.ticks} task-sampler ticks over {loops} loop(s) "
            f"({format_count(self.ticks / secs)}/s, {format_duration(per_tick)} each, "
            f"{format_duration(per_tick_cpu)} of CPU); "
            f"suspended tasks' wall{'/park' if want_park else ''} on the '(asyncio tasks)' thread(s), "
            "labels state=await|ready"]
        if self.subsampled:
            notes.append(f"asyncio: {self.subsampled} tick(s) saw more pending tasks than their "
                         f"budget ({max_tasks} tasks, {format_duration(budget_ns)}): a random subset "
                         "was sampled and its weights scaled (unbiased, noisier)")
        return notes

    def error_notes(self) -> list[str]:
        if not self.errors:
            return []
        detail = "; ".join(f"{m} (x{n})" for m, n in self.errors.items())
        return [f"asyncio task sampler errors: {detail}"]
