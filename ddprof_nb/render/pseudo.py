"""What a pseudo-frame means: the one table every hover and legend reads.

Pseudo-frames are the bracketed names in stacks that are not a function of the
program (``[idle]``, ``[GC]``, ``[cpu not sampled]``...).  A name listed here gets its
own sentence; any other pseudo-frame is explained by its kind (an allocated type such as
``[int]``, a lock, what a parked thread waits on).
"""

from __future__ import annotations

from ..events import FrameKind
from ..model import Frame

__all__ = ["PSEUDO_FRAMES", "KIND_MEANINGS", "explain", "explain_kind"]

PSEUDO_FRAMES = {
    "[idle]": "the asyncio event loop waiting in its selector: no task was ready to run",
    "[cpu not sampled]": "CPU the thread's own clock counted that no sample caught (timer signals came late or "
                         "not at all): the total is right, where in the code it went is unknown",
    "[GC]": "Python's garbage collector running (charged to the code that triggered it)",
    "[profiling signal blocked]": "CPU of a thread that blocks the profiling signal (numexpr's pool does), read from "
                                  "its own clock each tick: the frames above are where the thread starts, where "
                                  "inside them it ran is unknown",
    "[truncated]": "the stack was deeper than the frames kept: the frames nearest the root were cut",
    "[unknown]": "a frame whose code was freed before the profiler could name it",
    "[no Python frames]": "a thread running native code only: no Python frame on its stack",
    "[native threads]": "CPU or allocations of threads that run no Python (BLAS, OpenMP, Rust or database pools) "
                        "while no Python thread was inside their library to charge them to; by library, then "
                        "thread name",
    "[asyncio loop]": "the asyncio event loop's own machinery (run_forever, selectors, callbacks) as one frame",
    "[task]": "an asyncio task with an automatic name (Task-N); its name is in the task label",
    "[await]": "an async cell waiting at an await",
    "[ddprof_nb asyncio sampler]": "the profiler's own asyncio task sampler",
    "[other]": "smaller calls folded together: each under the chart's min % of the total",
    "[other threads]": "the least busy threads, sharing one lane",
}

KIND_MEANINGS = {
    FrameKind.NATIVE: "native (C/C++) code",
    FrameKind.GC: PSEUDO_FRAMES["[GC]"],
    FrameKind.THREAD: "a thread's or a task's root, not a function of the program",
    FrameKind.TRUNCATED: PSEUDO_FRAMES["[truncated]"],
    FrameKind.ERROR: "time the sampler could not place on a stack (e.g. [cpu not sampled]: CPU no sample caught)",
    FrameKind.LOCK: "a contended lock the thread waited for",
    FrameKind.BLOCKER: "what a parked or idle thread waits on (a lock, an event, a queue, I/O, [idle])",
    FrameKind.ALLOC_TYPE: "the type of the allocated objects: the stack's leaf in alloc and live",
    FrameKind.UNKNOWN: PSEUDO_FRAMES["[unknown]"],
}


def explain_kind(kind: FrameKind) -> str:
    """What frames of ``kind`` are (the event table's description when none is written here)."""
    return KIND_MEANINGS.get(kind, kind.description)


def explain(frame: Frame) -> str | None:
    """What the pseudo-frame ``frame`` means; None for a Python function."""
    if frame.name in PSEUDO_FRAMES:
        return PSEUDO_FRAMES[frame.name]
    if frame.kind is FrameKind.PYTHON:
        return None
    return explain_kind(frame.kind)
