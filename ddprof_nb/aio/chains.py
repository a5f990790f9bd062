"""Asyncio, for job 2 (samples of suspended tasks): what a suspended task awaits, read from its
await chain (coroutines, generators, async generators) and the future it waits on.
"""

from __future__ import annotations

import asyncio
import re
import types

from . import stepper as _stepper
from .fold import _AUTO_NAME

MAX_CHAIN = 256  # await-chain links followed per task

_CoroutineType = types.CoroutineType
_GeneratorType = types.GeneratorType
_AsyncGenType = types.AsyncGeneratorType


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
        elif t is _stepper._TaskCoro:
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
