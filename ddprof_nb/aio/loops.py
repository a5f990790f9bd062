"""Asyncio, for job 2 (samples of suspended tasks): what the task sampler keeps per loop and
per task, how it finds a loop's tasks (asyncio's registries, the tasks created while
profiling), and the selector hook that tells when a loop's batch of callbacks begins.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref

from .. import labeling as _lab
from ..labeling import TASK_SHIFT as _TASK_SHIFT
from ..labeling import _task_counter, _task_names
from . import stepper as _stepper
from .fold import OTHER_TASKS

_weakref = weakref.ref
_monotonic_ns = time.monotonic_ns


def _multiplicities(refs: list) -> list:
    """(reference, how many times it is in ``refs``) (by identity: a dead weak
    reference may not be hashable)."""
    out: dict = {}
    for ref in refs:
        cell = out.get(id(ref))
        if cell is None:
            out[id(ref)] = [ref, 1]
        else:
            cell[1] += 1
    return [(ref, k) for ref, k in out.values()]


def _pending(ref, loop, running, ended: bool = False):
    """The task behind ``ref`` if it is pending on ``loop`` and not the one running
    (``ended``: or ended, its step timing stopped)."""
    task = ref()
    if task is None or task is running:
        return None
    try:
        if task.get_loop() is not loop:
            return None
        if task.done() and not (ended and type(coro := task.get_coro()) is _stepper._TaskCoro and coro._end):
            return None
    except Exception:  # noqa: BLE001 - not a task after all
        return None
    return task


def _task_registries() -> list:
    """asyncio's registries of every task of every loop (WeakSets; 3.12+ adds a set of
    tasks being run eagerly)."""
    mod = asyncio.tasks
    return [getattr(mod, n) for n in ("_all_tasks", "_scheduled_tasks", "_eager_tasks") if hasattr(mod, n)]


def _registry_refs(registries) -> list:
    """A snapshot of the registries: weak references (WeakSets) or tasks (sets), cheap
    (no task is dereferenced).  Retries when another thread changes a set meanwhile."""
    for _ in range(100):
        try:
            out = []
            for reg in registries:
                data = getattr(reg, "data", None)
                out.extend(list(data) if data is not None else list(reg))
            return out
        except RuntimeError:  # changed size during iteration: retry
            continue
    return []


def _deref(ref):
    return ref() if isinstance(ref, weakref.ref) else ref


def _foreign_pending(ref, loop):
    """Is ``ref`` (a registry entry) a pending task of ``loop`` that was not wrapped?"""
    task = _deref(ref)
    try:
        ok = task is not None and task.get_loop() is loop and not task.done() \
            and type(task.get_coro()) is not _stepper._TaskCoro
    except Exception:  # noqa: BLE001 - not a task
        return None
    return (_weakref(task) if not isinstance(ref, weakref.ref) else ref) if ok else None


_UNSET = -2  # a stack id not computed yet (-1: not sampled)
_NEW = object()  # a task state's key before its first description


class _TaskState:
    __slots__ = ("last", "key", "stacks", "lid", "w", "r", "p", "e")

    def __init__(self, last: int):
        self.last = last  # the time of the task's previous sample
        self.key = _NEW  # the awaited future when the stacks below were computed
        self.stacks = [_UNSET, _UNSET, _UNSET]  # stack ids: ready, parked, not started
        self.lid = -1  # published id (-1: not computed)
        # wrapped tasks: their (start wait, ready, park) times accounted so far
        self.w = self.r = self.p = 0
        self.e = 0  # their _stepper._TaskCoro._e then


class _LoopState:
    """What the sampler keeps per event loop."""

    def __init__(self, loop):
        self.loop = loop
        self.states: dict = {}  # task -> _TaskState
        self.reg: list = []  # weak references to the tasks created on this loop while profiling
        self.compact_at = 256  # compact ``reg`` (drop dead and done tasks) beyond this length
        self.others: list = []  # weak references to pending tasks that were not wrapped
        self.others_at = 0
        self.handle = None
        self.thread = -1  # builder thread index, set at the first tick
        self.last_tick = 0
        # what the previous tick described, for the next to account: a draw of the tasks
        # (with replacement; [] before the first tick), or None: every task
        self.panel: list | None = []
        self.panel_n = 0  # how many tasks were pending when it was drawn
        self.mark = 0  # len(reg) at the previous tick: tasks registered since are new
        self.next_due = 0
        self.cost = 0  # ns a tick takes (smoothed)
        self.draw_ns = 0  # ns a random draw takes, when subsampling (smoothed)
        self.prefix_ns = 0  # ns the current tick spent looking up the loop's stack
        self.prefix: list[int] | None = None
        self.prefix_at = 0
        self.chains: dict = {}  # await chain key -> stack id (-1: not sampled), for this prefix
        self.hook = None  # (selector, our select, the loop thread's slot); False: not hookable


class _Tracker:
    """Global state while a TaskSampler runs: loops seen, task names used."""

    def __init__(self, sampler: "TaskSampler"):
        self.sampler = sampler
        self.loops: dict = {}
        self.names: dict[str, int] = {}  # names given by the program -> their task bits
        self.auto = 0  # tasks with automatic names so far
        self.names_capped = 0
        self.lock = threading.Lock()
        self.other = _lab.task_bits(OTHER_TASKS)
        # loop -> its _LoopState.reg list, when the sampler samples (None: labels only)
        self.registered: dict | None = {} if sampler.sampling else None

    def task_bits(self, name: str) -> int:
        """Task bits for a task named ``name``: asyncio's automatic names (``Task-<n>``,
        unique) get fresh bits, the first ``_stepper.MAX_TASK_NAMES`` of them per profile; names
        given by the program are shared per name (up to ``_stepper.MAX_TASK_NAMES`` distinct);
        past the caps a task is ``[other]``."""
        if name.startswith("Task-"):
            if self.auto < _stepper.MAX_TASK_NAMES:
                self.auto += 1
                idx = next(_task_counter)
                _task_names[idx] = name
                return idx << _TASK_SHIFT
            self.names_capped += 1
            return self.other
        bits = self.names.get(name)
        if bits is None:
            if len(self.names) >= _stepper.MAX_TASK_NAMES:
                self.names_capped += 1
                return self.other
            bits = self.names[name] = _lab.task_bits(name)
        return bits

    def renamed(self, proxy: "_stepper._TaskCoro", task) -> int:
        """``proxy``'s published id, with new task bits if the task was renamed since its
        first step (``set_name``): checked when the sampler describes the task (at each
        new suspension), its next steps then publish the new name."""
        lid = proxy._lid
        old = _lab._task_names.get(lid >> _lab.TASK_SHIFT)
        name = task.get_name()
        if old == name or old == OTHER_TASKS:
            return lid
        lid = proxy._lid = self.task_bits(name) | (lid & _lab.LOW_MASK)
        return lid

    def add_loop(self, loop) -> "_LoopState":
        with self.lock:
            state = self.loops.get(loop)
            if state is None:
                state = self.loops[loop] = _LoopState(loop)
                if self.registered is not None:
                    self.registered[loop] = state.reg
                self.sampler._schedule_first(state)
            return state


def _hook_selector(st: _LoopState) -> None:
    """Time the start of each batch of the loop's callbacks (its selector returning)
    into the loop thread's slot (see _stepper._TaskCoro).  On the loop's thread; loops
    without a selector of their own (uvloop, proactor) are left alone: their woken
    tasks' wait for the loop stays in park."""
    st.hook = False
    sel = getattr(st.loop, "_selector", None)
    inner = getattr(sel, "select", None)
    if inner is None or getattr(inner, "__self__", None) is not sel:  # absent, or wrapped by someone
        return
    slot = _lab._slot_here()
    clock = _monotonic_ns

    def select(timeout=None):
        events = inner(timeout)
        slot.batch = clock()
        return events

    try:
        sel.select = select
    except AttributeError:  # no instance attributes
        return
    st.hook = (sel, select, slot)


def _unhook_selector(st: _LoopState) -> None:
    hook, st.hook = st.hook, None
    if hook:
        sel, select, _ = hook
        if getattr(sel, "__dict__", {}).get("select") is select:
            del sel.select
