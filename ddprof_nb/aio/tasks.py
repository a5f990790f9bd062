"""Asyncio job 2: samples of suspended tasks (``TaskSampler``).

**Wall and park of suspended tasks** (``TaskSampler``).  A callback on each running
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
selector is hooked for that; see ``_stepper._TaskCoro``).  A suspension that begins and ends
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

Apart: the stacks drawn (``task_stacks``), what is kept per loop and per task (``loops``),
what a task awaits (``chains``), the names a session gave (``task_names``), the ticks' cost
and errors (``tick_stats``).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import random
import threading
import time
import weakref
from typing import Iterable

import numpy as np

from .. import labeling as _lab
from .. import sources as _sources
from ..errors import NotRunningError, ProfilerBusyError
from ..events import EventType
from ..labeling import TASK_SHIFT as _TASK_SHIFT
from ..labeling import _current, label_id
from ..model import EMPTY_LABELS, Metadata, Profile, ProfileBuilder
from . import stepper as _stepper
from . import task_names
from .fold import OTHER_TASKS
from .loops import (_UNSET, _deref, _foreign_pending, _hook_selector, _LoopState, _multiplicities, _pending,
                    _registry_refs, _task_registries, _TaskState, _Tracker, _unhook_selector)
from .stepper import _install_create_task, _state, _uninstall_create_task
from .task_stacks import TaskStacks
from .tick_stats import TickStats

RESCAN_NS = 1_000_000_000  # how often pre-existing (unwrapped) tasks are looked up again
TICK_COST_RATIO = 200  # the task sampler's next tick comes at least 200x a tick's cost later...
MAX_TICK_PERIODS = 4  # ... and at most 4 intervals later
SHORTS_PER_TICK = 4  # suspensions no tick saw: about this many drawn between two ticks

_monotonic_ns = time.monotonic_ns
_current_task = asyncio.current_task
_weakref = weakref.ref
_tracker_pid = 0  # the process the tracker runs in (a fork child inherits it, not the sampler)


def engine_events(events: Iterable[EventType], engine_supported: Iterable[EventType] = ()) -> tuple[EventType, ...]:
    """The events an engine must sample when a TaskSampler runs beside it: PARK is
    dropped unless the engine samples it itself (``engine_supported``)."""
    return _sources.engine_events(events, TaskSampler.provides, engine_supported)


def engine_config(config, engine_supported: Iterable[EventType] = ()):
    """The SamplerConfig for the engine that runs beside a TaskSampler
    (``sources.engine_config``)."""
    return _sources.engine_config(config, TaskSampler.provides, engine_supported)


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
        self._stacks: TaskStacks | None = None
        self._rows: list = []  # (stack, thread, published id, parked, rel time, count, weight)
        self._stats = TickStats()
        self._empty_ctx = contextvars.Context()
        self._registries = _task_registries()
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
        self._stacks = TaskStacks(b, self.max_depth)
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
        return task_names.forget(first, loops)

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
            self._stats.error(exc)
        took = _monotonic_ns() - t0
        # a smoothed cost, one-off work excluded (the loop's stack, looked up once a second)
        st.cost = (3 * st.cost + max(0, took - st.prefix_ns)) // 4
        st.prefix_ns = 0
        self._stats.tick(took, time.thread_time_ns() - c0)

    def _sample_loop(self, st: _LoopState, now: int) -> None:
        """One tick: account the tasks the previous tick described (all of them, or a
        uniform draw of them, scaled) and the tasks created since, then describe the
        tasks the next tick will account: all of them while they are few, else a draw.
        A task is accounted from its step timing between two of its descriptions, at
        the stacks it had then and has now, as a thread's CPU clock between two of its
        samples; a draw made at the previous tick stands for every task pending then."""
        loop = st.loop
        self._stacks.thread(st)
        prev_tick = st.last_tick or self._start_mono
        st.last_tick = now
        self._pace_short_draws(now)
        self._watch_loop(st, now)
        described, created = st.reg[:st.mark], st.reg[st.mark:]  # registered before / since the previous tick
        self._compact(st)
        reg, others = st.reg, st.others
        n = len(reg) + len(others)
        running = _current_task(loop) if asyncio._get_running_loop() is loop else None
        draws = max(4, min(self.max_tasks, self.budget_ns // max(1, 2 * st.draw_ns)))
        account = self._to_account(st, described + others, created, n, draws)
        acc: dict = {}
        t_visits = _monotonic_ns()
        seen = self._account(st, account, running, now, prev_tick, acc)
        st.states = self._describe_next(st, n, draws, running, seen, now, prev_tick, t_visits)
        st.mark = len(st.reg)
        rel = now - self._start_mono
        for (stack, lid, parked), (count, weight) in acc.items():
            if weight > 0:
                self._rows.append((stack, st.thread, lid, parked, rel, count, weight))

    def _pace_short_draws(self, now: int) -> None:
        """Suspensions that begin from now on and end before the next tick are drawn at
        their end: about SHORTS_PER_TICK a tick (each describes an await chain)."""
        slot = _lab._slot_here()
        slot.tick = now
        if slot.shorts > SHORTS_PER_TICK:
            slot.rate *= 2
        elif slot.shorts < SHORTS_PER_TICK // 2 and slot.rate > self.interval_ns:
            slot.rate = max(self.interval_ns, slot.rate // 2)
        slot.shorts = 0

    def _watch_loop(self, st: _LoopState, now: int) -> None:
        """The loop's selector hook (when a batch of callbacks begins), and its tasks not
        created through create_task, looked up again now and then."""
        if st.hook is None:
            _hook_selector(st)
        if st.hook and st.hook[2].batch < now:
            # a task resumed later in this batch was charged park until now by this tick
            st.hook[2].batch = now
        if now >= st.others_at:
            # tasks not created through create_task while profiling (asyncio.Task(...),
            # loops of other classes) are looked up now and then: O(all tasks), so at most
            # every second and at most ~0.5% of the time
            st.others = [w for w in (_foreign_pending(r, st.loop) for r in _registry_refs(self._registries))
                         if w is not None]
            st.others_at = now + max(RESCAN_NS, 200 * (_monotonic_ns() - now))

    def _compact(self, st: _LoopState) -> None:
        """Drop the loop's done tasks from its registered list: amortized O(1) per task created."""
        if len(st.reg) > st.compact_at:
            st.reg = [r for r in st.reg if (t := r()) is not None and not t.done()]
            st.compact_at = max(256, 2 * len(st.reg))
            if self._tracker is not None and self._tracker.registered is not None:
                self._tracker.registered[st.loop] = st.reg

    def _to_account(self, st: _LoopState, described: list, created: list, n: int, draws: int) -> list:
        """What this tick accounts: (task reference, scale numerator, scale denominator)."""
        if st.panel is None:  # the previous tick described every task
            account = [(ref, 1, 1) for ref in described]
        else:
            account = [(ref, st.panel_n * k, len(st.panel)) for ref, k in _multiplicities(st.panel)]
        if len(created) <= draws or n <= self.max_tasks:
            account += [(ref, 1, 1) for ref in created]
        else:  # many new tasks: a draw of them (with replacement), for their time since creation
            rand = self._rng.random
            picks = [created[int(rand() * len(created))] for _ in range(draws)]
            account += [(ref, len(created) * k, draws) for ref, k in _multiplicities(picks)]
        return account

    def _account(self, st: _LoopState, account: list, running, now: int, prev_tick: int, acc: dict) -> dict:
        """Account each task of ``account`` into ``acc``; returns the pending ones' states."""
        loop, states, seen = st.loop, st.states, {}
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
        return seen

    def _describe_next(self, st: _LoopState, n: int, draws: int, running, seen: dict, now: int, prev_tick: int,
                       t_visits: int) -> dict:
        """Describe what the next tick accounts: every pending task while they are few, else
        a uniform draw (with replacement: cheap, unbiased once scaled).  Returns their states."""
        loop, states, reg, others = st.loop, st.states, st.reg, st.others
        if n <= self.max_tasks:
            st.panel = None
            for ref in reg + others:
                task = _pending(ref, loop, running)
                if task is not None and task not in seen:
                    seen[task] = self._visit(task, states.get(task), st, now, prev_tick, None, 0, 1)
            return seen
        self._stats.subsampled += 1
        nreg = len(reg)
        rand = self._rng.random
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
        return keep

    def _visit(self, task, s: "_TaskState | None", st: _LoopState, now: int, prev_tick: int, acc: dict | None,
               num: int, den: int) -> "_TaskState":
        """Describe ``task`` now (its step timing, and its stacks if it awaits something
        new) and, given ``acc``, account its time since its previous description, times
        num/den, into ``acc``.  Returns its state."""
        floor = self._start_mono
        coro = task.get_coro()
        proxy = coro if type(coro) is _stepper._TaskCoro else None
        if s is None:  # (a task not ours, first seen while accounting: the tick's period)
            s = _TaskState(0 if proxy is not None else (max(prev_tick, floor) if acc is not None else now))
        waiter = task._fut_waiter
        # a task that has not resumed still waits on the same future: same stacks
        if waiter is None or waiter is not s.key:
            if st.prefix is None or now - st.prefix_at > RESCAN_NS:
                p0 = _monotonic_ns()
                st.prefix, st.prefix_at = self._stacks.prefix(), now
                st.chains = {}
                st.prefix_ns = _monotonic_ns() - p0
            s.key = waiter
            before, s.stacks = s.stacks, [_UNSET, _UNSET, _UNSET]
            s.lid = -1
            if proxy is not None and proxy._w >= 0 and not proxy._end:
                # both, while the chain is there: the next tick may charge this
                # suspension's rest (its park, its wait to run) after it resumed
                self._stacks.stack_of(proxy, waiter, 1, st, s.stacks)
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

    def _short(self, proxy: _stepper._TaskCoro, batch: int, e: int, resumed: int, weight: int) -> None:
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
                    st.prefix, st.prefix_at, st.chains = self._stacks.prefix(), resumed, {}
                thread, rel = self._stacks.thread(st), resumed - self._start_mono
                stacks = [_UNSET, _UNSET, _UNSET]
                self._stacks.stack_of(proxy, None, 1, st, stacks)  # (one walk for both)
                for parked, w in ((True, park_w), (False, ready_w)):
                    if w > 0 and stacks[parked] >= 0:
                        self._rows.append((stacks[parked], thread, proxy._lid, parked, rel, 1, w))
        except Exception as exc:  # noqa: BLE001 - never raise into the user's task
            self._stats.error(exc)

    def _sid(self, s: _TaskState, coro, waiter, variant: int, st: _LoopState) -> int:
        """The task's stack for ``variant`` (0 ready, 1 parked, 2 not started), computed
        once per suspension."""
        sid = s.stacks[variant]
        if sid == _UNSET:
            sid = s.stacks[variant] = self._stacks.stack_of(coro, waiter, variant, st)
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

    def _lid_of(self, task, coro) -> int:
        """The task's published id (for our proxies, the one its steps publish)."""
        tracker = self._tracker
        if type(coro) is _stepper._TaskCoro and coro._lid >= 0:
            # renamed since its first step? (set_name; an eager task named afterwards)
            return tracker.renamed(coro, task) if tracker is not None else coro._lid
        # not started, or not ours: its context's labels and its name
        ctx = task.get_context() if hasattr(task, "get_context") else None
        base = ctx.get(_current, EMPTY_LABELS) if ctx is not None else EMPTY_LABELS
        name = task.get_name()
        bits = tracker.task_bits(name) if tracker is not None else _lab.task_bits(name)
        return bits | label_id(base)

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
            if parked and self.want_park:
                b.add(EventType.PARK, stack, thread, lab, rel, count, weight)
        secs = max((end - self._start_mono) / 1e9, 1e-9)
        stats = self._stats
        notes = (stats.notes(len(tracker.loops), secs, self.want_park, self.max_tasks, self.budget_ns)
                 if self.sampling else [])
        if tracker.names_capped:
            notes.append(f"asyncio: more than {_stepper.MAX_TASK_NAMES} task names: {tracker.names_capped} task(s) "
                         f"labelled task={OTHER_TASKS}")
        notes += stats.error_notes()
        b.metadata = b.metadata.replace(notes=tuple(notes), extra={"asyncio_ticks": str(stats.ticks)})
        return b.build(end_ns=b.metadata.start_ns + (end - self._start_mono))


def _copy_into(profile: Profile, sink: ProfileBuilder) -> None:
    """Add ``profile``'s samples to ``sink`` (times re-based on the sink's start)."""
    shift = profile.metadata.start_ns - sink.metadata.start_ns if sink.metadata.start_ns else 0
    stack_map = sink.stacks_of(profile)
    thread_map = [sink.thread_id(t.tid, t.name) for t in profile.threads]
    label_map = [sink.labels_id(ls) for ls in profile.labelsets]
    if len(profile):
        sink.add_many(profile.event, [stack_map[i] for i in profile.stack.tolist()],
                      [thread_map[i] for i in profile.thread.tolist()],
                      [label_map[i] for i in profile.labels.tolist()],
                      np.maximum(profile.time_ns + shift, 0), profile.values)
    if profile.metadata.notes:
        sink.metadata = sink.metadata.replace(notes=tuple(sink.metadata.notes) + tuple(profile.metadata.notes))
