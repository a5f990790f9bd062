"""Sampler: picks an engine, runs it beside the session's sources (``ddprof_nb.sources``:
asyncio tasks, child processes, Dask workers, found in the sources' registry), and hands
back a Profile rooted at the caller.

One sampler runs per process at a time (a second start raises ProfilerBusyError).
``profile()`` is the context manager behind the public API; the magics and the CLI
use ``Sampler`` directly.  What ``stop()`` does to the samples is the list of
``pipeline`` steps its caller picks.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

from . import pipeline, sources
from .config import DEFAULT_NATIVE_THREADS, SamplerConfig
from .errors import EngineUnavailableError, NotRunningError, ProfilerBusyError
from .engines.python import PythonEngine
from .live import LiveAggregate, LiveRefresher
from .model import Profile

_active_lock = threading.Lock()
_active: "Sampler | None" = None


def _after_fork_child() -> None:
    """A fork child runs none of its parent's session (the engines forget it), and a fork
    taken while another thread was inside start() or stop() leaves _active_lock held for
    good: the child starts afresh, so it may profile itself."""
    global _active_lock, _active
    _active_lock = threading.Lock()
    _active = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_child)


def _engine_classes() -> dict:
    classes = {"python": PythonEngine}
    try:
        from .engines.native import NativeEngine
    except Exception as exc:  # noqa: BLE001 - a broken native build must not break import
        classes["native"] = exc
    else:
        classes["native"] = NativeEngine
    return classes


def choose_engine(config: SamplerConfig):
    """The engine class for ``config`` and a note when 'auto' had to fall back."""
    classes = _engine_classes()
    native = classes["native"]
    reason = f"native engine failed to load: {native}" if isinstance(native, Exception) else native.unavailable_reason()
    if config.engine == "native":
        if reason:
            raise EngineUnavailableError(reason)
        return native, None
    if config.engine == "python":
        return classes["python"], None
    if reason is None and all(e in native.supported_events for e in config.events):
        return native, None
    if reason is None:
        missing = [e.label for e in config.events if e not in native.supported_events]
        raise EngineUnavailableError(f"the native engine cannot sample {', '.join(missing)} yet")
    python = classes["python"]
    missing = [e.label for e in config.events if e not in python.supported_events]
    if missing:
        raise EngineUnavailableError(f"{reason}; the portable python engine cannot sample {', '.join(missing)}")
    return python, f"fell back to the python engine: {reason}"


def _caller_frames(depth: int) -> list[tuple[str, str, int]]:
    """(qualname, filename, first line) of the calling thread's frames, root first."""
    frame = sys._getframe(depth + 1)
    out = []
    while frame is not None:
        code = frame.f_code
        out.append((code.co_qualname, code.co_filename, code.co_firstlineno))
        frame = frame.f_back
    out.reverse()
    return out


