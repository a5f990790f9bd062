"""Labels: ``with ddprof_nb.labels(request="x"):`` tags every sample taken inside it (module: ddprof_nb.labeling).

Public API (``__all__``): ``labels(**values)``, a context manager that also decorates a
function (each call runs inside the block), and ``current()``, the LabelSet in force in
the calling context.  Every other name here is the engines' side (interning, published
ids, mirrors, propagation hooks, task bits): the package's own interface, free to change.

Each distinct label set gets a small integer id once (interned); engines read the
current thread's id on their hot path and turn ids back into LabelSets when they build
the profile.

Two places hold "the labels in force", and this module keeps them in step:

- the contextvar ``_current`` (a LabelSet): what code running in a context sees.  asyncio
  tasks copy it when created, so labels flow to child tasks as Go's pprof labels do;
- the per-thread *published* id (``_slots``): what samplers read, because a sampler
  sees threads, not contexts.  ``labels()`` publishes on entry and exit; while
  profiling, the asyncio task stepper (``aio.stepper``) republishes at every step of a
  task (a task's steps share their thread with other tasks), and the propagation below
  publishes in threads started from a labelled context.

Readers: the python engine reads ``thread_label_ids`` (ident -> id); other readers
mirror every change of the calling thread, either as a listener ``fn(id)``
(``add_listener``: a call per change) or, cheaper, through a slot provider
(``add_slot_provider``: ``fn()`` returns a one-item ``'Q'`` memoryview over the calling
thread's native slot, written directly).  The native engine is a slot provider (its words
are never freed, see engines/native/engine.py); views are asked for again after a fork (the
thread has a new tid there).

Propagation to threads (installed on the first ``labels()``; ``install_propagation``).
Minimal monkeypatching, and no behaviour change when no labels are in force (each
wrapper then calls the original with the same arguments):

- ``threading.Thread.start``: a thread started from a labelled context runs its
  ``run()`` under the starter's LabelSet (published in the new thread);
- ``concurrent.futures.ThreadPoolExecutor.submit``: ``fn`` runs under the submitter's
  labels (this covers ``loop.run_in_executor`` and ``asyncio.to_thread``); pool worker
  threads started by a submit do NOT inherit the labels: they outlive the submit.

Task ids.  A published id is 64 bits: the low 32 are a label-set id, the high 32 a
task index (``task_bits``), 0 outside asyncio tasks.  The task scheduler knows a task's
name cheaply but building a LabelSet per task costs microseconds, so the pair is
resolved only when a sample needs it: ``labelset(id)`` returns the label set merged
with ``task=<name>``.  ``labels()`` blocks keep the task bits of the thread's current
id, and threads started or work submitted from a task carry them too.  The names table
grows with the tasks named while profiling (capped per profile by the task stepper) and
is never pruned: an id may be resolved long after its task ended.

Invariants: ids are never reused while the process lives (id 0 = no labels); a thread's
published id is its own business (only code running on that thread changes it, except
``set_thread_label_id`` for tests); slots of finished threads are dropped, so a new
thread that reuses an ident starts unlabelled.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping

from ._steptypes import SLOT_BASE
from .model import EMPTY_LABELS, LabelSet

__all__ = ["labels", "current"]  # the public API (module docstring); the rest serves the engines

_by_id: list[LabelSet] = [EMPTY_LABELS]
_ids: dict[LabelSet, int] = {EMPTY_LABELS: 0}
_lock = threading.Lock()
_current: contextvars.ContextVar[LabelSet] = contextvars.ContextVar("ddprof_nb_labels", default=EMPTY_LABELS)


def label_id(labels: LabelSet) -> int:
    """The stable id of an interned label set (0 = no labels)."""
    found = _ids.get(labels)
    if found is not None:
        return found
    with _lock:
        found = _ids.get(labels)
        if found is None:
            found = _ids[labels] = len(_by_id)
            _by_id.append(labels)
        return found


TASK_SHIFT = 32
LOW_MASK = (1 << TASK_SHIFT) - 1
_task_names: dict[int, str] = {}  # task index -> name
_task_counter = itertools.count(1)  # next() is atomic under the GIL: no lock on this path
_packed: dict[int, LabelSet] = {}  # resolved (label set id | task bits) ids


def task_bits(name: str) -> int:
    """Fresh high bits naming task ``name`` in a published id.  Callers keep them per
    task (or per name, see aio.stepper): every call takes a new index."""
    idx = next(_task_counter)
    _task_names[idx] = name
    return idx << TASK_SHIFT


def labelset(ident: int) -> LabelSet:
    """The label set with id ``ident`` (task bits add ``task=<name>``); unknown ids raise ValueError."""
    if not isinstance(ident, int) or ident < 0:
        raise ValueError(f"unknown label set id {ident!r}")
    if ident <= LOW_MASK:
        if ident >= len(_by_id):
            raise ValueError(f"unknown label set id {ident!r}")
        return _by_id[ident]
    found = _packed.get(ident)
    if found is None:
        low, task = ident & LOW_MASK, ident >> TASK_SHIFT
        name = _task_names.get(task)
        if low >= len(_by_id) or name is None:
            raise ValueError(f"unknown label set id {ident!r}")
        found = _packed[ident] = _by_id[low].plus("task", name)
    return found


def task_name(ident: int) -> str | None:
    """The task name in published id ``ident``'s task bits (None: no task bits, or unknown)."""
    return _task_names.get(ident >> TASK_SHIFT) if ident > LOW_MASK else None


