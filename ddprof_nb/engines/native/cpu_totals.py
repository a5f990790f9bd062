"""CPU totals from the threads' own CPU clocks (the native engine's last step at stop).

The project's rule: a profile's CPU total for a thread is what that thread's CPU clock
says it used in the session.  The CPU timers' signals only say where the CPU went: the
kernel checks a thread's CPU timer at the clock ticks the thread is running for, so a
thread that runs between ticks (short bursts, or many runnable tasks sharing a core and
preempting each other between ticks) is signalled late, coalesced, or not at all, and the
last period before stop never signals.  So, per thread with clock CPU in the session:

- it has CPU samples: they are scaled so that they add up to its clock (the split between
  stacks is the samples');
- it has none, but wall samples taken while it was on CPU (``state=cpu``): its clock's CPU
  is split over those stacks in proportion to their wall time (the wall sampler found it
  running there; noted);
- neither: its clock's CPU goes to one ``[cpu not sampled]`` frame beneath the thread, so that
  the CPU total stays right even though nothing says where it went (noted when a thread's is
  at least one interval: less, a timer need not signal, and idle threads, a session's stopper,
  would add the note to every profile).
"""

from __future__ import annotations

import numpy as np

from ...events import EventType, FrameKind
from ...model import Frame, LabelSet, Profile, Thread
from ...render.format import format_count, format_duration

__all__ = ["calibrate_cpu", "UNSAMPLED"]

UNSAMPLED = Frame("[cpu not sampled]", kind=FrameKind.ERROR)
_CPU, _WALL = EventType.CPU.value, EventType.WALL.value