class Sampler:
    """Runs one engine between ``start()`` and ``stop()``; ``stop()`` returns the Profile."""

    def __init__(self, config: SamplerConfig | None = None, *, children: bool = False, dask=None, **options):
        """``config``, or ``options`` (``SamplerConfig.make``'s, by name) to make one: never
        both.  ``children``: also profile child Python processes started while running
        (ddprof_nb.children); ``dask``: a dask.distributed Client whose workers are
        profiled too (ddprof_nb.dask_support).  Both merge into the returned Profile;
        they are sources (``ddprof_nb.sources``), found by option name."""
        if config is not None and options:
            raise TypeError(f"Sampler: a config or options ({', '.join(sorted(options))}), not both")
        self.config = config if config is not None else SamplerConfig.make(**options)
        self._source_options = {"children": bool(children), "dask": dask}
        self._engine = None
        self._sources: list = []  # running beside the engine (ddprof_nb.sources), in merge order
        self._note: str | None = None
        self._prefix: list = []
        self._tid = 0
        self._keep_last = True
        self._live: LiveRefresher | None = None
        self.profile: Profile | None = None

    @property
    def running(self) -> bool:
        return self._engine is not None

    @property
    def engine_name(self) -> str:
        return self._engine.name if self._engine is not None else ""

    def exclude_thread(self, tid: int) -> bool:
        """Leave thread ``tid`` (native id) out of the engine's samples: a source's own
        threads.  False when the engine cannot (the caller filters it out of the profile)."""
        return self._engine.exclude_thread(tid) if self._engine is not None else False

    def start(self, *, caller_depth: int = 0, trim: str = "caller", live=None) -> "Sampler":
        """Start sampling.  ``trim``: 'caller' roots the starting thread's stacks at the
        frame ``caller_depth`` levels above this call; 'below' roots them below it (magics:
        the cell itself); 'none' keeps whole stacks.  ``live``: a sink (``ddprof_nb.live``)
        given a snapshot of the samples so far about once a second until stop."""
        global _active
        if trim not in ("caller", "below", "none"):
            raise ValueError(f"invalid trim {trim!r}")
        with _active_lock:
            if _active is not None:
                raise ProfilerBusyError(
                    "a profile is already running in this process (started by "
                    f"{_active.config.engine} engine); stop it first"
                )
            cls, self._note = choose_engine(self.config)
            srcs = sources.make_sources(self.config, self._source_options)
            provided = frozenset().union(*(s.provides for s in srcs))
            engine_config = self.config
            if provided:  # what the sources sample the engine needn't, unless it can itself
                engine_config = sources.engine_config(self.config, provided, cls.supported_events)
                if engine_config.engine == "python" and not engine_config.events:
                    cls = _engine_classes()["python"]
            engine = cls(engine_config)
            refresher = None
            if live is not None:
                engine.live = LiveAggregate()
                refresher = LiveRefresher(engine.live, live)
            self._prefix = [] if trim == "none" else _caller_frames(caller_depth + 1)
            self._keep_last = trim == "caller"
            self._tid = threading.get_native_id()
            engine.start()
            self._engine, self._sources = engine, []
            _active = self
            if refresher is not None:
                self._live = refresher
                refresher.start()
        try:
            for src in srcs:
                src.start()
                self._sources.append(src)
        except BaseException:
            for src in reversed(self._sources):
                src.abort()
            self._sources = []
            self.stop()
            raise
        return self

    def stop(self, steps: tuple = pipeline.COLLECT, **front_end) -> Profile:
        """Stop sampling and return the Profile (also kept as ``self.profile``), passed
        through ``steps`` (``ddprof_nb.pipeline``); ``front_end`` adds the caller's facts to
        the steps' ``StopContext`` (``is_root``, ``hide``...)."""
        global _active
        with _active_lock:
            if self._engine is None:
                raise NotRunningError("the profiler is not running (stop without start)")
            engine, self._engine = self._engine, None
            srcs, self._sources = self._sources, []
            live, self._live = self._live, None
            if live is not None:  # first: no refresh outlives the session
                live.stop()
            local = []
            try:
                for src in srcs:
                    part = src.stop()
                    if part is not None:
                        local.append(part)
            finally:
                try:
                    profile = engine.stop()
                finally:
                    _active = None
                    for src in srcs:  # (after the engine's last drain: its records may name what they published)
                        src.release()
        ctx = self._context(local=tuple(local), remote=tuple(s for s in srcs if s.remote), **front_end)
        profile = pipeline.run(profile, steps, ctx)
        if live is not None and live.error:
            profile = profile.with_metadata(notes=profile.metadata.notes + (
                f"live view: stopped refreshing after {live.refreshes} refresh(es): {live.error}",))
        self.profile = profile
        return self.profile

    def _context(self, **facts) -> pipeline.StopContext:
        return pipeline.StopContext(
            tid=self._tid, prefix=tuple(self._prefix), keep_last=self._keep_last, labels=dict(self.config.labels or {}),
            note=self._note, asyncio=self.config.asyncio, sampler_files=frozenset({__file__}), **facts,
        )

    def shape_live(self, profile: Profile, steps: tuple = pipeline.COLLECT, **front_end) -> Profile:
        """A live snapshot's profile through the stack-shaping steps of ``steps``
        (``pipeline.live_steps``), with the facts ``stop(steps, **front_end)`` will have."""
        return pipeline.run(profile, pipeline.live_steps(steps), self._context(**front_end))


def active() -> Sampler | None:
    """The running sampler, if any."""
    return _active


