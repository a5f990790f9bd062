"""The contract every sampling engine fulfils (native, python).

An engine samples the whole process between ``start()`` and ``stop()`` and returns a
Profile built with ``model.ProfileBuilder``.  ``stop()`` always returns what was
collected (a partial profile rather than nothing), with dropped-sample counts and
notes in its metadata.  Engines never import the magics, exporters or explorer.
"""

from __future__ import annotations

import abc

from ..config import SamplerConfig
from ..errors import ProfilerError
from ..events import EventType
from ..model import Profile


class Engine(abc.ABC):
    """One way of taking samples.  Subclasses set ``name`` and ``supported_events``."""

    name: str = ""
    supported_events: frozenset[EventType] = frozenset()

    def __init__(self, config: SamplerConfig):
        unsupported = [e.label for e in config.events if e not in self.supported_events]
        if unsupported:
            raise ProfilerError(
                f"the {self.name} engine cannot sample {', '.join(unsupported)}; "
                f"it supports: {', '.join(e.label for e in EventType if e in self.supported_events)}"
            )
        self.config = config
        # a live view's running aggregate (ddprof_nb.live.LiveAggregate), set before start():
        # the engine makes it its builder's tap and flushes the builder each time it drains
        self.live = None

    @classmethod
    @abc.abstractmethod
    def unavailable_reason(cls) -> str | None:
        """Why this engine cannot run here, or None when it can."""

    @abc.abstractmethod
    def start(self) -> None:
        """Begin sampling every thread of the process."""

    @abc.abstractmethod
    def stop(self) -> Profile:
        """Stop sampling, release every resource (timers, threads, hooks) and return the profile."""

    def exclude_thread(self, tid: int) -> bool:
        """Leave thread ``tid`` (native id) out of the samples from now on (a source's own
        threads); False when this engine cannot, and the caller filters it out instead."""
        return False
