"""Asyncio-aware profiling on real event loops, on the python and the native engine:
wall/park attribution by task against a ground truth, labels reaching child tasks and
threads, the slot following the running task, blockers named, loops already running.

Profiles are taken by ``Sampler`` (``take``), which runs the engine and a ``TaskSampler``
side by side, merges them and folds the loop's frames (config ``asyncio="fold"``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import sys
import threading
import time
from collections import defaultdict

import pytest

from ddprof_nb import EventType, labeling
from ddprof_nb.model import selection
from ddprof_nb import asyncio_support as A
from ddprof_nb.aio import stepper as S
from ddprof_nb.config import SamplerConfig
from ddprof_nb.engines.python import PythonEngine
from ddprof_nb.model import EMPTY_LABELS
from ddprof_nb.sampler import Sampler


def _native_param():
    try:
        from ddprof_nb.engines.native import NativeEngine
    except Exception as exc:  # noqa: BLE001 - report why
        return pytest.param("native", marks=pytest.mark.skip(reason=f"native engine not importable: {exc}"))
    reason = NativeEngine.unavailable_reason()
    if reason:
        return pytest.param("native", marks=pytest.mark.skip(reason=f"native engine unavailable: {reason}"))
    return "native"


ENGINES = ["python", _native_param()]


def _c_stepper_param():
    if S._STEP_BASE is None:
        return pytest.param("c", marks=pytest.mark.skip(reason="no C task stepper: the native module did not load"))
    return "c"


@pytest.fixture(autouse=True, params=[_c_stepper_param(), "py"], ids=lambda p: f"{p}-stepper")
def stepper(request, monkeypatch):
    """Every test runs with each task stepper: the C one (native/aiostep.c, the default when
    the native module loads) and the pure-Python one, which must behave the same."""
    if request.param == "py":
        monkeypatch.setattr(S, "_TaskCoro", S._PyTaskCoro)
    return request.param


def engine_class(name):
    if name == "python":
        return PythonEngine
    from ddprof_nb.engines.native import NativeEngine

    return NativeEngine


class take:
    """``with take(engine, events) as t: ...`` then ``t.profile`` (folded).

    Profiles are taken by ``Sampler`` (asyncio="fold"), as the API and magics take them;
    given TaskSampler options (``max_tasks_per_tick``, ``tick_budget``), the engine and a
    TaskSampler built with them run side by side the way Sampler runs them."""

    def __init__(self, engine: str, events=("cpu", "wall", "park"), interval="5ms", **sampler_options):
        self.config = SamplerConfig.make(events=events, engine=engine, interval=interval)
        self.sampler = None if sampler_options else Sampler(self.config)
        if sampler_options:
            ecfg = A.engine_config(self.config)
            self.engine = engine_class(ecfg.engine)(ecfg)
            self.tasks = A.TaskSampler(self.config, **sampler_options)
        self.profile = None

    def start(self):
        if self.sampler is not None:
            self.sampler.start(trim="none")
        else:
            self.engine.start()
            self.tasks.start()
        return self

    def stop(self):
        if self.sampler is not None:
            self.profile = self.sampler.stop()
        else:
            tp = self.tasks.stop()
            self.profile = A.fold_loop_frames(selection.merge(self.engine.stop(), tp))
            self.tasks.release()
        return self.profile

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def burn_wall(seconds):
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        for _ in range(100):
            x += 1
    return x


def burn_cpu(seconds):
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for _ in range(100):
            x += 1
    return x


def by(profile, event, key):
    out = defaultdict(int)
    for s in profile.samples():
        if s.event is event:
            out[key(s)] += s.values[1]
    return dict(out)


def shares(d, keys):
    total = sum(d.get(k, 0) for k in keys)
    return {k: d.get(k, 0) / total for k in keys} if total else {}


def fnames(sample):
    return {f.name for f in sample.stack}


# -- ground truth ------------------------------------------------------------------------------
async def sleeper(n, delay, truth, name):
    t_start = time.perf_counter()
    parked = 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        await asyncio.sleep(delay)
        parked += time.perf_counter() - t0
    truth[name] = (time.perf_counter() - t_start, parked)


BLOCK = b"x" * (1 << 16)


def burn_hashing(seconds):
    """CPU work that releases the GIL (hashlib on 64 KiB blocks)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        hashlib.sha256(BLOCK).digest()


