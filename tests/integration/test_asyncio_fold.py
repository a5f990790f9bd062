"""fold_loop_frames (ddprof_nb.aio.fold) on mock profiles shaped like the engines' stacks
(asyncio run by a script, by ipykernel, idle in the selector, tasks entered through the
profiler's task proxy or the task sampler's marker)."""

import numpy as np
import pytest

from ddprof_nb import EventType, FrameKind
from ddprof_nb import asyncio_support as A
from ddprof_nb.aio import fold
from ddprof_nb.aio import stepper as S
from ddprof_nb.model import Frame, LabelSet, Metadata, ProfileBuilder

LIB = "/usr/lib/python3.12"
ASYNCIO = LIB + "/asyncio/"
ME = S.__file__  # the task proxy's send (the profiler's own asyncio module)
SAMPLER = ME.replace("stepper.py", "tasks.py")  # the task sampler's ticks

# the folding is pure Python on hand-built profiles: nothing here reads interpreter internals
pytestmark = pytest.mark.pure_python


def F(name, file="app.py", line=1):
    return Frame(name, file, line, 1)


SCRIPT_LOOP = [
    F("<module>", "app.py"),
    F("run", ASYNCIO + "runners.py"),
    F("Runner.run", ASYNCIO + "runners.py"),
    F("BaseEventLoop.run_until_complete", ASYNCIO + "base_events.py"),
    F("BaseEventLoop.run_forever", ASYNCIO + "base_events.py"),
    F("BaseEventLoop._run_once", ASYNCIO + "base_events.py"),
]
DISPATCH = [F("Handle._run", ASYNCIO + "events.py")]
PROXY = [F("_PyTaskCoro.send", ME, 60)]  # the Python stepper's frame (the C stepper has none)
KERNEL_LOOP = [
    F("_run_module_as_main", LIB + "/runpy.py"),
    F("_run_code", LIB + "/runpy.py"),
    F("<module>", "/venv/lib/python3.12/site-packages/ipykernel_launcher.py"),
    F("Application.launch_instance", "/venv/lib/python3.12/site-packages/traitlets/config/application.py"),
    F("IPKernelApp.start", "/venv/lib/python3.12/site-packages/ipykernel/kernelapp.py"),
    F("BaseAsyncIOLoop.start", "/venv/lib/python3.12/site-packages/tornado/platform/asyncio.py"),
    F("BaseEventLoop.run_forever", ASYNCIO + "base_events.py"),
    F("BaseEventLoop._run_once", ASYNCIO + "base_events.py"),
]


def build(rows):
    """rows: (event, frames, labels dict, value) -> Profile on one thread."""
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10_000_000))
    t = b.thread_id(1, "MainThread")
    for event, frames, labels, value in rows:
        b.add(event, b.stack_of(frames), t, b.labels_id(labels), 0, 1, value)
    return b.build()


def stacks(profile, event=EventType.CPU):
    out = {}
    for s in profile.samples():
        if s.event is event:
            key = " > ".join(f.name for f in s.stack)
            out[key] = out.get(key, 0) + s.values[1]
    return out


@pytest.mark.quick
def test_a_running_task_shows_loop_task_and_await_chain():
    # GIVEN a CPU sample of a named task's coroutine chain run by asyncio.run
    chain = [F("main"), F("fetch"), F("parse")]
    p = build([("cpu", SCRIPT_LOOP + DISPATCH + PROXY + chain, {"task": "fetcher"}, 10)])
    # WHEN the loop is folded
    folded = A.fold_loop_frames(p)
    # THEN the loop's machinery is one frame, then the task, then its await chain
    assert stacks(folded) == {"<module> > [asyncio loop] > [task fetcher] > main > fetch > parse": 10}
    (loop_frame,) = [f for f in folded.frames if f.name == "[asyncio loop]"]
    assert loop_frame.kind is FrameKind.THREAD


def test_the_c_steppers_tasks_get_their_marker_where_no_stepper_frame_sits():
    # GIVEN the same stacks as the C stepper leaves them: the coroutine right under the
    # loop's callback runner (Handle._run), or under the create_task wrapper (an eager
    # start); a plain callback run by the loop outside any task; and a notebook's runner
    # frames inside a task entered through the Python stepper
    chain = [F("main"), F("fetch")]
    wrapper = [F("main"), F("BaseEventLoop.create_task", ME, 400)]
    kernel_task = [F("Kernel.dispatch_queue", "/venv/site-packages/ipykernel/kernelbase.py"), F("cell")]
    p = build([
        ("cpu", SCRIPT_LOOP + DISPATCH + chain, {"task": "fetcher"}, 10),
        ("cpu", SCRIPT_LOOP + DISPATCH + wrapper + [F("child")], {"task": "kid"}, 3),
        ("cpu", SCRIPT_LOOP + DISPATCH + [F("on_timer")], {}, 2),
        ("cpu", SCRIPT_LOOP + DISPATCH + PROXY + kernel_task, {"task": "k"}, 4),
    ])
    # WHEN the loop is folded
    folded = A.fold_loop_frames(p, task_frames="all")
    # THEN a task's coroutine gets its [task] frame (the eager child the innermost, named
    # one); a callback outside tasks and a runner's frames inside one get none
    assert stacks(folded) == {
        "<module> > [asyncio loop] > [task fetcher] > main > fetch": 10,
        "<module> > [asyncio loop] > [task] > main > [task kid] > child": 3,
        "<module> > [asyncio loop] > on_timer": 2,
        "<module> > [asyncio loop] > [task k] > cell": 4,  # (runner frames in a task: dropped)
    }