def current() -> LabelSet:
    """Labels in force in the calling context."""
    return _current.get()


# -- per-thread published ids -----------------------------------------------------------
class _Slot(SLOT_BASE or object):
    """One thread's published label id, plus its cached native mirrors (views).  With the
    native module, the C task stepper's SlotBase holds the words a task step reads and
    writes (id, view, batch, tick, left, rate, shorts) as C fields."""

    __slots__ = ("views", "gen") if SLOT_BASE else ("id", "views", "gen", "view", "batch", "tick", "left", "rate",
                                                     "shorts")

    def __init__(self):
        self.id = 0
        # the asyncio task sampler's sampling on this thread's event loop (set only while it
        # samples): when the loop began its current batch of callbacks (its selector
        # returned), when the sampler's last tick ran, and the length sampling of
        # suspensions no tick saw (suspended ns left to the next draw, ns per draw, draws
        # since the last tick)
        self.batch = 0
        self.tick = 0
        self.left = 0
        self.rate = 10_000_000
        self.shorts = 0
        self.views: tuple = ()
        self.gen = -1  # _gen when ``views`` was computed
        # the fast path (hot loops store into it directly): the one view when it is the
        # only mirror, else None (then ``_push`` if ``_mirrored``); reset when mirrors change
        self.view = None


class _Reaper:
    """Kept in the thread's thread-local storage: when the thread ends, that storage is
    freed and the thread's slot is dropped (its ident may be reused by a new thread)."""

    __slots__ = ("ident", "slot", "table")

    def __init__(self, ident: int, slot: _Slot, table: dict):
        self.ident = ident
        self.slot = slot
        self.table = table  # held here: module globals may be gone at interpreter exit

    def __del__(self):
        if self.table.get(self.ident) is self.slot:
            del self.table[self.ident]


_slots: dict[int, _Slot] = {}  # thread ident -> slot; written only by the thread itself
_tls = threading.local()
_get_ident = threading.get_ident

# mirrors of the published id into native slots
_listeners: list[Callable[[int], None]] = []
_listeners_t: tuple = ()
_providers: list[Callable[[], object]] = []
_mirrored = False  # any listener or provider: checked on hot paths before calling _push
_mirrored_watchers: list = []  # the task steppers' states: their ``mirrored`` follows _mirrored
_gen = 0  # bumped when providers change; slots refresh their cached views


def _new_slot(ident: int) -> _Slot:
    """The calling thread's slot, created (call only from the thread ``ident``)."""
    slot = _slots.get(ident)
    if slot is None:
        slot = _slots[ident] = _Slot()
        _tls.reaper = _Reaper(ident, slot, _slots)
    return slot


def _slot_here() -> _Slot:
    ident = _get_ident()
    slot = _slots.get(ident)
    return slot if slot is not None else _new_slot(ident)