def compute_for(engine):
    # The python engine reads stacks only when its thread gets the GIL, so a loop
    # thread computing in pure Python is sampled at its next GIL release, the selector
    # (NOTE_GIL in engines/python.py): the running task's wall then shifts to the idle
    # loop, an engine limit measured at ~10 points here.  Its ground truth computes
    # with GIL-releasing work; the native engine's computes in pure Python.
    return burn_hashing if engine == "python" else burn_wall


async def computer(chunks, chunk_s, truth, name, burn=burn_wall):
    t_start = time.perf_counter()
    for _ in range(chunks):
        burn(chunk_s)
        await asyncio.sleep(0)
    truth[name] = (time.perf_counter() - t_start, 0.0)


async def ground_truth_program(truth, burn=burn_wall):
    loop = asyncio.get_running_loop()
    await asyncio.gather(
        loop.create_task(sleeper(10, 0.03, truth, "A"), name="A"),
        loop.create_task(sleeper(20, 0.03, truth, "B"), name="B"),
        loop.create_task(sleeper(30, 0.03, truth, "C"), name="C"),
        loop.create_task(computer(60, 0.005, truth, "D", burn), name="D"),
    )


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.quick
def test_wall_and_park_by_task_match_the_ground_truth(engine):
    # GIVEN three tasks sleeping 0.3, 0.6 and 0.9 s in 30 ms sleeps and one computing
    # 0.3 s in 5 ms chunks, their truth measured by the tasks themselves
    truth = {}
    with take(engine) as t:
        asyncio.run(ground_truth_program(truth, compute_for(engine)))
    p = t.profile
    wall = by(p, EventType.WALL, lambda s: s.labels.get("task"))
    park = by(p, EventType.PARK, lambda s: s.labels.get("task"))
    # THEN each task's share of the four tasks' wall time (its lifetime) is within 5 points
    got, want = shares(wall, "ABCD"), shares({k: v[0] for k, v in truth.items()}, "ABCD")
    for k in "ABCD":
        assert abs(got[k] - want[k]) <= 0.05, (k, got, want)
    # AND each sleeper's share of the sleepers' park time is within 5 points
    got, want = shares(park, "ABC"), shares({k: v[1] for k, v in truth.items()}, "ABC")
    for k in "ABC":
        assert abs(got[k] - want[k]) <= 0.05, (k, got, want)
    # AND the computing task never parks; its wall is mostly running (engine samples)
    assert park.get("D", 0) < 0.05 * sum(park.values())
    # AND park stacks name what the task awaits; every park sample has a task
    parked = by(p, EventType.PARK, lambda s: (s.labels.get("task"), s.stack[-1].name, s.stack[-2].name,
                                              s.thread.name))
    assert {k[:3] for k in parked if k[0] and k[0] in "ABC"} == {(n, "[asyncio.sleep]", "sleeper") for n in "ABC"}
    # every park sample of the tasks' twin has a task; the loop thread's own park (the
    # native engine samples its selector wait) has none
    assert None not in {k[0] for k in parked if k[3].endswith("(asyncio tasks)")}
    loop_park = {k: v for k, v in parked.items() if k[3] == "MainThread"}
    assert all(k[0] is None for k in loop_park), loop_park
    # AND the suspended tasks' samples sit on the loop thread's "(asyncio tasks)" twin
    names = {s.thread.name for s in p.samples() if s.event is EventType.PARK and s.labels.get("task")}
    assert names == {"MainThread (asyncio tasks)"}
    # AND the running task's stack shows loop, task, chain
    running = [s for s in p.samples() if s.event is EventType.WALL and s.labels.get("task") == "D"
               and {"burn_wall", "burn_hashing"} & fnames(s)]
    # (a failure shows the samples that broke it, with their frames' kinds, not the first one)
    odd = [s for s in running if [f.name for f in s.stack][-4:-1] != ["[asyncio loop]", "[task D]", "computer"]]
    assert running and not odd, (f"{len(odd)} of {len(running)} samples", [
        ([f"{f.name} ({f.kind.name.lower()})" for f in s.stack], dict(s.labels), s.thread.name) for s in odd[:3]],
        [n for n in p.metadata.notes if "torn" in n or "dropped" in n])


# -- labels follow tasks and threads ---------------------------------------------------------
def child_work():
    burn_cpu(0.15)


def pool_work():
    burn_cpu(0.15)


def thread_work():
    burn_cpu(0.15)


def to_thread_work():
    burn_cpu(0.15)


async def child_task():
    child_work()
    await asyncio.sleep(0)
    child_work()