def test_automatic_task_names_make_one_frame_but_stay_in_the_label():
    chain = [F("worker")]
    p = build([("cpu", SCRIPT_LOOP + DISPATCH + PROXY + chain, {"task": f"Task-{i}"}, 1) for i in range(5)])
    folded = A.fold_loop_frames(p)
    assert stacks(folded) == {"<module> > [asyncio loop] > [task] > worker": 5}
    assert {ls.get("task") for ls in folded.labelsets} >= {f"Task-{i}" for i in range(5)}
    # AND task_frames='all' names every task; 'none' drops the task frame
    assert len(stacks(A.fold_loop_frames(p, task_frames="all"))) == 5
    assert stacks(A.fold_loop_frames(p, task_frames="none")) == {"<module> > [asyncio loop] > worker": 5}
    with pytest.raises(ValueError):
        A.fold_loop_frames(p, task_frames="some")


def test_the_idle_loop_is_one_loop_frame_and_an_idle_leaf():
    idle = SCRIPT_LOOP + [F("EpollSelector.select", LIB + "/selectors.py")]
    p = build([("wall", idle, {}, 50)])
    assert stacks(A.fold_loop_frames(p), EventType.WALL) == {"<module> > [asyncio loop] > [idle]": 50}


def test_keep_loop_keeps_the_machinery_but_still_names_the_task():
    chain = [F("main")]
    p = build([("cpu", SCRIPT_LOOP + DISPATCH + PROXY + chain, {"task": "t"}, 3)])
    (key,) = stacks(A.fold_loop_frames(p, keep_loop=True))
    names = key.split(" > ")
    assert names[:7] == [f.name for f in SCRIPT_LOOP + DISPATCH]
    assert names[7:] == ["[task t]", "main"]


def test_a_kernels_runner_frames_fold_too():
    # GIVEN a task run by ipykernel's loop, and the kernel's own dispatch task, which
    # runs a cell (tornado/ipykernel frames after the dispatch)
    cell = [F("<module>", "/tmp/ipykernel_1/123.py"), F("user_fn", "/tmp/ipykernel_1/123.py")]
    kernel_task = [F("Kernel.dispatch_queue", "/venv/site-packages/ipykernel/kernelbase.py"),
                   F("InteractiveShell.run_cell_async", "/venv/site-packages/IPython/core/interactiveshell.py")]
    p = build([
        ("cpu", KERNEL_LOOP + DISPATCH + PROXY + [F("child")], {"task": "c"}, 1),
        ("cpu", KERNEL_LOOP + DISPATCH + kernel_task + cell, {}, 2),
        ("cpu", KERNEL_LOOP + DISPATCH + PROXY + kernel_task + cell, {"task": "k"}, 4),
    ])
    # THEN the whole launcher-to-dispatch chain is one [asyncio loop] frame; the
    # kernel's dispatch frames inside a task are dropped, outside one they fold in too
    assert stacks(A.fold_loop_frames(p)) == {
        "[asyncio loop] > [task c] > child": 1,
        "[asyncio loop] > <module> > user_fn": 2,
        "[asyncio loop] > [task k] > <module> > user_fn": 4,
    }


def test_loop_methods_called_by_user_code_are_not_folded():
    # GIVEN a task calling loop.run_in_executor and create_task (asyncio functions)
    frames = SCRIPT_LOOP + DISPATCH + PROXY + [
        F("main"), F("BaseEventLoop.run_in_executor", ASYNCIO + "base_events.py"),
        F("ThreadPoolExecutor.submit", LIB + "/concurrent/futures/thread.py")]
    (key,) = stacks(A.fold_loop_frames(build([("cpu", frames, {"task": "m"}, 1)])))
    assert key.endswith("[task m] > main > BaseEventLoop.run_in_executor > ThreadPoolExecutor.submit")