def _push(slot: _Slot, ident: int) -> None:
    """Mirror ``ident`` into the calling thread's native slots (listeners, providers)."""
    if slot.gen != _gen:
        views = []
        for provider in tuple(_providers):
            try:
                view = provider()
            except Exception:  # noqa: BLE001 - a provider that cannot serve this thread
                view = None
            if view is not None:
                views.append(view)
        slot.views = tuple(views)
        slot.gen = _gen
        slot.view = views[0] if len(views) == 1 and not _listeners_t else None
    for view in slot.views:
        view[0] = ident
    for listener in _listeners_t:
        listener(ident)


def _set(slot: _Slot, ident: int) -> None:
    slot.id = ident
    view = slot.view
    if view is not None:
        view[0] = ident
    elif _mirrored:
        _push(slot, ident)


def _publish(ident: int) -> None:
    """Publish ``ident`` as the calling thread's label id."""
    _set(_slot_here(), ident)


def set_thread_label_id(ident: int) -> int:
    """Publish ``ident`` for the calling thread; returns the previous id (tests, tools)."""
    slot = _slot_here()
    prev = slot.id
    _set(slot, ident)
    return prev


class _ThreadLabelIds(Mapping):
    """Read-only view: thread ident -> published label id (what the python engine reads)."""

    def __getitem__(self, ident: int) -> int:
        return _slots[ident].id

    def get(self, ident, default=None):
        slot = _slots.get(ident)
        return default if slot is None else slot.id

    def __iter__(self) -> Iterator[int]:
        return iter(list(_slots))

    def __len__(self) -> int:
        return len(_slots)

    def items(self):
        return [(i, s.id) for i, s in list(_slots.items())]

    def __repr__(self) -> str:
        return f"thread_label_ids({dict(self.items())!r})"


thread_label_ids: Mapping[int, int] = _ThreadLabelIds()


def _mirrors_changed() -> None:
    global _listeners_t, _mirrored, _gen
    _listeners_t = tuple(_listeners)
    _mirrored = bool(_listeners or _providers)
    for state in _mirrored_watchers:
        state.mirrored = _mirrored
    _gen += 1
    for slot in list(_slots.values()):  # no fast-path store into a view no longer wanted
        slot.view = None


def watch_mirrored(state) -> None:
    """Keep ``state.mirrored`` equal to whether label mirrors want ``_push`` (the asyncio
    task stepper reads it there, at each step, without a look-up in this module)."""
    _mirrored_watchers.append(state)
    state.mirrored = _mirrored


def add_listener(listener: Callable[[int], None]) -> None:
    """Call ``listener(id)`` on the calling thread whenever that thread's published id changes."""
    _listeners.append(listener)
    _mirrors_changed()


def remove_listener(listener: Callable[[int], None]) -> None:
    if listener in _listeners:
        _listeners.remove(listener)
        _mirrors_changed()


def add_slot_provider(provider: Callable[[], object]) -> None:
    """Register ``provider()``: called once per thread (on that thread), it returns a
    writable one-item view (``view[0] = id``, e.g. ``memoryview(...).cast('Q')``) of the
    thread's native label slot, or None.  Cheaper than a listener on hot paths (asyncio
    task steps publish twice per step): a store, not a call."""
    _providers.append(provider)
    _mirrors_changed()


def remove_slot_provider(provider: Callable[[], object]) -> None:
    if provider in _providers:
        _providers.remove(provider)
        _mirrors_changed()


# -- the public context manager -------------------------------------------------------
@contextmanager
def labels(**values):
    """Tag samples taken inside the block with ``key=value`` labels (nested blocks add up,
    an inner value wins); yields the LabelSet in force inside.

    Tasks created, threads started and pool work submitted inside the block inherit the
    labels.  As a decorator (``@ddprof_nb.labels(stage="parse")``) every call of the
    function runs inside the block.
    """
    if not _propagation:
        install_propagation()
    new = _current.get().merged(values)
    token = _current.set(new)
    slot = _slot_here()
    _set(slot, (slot.id & ~LOW_MASK) | label_id(new))  # the running task's bits stay
    try:
        yield new
    finally:
        _current.reset(token)
        slot = _slot_here()
        _set(slot, (slot.id & ~LOW_MASK) | label_id(_current.get()))


# -- propagation to threads ------------------------------------------------------------
_propagation: dict[str, tuple] = {}  # what is patched: name -> (owner, attribute, original)
_propagation_lock = threading.Lock()


