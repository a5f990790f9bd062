"""Asyncio-aware profiling: task labels, samples of suspended tasks, and loop-frame folding.

Three pieces, usable beside any engine:

1. **Labels follow the running task.**  While profiling, ``BaseEventLoop.create_task``
   is patched (restored at stop) to wrap each new task's coroutine in ``_TaskCoro``, a
   transparent proxy whose ``send``/``throw`` publish the task's label id to the
   thread's slot when a step starts and restore the previous id when it ends (see
   ``labeling``).  A task's labels are its context's (contextvars copy the creator's,
   so child tasks inherit them, and ``labels()`` blocks inside the task add to them)
   plus ``task=<name>``, carried as the task bits of the published id
   (``labeling.task_bits``: no LabelSet is built per task), which threads the task
   starts or submits work to inherit too.  The proxy's step is C where the native
   module loads (``native/aiostep.c``: ``_CTaskCoro``, which asyncio's C Task steps
   through its ``am_send`` slot), else Python (``_PyTaskCoro``).  Cost per step: two
   slot stores and, while wall/park are sampled, two clock reads (benchmarks/bench_asyncio.py).
   Tasks that existed before profiling started cannot be wrapped: the engines' samples
   of their steps carry no ``task`` label (the task sampler below still names them).

2. **Wall and park of suspended tasks** (``TaskSampler``).  A callback on each running
   loop (every ``interval``, spaced out when ticks get costly; running on the loop's own
   thread, so no task is mid-step and nothing is read while it changes) walks the
   loop's pending tasks: each
   suspended task's await chain (``cr_await`` / ``gi_yieldfrom`` / ``ag_await``) and the
   future it waits on (``task._fut_waiter``) become a WALL sample and, while that future
   is pending, a PARK sample ending in a BLOCKER pseudo-frame that names the awaited
   thing (``[asyncio.sleep]``, ``[asyncio.Lock.acquire]``, ``[asyncio.Queue.get]``,
   ``[asyncio.gather]``, ``[asyncio.Future]`` ...).  Weights: the time the task spent
   suspended since its previous sample (its proxy times its steps: the time it ran
   meanwhile is the engine's to sample, never counted twice), split as threads' time
   is: awaiting a pending future is park; runnable but waiting for the loop is not
   (WALL with state=ready): the wait before the first step, charged at the coroutine's
   entry line, a bare yield's (``asyncio.sleep(0)``), and the wait to run once woken,
   counted from the start of the batch of callbacks that wakes the task (the loop's
   selector is hooked for that; see ``_TaskCoro``).  A suspension that begins and ends
   between two ticks (a 5 ms query between 10 ms ticks) is seen by no tick: it is kept
   out of the ticks' account and such suspensions are drawn by length at their end,
   while their await chain is still there (``_short_suspension``).  For tasks created
   before profiling started, the time since their previous sample in the state seen
   (the engines' rule for threads).  Beyond ``max_tasks_per_tick`` pending tasks, a
   tick describes a uniform draw of them (with replacement), which the next tick
   accounts (each drawn task's time between the two, as above) scaled by pending then /
   drawn, plus the tasks created in between (a draw of them when many): unbiased,
   bounded cost.  A task that ended since a tick described it is accounted up to its
   end (its proxy stops its times then).
   Samples go to a synthetic thread ``"<loop thread name> (asyncio tasks)"`` with the
   loop thread's tid, so the loop thread's own wall time stays its own.  Tasks whose
   await chain holds only loop / kernel machinery (ipykernel's idle dispatch tasks) are
   not sampled.

3. **Folding the loop** (``fold_loop_frames``): a Profile transform that folds the event
   loop's machinery (asyncio's run/run_forever/_run_once/Handle._run/Task.__step,
   selectors, tornado/ipykernel/IPython loop runners) into one ``[asyncio loop]`` frame,
   marks each task entry (the Python proxy's ``send`` frame; with the C proxy, which
   has no frame, the coroutine's first frame under the loop's callback runner) with
   ``[task <name>]`` and drops the profiler's own wrapper frames.

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
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import collections.abc
import contextvars
import os
import random
import re
import sys
import threading
import time
import types
import weakref
from typing import Iterable

import numpy as np

from . import labeling as _lab
from . import sources as _sources
from ._steptypes import STEP_BASE as _STEP_BASE
from ._steptypes import STEP_STATE as _STEP_STATE
from .errors import NotRunningError, ProfilerBusyError
from .events import EventType, FrameKind
from .labeling import _current, _new_slot, _push, _slots, label_id
from .labeling import TASK_SHIFT as _TASK_SHIFT
from .labeling import _task_counter, _task_names
from .model import EMPTY_LABELS, Frame, Metadata, Profile, ProfileBuilder, aggregate_columns

__all__ = ["TaskSampler", "fold_loop_frames", "engine_events", "engine_config", "MAX_TASK_NAMES", "LOOP_FRAME", "IDLE_FRAME"]

MAX_TASK_NAMES = 10_000  # task names per profile (automatic and given, each); later ones: task=[other]
OTHER_TASKS = "[other]"
MAX_CHAIN = 256  # await-chain links followed per task
RESCAN_NS = 1_000_000_000  # how often pre-existing (unwrapped) tasks are looked up again
TICK_COST_RATIO = 200  # the task sampler's next tick comes at least 200x a tick's cost later...
MAX_TICK_PERIODS = 4  # ... and at most 4 intervals later
SHORTS_PER_TICK = 4  # suspensions no tick saw: about this many drawn between two ticks

LOOP_FRAME = Frame("[asyncio loop]", kind=FrameKind.THREAD)
IDLE_FRAME = Frame("[idle]", kind=FrameKind.BLOCKER)
TASK_MARK = Frame("[task]", kind=FrameKind.THREAD)
SAMPLER_FRAME = Frame("[ddprof_nb asyncio sampler]", kind=FrameKind.THREAD)

_CoroutineType = types.CoroutineType
_GeneratorType = types.GeneratorType
_AsyncGenType = types.AsyncGeneratorType
_get_ident = threading.get_ident
_monotonic_ns = time.monotonic_ns
_current_task = asyncio.current_task
_weakref = weakref.ref
_tracker_pid = 0  # the process the tracker runs in (a fork child inherits it, not the sampler)
# _state (below, after the helpers it names): what both task steppers read at each step,
# the tracker (set while a TaskSampler runs) and whether steps are timed among it


def engine_events(events: Iterable[EventType], engine_supported: Iterable[EventType] = ()) -> tuple[EventType, ...]:
    """The events an engine must sample when a TaskSampler runs beside it: PARK is
    dropped unless the engine samples it itself (``engine_supported``)."""
    return _sources.engine_events(events, TaskSampler.provides, engine_supported)


def engine_config(config, engine_supported: Iterable[EventType] = ()):
    """The SamplerConfig for the engine that runs beside a TaskSampler
    (``sources.engine_config``)."""
    return _sources.engine_config(config, TaskSampler.provides, engine_supported)


# =====================================================================================
# 1. labels follow the running task
# =====================================================================================
class _TaskCoroMethods(collections.abc.Coroutine):
    """What the two task steppers (``_PyTaskCoro``, ``_CTaskCoro``) share: every attribute
    but the step itself (``cr_frame``, ``cr_await``, ``__qualname__`` ...) is the wrapped
    coroutine's, so a task's repr, ``get_stack()`` and ``get_coro()`` introspection look
    the same; ``throw`` (rare) and the helpers a step calls back are Python."""

    __slots__ = ()

    def throw(self, typ, val=None, tb=None):
        args = (typ,) if val is None and tb is None else (typ, val, tb)
        st = _state
        if st.tracker is None:
            return self._coro.throw(*args)
        timing = st.timing
        resumed = _monotonic_ns()
        slot = _lab._slot_here()
        if timing:
            self._resumes(slot, resumed)
        prev = slot.id
        _lab._set(slot, self._lid if self._lid >= 0 else self._first_step())
        try:
            result = self._coro.throw(*args)
        except BaseException:
            self._finish(slot, prev)
            if timing:
                self._ended(resumed)
            raise
        self._lid = slot.id
        _lab._set(slot, prev)
        if timing:
            end = _monotonic_ns()
            self._q += resumed - end
            self._e = -end if result is None else end
        return result

    def _times(self, now: int) -> tuple[int, int, int]:
        """(start wait, ready, park) so far, in ns, at ``now`` (between steps; at its
        end for a task that ended)."""
        if self._end:
            now = self._end
        suspended = now + self._q
        if self._w < 0:
            return suspended, 0, 0
        ready = self._r + (now + self._e if self._e < 0 else 0)
        return self._w, ready, suspended - self._w - ready

    def close(self):
        return self._coro.close()

    def __await__(self):
        return self._coro.__await__()

    def __getattr__(self, name):
        return getattr(self._coro, name)

    def __repr__(self) -> str:
        return repr(self._coro)

    def _first_step(self) -> int:
        """The task's published id: its context's labels plus its name (as task bits).
        (Not computed in create_task: ``asyncio.create_task(name=...)`` names the task
        after the loop's create_task returns.)"""
        if self._w < 0:  # the ready time so far is the wait to start
            self._w, self._r = self._r, 0
        task = self._task
        if task is not None:
            self._task = None  # no task <-> proxy cycle once it runs
        else:  # an eager first step (inside create_task), or a task built elsewhere
            task = _current_task()  # ~0.3 us: why create_task hands the task over
        name = task.get_name() if task is not None else "?"
        tracker = _state.tracker
        if tracker is None:
            bits = _lab.task_bits(name)
        elif tracker.auto < MAX_TASK_NAMES and name.startswith("Task-"):  # task_bits' common case, inline
            tracker.auto += 1
            idx = next(_task_counter)
            _task_names[idx] = name
            bits = idx << _TASK_SHIFT
        else:
            bits = tracker.task_bits(name)
        global _last_labels
        ls = _current.get()
        last = _last_labels  # LabelSet.__hash__ is Python code: skip it for a repeated set
        if last[0] is ls:
            low = last[1]
        else:
            low = label_id(ls)
            _last_labels = (ls, low)
        lid = self._lid = bits | low
        return lid

    def _resumes(self, slot, resumed: int) -> None:
        """Its suspension ends now: its ready time, or (one no tick saw) its draw."""
        e = self._e
        if e < 0:
            self._r += resumed + e
        elif e > slot.tick:
            span = resumed - e
            self._q -= span
            left = slot.left - span
            slot.left = left if left > 0 else _short_suspension(self, slot, e, resumed, left)
        elif slot.batch > e:
            self._r += resumed - slot.batch

    def _ended(self, resumed: int) -> None:
        """Its last step ended: its times stop now (the next tick accounts the rest of
        its time since a tick last described it)."""
        end = _monotonic_ns()
        self._q += resumed - end
        self._e = self._end = end

    def _finish(self, slot, prev: int) -> None:
        """The task ended inside ``throw``: restore the slot."""
        if slot.id != prev:
            _lab._set(slot, prev)


class _PyTaskCoro(_TaskCoroMethods):
    """A task's coroutine, wrapped (the pure-Python stepper: without the native module, and
    in tests beside the C one): each step publishes the task's label id on the thread
    running it and restores the previous id when the step ends.  ``native/aiostep.c``'s
    StepBase does the same in C (``_CTaskCoro``): change both together."""

    __slots__ = ("_coro", "_lid", "_q", "_t0", "_task", "_e", "_r", "_w", "_end")

    # Step timing (while wall/park are sampled), read by the task sampler's ticks, which
    # run between steps.  A task's life is: waiting to start (in the loop's ready queue),
    # then steps separated by suspensions.  A suspension on a future is park until the
    # future completes; runnable time is ready (wall, not park: a thread waiting for the
    # GIL is not parked either): the wait before the first step, a bare yield's
    # (``asyncio.sleep(0)``), and the wait between the future's completion and the step
    # it wakes.  That completion is not seen (a done callback per await would cost
    # more than the step); the step runs in the loop's next batch of callbacks, so the
    # batch's start (its selector returning, hooked by the sampler: ``slot.batch``)
    # bounds it: the rest of the completing batch stays in park, the wait behind the
    # waking batch's earlier callbacks is ready.
    # A suspension that began after the sampler's last tick on this thread and ends
    # before the next (a 5 ms database call between two 10 ms ticks) is seen by no tick:
    # the ticks would charge it to the await they saw before (or, for a task that ends,
    # lose it).  So its time is kept out of the ticks' account, and suspensions like it
    # are drawn by length at their end, while their await chain is still there
    # (_short_suspension): a Poisson-like draw every ``slot.rate`` ns of such time.
    def __init__(self, coro, t0: int):
        self._coro = coro
        self._t0 = t0  # creation (0 unless timing)
        self._lid = -1  # published id at the last suspension; -1 before the first step
        # suspended time so far (start wait, park and ready) = now + _q while suspended
        # (q = -creation - time run)
        self._q = -t0
        self._task = None  # the task, from its creation to its first step (for its name)
        # when the current suspension began: the last step's end (creation before the
        # first step), negated when it is ready (not started yet, or a bare yield)
        self._e = -t0
        self._r = 0  # ready time of bare yields, ended suspensions
        self._w = -1  # the wait before the first step (-1: not started)
        self._end = 0  # when its last step ended (0: not ended): its times stop there

    def send(self, value):
        st = _state
        if st.tracker is None:  # profiling ended: only forward
            return self._coro.send(value)
        timing = st.timing
        if timing:
            resumed = _monotonic_ns()
        ident = _get_ident()
        slot = _slots.get(ident)
        if slot is None:
            slot = _new_slot(ident)
        if timing:  # (_resumes, inlined: a call per step costs more than these lines)
            e = self._e
            if e < 0:  # a ready suspension ends: not park (the first: _first_step moves it to _w)
                self._r += resumed + e
            elif e > slot.tick:  # a suspension no tick saw: out of the ticks' account, drawn by length
                span = resumed - e
                self._q -= span
                left = slot.left - span
                slot.left = left if left > 0 else _short_suspension(self, slot, e, resumed, left)
            elif slot.batch > e:  # woken: ready since its batch began
                self._r += resumed - slot.batch
        prev = slot.id
        lid = self._lid
        if lid < 0:
            lid = self._first_step()
        if lid != prev:  # labeling._set, inlined (a store into the native word's view)
            slot.id = lid
            view = slot.view
            if view is not None:
                view[0] = lid
            elif _lab._mirrored:
                _push(slot, lid)
        try:
            result = self._coro.send(value)  # no bound method kept: one GC-tracked object less per task
        except BaseException:  # the task returned (StopIteration) or raised
            if slot.id != prev:  # labeling._set, inlined
                slot.id = prev
                view = slot.view
                if view is not None:
                    view[0] = prev
                elif _lab._mirrored:
                    _push(slot, prev)
            if timing:
                self._ended(resumed)
            raise
        lid = slot.id  # labels() blocks inside the step may have changed it: keep theirs
        self._lid = lid
        if lid != prev:
            slot.id = prev
            view = slot.view
            if view is not None:
                view[0] = prev
            elif _lab._mirrored:
                _push(slot, prev)
        if timing:
            end = _monotonic_ns()
            self._q += resumed - end  # minus the time this step ran
            self._e = -end if result is None else end  # a bare yield: runnable again at once
        return result

if _STEP_BASE is not None:
    class _CTaskCoro(_STEP_BASE, _TaskCoroMethods):
        """The task stepper in C (``native/aiostep.c``): ``send``, also the ``am_send`` slot
        that asyncio's C Task steps through (no StopIteration when a task returns), and the
        fields of ``_PyTaskCoro`` as C members."""

        __slots__ = ()

    _TaskCoro = _CTaskCoro
else:
    _TaskCoro = _PyTaskCoro


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
        if task.done() and not (ended and type(coro := task.get_coro()) is _TaskCoro and coro._end):
            return None
    except Exception:  # noqa: BLE001 - not a task after all
        return None
    return task


def _short_suspension(proxy: _TaskCoro, slot, e: int, resumed: int, left: int) -> int:
    """A draw among the suspensions no tick saw (see _TaskCoro): this one, which ends
    now after ``resumed - e`` ns, stands for the ``k * slot.rate`` ns the countdown
    ``left`` crossed.  Returns the countdown to the next draw."""
    rate = slot.rate
    k = 1 + (-left) // rate
    tracker = _state.tracker
    if tracker is not None:
        tracker.sampler._short(proxy, slot.batch, e, resumed, k * rate)
    slot.shorts += 1
    return left + k * rate


class _PyStepState:
    """The pure-Python stepper's StepState (``native/aiostep.c``'s, without the native module)."""

    __slots__ = ("tracker", "timing", "mirrored", "slots", "new_slot", "push", "short_suspension", "first_step")

    def __init__(self, *, slots, new_slot, push, short_suspension, first_step):
        self.tracker, self.timing, self.mirrored = None, False, False
        self.slots, self.new_slot, self.push = slots, new_slot, push
        self.short_suspension, self.first_step = short_suspension, first_step


def _make_step_state():
    """What the steppers read at each step, built from the Python helpers and tables they
    call back, named here (a renamed one fails now, at import, not at a task's step); the
    C stepper gets it once (``StepBase._bind``)."""
    state = (_STEP_STATE or _PyStepState)(
        slots=_lab._slots, new_slot=_lab._new_slot, push=_lab._push,
        short_suspension=_short_suspension, first_step=_TaskCoroMethods._first_step,
    )
    _lab.watch_mirrored(state)  # labeling keeps its ``mirrored`` equal to its own flag
    if _STEP_BASE is not None:
        _STEP_BASE._bind(state)
    return state


_state = _make_step_state()
_orig_create_task = None
_carried: dict = {}  # task index -> weakref of its task: names a stopped session kept for pending tasks
_last_labels: tuple = (EMPTY_LABELS, 0)  # (the label set a first step saw last, its id)


def _create_task(self, coro, *args, **kwargs):
    tracker = _state.tracker
    if tracker is None or type(coro) is not _CoroutineType:
        return _orig_create_task(self, coro, *args, **kwargs)
    if self not in tracker.loops:
        tracker.add_loop(self)
    proxy = _TaskCoro(coro, _monotonic_ns() if _state.timing else 0)
    task = _orig_create_task(self, proxy, *args, **kwargs)
    if proxy._lid < 0:
        proxy._task = task  # its first step takes the name from here (cheaper than current_task)
    else:
        # it ran already (an eager start) unnamed: asyncio may name it after we return,
        # so its next step looks its name up again
        proxy._lid = -1
        if not task.done():
            proxy._task = task
    reg = tracker.registered
    if reg is not None:  # the task sampler draws from these (weak: no task is kept alive)
        reg[self].append(_weakref(task))
    return task


_create_task.__wrapped__ = asyncio.base_events.BaseEventLoop.create_task
_create_task.__qualname__ = "BaseEventLoop.create_task"


def _install_create_task() -> None:
    global _orig_create_task
    cls = asyncio.base_events.BaseEventLoop
    current = cls.__dict__["create_task"]
    if current is not _create_task:
        _orig_create_task = current
        _create_task.__wrapped__ = current
        cls.create_task = _create_task


def _uninstall_create_task() -> None:
    cls = asyncio.base_events.BaseEventLoop
    if cls.__dict__.get("create_task") is _create_task and _orig_create_task is not None:
        cls.create_task = _orig_create_task


# =====================================================================================
# 2. samples of suspended tasks
# =====================================================================================
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
            and type(task.get_coro()) is not _TaskCoro
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
        self.e = 0  # their _TaskCoro._e then


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
        unique) get fresh bits, the first ``MAX_TASK_NAMES`` of them per profile; names
        given by the program are shared per name (up to ``MAX_TASK_NAMES`` distinct);
        past the caps a task is ``[other]``."""
        if name.startswith("Task-"):
            if self.auto < MAX_TASK_NAMES:
                self.auto += 1
                idx = next(_task_counter)
                _task_names[idx] = name
                return idx << _TASK_SHIFT
            self.names_capped += 1
            return self.other
        bits = self.names.get(name)
        if bits is None:
            if len(self.names) >= MAX_TASK_NAMES:
                self.names_capped += 1
                return self.other
            bits = self.names[name] = _lab.task_bits(name)
        return bits

    def renamed(self, proxy: "_TaskCoro", task) -> int:
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
    into the loop thread's slot (see _TaskCoro).  On the loop's thread; loops
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


class TaskSampler:
    """An extra sampler, run beside any engine: asyncio task labels while profiling, and
    WALL/PARK samples of suspended tasks (see the module docstring).

    ``start()`` then ``stop(sink=None)``: stop returns a Profile (its own builder) or,
    given a ProfileBuilder ``sink``, adds the samples to it and returns None.  One runs
    per process at a time.  Samples are taken only while the events ask for them
    (WALL and/or PARK); task labels are published whatever the events.

    Cost bounds: with at most ``max_tasks_per_tick`` tasks registered, every pending task
    is described at every tick (exact weights).  With more, the tick draws tasks at
    random for the next tick to account, as many as fit ``tick_budget`` (a fraction of
    the interval) at the cost per drawn task of the previous ticks (at least 4, at most
    ``max_tasks_per_tick``); they carry the time of every task pending when they were
    drawn (scaled weights).  The number of draws is fixed before drawing, never cut by
    what the draws cost, so tasks costly to describe are not favoured.  Suspensions no
    tick saw are drawn at their end, about SHORTS_PER_TICK between two ticks.
    A tick that took long (many tasks, cold caches) delays the next one, so ticks take at
    most ~0.5% of the loop's time (``TICK_COST_RATIO``).
    """

    name = "asyncio"
    provides = frozenset({EventType.PARK})
    remote = False  # (a ``sources.Source``: suspended tasks of this process)

    def __init__(self, config, *, max_tasks_per_tick: int = 32, tick_budget: float = 0.003,
                 rng: random.Random | None = None):
        self.config = config
        self.interval_ns = int(config.interval_ns)
        self.max_depth = int(getattr(config, "max_depth", 128))
        events = set(config.events)
        self.want_wall = EventType.WALL in events
        self.want_park = EventType.PARK in events
        self.max_tasks = max(1, int(max_tasks_per_tick))
        self.budget_ns = max(20_000, int(self.interval_ns * tick_budget))
        self._rng = rng or random.Random()
        self._builder: ProfileBuilder | None = None
        self._tracker: _Tracker | None = None
        self._lock = threading.RLock()  # the builder and caches: loops may run on several threads
        self._running = False
        self._start_mono = 0
        self._frame_cache: dict = {}  # (id(code), lasti) -> (code, frame id)
        self._blockers: dict[str, int] = {}
        self._rows: list = []  # (stack, thread, published id, parked, rel time, count, weight)
        self._ticks = 0
        self._samples = {EventType.WALL: 0, EventType.PARK: 0}
        self._subsampled_ticks = 0
        self._errors: dict[str, int] = {}
        self._tick_ns = 0
        self._tick_cpu_ns = 0  # the ticks' own CPU time: their wall time adds preemption and GIL waits
        self._empty_ctx = contextvars.Context()
        self._registries = _task_registries()
        self._mark = self._truncated = -1
        self._names_from: int | None = None  # after stop: the first task index the session gave
        self._names_loops: list = []

    @property
    def sampling(self) -> bool:
        return self.want_wall or self.want_park

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        global _tracker_pid
        if _state.tracker is not None and _tracker_pid != os.getpid():
            # a fork child (multiprocessing fork, children=True): the parent's sampler does
            # not run here, its create_task patch only forwards
            _state.tracker = None
            _uninstall_create_task()
        if _state.tracker is not None:
            raise ProfilerBusyError("an asyncio task sampler is already running in this process")
        self._start_mono = _monotonic_ns()
        self._builder = b = ProfileBuilder(Metadata(start_ns=time.time_ns(), interval_ns=self.interval_ns,
                                                    engine=self.name))
        self._mark = b.frame_id(TASK_MARK)
        self._truncated = b.frame_id(Frame("[truncated]", kind=FrameKind.TRUNCATED))
        self._tracker = tracker = _Tracker(self)
        self._running = True
        _lab.install_propagation()  # task labels reach the threads tasks start
        _state.timing = self.sampling
        for slot in list(_lab._slots.values()):  # suspensions from before this start are the ticks'
            slot.tick, slot.rate, slot.shorts = self._start_mono, self.interval_ns, 0
            slot.left = int(self._rng.random() * self.interval_ns) + 1
        _state.tracker, _tracker_pid = tracker, os.getpid()
        _install_create_task()
        # loops already running: the caller's (a notebook's), and any other with tasks
        # (their pending tasks are looked up now, outside the profiled code's time)
        loops: dict = {}
        here = asyncio._get_running_loop()
        if here is not None:
            loops[here] = []
        for ref in _registry_refs(self._registries):
            task = _deref(ref)
            try:
                loop = task.get_loop()
                if task.done() or not loop.is_running():
                    continue
            except Exception:  # noqa: BLE001 - a dead reference, a foreign object
                continue
            loops.setdefault(loop, []).append(ref if isinstance(ref, weakref.ref) else _weakref(task))
        for loop, pending in loops.items():
            state = tracker.add_loop(loop)
            state.others = pending
            state.others_at = self._start_mono + RESCAN_NS

    def stop(self, sink: ProfileBuilder | None = None, forget_names: bool = False) -> Profile | None:
        """Stop; the samples as a Profile, or added to ``sink`` (then None is returned).
        The task names this session gave are kept until ``release()`` (after an engine's
        last drain, whose records carry them), or dropped now with ``forget_names=True``."""
        tracker = self._tracker
        if tracker is None:
            raise NotRunningError("the asyncio task sampler is not running")
        # a last sample of the loop we are called from (a notebook cell, a coroutine)
        here = asyncio._get_running_loop()
        state = tracker.loops.get(here) if here is not None else None
        if state is not None and self.sampling:
            self._safe_tick(state)
        self._running = False
        if _state.tracker is tracker:
            _state.tracker = None
            _state.timing = False
        _uninstall_create_task()
        for st in list(tracker.loops.values()):
            self._cancel(st)
            _unhook_selector(st)
            st.states = {}
        self._tracker = None
        profile = self._build(tracker)
        self._names_from, self._names_loops = tracker.other >> _TASK_SHIFT, list(tracker.loops)
        if forget_names:
            self.forget_names()
        if sink is None:
            return profile
        _copy_into(profile, sink)
        return None

    def release(self) -> None:
        """(``sources.Source``) The engine's last records are read: forget the names."""
        self.forget_names()

    def collect(self, profile: Profile) -> Profile:
        """(``sources.Source``) Nothing from other processes: ``stop()`` gave the samples."""
        return profile

    def abort(self) -> None:
        """(``sources.Source``) Undo ``start()`` after another source failed to start."""
        if self._tracker is not None:
            self.stop(forget_names=True)

    def forget_names(self) -> int:
        """Drop the task names this session gave (a process profiling many cells of many
        tasks kept ~5,000 names per session otherwise), but those still published by
        pending tasks, which go on into later sessions.  Returns how many were dropped."""
        first, loops = self._names_from, self._names_loops
        if first is None:
            return 0
        self._names_from, self._names_loops = None, []
        keep = {}  # task index -> its pending task
        for loop in loops:
            try:
                pending = asyncio.all_tasks(loop)
            except Exception:  # noqa: BLE001 - a closed loop, a foreign one
                continue
            for task in pending:
                coro = task.get_coro()
                lid = coro._lid if type(coro) is _TaskCoro else -1
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

    def _cancel(self, st: _LoopState) -> None:
        handle, st.handle = st.handle, None
        if handle is None:
            return
        if asyncio._get_running_loop() is st.loop:
            handle.cancel()
            return
        try:
            st.loop.call_soon_threadsafe(handle.cancel)
        except RuntimeError:  # loop closed: its handles are gone with it
            pass

    def _schedule_first(self, st: _LoopState) -> None:
        if not self.sampling:
            return
        loop = st.loop
        try:
            if asyncio._get_running_loop() is loop or not loop.is_running():
                st.handle = loop.call_soon(self._tick, st, context=self._empty_ctx)
            else:
                st.handle = loop.call_soon_threadsafe(self._tick, st, context=self._empty_ctx)
        except RuntimeError:  # closed loop
            st.handle = None

    # -- ticks (on the loop's thread) -------------------------------------------------
    def _tick(self, st: _LoopState) -> None:
        if not self._running:
            return
        self._safe_tick(st)
        if not self._running:
            return
        now = _monotonic_ns()
        # ticks cost at most ~0.5% of the loop's time: a costly tick (many tasks, cold
        # caches) spaces the next one out; weights carry the time since the previous
        # tick either way, only the time resolution of the suspended tasks' samples drops
        period = min(max(self.interval_ns, st.cost * TICK_COST_RATIO), MAX_TICK_PERIODS * self.interval_ns)
        due = st.next_due + period if st.next_due else now + period
        if due <= now:  # the loop was busy past a whole interval: no burst to catch up
            due = now + period
        st.next_due = due
        try:
            st.handle = st.loop.call_later((due - now) / 1e9, self._tick, st, context=self._empty_ctx)
        except RuntimeError:
            st.handle = None

    def _safe_tick(self, st: _LoopState) -> None:
        t0, c0 = _monotonic_ns(), time.thread_time_ns()
        try:
            with self._lock:
                self._sample_loop(st, t0)
        except Exception as exc:  # noqa: BLE001 - never raise into the user's loop
            msg = f"{type(exc).__name__}: {exc}"[:200]
            if msg in self._errors or len(self._errors) < 5:
                self._errors[msg] = self._errors.get(msg, 0) + 1
        took = _monotonic_ns() - t0
        # a smoothed cost, one-off work excluded (the loop's stack, looked up once a second)
        st.cost = (3 * st.cost + max(0, took - st.prefix_ns)) // 4
        st.prefix_ns = 0
        self._tick_ns += took
        self._tick_cpu_ns += time.thread_time_ns() - c0
        self._ticks += 1

    def _prefix(self) -> list[int]:
        """Frame ids of the loop thread's stack, root first, down to the innermost
        ``Handle._run`` above us (the loop's dispatch); [] when there is none."""
        f = sys._getframe(1)
        chain = []
        found = -1
        while f is not None:
            chain.append(f)
            if found < 0 and f.f_code.co_name == "_run" and f.f_code.co_filename.endswith("events.py"):
                found = len(chain) - 1
            f = f.f_back
        if found < 0:
            return []
        ids = [self._frame_id(fr) for fr in chain[found:]]
        ids.reverse()
        return ids

    def _frame_id(self, frame) -> int:
        code = frame.f_code
        key = (id(code), frame.f_lasti)
        hit = self._frame_cache.get(key)
        if hit is None:
            line = frame.f_lineno or code.co_firstlineno
            hit = self._frame_cache[key] = (
                code, self._builder.frame_id(Frame(code.co_qualname, code.co_filename, line, code.co_firstlineno)))
        return hit[1]

    def _twin(self, st: _LoopState) -> int:
        """The loop thread's "(asyncio tasks)" thread id (on the loop's thread)."""
        if st.thread < 0:
            st.thread = self._builder.thread_id(threading.get_native_id(),
                                                f"{threading.current_thread().name} (asyncio tasks)")
        return st.thread

    def _sample_loop(self, st: _LoopState, now: int) -> None:
        """One tick: account the tasks the previous tick described (all of them, or a
        uniform draw of them, scaled) and the tasks created since, then describe the
        tasks the next tick will account: all of them while they are few, else a draw.
        A task is accounted from its step timing between two of its descriptions, at
        the stacks it had then and has now, as a thread's CPU clock between two of its
        samples; a draw made at the previous tick stands for every task pending then."""
        loop = st.loop
        self._twin(st)
        prev_tick = st.last_tick or self._start_mono
        st.last_tick = now
        slot = _lab._slot_here()
        # suspensions that begin from now on and end before the next tick are drawn at
        # their end (about SHORTS_PER_TICK a tick: each describes an await chain)
        slot.tick = now
        if slot.shorts > SHORTS_PER_TICK:
            slot.rate *= 2
        elif slot.shorts < SHORTS_PER_TICK // 2 and slot.rate > self.interval_ns:
            slot.rate = max(self.interval_ns, slot.rate // 2)
        slot.shorts = 0
        if st.hook is None:
            _hook_selector(st)
        if st.hook and st.hook[2].batch < now:
            # a task resumed later in this batch was charged park until now by this tick
            st.hook[2].batch = now
        if now >= st.others_at:
            # tasks not created through create_task while profiling (asyncio.Task(...),
            # loops of other classes) are looked up now and then: O(all tasks), so at most
            # every second and at most ~0.5% of the time
            st.others = [w for w in (_foreign_pending(r, loop) for r in _registry_refs(self._registries))
                         if w is not None]
            st.others_at = now + max(RESCAN_NS, 200 * (_monotonic_ns() - now))
        described, created = st.reg[:st.mark], st.reg[st.mark:]  # registered before / since the previous tick
        if len(st.reg) > st.compact_at:  # amortized O(1) per task created
            st.reg = [r for r in st.reg if (t := r()) is not None and not t.done()]
            st.compact_at = max(256, 2 * len(st.reg))
            if self._tracker is not None and self._tracker.registered is not None:
                self._tracker.registered[loop] = st.reg
        reg, others = st.reg, st.others
        n = len(reg) + len(others)
        running = _current_task(loop) if asyncio._get_running_loop() is loop else None
        draws = max(4, min(self.max_tasks, self.budget_ns // max(1, 2 * st.draw_ns)))
        rand = self._rng.random
        # what this tick accounts: (reference, scale numerator, scale denominator)
        if st.panel is None:  # the previous tick described every task
            account = [(ref, 1, 1) for ref in described + others]
        else:
            account = [(ref, st.panel_n * k, len(st.panel)) for ref, k in _multiplicities(st.panel)]
        if len(created) <= draws or n <= self.max_tasks:
            account += [(ref, 1, 1) for ref in created]
        else:  # many new tasks: a draw of them (with replacement), for their time since creation
            picks = [created[int(rand() * len(created))] for _ in range(draws)]
            account += [(ref, len(created) * k, draws) for ref, k in _multiplicities(picks)]
        states, acc, seen = st.states, {}, {}
        t_visits = _monotonic_ns()
        for ref, num, den in account:
            task = _pending(ref, loop, running, ended=True)
            if task is None:
                continue
            s = states.get(task)
            if task.done():  # ended since a tick described it: its time from then to its end
                if s is not None:
                    self._visit(task, s, st, now, prev_tick, acc, num, den)
                continue
            seen[task] = self._visit(task, s, st, now, prev_tick, acc, num, den)
        # what the next tick accounts
        if n <= self.max_tasks:
            st.panel = None
            for ref in reg + others:
                task = _pending(ref, loop, running)
                if task is not None and task not in seen:
                    seen[task] = self._visit(task, states.get(task), st, now, prev_tick, None, 0, 1)
            keep = seen
        else:  # a uniform draw (with replacement: cheap, unbiased once scaled)
            self._subsampled_ticks += 1
            nreg = len(reg)
            st.panel = [reg[i] if i < nreg else others[i - nreg] for i in (int(rand() * n) for _ in range(draws))]
            st.panel_n = n
            keep = {}
            for ref in st.panel:
                task = _pending(ref, loop, running)
                if task is not None and task not in keep:
                    s = seen.get(task)
                    keep[task] = s if s is not None else self._visit(task, states.get(task), st, now, prev_tick,
                                                                     None, 0, 1)
            visits = len(seen) + len(keep)
            if visits:
                per = (_monotonic_ns() - t_visits) // visits
                st.draw_ns = per if not st.draw_ns else (3 * st.draw_ns + per) // 4
        st.states = keep
        st.mark = len(st.reg)
        rel = now - self._start_mono
        for (stack, lid, parked), (count, weight) in acc.items():
            if weight > 0:
                self._rows.append((stack, st.thread, lid, parked, rel, count, weight))

    def _visit(self, task, s: "_TaskState | None", st: _LoopState, now: int, prev_tick: int, acc: dict | None,
               num: int, den: int) -> "_TaskState":
        """Describe ``task`` now (its step timing, and its stacks if it awaits something
        new) and, given ``acc``, account its time since its previous description, times
        num/den, into ``acc``.  Returns its state."""
        floor = self._start_mono
        coro = task.get_coro()
        proxy = coro if type(coro) is _TaskCoro else None
        if s is None:  # (a task not ours, first seen while accounting: the tick's period)
            s = _TaskState(0 if proxy is not None else (max(prev_tick, floor) if acc is not None else now))
        waiter = task._fut_waiter
        # a task that has not resumed still waits on the same future: same stacks
        if waiter is None or waiter is not s.key:
            if st.prefix is None or now - st.prefix_at > RESCAN_NS:
                p0 = _monotonic_ns()
                st.prefix, st.prefix_at = self._prefix(), now
                st.chains = {}
                st.prefix_ns = _monotonic_ns() - p0
            s.key = waiter
            before, s.stacks = s.stacks, [_UNSET, _UNSET, _UNSET]
            s.lid = -1
            if proxy is not None and proxy._w >= 0 and not proxy._end:
                # both, while the chain is there: the next tick may charge this
                # suspension's rest (its park, its wait to run) after it resumed
                self._stack_of(proxy, waiter, 1, st, s.stacks)
        else:
            before = s.stacks
        if proxy is None:
            # not ours: the time since its previous description, in the state it is in now
            parked = waiter is not None and not waiter.done()
            weight = now - max(s.last, floor)
            s.last = now
            if acc is not None and weight > 0:
                self._add(acc, task, coro, int(parked), weight * num // den, s,
                          self._sid(s, coro, waiter, int(parked), st))
            return s
        # ours: its step timing splits its suspended time since its previous description
        # (the time it ran meanwhile is the engine's to sample) into its wait to start,
        # ready and park, each charged at its own stack
        t0 = proxy._t0
        at = proxy._end or now  # (a task that ended: its times stopped then)
        w, r, p = proxy._times(at)
        started = t0 + w  # when its first step began (now, if not yet)
        dw = started - max(t0 + s.w, floor)
        dr, dp = r - s.r, p - s.p
        span = at - max(started, floor)
        if dr + dp > span:  # (time before the session started)
            span, both = max(span, 0), dr + dp
            dr, dp = dr * span // both, dp * span // both
        if acc is not None and proxy._e != s.e and before[0] != _UNSET:
            # it resumed since its previous description: the current suspension (since
            # its last step ended) is charged here, the rest at the stacks described
            # then (the suspension it was in then went on for part of it; suspensions
            # that began and ended in between were drawn at their end: _short)
            cur = at - abs(proxy._e)  # (0 for a task that ended)
            if proxy._e < 0:
                now_r, now_p = min(dr, cur), 0
            else:
                now_r, now_p = 0, min(dp, cur)
            self._add(acc, task, proxy, 0, (dr - now_r) * num // den, s, before[0])
            self._add(acc, task, proxy, 1, (dp - now_p) * num // den, s, before[1])
            dr, dp = now_r, now_p
        s.w, s.r, s.p, s.last, s.e = w, r, p, at, proxy._e
        if acc is not None:
            for variant, d in ((2, dw), (0, dr), (1, dp)):
                if d > 0:
                    self._add(acc, task, proxy, variant, d * num // den, s, self._sid(s, proxy, waiter, variant, st))
        return s

    def _short(self, proxy: _TaskCoro, batch: int, e: int, resumed: int, weight: int) -> None:
        """Rows for a suspension no tick saw, drawn at its end (_short_suspension): it
        stands for ``weight`` ns of such suspensions, split as its own time was between
        park (until the batch that resumes it began) and ready; on the loop's thread,
        before the task's step, so its await chain is still there."""
        tracker = self._tracker
        loop = asyncio._get_running_loop()
        st = tracker.loops.get(loop) if tracker is not None and loop is not None else None
        if st is None or not self._running:
            return
        start = max(e, self._start_mono)
        full, span = resumed - e, resumed - start
        if span <= 0:
            return
        ready = min(resumed - batch, span) if batch > e else 0
        park_w, ready_w = weight * (span - ready) // full, weight * ready // full
        try:
            with self._lock:
                if st.prefix is None:
                    st.prefix, st.prefix_at, st.chains = self._prefix(), resumed, {}
                thread, rel = self._twin(st), resumed - self._start_mono
                stacks = [_UNSET, _UNSET, _UNSET]
                self._stack_of(proxy, None, 1, st, stacks)  # (one walk for both)
                for parked, w in ((True, park_w), (False, ready_w)):
                    if w > 0 and stacks[parked] >= 0:
                        self._rows.append((stacks[parked], thread, proxy._lid, parked, rel, 1, w))
        except Exception as exc:  # noqa: BLE001 - never raise into the user's task
            msg = f"{type(exc).__name__}: {exc}"[:200]
            if msg in self._errors or len(self._errors) < 5:
                self._errors[msg] = self._errors.get(msg, 0) + 1

    def _sid(self, s: _TaskState, coro, waiter, variant: int, st: _LoopState) -> int:
        """The task's stack for ``variant`` (0 ready, 1 parked, 2 not started), computed
        once per suspension."""
        sid = s.stacks[variant]
        if sid == _UNSET:
            sid = s.stacks[variant] = self._stack_of(coro, waiter, variant, st)
        return sid

    def _add(self, acc: dict, task, coro, variant: int, weight: int, s: _TaskState, sid: int) -> None:
        """Add ``weight`` to the task's row at stack ``sid`` for ``variant``."""
        if sid < 0 or weight <= 0:
            return
        if s.lid < 0:
            s.lid = self._lid_of(task, coro)
        key = (sid, s.lid, variant == 1)
        cell = acc.get(key)
        if cell is None:
            acc[key] = [1, weight]
        else:
            cell[0] += 1
            cell[1] += weight

    def _stack_of(self, coro, waiter, variant: int, st: _LoopState, both: list | None = None) -> int:
        """The stack of a suspended task (``coro``: its coroutine or our proxy) for
        ``variant``: its await chain, ready (0) or parked (1, ending in a BLOCKER naming
        what it awaits); or (2) its coroutine's entry, where it waited to start.
        Cached per await chain (code and instruction of each frame, and what is
        awaited): tasks suspended at the same place share one entry.  ``both``: a
        task's stacks list, to fill with the ready and parked ones (one walk)."""
        inner = coro._coro if type(coro) is _TaskCoro else coro
        if variant == 2:
            code = getattr(inner, "cr_code", None)
            key = ("start", id(code))
            sid = st.chains.get(key)
            if sid is None:
                if code is None or _file_kind(code.co_filename) != _OTHER:
                    sid = -1
                else:
                    fid = self._builder.frame_id(Frame(code.co_qualname, code.co_filename, code.co_firstlineno,
                                                       code.co_firstlineno))
                    sid = self._builder.stack_id(st.prefix + [self._mark, fid])
                st.chains[key] = sid
            return sid
        frames = _await_chain(inner)
        chain = []
        for f in frames:
            chain.append(id(f.f_code))
            chain.append(f.f_lasti)
        chain = tuple(chain)
        sid = -1
        for parked in ((False, True) if both is not None else (variant == 1,)):
            if parked:
                key = (waiter.get_name() if isinstance(waiter, asyncio.Task) else type(waiter), True, chain)
            else:
                key = (None, False, chain)
            sid = st.chains.get(key)
            if sid is None:
                sid = st.chains[key] = self._stack_for(frames, waiter, parked, st)
            if both is not None:
                both[parked] = sid
        return sid

    def _lid_of(self, task, coro) -> int:
        """The task's published id (for our proxies, the one its steps publish)."""
        tracker = self._tracker
        if type(coro) is _TaskCoro and coro._lid >= 0:
            # renamed since its first step? (set_name; an eager task named afterwards)
            return tracker.renamed(coro, task) if tracker is not None else coro._lid
        # not started, or not ours: its context's labels and its name
        ctx = task.get_context() if hasattr(task, "get_context") else None
        base = ctx.get(_current, EMPTY_LABELS) if ctx is not None else EMPTY_LABELS
        name = task.get_name()
        bits = tracker.task_bits(name) if tracker is not None else _lab.task_bits(name)
        return bits | label_id(base)

    def _stack_for(self, frames: list, waiter, parked: bool, st: _LoopState) -> int:
        """The stack id of a suspended task whose await chain is ``frames`` (outermost
        first): the loop's prefix, the task marker, the chain and, when parked, a
        BLOCKER naming what it awaits; -1 when no frame is user code (neither asyncio
        nor notebook machinery: such tasks are not sampled)."""
        ids: list[int] = []
        tail: list = []  # trailing asyncio-internal codes, outermost first
        user = False
        for frame in frames:
            code = frame.f_code
            ids.append(self._frame_id(frame))
            kind = _file_kind(code.co_filename)
            if kind == _ASYNCIO:
                tail.append(code)
            else:
                tail = []
                user = user or kind == _OTHER
        if not user:
            return -1
        if parked:
            if tail:  # name the API the task called, not asyncio's insides
                ids = ids[: len(ids) - len(tail)]
                blocker = _api_name(tail)
            else:
                blocker = _describe_waiter(waiter)
            fid = self._blockers.get(blocker)
            if fid is None:
                fid = self._blockers[blocker] = self._builder.frame_id(Frame(f"[{blocker}]", kind=FrameKind.BLOCKER))
            ids.append(fid)
        full = st.prefix + [self._mark] + ids
        if len(full) > self.max_depth:
            full = [self._truncated] + full[len(full) - self.max_depth + 1:]
        return self._builder.stack_id(full)

    # -- the profile ------------------------------------------------------------------
    def _build(self, tracker: _Tracker) -> Profile:
        b = self._builder
        end = _monotonic_ns()
        with self._lock:  # a tick of another loop thread may still be running
            rows, self._rows = self._rows, []
        labels: dict[tuple[int, bool], int] = {}
        for stack, thread, lid, parked, rel, count, weight in rows:
            lab = labels.get((lid, parked))
            if lab is None:
                try:
                    ls = _lab.labelset(lid)
                except ValueError:
                    ls = EMPTY_LABELS
                lab = labels[(lid, parked)] = b.labels_id(ls.merged({"state": "await" if parked else "ready"}))
            if self.want_wall:
                b.add(EventType.WALL, stack, thread, lab, rel, count, weight)
                self._samples[EventType.WALL] += count
            if parked and self.want_park:
                b.add(EventType.PARK, stack, thread, lab, rel, count, weight)
                self._samples[EventType.PARK] += count
        secs = max((end - self._start_mono) / 1e9, 1e-9)
        notes = []
        if self.sampling:
            per_tick = self._tick_ns / max(1, self._ticks) / 1e3
            per_tick_cpu = self._tick_cpu_ns / max(1, self._ticks) / 1e3
            notes.append(
                f"asyncio: {self._ticks} task-sampler ticks over {len(tracker.loops)} loop(s) "
                f"({self._ticks / secs:.0f}/s, {per_tick:.0f} us each, {per_tick_cpu:.0f} us of CPU); "
                f"suspended tasks' wall{'/park' if self.want_park else ''} on the '(asyncio tasks)' thread(s), "
                "labels state=await|ready")
            if self._subsampled_ticks:
                notes.append(f"asyncio: {self._subsampled_ticks} tick(s) saw more pending tasks than their "
                             f"budget ({self.max_tasks} tasks, {self.budget_ns / 1e3:.0f} us): a random subset "
                             "was sampled and its weights scaled (unbiased, noisier)")
        if tracker.names_capped:
            notes.append(f"asyncio: more than {MAX_TASK_NAMES} task names: {tracker.names_capped} task(s) "
                         f"labelled task={OTHER_TASKS}")
        if self._errors:
            detail = "; ".join(f"{m} (x{n})" for m, n in self._errors.items())
            notes.append(f"asyncio task sampler errors: {detail}")
        b.metadata = b.metadata.replace(notes=tuple(notes), extra={"asyncio_ticks": str(self._ticks)})
        return b.build(end_ns=b.metadata.start_ns + (end - self._start_mono))


def _await_chain(coro) -> list:
    """The frames of a suspended coroutine's await chain, outermost first: through
    coroutines (``cr_await``), generators (``gi_yieldfrom``), async generators
    (``ag_await``, and the generator behind an ``async for``'s ``asend``)."""
    frames = []
    obj = coro
    for _ in range(MAX_CHAIN):
        t = type(obj)
        if t is _CoroutineType:
            frame, nxt = obj.cr_frame, obj.cr_await
        elif t is _GeneratorType:
            frame, nxt = obj.gi_frame, obj.gi_yieldfrom
        elif t is _AsyncGenType:
            frame, nxt = obj.ag_frame, obj.ag_await
        elif t.__name__ in ("async_generator_asend", "async_generator_athrow"):
            obj = _agen_of(obj)
            if obj is None:
                break
            continue
        elif t is _TaskCoro:
            obj = obj._coro
            continue
        elif hasattr(obj, "gi_frame") and hasattr(obj, "gi_yieldfrom"):  # types.coroutine wrappers
            frame, nxt = obj.gi_frame, obj.gi_yieldfrom
        else:
            break  # a future (or its iterator): the end of the chain
        if frame is None:
            break
        frames.append(frame)
        obj = nxt
        if obj is None:
            break
    return frames


def _agen_of(awaitable):
    """The async generator behind an ``asend``/``athrow`` awaitable (no Python attribute
    names it; the garbage collector's referents do)."""
    import gc

    for ref in gc.get_referents(awaitable):
        if type(ref) is _AsyncGenType:
            return ref
    return None


_EVENTLOOP_CLASS = re.compile(r"^\w*EventLoop\.")


def _api_name(tail: list) -> str:
    """``asyncio.<qualname>`` of the asyncio API a task called: the outermost of its
    trailing asyncio frames, past ``async with`` plumbing (``__aenter__`` ...); loop
    classes are shown as ``loop``."""
    code = tail[0]
    for c in tail:
        code = c
        if not (c.co_name.startswith("__") and c.co_name.endswith("__")):
            break
    return "asyncio." + _EVENTLOOP_CLASS.sub("loop.", code.co_qualname).lstrip("_")


def _describe_waiter(waiter) -> str:
    if waiter is None:
        return "asyncio.Future"
    if isinstance(waiter, asyncio.Task):
        name = waiter.get_name()
        return "asyncio.Task" if _AUTO_NAME.match(name) else f"asyncio.Task {name}"
    tname = type(waiter).__name__
    if tname == "_GatheringFuture":
        return "asyncio.gather"
    if asyncio.isfuture(waiter):
        mod = type(waiter).__module__
        return "asyncio.Future" if mod in ("_asyncio", "asyncio.futures") else f"{mod}.{type(waiter).__qualname__}"
    return type(waiter).__qualname__


def _copy_into(profile: Profile, sink: ProfileBuilder) -> None:
    """Add ``profile``'s samples to ``sink`` (times re-based on the sink's start)."""
    shift = profile.metadata.start_ns - sink.metadata.start_ns if sink.metadata.start_ns else 0
    stack_map = [sink.stack_of(profile.stack_frames(i)) for i in range(len(profile.stacks))]
    thread_map = [sink.thread_id(t.tid, t.name) for t in profile.threads]
    label_map = [sink.labels_id(ls) for ls in profile.labelsets]
    if len(profile):
        sink.add_many(profile.event, [stack_map[i] for i in profile.stack.tolist()],
                      [thread_map[i] for i in profile.thread.tolist()],
                      [label_map[i] for i in profile.labels.tolist()],
                      np.maximum(profile.time_ns + shift, 0), profile.values)
    if profile.metadata.notes:
        sink.metadata = sink.metadata.replace(notes=tuple(sink.metadata.notes) + tuple(profile.metadata.notes))


# =====================================================================================
# 3. folding the loop's frames
# =====================================================================================
_OTHER, _ASYNCIO, _RUNNER = 0, 1, 2
_AUTO_NAME = re.compile(r"^Task-\d+$")
_ASYNCIO_FILE = re.compile(r"(^|[/\\])asyncio[/\\]\w+\.py$")
_RUNNER_FILE = re.compile(
    r"(^|[/\\])("
    r"ipykernel[/\\].*|ipykernel_launcher\.py|tornado[/\\].*|zmq[/\\].*|jupyter_client[/\\].*|"
    r"traitlets[/\\]config[/\\]application\.py|IPython[/\\]core[/\\](async_helpers|interactiveshell)\.py|"
    r"nest_asyncio\.py|runpy\.py|<frozen runpy>|selectors\.py"
    r")$"
)
_file_kinds: dict[str, int] = {}


def _file_kind(filename: str) -> int:
    kind = _file_kinds.get(filename)
    if kind is None:
        if _ASYNCIO_FILE.search(filename):
            kind = _ASYNCIO
        elif _RUNNER_FILE.search(filename):
            kind = _RUNNER
        else:
            kind = _OTHER
        if len(_file_kinds) < 100_000:
            _file_kinds[filename] = kind
    return kind


# frame classes for folding
_F_OTHER, _F_LOOP, _F_DRIVER, _F_SELECT, _F_ENTRY, _F_DROP, _F_OWN, _F_ENTRY_BEFORE = range(8)
_STEP_RUNNERS = {"Handle._run", "Task.__step", "Task.__step_run_and_handle_result"}
_LOOP_MODULES = {"base_events", "events", "runners", "selector_events", "unix_events", "proactor_events",
                 "windows_events", "base_subprocess"}
_DRIVERS = {"BaseEventLoop.run_forever", "BaseEventLoop._run_once", "BaseEventLoop.run_until_complete",
            "Runner.run", "run", "Handle._run", "BaseEventLoop._run_forever_setup",
            "Task.__step", "Task.__wakeup", "Task.__step_run_and_handle_result", "Task.__eager_start"}
_THIS_FILE = re.compile(r"(^|[/\\])ddprof_nb[/\\]asyncio_support\.py$")
_LABELING_FILE = re.compile(r"(^|[/\\])ddprof_nb[/\\]labeling\.py$")


def _frame_class(f: Frame) -> int:
    if f.kind is not FrameKind.PYTHON:
        return _F_ENTRY if f == TASK_MARK else _F_OTHER
    fn = f.filename
    if _THIS_FILE.search(fn):
        if f.name in ("_PyTaskCoro.send", "_TaskCoroMethods.throw", "_TaskCoro.send", "_TaskCoro.throw"):
            return _F_ENTRY
        if f.name.startswith("TaskSampler."):
            return _F_OWN
        return _F_DROP
    if _LABELING_FILE.search(fn):
        return _F_DROP
    kind = _file_kind(fn)
    if kind == _ASYNCIO:
        module = re.split(r"[/\\]", fn)[-1][:-3]
        if module in _LOOP_MODULES or (module == "tasks" and f.name in _DRIVERS):
            return _F_DRIVER if f.name in _DRIVERS else _F_LOOP
        return _F_OTHER
    if kind == _RUNNER:
        return _F_SELECT if fn.endswith("selectors.py") else _F_DRIVER
    return _F_OTHER


def _implicit_entries(frames: tuple[Frame, ...], classes: list[int]) -> set[int]:
    """Where a task's coroutine begins with no stepper frame above it: the C stepper
    (``_CTaskCoro``) runs between asyncio's C Task and the coroutine, so its first frame
    sits right under the loop's callback runner (``Handle._run``; ``Task.__step`` for
    asyncio's Python Task) or, for an eager start, under the profiler's create_task
    wrapper."""
    out = set()
    for i in range(1, len(frames)):
        if classes[i] == _F_OTHER:
            above, c = frames[i - 1].name, classes[i - 1]
            if (c == _F_DRIVER and above in _STEP_RUNNERS) or (c == _F_DROP and above == "BaseEventLoop.create_task"):
                out.add(i)
    return out


def _fold(frames: tuple[Frame, ...], classes: list[int], task: str | None, keep_loop: bool,
          task_frames: str) -> tuple[Frame, ...]:
    out: list[Frame] = []
    n = len(frames)
    # implicit entries only when the sample is of a task step (labelled with its task)
    implicit = _implicit_entries(frames, classes) if task is not None else set()
    last_entry = max([i for i, c in enumerate(classes) if c == _F_ENTRY] + list(implicit), default=-1)
    i = 0
    while i < n:
        c = classes[i]
        if i in implicit:
            c = _F_ENTRY_BEFORE
        if c in (_F_LOOP, _F_DRIVER, _F_SELECT) and not keep_loop:
            j = i
            folds = False
            while j < n and classes[j] in (_F_LOOP, _F_DRIVER, _F_SELECT):
                folds = folds or classes[j] != _F_LOOP
                j += 1
            if not folds:  # a loop method called from user code (create_task, call_soon ...)
                out.extend(frames[i:j])
            elif out and out[-1].name.startswith("[task") and j < n:
                pass  # a task's own runner frames (a notebook's dispatch task): drop
            else:
                if not (out and out[-1] == LOOP_FRAME):
                    out.append(LOOP_FRAME)
                if j == n and classes[j - 1] == _F_SELECT:
                    out.append(IDLE_FRAME)
            i = j
            continue
        if c in (_F_ENTRY, _F_ENTRY_BEFORE):
            if task_frames != "none":
                name = task if i == last_entry else None
                if name is None or (task_frames == "named" and (_AUTO_NAME.match(name) or name == OTHER_TASKS)):
                    out.append(Frame("[task]", kind=FrameKind.THREAD))
                else:
                    out.append(Frame(f"[task {name}]", kind=FrameKind.THREAD))
            if c == _F_ENTRY_BEFORE:  # the marker goes before the coroutine's own frame
                out.append(frames[i])
        elif c == _F_OWN:
            out.append(SAMPLER_FRAME)
            break
        elif c != _F_DROP:
            out.append(frames[i])
        i += 1
    # only the profiler's wrapper frames (a chain the wall sampler read while the thread
    # changed it): keep them as they are rather than make an empty stack
    return tuple(out) if out else frames


def fold_loop_frames(profile: Profile, keep_loop: bool = False, task_frames: str = "named") -> Profile:
    """A new Profile whose stacks show asyncio tasks instead of the loop's machinery.

    - Each run of event-loop frames (asyncio's runners, ``run_forever``, ``_run_once``,
      ``Handle._run``, ``Task.__step``, selectors, and the tornado/ipykernel/IPython
      loop runners) becomes one ``[asyncio loop]`` frame, followed by ``[idle]`` when the
      loop was waiting in its selector (``keep_loop=True`` keeps those frames as they are).
    - Each task entry (the Python task proxy's frame, the task sampler's marker, or,
      in a sample labelled with a task, a coroutine's first frame right under the loop's
      callback runner, where the C proxy leaves no frame) gets a ``[task <name>]`` frame
      from the sample's ``task`` label.  ``task_frames``: ``"named"``
      (default) writes names given by the program and a bare ``[task]`` for asyncio's
      automatic ``Task-<n>`` names (unique counters that would split every flame graph
      into slivers; the exact name stays in the ``task`` label); ``"all"`` writes every
      name; ``"none"`` drops task frames.
    - The profiler's own wrapper frames (task proxy, create_task and thread-label
      wrappers) are removed; the task sampler's ticks show as one
      ``[ddprof_nb asyncio sampler]`` frame.

    Values are unchanged: stacks that become equal merge and their values add up.
    Returns ``profile`` itself when no stack holds such frames.
    """
    if task_frames not in ("named", "all", "none"):
        raise ValueError(f"task_frames={task_frames!r}: expected 'named', 'all' or 'none'")
    classes = [_frame_class(f) for f in profile.frames]
    if not any(c != _F_OTHER for c in classes) or not len(profile):
        return profile
    task_of = [ls.get("task") for ls in profile.labelsets]
    nl = max(1, len(profile.labelsets))
    key = profile.stack.astype(np.int64) * nl + profile.labels.astype(np.int64)
    uniq, inverse = np.unique(key, return_inverse=True)
    builder = ProfileBuilder(profile.metadata)
    memo: dict[tuple[int, str | None], int] = {}
    new_ids = np.empty(len(uniq), dtype=np.int32)
    for k, u in enumerate(uniq.tolist()):
        s, lab = divmod(u, nl)
        stack = profile.stacks[s]
        name = task_of[lab]
        m = (s, name)
        sid = memo.get(m)
        if sid is None:
            frames = tuple(profile.frames[i] for i in stack)
            sid = memo[m] = builder.stack_of(
                _fold(frames, [classes[i] for i in stack], name, keep_loop, task_frames))
        new_ids[k] = sid
    thread_map = np.array([builder.thread_id(t.tid, t.name) for t in profile.threads] or [0], dtype=np.int32)
    label_map = np.array([builder.labels_id(ls) for ls in profile.labelsets] or [0], dtype=np.int32)
    cols = aggregate_columns(profile.event, new_ids[inverse], thread_map[profile.thread],
                             label_map[profile.labels], profile.time_ns, profile.values)
    built = builder.build()
    return Profile(built.frames, built.stacks, built.threads, built.labelsets, *cols,
                   profile.metadata, profile.tick_ns)
