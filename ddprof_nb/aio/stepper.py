"""Asyncio job 1: labels follow the running task (the task steppers and the create_task patch).

**Labels follow the running task.**  While profiling, ``BaseEventLoop.create_task``
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

The state both steppers read at each step (``_state``: the task sampler's tracker, whether
steps are timed, label mirrors) is one object, built here from the helpers it calls back
and handed to the C stepper once (``StepBase._bind``).
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import collections.abc
import threading
import time
import types
import weakref

from .. import labeling as _lab
from .._steptypes import STEP_BASE as _STEP_BASE
from .._steptypes import STEP_STATE as _STEP_STATE
from ..labeling import TASK_SHIFT as _TASK_SHIFT
from ..labeling import _current, _push, _slots, _new_slot, _task_counter, _task_names, label_id
from ..model import EMPTY_LABELS

MAX_TASK_NAMES = 10_000  # task names per profile (automatic and given, each); later ones: task=[other]

_CoroutineType = types.CoroutineType
_get_ident = threading.get_ident
_monotonic_ns = time.monotonic_ns
_current_task = asyncio.current_task
_weakref = weakref.ref
# _state (below, after the helpers it names): what both task steppers read at each step,
# the tracker (set while a TaskSampler runs) and whether steps are timed among it


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