async def labelled_parent():
    loop = asyncio.get_running_loop()
    with labeling.labels(req="r1"):
        await loop.create_task(child_task(), name="child")
        await loop.run_in_executor(None, pool_work)
        await asyncio.to_thread(to_thread_work)
        th = threading.Thread(target=thread_work, name="started-in-task")
        th.start()
        await loop.run_in_executor(None, th.join)
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as ex:
            await asyncio.wrap_future(ex.submit(pool_work))


@pytest.mark.parametrize("engine", ENGINES)
def test_labels_reach_child_tasks_and_threads(engine):
    # GIVEN a task under labels(req=r1) that creates a task and starts pool work and a thread
    with take(engine, events=("cpu",)) as t:
        asyncio.run(labelled_parent(), debug=False)
    p = t.profile
    cpu = by(p, EventType.CPU, lambda s: (
        next((n for n in ("child_work", "pool_work", "thread_work", "to_thread_work") if n in fnames(s)), None),
        s.labels.get("req"), s.labels.get("task")))
    # THEN every CPU sample of the child task carries req=r1 and task=child
    for fn in ("child_work", "pool_work", "thread_work", "to_thread_work"):
        mine = {k: v for k, v in cpu.items() if k[0] == fn}
        assert mine, (fn, cpu)
        assert {k[1] for k in mine} == {"r1"}, (fn, mine)
    assert {k[2] for k in cpu if k[0] == "child_work"} == {"child"}, cpu
    # AND work done in threads for the parent task carries the parent's task name
    parent = {k[2] for k in cpu if k[0] in ("pool_work", "to_thread_work", "thread_work")}
    assert parent == {"Task-1"} or (len(parent) == 1 and parent != {"child"}), cpu


async def interleaved(n, burn):
    async def worker(tag):
        with labeling.labels(x=tag):
            for _ in range(n):
                burn(0.004)
                await asyncio.sleep(0)

    async def idle():
        await asyncio.sleep(0.05)  # the loop idles a while: no labels may leak onto it

    await asyncio.gather(worker("a"), worker("b"), idle())
    await asyncio.sleep(0.1)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_published_labels_follow_the_running_task(engine):
    # GIVEN two tasks with different labels taking turns on the loop thread
    with take(engine, events=("cpu", "wall")) as t:
        asyncio.run(interleaved(60, compute_for(engine)))
    p = t.profile
    cpu = by(p, EventType.CPU, lambda s: (any(f.name.endswith("worker") for f in s.stack), s.labels.get("x")))
    # THEN each task's CPU carries its own label only
    worker = {k: v for k, v in cpu.items() if k[0]}
    assert {(True, "a"), (True, "b")} <= set(worker) <= {(True, "a"), (True, "b"), (True, None)}, cpu
    # (a sample may land in a worker's first step before it enters its labels() block)
    assert worker.get((True, None), 0) <= 0.05 * sum(worker.values()), cpu
    # AND the idle loop carries no task's labels
    idle = by(p, EventType.WALL, lambda s: (s.stack[-1].name, s.labels.get("x"), s.labels.get("task")))
    leaks = {k: v for k, v in idle.items() if k[0] == "[idle]" and (k[1] or k[2])}
    assert sum(leaks.values()) <= 0.02 * sum(v for k, v in idle.items() if k[0] == "[idle]"), leaks


# -- blockers, chains, transparency ------------------------------------------------------------
async def waits():
    lock, ev, q = asyncio.Lock(), asyncio.Event(), asyncio.Queue()
    fut = asyncio.get_running_loop().create_future()

    async def agen():
        await asyncio.sleep(0.2)
        yield 1

    async def hold_lock():
        async with lock:
            await asyncio.sleep(0.25)

    async def want_lock():
        await asyncio.sleep(0.01)
        async with lock:
            pass

    async def want_event():
        await ev.wait()

    async def want_queue():
        await q.get()

    async def want_future():
        await fut

    async def want_agen():
        async for _ in agen():
            pass

    async def want_gather():
        await asyncio.gather(asyncio.sleep(0.2), asyncio.sleep(0.21))

    names = ["hold_lock", "want_lock", "want_event", "want_queue", "want_future", "want_agen", "want_gather"]
    tasks = [asyncio.create_task(f(), name=f.__name__) for f in
             (hold_lock, want_lock, want_event, want_queue, want_future, want_agen, want_gather)]
    await asyncio.sleep(0.22)
    ev.set()
    q.put_nowait(1)
    fut.set_result(1)
    await asyncio.gather(*tasks)
    return names


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.alone  # (the main task's short gather kept no PARK sample beside another test at load 17)
def test_park_names_what_each_task_awaits(engine):
    with take(engine, events=("wall", "park")) as t:
        asyncio.run(waits())
    leaf = by(t.profile, EventType.PARK, lambda s: (s.labels.get("task"), s.stack[-1].name))
    got = defaultdict(set)
    for (task, name), v in leaf.items():
        got[task].add(name)
    assert got["hold_lock"] == {"[asyncio.sleep]"}
    assert "[asyncio.Lock.acquire]" in got["want_lock"]
    assert got["want_event"] == {"[asyncio.Event.wait]"}
    assert got["want_queue"] == {"[asyncio.Queue.get]"}
    assert got["want_future"] == {"[asyncio.Future]"}
    assert got["want_agen"] == {"[asyncio.sleep]"}
    assert got["want_gather"] == {"[asyncio.gather]"}
    # AND the async generator's frame is in the chain of the task iterating it
    chains = by(t.profile, EventType.PARK, lambda s: tuple(f.name for f in s.stack[-3:]))
    assert any(c[0].endswith("want_agen") and c[1].endswith("agen") and c[2] == "[asyncio.sleep]"
               for c in chains), chains
    # AND the main task is sampled too: parked in its sleep, then its gather
    main = by(t.profile, EventType.PARK, lambda s: (s.stack[-2].name, s.stack[-1].name))
    assert main.get(("waits", "[asyncio.sleep]")) and main.get(("waits", "[asyncio.gather]")), main


