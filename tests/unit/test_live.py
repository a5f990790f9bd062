"""The live view's running aggregate (ddprof_nb.live) and its widget's drawing, without a
sampler: rows go into a ProfileBuilder whose tap is the aggregate, as an engine's do."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ddprof_nb import pipeline
from ddprof_nb.events import EventType
from ddprof_nb.live import RECENT_S, LiveAggregate, LiveRefresher, THREAD_NAME, shown_event
from ddprof_nb.model import Frame, ProfileBuilder

NS = 1_000_000_000


def totals(profile) -> dict:
    """(event, frame names of the stack, thread name) -> summed values, time dropped."""
    out: dict = {}
    for i in range(len(profile)):
        key = (int(profile.event[i]), tuple(f.name for f in profile.stack_frames(int(profile.stack[i]))),
               profile.threads[int(profile.thread[i])].name)
        out[key] = out.get(key, np.zeros(2, np.int64)) + profile.values[i]
    return {k: tuple(v.tolist()) for k, v in out.items()}


def fill(builder, rng, n, t0_s, t1_s):
    stacks = [builder.stack_of([Frame(f"f{d}", "m.py", d) for d in range(depth)]) for depth in range(1, 6)]
    threads = [builder.thread_id(100 + k, f"T{k}") for k in range(3)]
    builder.add_many(
        rng.choice([EventType.CPU.value, EventType.WALL.value], n).astype(np.uint8),
        rng.choice(stacks, n), rng.choice(threads, n), np.zeros(n, np.int32),
        rng.integers(int(t0_s * NS), int(t1_s * NS), n), np.stack([np.ones(n, np.int64), rng.integers(1, 10**7, n)], 1))


def test_snapshots_fold_each_batch_once_and_end_equal_to_the_whole_profile():
    rng = np.random.default_rng(3)
    builder = ProfileBuilder()
    live = LiveAggregate()
    builder.tap = live.feed
    seen = []
    for k in range(5):  # five drains, a snapshot after each
        fill(builder, rng, 500, k, k + 1)
        builder.add(EventType.CPU, builder.stack_of([Frame("single", "m.py", 1)]), 0, 0, k * NS, 1, 7)
        builder.flush()  # rows added one by one reach the tap at the drain's flush
        snap = live.snapshot(k + 1)
        assert live._queued == []  # folded once: the next snapshot starts from the aggregate
        seen.append(snap)
    whole = builder.build()
    assert totals(seen[-1].profile) == totals(whole)
    # the samples so far only grow, and end at the whole profile's counts
    assert [s.samples[EventType.CPU] for s in seen] == sorted(s.samples[EventType.CPU] for s in seen)
    for e in (EventType.CPU, EventType.WALL):
        assert seen[-1].samples[e] == int(whole.values[whole.event == e.value, 0].sum())
    # a snapshot with nothing new is the same aggregate
    assert totals(live.snapshot().profile) == totals(whole)


def test_recent_counts_per_thread_and_second_leave_out_the_unfinished_seconds():
    builder = ProfileBuilder()
    live = LiveAggregate(start_mono_ns=time.monotonic_ns() - int(5.5 * NS))  # 5.5 s into the session
    builder.tap = live.feed
    st = builder.stack_of([Frame("f", "m.py", 1)])
    a, b = builder.thread_id(1, "A"), builder.thread_id(2, "B")
    for t_s, thread, count in ((1.2, a, 3), (1.7, a, 2), (3.5, b, 4), (4.2, a, 9), (5.1, a, 9)):
        builder.add_many(EventType.WALL, [st], thread, 0, [int(t_s * NS)], [[count, count * 10]])
    recent = live.snapshot().recent[EventType.WALL]
    # seconds 4 (still partly in the sampler's buffers) and 5 (unfinished) are not shown
    first = 5 - 1 - RECENT_S
    assert recent[a][1 - first] == 5 and sum(recent[a]) == 5
    assert recent[b][3 - first] == 4 and sum(recent[b]) == 4
    assert len(recent[a]) == RECENT_S


def test_live_steps_are_the_stack_shaping_ones_in_order():
    assert pipeline.live_steps(pipeline.MAGIC) == (pipeline.trim_caller, pipeline.drop_sampler_frames,
                                                   pipeline.fold_asyncio, pipeline.reroot)
    assert pipeline.live_steps(pipeline.PYTHON_API)[-1] is pipeline.name_cells


def test_refresher_stops_at_a_failing_sink_and_its_thread_ends():
    class Failing:
        calls = 0

        def update(self, snap):
            Failing.calls += 1
            raise RuntimeError("gone")

    r = LiveRefresher(LiveAggregate(), Failing(), period=0.02)
    r.start()
    deadline = time.monotonic() + 10
    while r.alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not r.alive and Failing.calls == 1 and r.error == "RuntimeError: gone"
    r.stop()
    assert THREAD_NAME not in {t.name for t in threading.enumerate()}


def test_refresher_refuses_a_bad_period():
    with pytest.raises(ValueError, match="refresh period"):
        LiveRefresher(LiveAggregate(), object(), period=0)


def test_live_view_draws_the_shaped_view_and_reuses_its_skeleton():
    pytest.importorskip("ipywidgets")
    from ddprof_nb.explorer.live_view import LiveView

    builder = ProfileBuilder()
    live = LiveAggregate()
    builder.tap = live.feed
    st = builder.stack_of([Frame("outer", "m.py", 1), Frame("hot_loop", "m.py", 2)])
    main = builder.thread_id(1, "MainThread")
    builder.add_many(EventType.CPU, [st, st], main, 0, [0, NS], [[1, 5], [1, 5]])
    shaped = []

    def shape(p):
        shaped.append(len(p))
        return p

    view = LiveView(shape=shape)
    view.update(live.snapshot(1))
    assert "hot_loop" in view.flame.value and view.refreshes == 1
    first = view._skeleton[1]
    # new samples of known keys: the values change, the skeleton is not shaped again
    builder.add_many(EventType.CPU, [st], main, 0, [2 * NS], [[1, 5]])
    view.update(live.snapshot(2))
    assert shaped == [1] and view._skeleton[1] is first
    # a new stack: shaped again
    other = builder.stack_of([Frame("outer", "m.py", 1), Frame("cold", "m.py", 3)])
    builder.add_many(EventType.CPU, [other], main, 0, [2 * NS], [[1, 5]])
    view.update(live.snapshot(3))
    assert shaped == [1, 2] and "cold" in view.flame.value
    assert "data-refreshes='3'" in view.status.value


def test_the_live_display_shows_an_event_with_weight_not_the_observations_of_zero():
    # GIVEN an alloc-only session with native threads: the observations behind their attribution
    # are CPU rows of count 0 beside the ALLOC rows
    builder = ProfileBuilder()
    st, th = builder.stack_of([Frame("f", "m.py", 1)]), builder.thread_id(1, "A")
    builder.add(EventType.CPU, st, th, 0, 0, 0, 0)
    builder.add(EventType.ALLOC, st, th, 0, 0, 2, 4096)
    profile = builder.build()
    # THEN the live flame and line show ALLOC; with CPU samples of weight, CPU
    assert shown_event(profile) is EventType.ALLOC
    builder.add(EventType.CPU, st, th, 0, 0, 1, 10_000_000)
    assert shown_event(builder.build()) is EventType.CPU
    assert shown_event(ProfileBuilder().build()) is None
