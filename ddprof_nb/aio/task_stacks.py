"""Asyncio, for job 2 (samples of suspended tasks): the stacks the task sampler draws
(``TaskStacks``).  A suspended task's stack is the loop thread's own stack down to the
loop's dispatch (``prefix``), a ``[task]`` marker, the task's await chain and, when it is
parked, a BLOCKER pseudo-frame naming what it awaits; frames, blockers and whole chains
are interned once per session, since a tick describes the same few await sites again and
again.  Everything here runs on the loop's thread, under the task sampler's lock.
"""

from __future__ import annotations

import asyncio
import sys
import threading

from ..events import FrameKind
from ..model import Frame, ProfileBuilder
from . import stepper as _stepper
from .chains import _api_name, _await_chain, _describe_waiter
from .fold import _ASYNCIO, _OTHER, TASK_MARK, _file_kind
from .loops import _LoopState


class TaskStacks:
    """Frame, blocker and stack ids of one session's builder (``builder``): stacks deeper
    than ``max_depth`` keep their leaf end under a ``[truncated]`` frame."""

    def __init__(self, builder: ProfileBuilder, max_depth: int):
        self.builder = builder
        self.max_depth = max_depth
        self.mark = builder.frame_id(TASK_MARK)
        self.truncated = builder.frame_id(Frame("[truncated]", kind=FrameKind.TRUNCATED))
        self._frame_cache: dict = {}  # (id(code), lasti) -> (code, frame id)
        self._blockers: dict[str, int] = {}

    def prefix(self) -> list[int]:
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
        ids = [self.frame_id(fr) for fr in chain[found:]]
        ids.reverse()
        return ids

    def frame_id(self, frame) -> int:
        code = frame.f_code
        key = (id(code), frame.f_lasti)
        hit = self._frame_cache.get(key)
        if hit is None:
            line = frame.f_lineno or code.co_firstlineno
            hit = self._frame_cache[key] = (
                code, self.builder.frame_id(Frame(code.co_qualname, code.co_filename, line, code.co_firstlineno)))
        return hit[1]

    def thread(self, st: _LoopState) -> int:
        """The loop thread's "(asyncio tasks)" thread id (on the loop's thread)."""
        if st.thread < 0:
            st.thread = self.builder.thread_id(threading.get_native_id(),
                                                f"{threading.current_thread().name} (asyncio tasks)")
        return st.thread

    def stack_of(self, coro, waiter, variant: int, st: _LoopState, both: list | None = None) -> int:
        """The stack of a suspended task (``coro``: its coroutine or our proxy) for
        ``variant``: its await chain, ready (0) or parked (1, ending in a BLOCKER naming
        what it awaits); or (2) its coroutine's entry, where it waited to start.
        Cached per await chain (code and instruction of each frame, and what is
        awaited): tasks suspended at the same place share one entry.  ``both``: a
        task's stacks list, to fill with the ready and parked ones (one walk)."""
        inner = coro._coro if type(coro) is _stepper._TaskCoro else coro
        if variant == 2:
            code = getattr(inner, "cr_code", None)
            key = ("start", id(code))
            sid = st.chains.get(key)
            if sid is None:
                if code is None or _file_kind(code.co_filename) != _OTHER:
                    sid = -1
                else:
                    fid = self.builder.frame_id(Frame(code.co_qualname, code.co_filename, code.co_firstlineno,
                                                       code.co_firstlineno))
                    sid = self.builder.stack_id(st.prefix + [self.mark, fid])
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
                sid = st.chains[key] = self.stack_for(frames, waiter, parked, st)
            if both is not None:
                both[parked] = sid
        return sid

    def stack_for(self, frames: list, waiter, parked: bool, st: _LoopState) -> int:
        """The stack id of a suspended task whose await chain is ``frames`` (outermost
        first): the loop's prefix, the task marker, the chain and, when parked, a
        BLOCKER naming what it awaits; -1 when no frame is user code (neither asyncio
        nor notebook machinery: such tasks are not sampled)."""
        ids: list[int] = []
        tail: list = []  # trailing asyncio-internal codes, outermost first
        user = False
        for frame in frames:
            code = frame.f_code
            ids.append(self.frame_id(frame))
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
                fid = self._blockers[blocker] = self.builder.frame_id(Frame(f"[{blocker}]", kind=FrameKind.BLOCKER))
            ids.append(fid)
        full = st.prefix + [self.mark] + ids
        if len(full) > self.max_depth:
            full = [self.truncated] + full[len(full) - self.max_depth + 1:]
        return self.builder.stack_id(full)