def test_wrapped_tasks_look_the_same_to_the_program():
    async def inner():
        await asyncio.sleep(0.01)
        return 7

    async def main():
        loop = asyncio.get_running_loop()
        t = take("python", events=("cpu", "wall", "park")).start()
        try:
            task = loop.create_task(inner(), name="look")
            await asyncio.sleep(0)
            coro = task.get_coro()
            assert coro.__qualname__.endswith("inner") and coro.cr_frame is not None
            assert asyncio.iscoroutine(coro)
            assert "inner() running at" in repr(task) and "look" in repr(task)
            assert task.get_stack() and task.get_stack()[0].f_code.co_name == "inner"
            # cancellation goes through the wrapper's throw
            victim = loop.create_task(asyncio.sleep(10))
            await asyncio.sleep(0)
            victim.cancel()
            with pytest.raises(asyncio.CancelledError):
                await victim
            assert await task == 7
            # a task still pending when profiling stops runs on, unwrapped behaviour
            later = loop.create_task(inner())
        finally:
            t.stop()
        assert asyncio.base_events.BaseEventLoop.create_task is not S._create_task
        assert await later == 7
        assert labeling.thread_label_ids.get(threading.get_ident(), 0) & labeling.LOW_MASK == 0

    asyncio.run(main())
    assert labeling.thread_label_ids.get(threading.get_ident(), 0) == 0


@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager tasks need Python 3.12")
def test_eager_tasks_and_task_groups_are_labelled():
    async def eager_child():
        burn_cpu(0.05)  # its first step runs inside create_task (eager)
        await asyncio.sleep(0.05)
        burn_cpu(0.1)

    async def main():
        asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)
        with labeling.labels(g="1"):
            async with asyncio.TaskGroup() as tg:
                tg.create_task(eager_child(), name="eager")

    with take("python", events=("cpu", "wall", "park")) as t:
        asyncio.run(main())
    cpu = by(t.profile, EventType.CPU, lambda s: ("burn_cpu" in fnames(s), s.labels.get("task"), s.labels.get("g")))
    burns = {k: v for k, v in cpu.items() if k[0]}
    # THEN its CPU carries the group's labels; once named (TaskGroup names a task after
    # an eager first step on 3.12) its name; before, asyncio's automatic name
    assert {k[2] for k in burns} == {"1"}, cpu
    assert burns.get((True, "eager", "1"), 0) > 0.5 * sum(burns.values()), cpu
    assert all(k[1] == "eager" or k[1].startswith("Task-") for k in burns), cpu
    park = by(t.profile, EventType.PARK, lambda s: (s.labels.get("task"), s.stack[-1].name))
    assert ("eager", "[asyncio.sleep]") in park, park


