"""Asyncio-aware profiling: task labels, samples of suspended tasks, and loop-frame folding.

Three jobs, usable beside any engine, one module each under ``ddprof_nb/aio/``:

1. **labels follow the running task** (``aio.stepper``): ``create_task`` wraps each new
   task's coroutine in a proxy whose steps publish the task's label id;
2. **wall and park of suspended tasks** (``aio.tasks.TaskSampler``, a ``sources.Source``):
   a callback on each running loop samples its pending tasks' await chains;
3. **folding the loop** (``aio.fold.fold_loop_frames``): the event loop's machinery becomes
   one ``[asyncio loop]`` frame, each task entry a ``[task <name>]`` mark.

Invariants: nothing here changes what the program computes; every patch is undone at
stop (a task wrapped while profiling keeps its proxy, which then only forwards); the
sampler never raises into the loop (errors are counted and reported in the notes).

Limits: a task that ends between two ticks is accounted up to its end by the next
tick only if something still holds it then (``gather`` does; a fire-and-forget task
freed at its end loses its time since the last tick that described it, as a thread's
last stretch is lost); a task that begins and ends between two ticks shows its awaits
but not its wait to start; a future completed late because the loop was
busy (a sleep's timer run late) is park until the batch that wakes the task, as is a
woken task's wait on loops without a selector of their own (uvloop, proactor); loops
that are not ``BaseEventLoop``s (uvloop)
run their tasks unwrapped (no ``task`` label on engine samples) and are seen by the task
sampler only when already running at start; ``asyncio.Task(coro)`` built directly is
not wrapped either (its loop's periodic scan still samples it).

This module keeps the public names importable from one place.
"""

from __future__ import annotations

from .aio.fold import IDLE_FRAME, LOOP_FRAME, fold_loop_frames
from .aio.stepper import MAX_TASK_NAMES
from .aio.tasks import TaskSampler, engine_config, engine_events

__all__ = ["TaskSampler", "fold_loop_frames", "engine_events", "engine_config", "MAX_TASK_NAMES", "LOOP_FRAME", "IDLE_FRAME"]