def test_the_profilers_own_frames_go():
    # GIVEN the task sampler's tick on the loop, the create_task wrapper and a thread
    # started under labels
    tick = SCRIPT_LOOP + DISPATCH + [F("TaskSampler._tick", SAMPLER), F("TaskSampler._safe_tick", SAMPLER),
                                     F("TaskSampler._sample_loop", SAMPLER)]
    create = SCRIPT_LOOP + DISPATCH + PROXY + [F("main"), F("_create_task", ME),
                                                F("BaseEventLoop.create_task", ASYNCIO + "base_events.py")]
    thread = [F("Thread._bootstrap", LIB + "/threading.py"), F("run_with_labels", "/x/ddprof_nb/labeling.py"),
              F("_run_labelled", "/x/ddprof_nb/labeling.py"), F("Thread.run", LIB + "/threading.py"), F("work")]
    p = build([("cpu", tick, {}, 1), ("cpu", create, {"task": "a"}, 2), ("cpu", thread, {}, 4)])
    assert stacks(A.fold_loop_frames(p)) == {
        "<module> > [asyncio loop] > [ddprof_nb asyncio sampler]": 1,
        "<module> > [asyncio loop] > [task a] > main > BaseEventLoop.create_task": 2,
        "Thread._bootstrap > Thread.run > work": 4,
    }


def test_task_sampler_marker_becomes_the_task_frame():
    frames = SCRIPT_LOOP + DISPATCH + [fold.TASK_MARK, F("worker"), Frame("[asyncio.sleep]", kind=FrameKind.BLOCKER)]
    p = build([("park", frames, {"task": "w", "state": "await"}, 7)])
    assert stacks(A.fold_loop_frames(p), EventType.PARK) == {
        "<module> > [asyncio loop] > [task w] > worker > [asyncio.sleep]": 7}


def test_folding_merges_equal_stacks_keeps_totals_and_returns_a_new_profile():
    chain = [F("w")]
    rows = [("cpu", SCRIPT_LOOP + DISPATCH + PROXY + chain, {"task": "Task-1"}, 5),
            ("cpu", SCRIPT_LOOP + [F("Handle._run", ASYNCIO + "events.py", 88)] + PROXY + chain, {"task": "Task-2"}, 6),
            ("wall", [F("other")], {}, 9)]
    p = build(rows)
    folded = A.fold_loop_frames(p)
    assert folded is not p
    assert folded.total("cpu") == p.total("cpu") == 11 and folded.total("wall") == 9
    assert stacks(folded) == {"<module> > [asyncio loop] > [task] > w": 11}
    assert len(folded.stacks) < len(p.stacks)
    # AND the input is untouched, and folding twice changes nothing more
    assert stacks(p) != stacks(folded)
    again = A.fold_loop_frames(folded)
    assert stacks(again) == stacks(folded)
    np.testing.assert_array_equal(np.sort(again.values[:, 1]), np.sort(folded.values[:, 1]))


def test_a_profile_without_asyncio_comes_back_as_is():
    p = build([("cpu", [F("main"), F("work")], {}, 3)])
    assert A.fold_loop_frames(p) is p


def test_engine_events_drop_park_unless_the_engine_samples_it():
    from ddprof_nb.config import SamplerConfig

    events = (EventType.CPU, EventType.WALL, EventType.PARK)
    assert A.engine_events(events) == (EventType.CPU, EventType.WALL)
    assert A.engine_events(events, {EventType.PARK}) == events
    cfg = SamplerConfig.make(events="cpu,park", engine="native", labels={"a": 1})
    ecfg = A.engine_config(cfg)
    assert ecfg.events == (EventType.CPU,) and ecfg.engine == "native" and ecfg.labels == cfg.labels
    # park alone: nothing left for an engine; the portable one idles beside the task sampler
    only = A.engine_config(SamplerConfig.make(events="park", engine="auto"))
    assert only.events == () and only.engine == "python"
    assert LabelSet.of({"a": 1}).get("a") == "1"


def test_a_stack_of_only_the_profilers_wrapper_frames_is_kept_not_emptied():
    # GIVEN a wall sample whose frames are all the profiler's wrappers (a chain the wall
    # sampler read while the thread changed it: CI saw one fold into an empty stack)
    labeling = A.__file__.replace("asyncio_support.py", "labeling.py")  # (ddprof_nb/labeling.py)
    only_wrappers = [F("labels.__exit__", labeling, 80), F("_TaskCoro._first_step", ME, 270)]
    p = build([(EventType.WALL, only_wrappers, {"task": "Task-3"}, 5)])
    # WHEN folded / THEN the sample keeps those frames: no stack is ever empty
    folded = A.fold_loop_frames(p)
    assert stacks(folded, EventType.WALL) == {"labels.__exit__ > _TaskCoro._first_step": 5}