def test_runnable_time_is_ready_not_park():
    # GIVEN 8 tasks created at once, each burning 20 ms in its first step (task i waits
    # ~20*i ms in the loop's ready queue before it starts), then awaiting one future
    # (completed at 0.3 s: they wake in one batch of callbacks, each burning 20 ms, so
    # task i waits ~20*i ms again to run), then sleeping 0.1 s (exact weights: fewer
    # tasks than a tick describes)
    waits, awaits, woke = {}, {}, {}

    async def job(i, created, gate):
        waits[i] = time.perf_counter() - created
        burn_wall(0.02)
        t = time.perf_counter()
        await gate
        woke[i] = time.perf_counter()
        awaits[i] = woke[i] - t
        burn_wall(0.02)
        await asyncio.sleep(0.1)

    async def main():
        loop = asyncio.get_running_loop()
        gate = loop.create_future()
        loop.call_later(0.3, gate.set_result, None)
        await asyncio.gather(*(loop.create_task(job(i, time.perf_counter(), gate), name=f"j{i}") for i in range(8)))

    with take("python", events=("wall", "park")) as t:
        asyncio.run(main())
    p = t.profile
    name, first = job.__code__.co_qualname, job.__code__.co_firstlineno
    wall = by(p, EventType.WALL, lambda s: (s.labels.get("task"), s.labels.get("state"),
                                            s.stack[-1].line if s.stack[-1].name == name else None))
    park = by(p, EventType.PARK, lambda s: (s.labels.get("task"), s.stack[-1].name))
    (gate_line,) = {s.stack[-2].line for s in p.samples()
                    if s.event is EventType.PARK and s.stack[-1].name == "[asyncio.Future]"}
    # THEN each task's wait to start is wall in state=ready at its coroutine's entry
    # (a thread waiting for the GIL is not parked either), within 10% for those that waited
    started = {i: wall.get((f"j{i}", "ready", first), 0) / 1e9 for i in range(8)}
    # AND so is its wait to run once the future completed, at the await it was woken
    # from, counted from the start of the batch that wakes it (the first task's wakeup,
    # within microseconds)
    late = {i: woke[i] - min(woke.values()) for i in range(8)}
    ready = {i: wall.get((f"j{i}", "ready", gate_line), 0) / 1e9 for i in range(8)}
    print(f"\n[runnable] wait to start: profile {sum(started.values()):.3f} s, tasks {sum(waits.values()):.3f} s; "
          f"wait after waking: profile {sum(ready.values()):.3f} s, tasks {sum(late.values()):.3f} s")
    assert sum(waits.values()) > 0.4 and sum(late.values()) > 0.4, (waits, late)  # 20+40+...+140 ms
    for i in range(8):
        if waits[i] > 0.05:
            assert abs(started[i] - waits[i]) < 0.1 * waits[i], (i, started, waits)
        if late[i] > 0.05:
            assert abs(ready[i] - late[i]) < 0.1 * late[i], (i, ready, late)
    # AND park holds the time each awaited the pending future, within 10% (the old code
    # charged the wait to start as park there: +35% here, and the wait to run +25%)
    for i in range(8):
        parked = park.get((f"j{i}", "[asyncio.Future]"), 0) / 1e9
        assert abs(parked - (awaits[i] - late[i])) < 0.1 * (awaits[i] - late[i]), (i, parked, awaits, late)
        # (its last stretch, after the last tick, is lost: up to a tick's period, 20 ms)
        assert park.get((f"j{i}", "[asyncio.sleep]"), 0) > 0.07e9, park
    assert not [k for k in park if k[1] == name], park


