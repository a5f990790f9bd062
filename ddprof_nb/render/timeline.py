"""Samples over time: one lane per thread, runs of the dominant state, ready for bars.

Pure numpy.  A profile without sample timestamps (a folded file, py-spy's output, any
format that stores none) has no time axis: ``timeline_data`` says so in ``has_time``
and carries no runs, and the outputs show a note instead of a chart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..events import EventType
from ..model import Profile
from .format import esc, value_unit
from .tree import pick_event

__all__ = ["TimelineData", "timeline_data", "has_time_axis"]


def has_time_axis(profile: Profile) -> bool:
    """True when the samples carry timestamps: the profile lasted some time or its rows
    fall in more than the first tick.  Formats without time give duration 0, time 0."""
    return profile.metadata.duration_ns > 0 or bool(len(profile) and profile.time_ns.max() > 0)


@dataclass
class TimelineData:
    """Runs of (thread lane, state) over time, ready for bar traces.

    Times are milliseconds from the profile's start.  Each run is one bar:
    ``base[i]`` .. ``base[i] + length[i]`` in lane ``lane[i]``.
    """

    lanes: list[str]
    states: list[str]
    lane: np.ndarray
    state: np.ndarray
    base: np.ndarray
    length: np.ndarray
    value: np.ndarray  # the chosen value summed over the run
    density: np.ndarray  # 0..1: the run's value per tick against the busiest tick
    extent_ms: tuple[float, float]
    unit: str
    event: EventType
    value_index: int
    has_time: bool = True  # False: the profile has no sample timestamps (no runs, no range filter)


def _lanes(profile: Profile, rows: np.ndarray, vals: np.ndarray, max_lanes: int) -> tuple[list[str], np.ndarray]:
    """Lane names (MainThread, then the busiest threads; the rest share ``[other threads]``) and each row's lane."""
    th = profile.thread[rows].astype(np.int64)
    per_thread = np.bincount(th, weights=vals.astype(np.float64), minlength=len(profile.threads))
    # MainThread first (where the user's code runs), then the busiest
    main = np.array([t.name != "MainThread" for t in profile.threads], dtype=bool)
    order = [int(t) for t in np.lexsort((-per_thread, main)) if per_thread[t] > 0] if len(main) else []
    lane_of_thread = np.full(len(profile.threads), -1, dtype=np.int64)
    lanes = []
    for t in order[:max_lanes]:
        lane_of_thread[t] = len(lanes)
        thr = profile.threads[t]
        lanes.append(esc(f"{thr.name} ({thr.tid})"))
    if len(order) > max_lanes:
        lane_of_thread[order[max_lanes:]] = len(lanes)
        lanes.append("[other threads]")
    return lanes, lane_of_thread[th]


def _states(profile: Profile, rows: np.ndarray, state_key: str) -> tuple[list[str], np.ndarray]:
    """The states these rows have (their ``state_key`` label; "" for none) and each row's state."""
    names: list[str] = []
    index: dict[str, int] = {}
    state_of_ls = np.empty(len(profile.labelsets), dtype=np.int64)
    for i, ls in enumerate(profile.labelsets):
        s = ls.get(state_key) or ""
        j = index.get(s)
        if j is None:
            j = index[s] = len(names)
            names.append(s)
        state_of_ls[i] = j
    st = state_of_ls[profile.labels[rows]]
    used = np.flatnonzero(np.bincount(st, minlength=len(names)))
    remap = np.zeros(len(names), dtype=np.int64)
    remap[used] = np.arange(len(used))
    return [names[i] for i in used.tolist()], remap[st]


def timeline_data(
    profile: Profile, event=None, value_index: int = 0, state_key: str = "state", max_lanes: int = 24
) -> TimelineData:
    """Samples over time, one lane per thread, each tick coloured by its dominant state.

    Consecutive ticks with the same state and a similar density (4 levels) merge into
    one run, keeping the bar count small for the browser.  Threads beyond ``max_lanes``
    (least busy first) share one ``[other threads]`` lane.
    """
    e = pick_event(profile, event)
    rows = np.flatnonzero(profile.event == e.value)
    tick = profile.tick_ns
    unit = value_unit(e, value_index)
    extent = (0.0, max(profile.metadata.duration_ns, int(profile.time_ns.max()) + tick if len(profile) else tick) / 1e6)
    timed = has_time_axis(profile)
    if timed and len(rows):  # rows whose chosen value is 0 (a format without counts) draw nothing
        rows = rows[profile.values[rows, value_index] != 0]
    if not timed or not len(rows):
        empty = np.zeros(0)
        return TimelineData([], [], *(np.zeros(0, np.int64),) * 4, empty, empty, extent, unit, e, value_index,
                            has_time=timed)
    vals = profile.values[rows, value_index]
    lanes, lane = _lanes(profile, rows, vals, max_lanes)
    state_names, st = _states(profile, rows, state_key)
    tk = profile.time_ns[rows] // tick
    nst, nt, nl = len(state_names), int(tk.max()) + 1, len(lanes)
    # a dense (lane, tick, state) grid: at most lanes x MAX_TICKS x states cells
    grid = np.bincount((lane * nt + tk) * nst + st, weights=vals, minlength=nl * nt * nst).reshape(nl * nt, nst)
    cell_val = grid.sum(axis=1)
    cells = np.flatnonzero(cell_val > 0)
    c_lane, c_tick = cells // nt, cells % nt
    c_state = np.argmax(grid[cells], axis=1)  # dominant state; first one on ties
    c_val = cell_val[cells]
    level = np.minimum(3, (4 * c_val / max(1.0, float(c_val.max()))).astype(np.int64))
    # runs: same lane, consecutive tick, same state and density level
    brk = np.ones(len(cells), dtype=bool)
    brk[1:] = (c_lane[1:] != c_lane[:-1]) | (c_tick[1:] != c_tick[:-1] + 1) | (c_state[1:] != c_state[:-1]) | (
        level[1:] != level[:-1]
    )
    heads = np.flatnonzero(brk)
    run_len = np.diff(np.append(heads, len(cells)))
    run_val = np.add.reduceat(c_val, heads) if len(heads) else c_val
    tick_ms = tick / 1e6
    no_states = state_names == [""]
    return TimelineData(
        lanes=lanes,
        states=["samples"] if no_states else [esc(s or "(none)") for s in state_names],
        lane=c_lane[heads],
        state=c_state[heads],
        base=c_tick[heads] * tick_ms,
        length=run_len * tick_ms,
        value=np.rint(run_val).astype(np.int64),
        density=(level[heads] + 1) / 4.0,
        extent_ms=extent,
        unit=unit,
        event=e,
        value_index=value_index,
    )

