"""Asyncio, for job 2: the task names a stopped session gave, forgotten once its engine's
last records are read (``forget``), but those pending tasks still publish: they go on
into later sessions, which forget them when those tasks are done.
"""

from __future__ import annotations

import asyncio
import weakref

from .. import labeling as _lab
from ..labeling import TASK_SHIFT as _TASK_SHIFT
from ..labeling import _task_names
from . import stepper as _stepper

_carried: dict = {}  # task index -> weakref of its task: names a stopped session kept for pending tasks


def forget(first: int, loops: list) -> int:
    """Drop the names of task indexes from ``first`` on (and those carried from earlier
    sessions) but those of tasks still pending on ``loops``.  Returns how many were dropped."""
    keep = {}  # task index -> its pending task
    for loop in loops:
        try:
            pending = asyncio.all_tasks(loop)
        except Exception:  # noqa: BLE001 - a closed loop, a foreign one
            continue
        for task in pending:
            coro = task.get_coro()
            lid = coro._lid if type(coro) is _stepper._TaskCoro else -1
            if lid > _lab.LOW_MASK:
                keep[lid >> _TASK_SHIFT] = task
    for idx, ref in list(_carried.items()):  # names kept by an earlier session: still pending?
        task = ref()
        if task is not None and not task.done():
            keep.setdefault(idx, task)
    drop = {i for i in list(_task_names) if (i >= first or i in _carried) and i not in keep}
    _carried.clear()
    _carried.update((i, weakref.ref(t)) for i, t in keep.items())
    for i in drop:
        _task_names.pop(i, None)
    packed = _lab._packed
    for ident in [k for k in list(packed) if (k >> _TASK_SHIFT) in drop]:
        packed.pop(ident, None)
    return len(drop)