@pytest.mark.alone  # (the park total within -30/+15 % of the measured waits: 1.19x beside other tests at load 10)
def test_many_tasks_are_subsampled_within_budget_and_stay_unbiased():
    # GIVEN 2000 tasks (more than a tick describes), half of them named, each burning
    # 100 us in its first step (so the last starts >= 0.2 s after it was created: that
    # wait is ready, not park) then awaiting a future completed 0.5 s later (a loaded
    # loop completes 2000 of them late: 0.5 s is a floor); each measures its wait to
    # start and its await until the future completed (the wait to run after that is
    # ready, not park)
    waits, spans = [], []

    def complete(fut):
        fut.set_result(time.perf_counter())

    async def sleepy(created):
        waits.append(time.perf_counter() - created)
        burn_wall(0.0001)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        t = time.perf_counter()
        loop.call_later(0.5, complete, fut)
        spans.append(await fut - t)

    async def main():
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.create_task(sleepy(time.perf_counter()), name="named" if i % 2 else None)
                               for i in range(2000)))

    # (a larger per-tick budget than the default: more draws, so the test is not noisy)
    with take("python", events=("wall", "park"), interval="10ms", tick_budget=0.02) as t:
        asyncio.run(main())
    p = t.profile
    park = by(p, EventType.PARK, lambda s: s.labels.get("task") == "named")
    total = sum(park.values()) / 1e9
    entry = "test_many_tasks_are_subsampled_within_budget_and_stay_unbiased.<locals>.sleepy"
    ready = by(p, EventType.WALL, lambda s: (s.labels.get("state"), s.stack[-1].name))
    started = ready.get(("ready", entry), 0) / 1e9
    (note,) = [n for n in p.metadata.notes if "task-sampler ticks" in n]
    # THEN the park time adds up to the tasks' own measure of their awaits (scaled draws:
    # unbiased; a task's time after the last tick that saw it is lost, ~4% here, as a
    # thread's last stretch is; seen 0.79-1.08 x beside 2 CPU hogs, where a tick draws
    # a few tasks for a long window).  The old bug, which charged the wait to start as
    # park, read 1.19-1.25 x here, 1.4-1.7 x beside 2 CPU hogs.
    truth = sum(spans)
    print(f'\n[many tasks] park {total:.0f} s, tasks measured {truth:.0f} s; '
          f'wait to start {started:.0f} s, tasks measured {sum(waits):.0f} s; {note}')
    assert len(spans) == 2000 and truth >= 1000
    assert 0.7 * truth < total < 1.15 * truth, (total, truth)
    # (named or not is a coin flip per draw; beside 2 CPU hogs a tick draws as few as 4
    # tasks for a long window: 0.71 seen)
    assert abs(park.get(True, 0) / sum(park.values()) - 0.5) < 0.25, park
    # AND the wait to start is ready wall at the tasks' entry (only the ticks right after
    # the burst of first steps see it: a few dozen draws, hence the wide margin)
    assert sum(waits) > 150
    assert 0.6 * sum(waits) < started < 1.4 * sum(waits), (started, sum(waits))
    # AND the ticks kept to their budget by describing a random subset of the tasks (the
    # note printed above gives their cost, for people to judge: ~250 us of CPU each here,
    # where describing every task would take tens of ms)
    assert any("random subset" in n for n in p.metadata.notes), p.metadata.notes


@pytest.mark.parametrize("max_tasks,budget", [(10_000, 0.003), (100, 0.05)], ids=["every-task", "subsampled"])
def test_short_awaits_between_ticks_are_charged_to_their_own_await(max_tasks, budget):
    # GIVEN 400 requests queueing for 8 slots, each then awaiting a future completed 5 ms
    # later (shorter than the 10 ms between two task-sampler ticks: most of these awaits
    # begin and end between two ticks) and computing 0.3 ms; each measures its await
    # until the future completed, and until the task resumed (later on a loaded machine,
    # whose loop runs ready tasks late)
    spans, resumed = [], []

    def complete(fut, t):
        spans.append(time.perf_counter() - t)
        fut.set_result(None)

    async def main():
        slots = asyncio.Semaphore(8)
        loop = asyncio.get_running_loop()

        async def request():
            async with slots:
                fut = loop.create_future()
                t0 = time.perf_counter()
                loop.call_later(0.005, complete, fut, t0)
                await fut
                resumed.append(time.perf_counter() - t0)
                burn_wall(0.0003)

        await asyncio.gather(*(request() for _ in range(400)))

    # (subsampled: 100 of the ~400 pending tasks a tick, so that the 2 % of them awaiting
    # the future are drawn often enough for a test; 32, the default, gave 0.63-1.78 x)
    with take("python", events=("wall", "park"), interval="10ms", max_tasks_per_tick=max_tasks,
              tick_budget=budget) as t:
        asyncio.run(main())
    park = by(t.profile, EventType.PARK, lambda s: s.stack[-1].name)
    # THEN the park at the future adds up to the requests' own measure: from the await to
    # the future's completion at least, to the task's resumption at most (park lasts until
    # the batch that resumes the task).  Every task drawn: 1.00-1.04 x of the completion
    # measure seen on a quiet machine; subsampled, the draws are few and fewer still on a
    # loaded machine (ticks spaced out as they get costly): 0.57-1.85 x seen beside 2 CPU
    # hogs and a test run, so its bound only tells drawn from lost.
    truth, until_resumed = sum(spans), sum(resumed)
    assert len(spans) == 400 and len(resumed) == 400 and truth > 1.9, truth
    lo, hi = (0.93 * truth, 1.05 * until_resumed) if max_tasks > 400 else (0.45 * truth, 2.2 * until_resumed)
    assert lo < park.get("[asyncio.Future]", 0) / 1e9 < hi, (truth, until_resumed, park)