class ProfileHandle:
    """What ``with profile() as p`` binds: ``p.profile`` is set when the block ends."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self.profile: Profile | None = None

    def __repr__(self) -> str:
        return f"<ProfileHandle {self.profile!r}>"


@contextmanager
def profile(events=("cpu", "wall"), interval="10ms", *, alloc_rate="512KiB", native_alloc=True, engine="auto",
            max_depth=None, labels=None, children=False, dask=None, asyncio="fold",
            live=False, native=False, native_threads=DEFAULT_NATIVE_THREADS) -> Iterator[ProfileHandle]:
    """Profile the block: ``with ddprof_nb.profile() as p: ...`` then ``p.profile``.

    ``asyncio``: "fold" (default) gives asyncio tasks their own stacks and ``task`` label,
    samples suspended tasks (wall, park) and folds the event loop's machinery into one
    ``[asyncio loop]`` frame; "raw" keeps the loop's frames; "off" leaves asyncio alone.

    ``native_alloc`` (alloc/live): also sample memory that C extensions allocate (numpy
    array data, the C allocator called from extension modules); False: Python objects only.

    ``native=True`` (native engine): CPU, alloc and lock/park samples also carry the C, C++
    and Rust frames between the Python ones (``numpy`` -> ``cblas_dgemm`` -> its kernel), the
    interpreter's eval-loop frames replaced by the Python frames they run;
    ``native="interpreter"`` keeps those frames too.

    ``native_threads`` (native engine; CPU, alloc/live): also sample the threads that run no Python
    (BLAS, OpenMP, Rust and database pools).  "attribute" (or True) puts their CPU and C allocations
    under the Python line that asked for the work, beneath a ``[pool: <thread name>]`` frame (the default);
    "raw" under each thread; "off" leaves them out (notes then say how much ran outside the profile).

    ``children=True`` also profiles child Python processes started in the block (labels
    ``pid``/``process``); ``dask=client`` profiles every worker of that dask.distributed
    cluster (label ``worker``).

    ``live=True`` shows the samples so far while the block runs, about once a second: in
    a notebook the live view (flame so far, samples per thread, elapsed time), which becomes
    the explorer of the whole profile at the end; elsewhere a progress line on stderr when
    it is a terminal, else nothing (``ddprof_nb.live_display``).  A sink object
    (``update(snapshot)``, ``finish(profile, error)``; ``ddprof_nb.live``) may be given instead.

    The profile is produced even when the block raises (including KeyboardInterrupt).
    """
    config = SamplerConfig.make(events=events, interval=interval, alloc_rate=alloc_rate, native_alloc=native_alloc,
                                engine=engine, max_depth=max_depth, labels=labels, asyncio=asyncio, native=native,
                                native_threads=native_threads)
    sampler = Sampler(config, children=children, dask=dask)
    handle = ProfileHandle(sampler)
    sink = None
    if live is True:
        from .live_display import sink_for

        sink = sink_for(lambda p: sampler.shape_live(p, pipeline.PYTHON_API))
    elif live is not False and live is not None:
        if not (callable(getattr(live, "update", None)) and callable(getattr(live, "finish", None))):
            raise TypeError(f"profile(live=...) takes True, False or a sink with update() and finish(), "
                            f"not {type(live).__name__}")
        sink = live
    try:
        sampler.start(caller_depth=2, live=sink)  # contextmanager's __enter__ and this generator sit between
    except BaseException as exc:
        if sink is not None:
            sink.finish(None, f"{type(exc).__name__}: {exc}")
        raise
    try:
        yield handle
    finally:
        try:
            handle.profile = sampler.stop(pipeline.PYTHON_API)
        finally:
            if sink is not None:
                sink.finish(handle.profile, None if handle.profile is not None else "the profile could not be made")


def profiled(func=None, *, children: bool = False, dask=None, **options):
    """Decorator: profile each call of ``func``, rooted at ``func``; the latest profile
    is ``func.last_profile`` (kept even when the call raises).  ``options`` are
    ``SamplerConfig.make``'s, checked once, when the function is decorated."""
    if func is None:
        return functools.partial(profiled, children=children, dask=dask, **options)
    config = SamplerConfig.make(**options)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        sampler = Sampler(config, children=children, dask=dask)
        sampler.start(trim="below")
        try:
            return func(*args, **kwargs)
        finally:
            wrapper.last_profile = sampler.stop(pipeline.PYTHON_API)

    wrapper.last_profile = None
    return wrapper
