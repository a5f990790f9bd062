"""Labels: ``with ddprof_nb.labels(request="x"):`` tags every sample taken inside it (module: ddprof_nb.labeling).

Each distinct label set gets a small integer id once (interned); engines read the
current thread's id on their hot path (the native handler from a per-thread slot,
O(1)) and turn ids back into LabelSets when they build the profile.  The current set
lives in a contextvar, so asyncio tasks and contexts inherit it as Go's pprof labels
are inherited.
"""

from __future__ import annotations

import contextvars
import threading
from contextlib import contextmanager
from typing import Callable

from .model import EMPTY_LABELS, LabelSet

_by_id: list[LabelSet] = [EMPTY_LABELS]
_ids: dict[LabelSet, int] = {EMPTY_LABELS: 0}
_lock = threading.Lock()
_current: contextvars.ContextVar[LabelSet] = contextvars.ContextVar("ddprof_nb_labels", default=EMPTY_LABELS)

# thread ident -> label id of what that thread runs now (read by the Python engine)
thread_label_ids: dict[int, int] = {}
# engines that need to hear of label changes on the calling thread (the native one)
_listeners: list[Callable[[int], None]] = []


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


def labelset(ident: int) -> LabelSet:
    """The label set with id ``ident``; unknown ids raise ValueError."""
    if not isinstance(ident, int) or not 0 <= ident < len(_by_id):
        raise ValueError(f"unknown label set id {ident!r}")
    return _by_id[ident]


def current() -> LabelSet:
    """Labels in force in the calling context."""
    return _current.get()


def _publish(ident: int) -> None:
    thread_label_ids[threading.get_ident()] = ident
    for listener in tuple(_listeners):
        listener(ident)


def add_listener(listener: Callable[[int], None]) -> None:
    _listeners.append(listener)


def remove_listener(listener: Callable[[int], None]) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


@contextmanager
def labels(**values):
    """Tag samples taken inside the block with ``key=value`` labels (nested blocks add up)."""
    new = _current.get().merged(values)
    token = _current.set(new)
    _publish(label_id(new))
    try:
        yield new
    finally:
        _current.reset(token)
        _publish(label_id(_current.get()))