# -- a loop that is already running (a notebook cell with top-level await) -------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_task_names_are_forgotten_after_a_session_but_a_pending_tasks(engine):
    # GIVEN a session that ran 300 short tasks and started one that is still pending
    async def main():
        gate = asyncio.Event()

        async def keeper():
            await gate.wait()
            burn_cpu(0.15)

        async def short():
            await asyncio.sleep(0)

        before = set(labeling._task_names)  # (names given outside sessions stay)
        with take(engine, events=("cpu", "wall")):
            kept = asyncio.create_task(keeper(), name="keeper")
            await asyncio.gather(*(asyncio.create_task(short()) for _ in range(300)))
        # WHEN it stops / THEN the names it gave are dropped, but the pending task's
        left = sorted(n for i, n in labeling._task_names.items() if i not in before)
        # AND the pending task, run in a later session, still carries its name
        with take(engine, events=("cpu",)) as later:
            gate.set()
            await kept
        return left, later.profile

    left, profile = asyncio.run(main())
    assert left == ["keeper"], left[:10]
    cpu = by(profile, EventType.CPU, lambda s: s.labels.get("task"))
    assert cpu.get("keeper", 0) > 0.5 * sum(cpu.values()), cpu


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.xfail(sys.version_info >= (3, 14), strict=True, reason="3.14+: the task that started profiling, created before it, gets no PARK sample (4 of 4 params, 3.14 and 3.15)")
def test_profiling_started_inside_a_running_loop(engine):
    truth = {}

    async def cell():
        # the profiler starts and stops from inside the loop, as in a notebook cell
        t = take(engine).start()
        await ground_truth_program(truth, compute_for(engine))
        return t.stop()

    p = asyncio.run(cell())
    park = by(p, EventType.PARK, lambda s: s.labels.get("task"))
    got, want = shares(park, "ABC"), shares({k: v[1] for k, v in truth.items()}, "ABC")
    for k in "ABC":
        assert abs(got[k] - want[k]) <= 0.05, (k, got, want)
    # AND the task that started profiling (created before it) is sampled too
    cell_park = by(p, EventType.PARK, lambda s: (any(f.name.endswith(".cell") for f in s.stack), s.stack[-1].name))
    assert cell_park.get((True, "[asyncio.gather]")), cell_park


def test_labels_and_tasks_in_a_real_kernel(tmp_path):
    pytest.importorskip("ipykernel")
    pytest.importorskip("jupyter_client")
    import os

    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ, IPYTHONDIR=str(tmp_path), PYDEVD_DISABLE_FILE_VALIDATION="1")
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60, env=env)
    try:
        setup = (
            "import asyncio, dataclasses, json, time\n"
            "from ddprof_nb import labeling, asyncio_support as A, EventType\n"
            "from ddprof_nb.model import selection\n"
            "from ddprof_nb.aio import stepper as S\n"
            "from ddprof_nb.config import SamplerConfig\n"
            "from ddprof_nb.engines.python import PythonEngine\n"
            "cfg = SamplerConfig.make(events=('cpu','wall','park'), engine='python', interval='5ms')\n"
            "async def work(tag):\n"
            "    with labeling.labels(tag=tag):\n"
            "        for _ in range(10):\n"
            "            await asyncio.sleep(0.02)\n"
        )
        cell = (
            "e = PythonEngine(dataclasses.replace(cfg, events=A.engine_events(cfg.events))); ts = A.TaskSampler(cfg)\n"
            "e.start(); ts.start()\n"
            "await asyncio.gather(asyncio.create_task(work('x'), name='wx'), asyncio.create_task(work('y'), name='wy'))\n"
            "tp = ts.stop(); p = A.fold_loop_frames(selection.merge(e.stop(), tp))\n"
            "park = {}\n"
            "for s in p.samples():\n"
            "    if s.event is EventType.PARK:\n"
            "        k = '|'.join([s.labels.get('task') or '', s.labels.get('tag') or '', s.stack[0].name, s.stack[-1].name])\n"
            "        park[k] = park.get(k, 0) + s.values[1]\n"
            "print(json.dumps([park, tp.metadata.notes]))\n"
        )
        for code in (setup, cell):
            out = []
            reply = kc.execute_interactive(code, timeout=60, output_hook=out.append)
            assert reply["content"]["status"] == "ok", reply["content"]
        text = "".join(m["content"]["text"] for m in out if m["msg_type"] == "stream")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    import json

    park, notes = json.loads(text.strip().splitlines()[-1])
    # THEN both tasks parked in asyncio.sleep, labelled, under one [asyncio loop] root
    secs = {k: v / 1e9 for k, v in park.items()}
    for name, tag in (("wx", "x"), ("wy", "y")):
        assert secs.get(f"{name}|{tag}|[asyncio loop]|[asyncio.sleep]", 0) > 0.1, (secs, notes)
    # AND the kernel's own idle tasks (ipykernel machinery only) are not sampled
    assert not [k for k in park if k.split("|")[0] not in ("wx", "wy") and "[asyncio.sleep]" not in k
                and "gather" not in k], park
    assert EMPTY_LABELS is labeling.current()


