"""Lock-contention and park records: the final event and the leaf pseudo-frame, from the stack.

The native wait hooks (native/waits.c) record every blocking wait of a Python thread with
the waiting thread's own stack, a provisional event and the libc call in ``aux``
(``DDP_WAIT_*``).  Whether a semaphore wait is lock contention or a thread parked on a
condition is a question about the *Python* stack, answered here at drain time:

* a sem wait under ``threading.Condition.wait`` (Event.wait, Queue.get/put, Barrier.wait,
  Future.result, concurrent.futures.wait, Thread.start) -> PARK, blocker named after the
  outermost library call (``[Event.wait]``, ``[Queue.get]``...);
* ``Thread.join`` -> PARK ``[join]`` (3.11/3.12 wait in ``_wait_for_tstate_lock``, 3.13 in the
  C thread handle: both have ``Thread.join`` on the stack);
* a sem wait in ``Semaphore.acquire``, ``Condition.__enter__``/``_acquire_restore``, the Python
  ``_RLock``, or a direct C ``Lock``/``RLock`` acquire (``with lock:``, ``lock.acquire()``)
  -> LOCK, the leaf naming the lock's type and the expression at the call site
  (``[Lock self._lock]``), read from the source line (linecache) of the frame that acquired it;
* the GIL wait (libpython's pthread_cond_(timed)wait) -> LOCK ``[GIL]``;
* clock_nanosleep/nanosleep -> PARK ``[sleep]``; select/poll/epoll -> PARK ``[select]``;
  recv*/accept* and _socket's timeout poll -> PARK ``[socket.recv]`` (the method when the call
  site names it).

What cannot be known: a C ``Lock`` and a C ``RLock`` look the same to the hook (both show as
``Lock``); where a lock was created is unknown (the hook sees waits, not constructors, so
locks created before profiling are covered but have no creation site); the value of the
expression at the call site (two locks behind one name are merged).
Results are cached per (stack, call), so the cost is per unique stack, not per record.
"""

from __future__ import annotations

import linecache
import re
from itertools import islice

from ...events import EventType, FrameKind
from ...model import Frame

__all__ = ["WaitClassifier", "WAIT_KINDS"]

# DDP_WAIT_* (native/ddprof.h); checked against the native module in tests.
WAIT_KINDS = {
    1: "sem_wait", 2: "sem_timedwait", 3: "sem_clockwait", 4: "clock_nanosleep", 5: "nanosleep",
    6: "select", 7: "pselect", 8: "poll", 9: "ppoll", 10: "epoll_wait", 11: "epoll_pwait",
    12: "recv", 13: "recvfrom", 14: "recvmsg", 15: "accept", 16: "accept4",
    17: "pthread_cond_wait", 18: "pthread_cond_timedwait", 19: "socket poll",
}
KIND_MASK = 255
_SEM = {1, 2, 3}
_SLEEP = {4, 5}
_SELECT = {6, 7, 8, 9, 10, 11}
_SOCKET = {12, 13, 14, 15, 16, 19}
_GIL = {17, 18}

_LIB_SUFFIXES = ("/threading.py", "/queue.py", "/concurrent/futures/_base.py")

# outermost library function -> blocker name (PARK)
_PARK_NAMES = {
    "Event.wait": "Event.wait",
    "Condition.wait": "Condition.wait",
    "Condition.wait_for": "Condition.wait",
    "Barrier.wait": "Barrier.wait",
    "Thread.join": "join",
    "Thread._wait_for_tstate_lock": "join",
    "Thread.start": "Thread.start",
    "Queue.get": "Queue.get",
    "Queue.put": "Queue.put",
    "Queue.join": "Queue.join",
    "Future.result": "Future.result",
    "Future.exception": "Future.result",
    "wait": "concurrent.futures.wait",
    "as_completed": "concurrent.futures.as_completed",
    "Timer.run": "Timer",
}
# leaf library functions whose sem wait is a lock acquire, and the lock type they mean
_LOCK_LEAVES = {
    "Condition.__enter__": "Condition",
    "Condition._acquire_restore": "Condition",
    "_RLock.acquire": "RLock",
    "_RLock.__enter__": "RLock",
    "_RLock._acquire_restore": "RLock",
}
_LOCK_OUTER = {"Semaphore.acquire": "Semaphore", "Semaphore.__enter__": "Semaphore",
               "BoundedSemaphore.acquire": "Semaphore"}

_WITH = re.compile(r"^\s*(?:async\s+)?with\s+([^:]+?)\s*(?:\bas\b[^:]*)?:")
_ACQUIRE = re.compile(r"([A-Za-z_][\w.\[\]'\"()]*?)\.acquire\s*\(")
_SOCK_METHOD = re.compile(r"\.(recv_into|recvfrom_into|recvfrom|recvmsg|recv|accept|connect|sendall|sendto|send|read|readline|makefile)\s*\(")
_JOIN = re.compile(r"([A-Za-z_][\w.\[\]'\"]*)\.join\s*\(")
_GET_PUT = re.compile(r"\.(get|put|get_nowait|join)\s*\(")


def _is_lib(f: Frame) -> bool:
    return f.kind is FrameKind.PYTHON and f.filename.endswith(_LIB_SUFFIXES)


def _line(f: Frame) -> str:
    if not f.filename or f.line <= 0:
        return ""
    try:
        return linecache.getline(f.filename, f.line)
    except Exception:  # noqa: BLE001 - unreadable source: no name
        return ""