def calibrate_cpu(profile: Profile, totals: dict[int, tuple[int, int]], names: dict[int, str] | None = None,
                  base_labels=None) -> tuple[Profile, list[str]]:
    """The profile with each thread's CPU total set to its clock's (``totals``: {tid: (clock
    CPU used in the session, CPU its samples carried)}), and the notes that say how.
    ``names``: thread names by tid, for a thread that has no row at all yet; ``base_labels``:
    the session's labels (a mapping or (key, value) pairs), for the ``[cpu not sampled]`` rows."""
    if not totals:
        return profile, []
    values = profile.values.copy()
    added = _AddedRows(profile)
    by_tid: dict[int, list[int]] = {}
    for index, thread in enumerate(profile.threads):
        by_tid.setdefault(thread.tid, []).append(index)
    cpu_rows = profile.event == _CPU
    wall_on_cpu = (profile.event == _WALL) & np.isin(
        profile.labels, [i for i, ls in enumerate(profile.labelsets) if ls.get("state") == "cpu"])
    end_tick = (max(0, profile.metadata.duration_ns) // profile.tick_ns) * profile.tick_ns
    factors, from_wall, unsampled = [], [], []
    for tid, (used, _) in sorted(totals.items()):
        if used <= 0:
            continue
        mine = np.isin(profile.thread, by_tid.get(tid, []))
        sel = cpu_rows & mine
        recorded = int(values[sel, 1].sum())
        if recorded > 0:
            k = used / recorded
            values[sel, 1] = np.rint(values[sel, 1] * k).astype(np.int64)
            factors.append(k)
            continue
        wall = np.flatnonzero(wall_on_cpu & mine)
        weights = profile.values[wall, 1]
        if len(wall) and weights.sum() > 0:
            share = _split(used, weights)
            for row, ns in zip(wall.tolist(), share.tolist()):
                if ns <= 0:
                    continue
                ls = profile.labelsets[profile.labels[row]]
                plain = LabelSet.of({k: v for k, v in ls if k != "state"})
                lab = added.index_of("labelsets", plain)
                added.rows.append((_CPU, int(profile.stack[row]), int(profile.thread[row]), lab, int(profile.time_ns[row]),
                            int(profile.values[row, 0]), ns))
            from_wall.append(used)
            continue
        if by_tid.get(tid):
            thread = by_tid[tid][0]
        else:
            t = Thread(tid, (names or {}).get(tid) or f"Thread {tid}")
            thread = added.index_of("threads", t)
        stack = added.index_of("stacks", (added.index_of("frames", UNSAMPLED),))
        lab = added.index_of("labelsets", LabelSet.of(base_labels))
        added.rows.append((_CPU, stack, thread, lab, end_tick, 0, used))
        unsampled.append(used)
    notes = _notes(factors, from_wall, unsampled, profile.metadata.interval_ns)
    if not added.rows:
        return (_rebuild(profile, values=values) if factors else profile), notes
    return added.build(values), notes


class _AddedRows:
    """Rows added to a profile, with the table entries (frames, stacks, threads, label sets)
    they need, indexed after the profile's own."""

    def __init__(self, profile: Profile):
        self.profile = profile
        self.rows: list[tuple[int, int, int, int, int, int, int]] = []  # event, stack, thread, labels, time, count, ns
        self.new: dict[str, list] = {"frames": [], "stacks": [], "threads": [], "labelsets": []}
        self.known: dict = {}  # (table, item) -> its index

    def index_of(self, table: str, item) -> int:
        if table == "labelsets" and (table, item) not in self.known and item in self.profile.labelsets:
            return self.profile.labelsets.index(item)
        if (table, item) not in self.known:
            self.known[(table, item)] = len(getattr(self.profile, table)) + len(self.new[table])
            self.new[table].append(item)
        return self.known[(table, item)]

    def build(self, values: np.ndarray) -> Profile:
        """The profile with ``values`` for its own rows and the added rows after them."""
        p, rows = self.profile, np.array(self.rows, dtype=np.int64)
        tables = {}
        for name, items in self.new.items():
            if items:
                old = getattr(p, name)
                tables[name] = [tuple(x) for x in old] + items if name == "stacks" else list(old) + items
        return _rebuild(
            p, **tables,
            event=np.concatenate([p.event, rows[:, 0].astype(np.uint8)]),
            stack=np.concatenate([p.stack, rows[:, 1].astype(np.int32)]),
            thread=np.concatenate([p.thread, rows[:, 2].astype(np.int32)]),
            labels=np.concatenate([p.labels, rows[:, 3].astype(np.int32)]),
            time_ns=np.concatenate([p.time_ns, rows[:, 4]]),
            values=np.concatenate([values, rows[:, 5:7]]),
        )


def _split(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` split in proportion to ``weights``, in integers that add up to it exactly."""
    share = np.floor(total * (weights / weights.sum())).astype(np.int64)
    share[int(np.argmax(weights))] += total - int(share.sum())
    return share


def _rebuild(profile: Profile, **columns) -> Profile:
    return profile.replace(**columns)


def _notes(factors: list[float], from_wall: list[int], unsampled: list[int], interval_ns: int) -> list[str]:
    notes = []
    if factors:
        notes.append(
            f"cpu: each thread's CPU total is its own CPU clock's ({len(factors)} thread(s); its samples, which "
            f"split it between stacks, had accounted x{format_count(1 / max(factors))} to x{format_count(1 / min(factors))} of it: "
            "timer signals come at clock ticks the thread runs for, and the last period before stop never signals)")
    if from_wall:
        notes.append(
            f"cpu: {len(from_wall)} thread(s) used {format_duration(sum(from_wall))} of CPU (their clocks) that their "
            "timers never signalled: it is split over their wall samples taken while they were on CPU (state=cpu), "
            "in proportion to their wall time")
    big = [u for u in unsampled if u >= interval_ns]
    if big:  # (less than one interval each: a timer need not signal it, the frame's name says enough)
        notes.append(
            f"cpu: {len(big)} thread(s) used {format_duration(sum(big))} of CPU (their clocks) that their "
            "timers never signalled, with no on-CPU wall sample either: it is under "
            f"'{UNSAMPLED.name}' beneath each such thread (the total is right; where it went is unknown)")
    return notes