def test_stop_into_a_builder_sink():
    # GIVEN a task sampler whose samples go into another profile's builder
    from ddprof_nb.model import Metadata, ProfileBuilder

    async def main():
        await asyncio.gather(asyncio.sleep(0.05), asyncio.sleep(0.06))

    ts = A.TaskSampler(SamplerConfig.make(events=("wall", "park"), interval="5ms"))
    sink = ProfileBuilder(Metadata(start_ns=time.time_ns()))
    ts.start()
    asyncio.run(main())
    # WHEN it stops into the sink
    assert ts.stop(sink) is None
    p = sink.build()
    # THEN the sink holds its park samples and notes; a second stop is an error
    assert p.total("park") > 0.02e9 and any("task-sampler ticks" in n for n in p.metadata.notes)
    with pytest.raises(Exception, match="not running"):
        ts.stop()
    # AND a second sampler may start once the first stopped; two at once may not
    other = A.TaskSampler(SamplerConfig.make(events=("wall",)))
    other.start()
    with pytest.raises(Exception, match="already running"):
        A.TaskSampler(SamplerConfig.make(events=("wall",))).start()
    other.stop()


def test_task_names_are_capped_per_profile_and_renames_are_followed(monkeypatch):
    # GIVEN a cap of 4 task names per profile
    monkeypatch.setattr(S, "MAX_TASK_NAMES", 4)

    async def work():
        burn_cpu(0.03)
        await asyncio.sleep(0.03)
        burn_cpu(0.03)

    async def renamed():
        burn_cpu(0.03)
        await asyncio.sleep(0.03)  # renamed while it sleeps
        await asyncio.sleep(0.03)  # the sampler sees the new name at its next suspension
        burn_cpu(0.06)

    async def main():
        loop = asyncio.get_running_loop()
        auto = [loop.create_task(work()) for _ in range(6)]
        given = [loop.create_task(work(), name=f"n{i % 2}") for i in range(4)]
        r = loop.create_task(renamed(), name="before")
        await asyncio.sleep(0.01)
        r.set_name("after")
        await asyncio.gather(*auto, *given, r)

    with take("python", events=("cpu", "wall", "park")) as t:
        asyncio.run(main())
    tasks = {ls.get("task") for ls in t.profile.labelsets} - {None}
    # THEN 4 automatic names, the given names (shared), then [other]
    assert len({n for n in tasks if n.startswith("Task-")}) <= 4, tasks
    assert {"n0", "n1", "[other]"} <= tasks, tasks
    assert any("task=[other]" in n for n in t.profile.metadata.notes), t.profile.metadata.notes
    # AND a task renamed mid-way carries its new name from its next suspension on
    assert {"before", "after"} <= tasks, tasks


def test_without_the_native_module_the_python_stepper_runs():
    # GIVEN an interpreter where ddprof_nb._native cannot be imported (another platform,
    # a build for another Python)
    import subprocess
    import textwrap

    code = textwrap.dedent(
        """
        import sys
        sys.modules["ddprof_nb._native"] = None  # import fails
        import asyncio
        import ddprof_nb
        from ddprof_nb import EventType, asyncio_support as A, labeling as L
        from ddprof_nb.aio import stepper as S
        async def child():
            await asyncio.sleep(0.01)
            t = time.process_time()
            while time.process_time() - t < 0.05:
                pass
        import time
        async def main():
            with ddprof_nb.labels(job="j"):
                await asyncio.create_task(child(), name="kid")
        with ddprof_nb.profile(events=("cpu", "wall"), interval="5ms") as p:
            asyncio.run(main())
        prof = p.profile
        tasks = {s.labels.get("task") for s in prof.samples()}
        jobs = {s.labels.get("job") for s in prof.samples() if s.labels.get("task") == "kid"}
        print("RESULT", S._TaskCoro.__name__, L._Slot.__mro__[1].__name__, "kid" in tasks, jobs == {"j"})
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    # WHEN a session profiles a labelled task THEN the Python stepper and slot ran, and
    # the task's samples carry its name and its creator's labels
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
    assert r.returncode == 0 and line, r.stdout[-2000:] + r.stderr[-2000:]
    assert line[0].split()[1:] == ["_PyTaskCoro", "object", "True", "True"], line