def _run_labelled(ls: LabelSet, bits: int, fn, args, kwargs):
    """Run ``fn(*args, **kwargs)`` on the calling thread under ``ls`` (and the task bits
    ``bits`` of the task that asked for it), then restore."""
    token = _current.set(ls)
    slot = _slot_here()
    prev = slot.id
    _set(slot, bits | label_id(ls))
    try:
        return fn(*args, **kwargs)
    finally:
        _current.reset(token)
        _set(_slot_here(), prev)


def _inherited() -> tuple[LabelSet, int]:
    """What a thread started (or work submitted) here inherits: labels and task bits."""
    slot = _slots.get(_get_ident())
    return _current.get(), (slot.id & ~LOW_MASK) if slot is not None else 0


_start_hooks: list = []  # called with each thread once it runs (its native id is known then)


def add_start_hook(hook) -> None:
    """Call ``hook(thread)`` after every ``Thread.start`` (with the propagation patch
    installed), e.g. to learn a short thread's name while it lives (idempotent)."""
    if hook not in _start_hooks:
        _start_hooks.append(hook)


def _patched_start(original):
    def start(self):
        started(self)
        for hook in _start_hooks:
            hook(self)

    def started(self):
        ls, bits = _inherited()
        if (ls is not EMPTY_LABELS or bits) and not getattr(_tls, "pool", False):
            own = self.__dict__.get("run")  # an instance-level run (rare) is restored after
            run = self.run

            def run_with_labels():
                try:
                    return _run_labelled(ls, bits, run, (), {})
                finally:  # drop the closure (and the LabelSet) with the thread
                    if own is None:
                        self.__dict__.pop("run", None)
                    else:
                        self.__dict__["run"] = own

            self.run = run_with_labels
            try:
                return original(self)
            except BaseException:  # not started (started twice, no memory...): undo
                if own is None:
                    self.__dict__.pop("run", None)
                else:
                    self.__dict__["run"] = own
                raise
        return original(self)

    start.__wrapped__ = original
    start.__doc__ = original.__doc__
    start.__name__ = "start"
    start.__qualname__ = "Thread.start"
    return start


def _patched_submit(original):
    def submit(self, fn, /, *args, **kwargs):
        ls, bits = _inherited()
        if ls is EMPTY_LABELS and not bits:
            return original(self, fn, *args, **kwargs)
        # worker threads this submit may start serve later submits too: they must not
        # inherit the labels through Thread.start
        _tls.pool = True
        try:
            return original(self, _run_labelled, ls, bits, fn, args, kwargs)
        finally:
            _tls.pool = False

    submit.__wrapped__ = original
    submit.__doc__ = original.__doc__
    submit.__name__ = "submit"
    submit.__qualname__ = "ThreadPoolExecutor.submit"
    return submit


def install_propagation() -> None:
    """Patch ``threading.Thread.start`` and ``ThreadPoolExecutor.submit`` so threads
    started, and pool work submitted, from a labelled context run under its labels
    (idempotent; see the module docstring)."""
    if _propagation:
        return
    import concurrent.futures.thread as cft

    with _propagation_lock:
        if _propagation:
            return
        patches = {
            "Thread.start": (threading.Thread, "start", _patched_start),
            "ThreadPoolExecutor.submit": (cft.ThreadPoolExecutor, "submit", _patched_submit),
        }
        for name, (owner, attr, make) in patches.items():
            original = owner.__dict__[attr]
            setattr(owner, attr, make(original))
            _propagation[name] = (owner, attr, original)


def uninstall_propagation() -> None:
    """Undo ``install_propagation`` (tests); a patch someone else replaced since is left alone."""
    with _propagation_lock:
        for owner, attr, original in _propagation.values():
            if getattr(owner.__dict__.get(attr), "__wrapped__", None) is original:
                setattr(owner, attr, original)
        _propagation.clear()


def propagation_installed() -> bool:
    return bool(_propagation)


def _after_fork_child() -> None:
    """A lock held by another thread (e.g. the drain thread) at fork stays held in the
    child; the surviving thread has a new native tid, so its cached views are stale."""
    global _lock, _propagation_lock
    _lock = threading.Lock()
    _propagation_lock = threading.Lock()
    _mirrors_changed()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_child)