def _lock_expr(f: Frame | None) -> str:
    """The lock expression acquired at this frame's line: ``with X:`` or ``X.acquire(``."""
    if f is None:
        return ""
    text = _line(f)
    m = _ACQUIRE.search(text)
    if m:
        return m.group(1)
    m = _WITH.match(text)
    if m:
        first = m.group(1).split(",")[0].strip()
        return first[:60]
    return ""


class WaitClassifier:
    """Turns provisional LOCK/PARK records into final (event id, stack id) pairs.

    Invariants: the returned event is an EventType id from the table (never a cast), the
    returned stack is the record's stack plus one leaf pseudo-frame (LOCK or BLOCKER kind);
    ``None`` as the event means the final event was not requested (the record is dropped).
    """

    def __init__(self, builder, wanted=(EventType.LOCK, EventType.PARK)):
        self.builder = builder
        self.wanted = {EventType.parse(e) for e in wanted}
        self._cache: dict[tuple[int, int], tuple[int | None, int]] = {}
        self._stack_keys: list[tuple[int, ...]] = []
        self._frame_keys: list[Frame] = []
        self.unwanted = 0

    def _frames_of(self, sid: int) -> list[Frame]:
        b = self.builder
        if sid >= len(self._stack_keys):
            self._stack_keys.extend(islice(b._stacks, len(self._stack_keys), None))
        ids = self._stack_keys[sid]
        if ids and max(ids) >= len(self._frame_keys):
            self._frame_keys.extend(islice(b._frames, len(self._frame_keys), None))
        return [self._frame_keys[i] for i in ids]

    def classify(self, aux: int, sid: int) -> tuple[int | None, int]:
        kind = int(aux) & KIND_MASK
        key = (sid, kind)
        hit = self._cache.get(key)
        if hit is None:
            frames = self._frames_of(sid)  # root first
            event, name, fkind = self._decide(kind, frames)
            leaf = self.builder.frame_id(Frame(f"[{name}]", kind=fkind))
            ev = event if event in self.wanted else None
            hit = self._cache[key] = (ev.value if ev is not None else None,
                                      self.builder.stack_id(list(self._stack_keys[sid]) + [leaf]))
        if hit[0] is None:
            self.unwanted += 1
        return hit

    # -- the rules ------------------------------------------------------------------------
    @staticmethod
    def _decide(kind: int, frames: list[Frame]) -> tuple[EventType, str, FrameKind]:
        park, lock = EventType.parse("park"), EventType.parse("lock")
        if kind in _GIL:
            return lock, "GIL", FrameKind.LOCK
        if kind in _SLEEP:
            return park, "sleep", FrameKind.BLOCKER
        py = [f for f in frames if f.kind is FrameKind.PYTHON]
        if kind in _SELECT:
            # _socket's timeout wait is a poll(): where _socket and select live in one object
            # (both built into the executable, as in Debian's 3.14/3.15) the hook sees the same
            # GOT slot for both, so the call site decides (a socket method there: socket)
            if kind == 8 and py:
                m = _SOCK_METHOD.search(_line(py[-1]))
                if m and "poll" not in _line(py[-1]) and "select" not in _line(py[-1]):
                    return park, f"socket.{m.group(1)}", FrameKind.BLOCKER
            return park, "select", FrameKind.BLOCKER
        if kind in _SOCKET:
            method = "recv" if kind in (12, 13, 14) else "accept" if kind in (15, 16) else ""
            if py:
                m = _SOCK_METHOD.search(_line(py[-1]))
                if m:
                    method = m.group(1)
            return park, f"socket.{method}" if method else "socket", FrameKind.BLOCKER
        if kind not in _SEM:
            return park, WAIT_KINDS.get(kind, f"wait {kind}"), FrameKind.BLOCKER
        # a semaphore wait: lock or park, from the Python stack
        if not py:
            return lock, "Lock", FrameKind.LOCK
        leaf = py[-1]
        i = len(py) - 1
        while i >= 0 and _is_lib(py[i]):
            i -= 1
        lib = py[i + 1:]             # contiguous library frames at the leaf (root first)
        caller = py[i] if i >= 0 else None  # the frame that called into the library
        if not lib:
            # a C lock acquired from this frame; a C SimpleQueue.get waits the same way
            text = _line(leaf)
            if _GET_PUT.search(text) and not _ACQUIRE.search(text) and not _WITH.match(text):
                return park, "SimpleQueue.get", FrameKind.BLOCKER
            expr = _lock_expr(leaf)
            return lock, f"Lock {expr}" if expr else "Lock", FrameKind.LOCK
        outer = lib[0].name
        if outer in _LOCK_OUTER:
            expr = _lock_expr(caller) or ""
            return lock, f"{_LOCK_OUTER[outer]} {expr}".strip(), FrameKind.LOCK
        if leaf.name in _LOCK_LEAVES or (leaf.name == "Condition.wait" and "_acquire_restore" in _line(leaf)):
            ltype = _LOCK_LEAVES.get(leaf.name, "Condition")
            if len(lib) == 1:
                expr = _lock_expr(caller)
                return lock, f"{ltype} {expr}".strip(), FrameKind.LOCK
            return lock, f"{ltype} in {outer}", FrameKind.LOCK
        name = _PARK_NAMES.get(outer)
        if name is None:
            name = outer
        if name == "join" and caller is not None:
            m = _JOIN.search(_line(caller))
            if m:
                name = f"join {m.group(1)}"
        return park, name, FrameKind.BLOCKER
