"""Sources: what a session runs beside its engine, behind one small interface.

The engine samples this process's threads; a source adds samples the engine cannot take:
the asyncio task sampler (suspended tasks, ``aio.tasks.TaskSampler``), child
processes (``children.ChildCollector``) and Dask workers (``dask_support.DaskProfiler``).
``Sampler`` drives them through ``Source`` and finds them in a registry, so it never
imports the modules that implement them (child processes and Dask workers run a Sampler
themselves: they import the sampler, not the reverse).

A source's life in a session, in the sampler's order:

- ``start()`` after the engine started (a failure stops the engine and the sources
  already started, through ``abort()``);
- ``stop()`` before the engine stops: no new samples; returns this process's samples as a
  Profile (merged first, before the session's labels and trims), or None;
- ``release()`` after the engine's last records were read (they may name what the source
  published, e.g. task names);
- ``collect(profile)``, a stop-pipeline step (``pipeline.merge_remote``): the samples of
  other processes merged in, after this process's labels and trims (they carry their own).

A source that needs its own threads left out of the samples asks the engine through
``Sampler.exclude_thread(tid)`` (engines without exclusion say False; the caller then
filters those threads out of the profile).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Protocol, runtime_checkable

from .events import EventType
from .model import Profile

__all__ = ["Source", "register", "make_sources", "engine_events", "engine_config"]


@runtime_checkable
class Source(Protocol):
    """What the sampler needs of a source (see the module docstring for the order)."""

    name: str
    provides: frozenset  # EventTypes it samples itself: an engine that cannot sample them needn't
    remote: bool  # True: its samples come from other processes (merged by ``collect``)

    def start(self) -> None: ...

    def stop(self) -> Profile | None: ...

    def release(self) -> None: ...

    def collect(self, profile: Profile) -> Profile: ...

    def abort(self) -> None: ...


# option name -> factory(config, value) -> Source | None, in merge order
Factory = Callable[[object, object], "Source | None"]
_factories: dict[str, Factory] = {}


def register(option: str, factory: Factory) -> None:
    """``Sampler(**{option: value})`` runs ``factory(config, value)``'s source (None: no
    source for that value).  Registered by the module that implements the source."""
    _factories[option] = factory


def make_sources(config, options: dict) -> list:
    """The sources of a session: one per registered factory that gives one, in registry
    order.  ``options``: the Sampler's source options (``children``, ``dask``...)."""
    unknown = sorted(k for k, v in options.items() if k not in _factories and v not in (None, False))
    if unknown:
        raise ValueError(f"no source handles the option(s) {', '.join(unknown)}: "
                         f"known: {', '.join(k for k in _factories if k != 'asyncio')}")
    out = []
    for option, factory in _factories.items():
        src = factory(config, options.get(option))
        if src is not None:
            if not isinstance(src, Source):
                raise TypeError(f"the {option!r} factory made a {type(src).__name__}, not a Source")
            out.append(src)
    return out


def engine_events(events: Iterable[EventType], provided: Iterable[EventType] = (),
                  engine_supported: Iterable[EventType] = ()) -> tuple[EventType, ...]:
    """The events the engine must sample beside sources that sample ``provided``: those
    are dropped unless the engine samples them itself (``engine_supported``)."""
    provided, supported = set(provided), set(engine_supported)
    return tuple(e for e in events if e not in provided or e in supported)


def engine_config(config, provided: Iterable[EventType] = (), engine_supported: Iterable[EventType] = ()):
    """The SamplerConfig of the engine beside sources that sample ``provided``; when no
    event is left (park only), the portable engine runs with none (the native one needs
    at least one)."""
    events = engine_events(config.events, provided, engine_supported)
    if not events:
        return dataclasses.replace(config, events=(), engine="python")
    return dataclasses.replace(config, events=events)
