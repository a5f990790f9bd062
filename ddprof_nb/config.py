"""Sampler options: their defaults, units and parsing (the one place each lives).

Every entry point (Python API, magics, CLI) builds a ``SamplerConfig`` through
``SamplerConfig.make``, so an option means the same thing everywhere and bad values
get the same clear error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .events import EventType

DEFAULT_EVENTS = (EventType.CPU, EventType.WALL)
DEFAULT_INTERVAL_NS = 10_000_000  # 100 Hz, for cpu and wall
DEFAULT_ALLOC_RATE = 512 * 1024  # mean bytes between allocation samples
DEFAULT_MAX_DEPTH = 128  # frames kept per stack; deeper stacks end in [truncated]
MIN_INTERVAL_NS = 100_000  # 10 kHz; finer is noise with a 250 Hz kernel tick
MAX_INTERVAL_NS = 60_000_000_000
ENGINES = ("auto", "native", "python")
# CPU and C allocations of threads that run no Python (BLAS, OpenMP, Rust pools; native engine):
# "attribute" puts them under the Python line that asked for the work, "raw" under each thread, "off" leaves them out
NATIVE_THREADS_MODES = ("off", "attribute", "raw")
DEFAULT_NATIVE_THREADS = "attribute"  # every CPU second of the process, under the line that asked
# native frames: True merges the interpreter's eval-loop frames into the Python frames they run
# (as py-spy does); "interpreter" keeps them in the stack as well
NATIVE_MODES = (False, True, "interpreter")
# asyncio tasks (ddprof_nb.aio): "fold" samples suspended tasks, labels each
# task's samples and folds the event loop's machinery into one frame; "raw" does the same
# but keeps the loop's frames; "off" leaves asyncio alone
ASYNCIO_MODES = ("fold", "raw", "off")

_DURATION_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_SIZE_UNITS = {"b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2, "gb": 1000**3, "gib": 1024**3}


def parse_duration_ns(value, what: str = "interval") -> int:
    """Nanoseconds from ``"10ms"``, ``"250us"``, ``"1s"``, or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"invalid {what} {value!r}")
    if isinstance(value, (int, float)):
        ns = int(round(value * 1e9))
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s)\s*", str(value))
        if not m:
            raise ValueError(f"invalid {what} {value!r}: use a number with a unit, e.g. '10ms', '250us', '1s'")
        ns = int(round(float(m.group(1)) * _DURATION_UNITS[m.group(2)]))
    if ns <= 0:
        raise ValueError(f"invalid {what} {value!r}: must be positive")
    return ns


def parse_size_bytes(value, what: str = "alloc rate") -> int:
    """Bytes from ``"512KiB"``, ``"1MB"``, ``"4096"`` or an int."""
    if isinstance(value, bool):
        raise ValueError(f"invalid {what} {value!r}")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        unit = m.group(2).lower() if m else ""
        if not m or (unit and unit not in _SIZE_UNITS):
            raise ValueError(f"invalid {what} {value!r}: use bytes with a unit, e.g. '512KiB', '1MiB'")
        n = int(float(m.group(1)) * _SIZE_UNITS.get(unit or "b"))
    if n <= 0:
        raise ValueError(f"invalid {what} {value!r}: must be positive")
    return n


def parse_events(events) -> tuple[EventType, ...]:
    """Event types from ``"cpu,wall"``, ``("cpu", "alloc")`` or EventTypes; LIVE comes with ALLOC."""
    if isinstance(events, (str, EventType)):
        events = [events]
    parsed: list[EventType] = []
    for item in events:
        parts = item.split(",") if isinstance(item, str) else [item]
        for part in parts:
            if isinstance(part, str) and not part.strip():
                continue
            e = EventType.parse(part)
            if e is EventType.LIVE:
                e = EventType.ALLOC  # live heap is measured by the allocation sampler
            if e not in parsed:
                parsed.append(e)
    if not parsed:
        raise ValueError("no event types given; choose from: " + ", ".join(e.label for e in EventType))
    return tuple(e for e in EventType if e in parsed)


@dataclass(frozen=True)
class SamplerConfig:
    """What to sample and how often.  Build with ``SamplerConfig.make(**options)``."""

    events: tuple[EventType, ...] = DEFAULT_EVENTS
    interval_ns: int = DEFAULT_INTERVAL_NS  # CPU-time period per thread, and the wall period
    alloc_rate: int = DEFAULT_ALLOC_RATE
    native_alloc: bool = True  # alloc/live also sample C allocations of extension modules (native engine)
    native: bool | str = False  # one of NATIVE_MODES: the C/C++/Rust frames between the Python ones (native engine)
    native_threads: str = DEFAULT_NATIVE_THREADS  # one of NATIVE_THREADS_MODES
    max_depth: int = DEFAULT_MAX_DEPTH
    engine: str = "auto"
    labels: tuple[tuple[str, str], ...] = field(default=())  # labels on every sample
    asyncio: str = "fold"  # one of ASYNCIO_MODES

    @classmethod
    def make(
        cls,
        events=DEFAULT_EVENTS,
        interval=DEFAULT_INTERVAL_NS / 1e9,
        alloc_rate=DEFAULT_ALLOC_RATE,
        max_depth: int | None = DEFAULT_MAX_DEPTH,
        native_alloc: bool = True,
        engine: str = "auto",
        native: bool | str = False,
        native_threads: str = DEFAULT_NATIVE_THREADS,
        labels=None,
        asyncio: str = "fold",
    ) -> "SamplerConfig":
        """Validate user-facing options (strings with units allowed) into a config;
        ``max_depth=None`` is the default depth."""
        max_depth = DEFAULT_MAX_DEPTH if max_depth is None else max_depth
        interval_ns = parse_duration_ns(interval)
        if not MIN_INTERVAL_NS <= interval_ns <= MAX_INTERVAL_NS:
            raise ValueError(f"invalid interval {interval!r}: must be between 100us and 60s")
        if engine not in ENGINES:
            raise ValueError(f"invalid engine {engine!r}; expected one of: {', '.join(ENGINES)}")
        if not isinstance(max_depth, int) or not 1 <= max_depth <= 4096:
            raise ValueError(f"invalid max_depth {max_depth!r}: must be an int in 1..4096")
        if not isinstance(native_alloc, bool):
            raise ValueError(f"invalid native_alloc {native_alloc!r}: must be True or False")
        if not any(native is m or (isinstance(m, str) and native == m) for m in NATIVE_MODES):
            raise ValueError(f"invalid native {native!r}: must be True, False or 'interpreter'")
        if native_threads is True or native_threads is False:
            native_threads = "attribute" if native_threads else "off"
        if native_threads not in NATIVE_THREADS_MODES:
            raise ValueError(f"invalid native_threads {native_threads!r}; expected one of: "
                             f"{', '.join(NATIVE_THREADS_MODES)}")
        if asyncio not in ASYNCIO_MODES:
            raise ValueError(f"invalid asyncio mode {asyncio!r}; expected one of: {', '.join(ASYNCIO_MODES)}")
        return cls(
            events=parse_events(events),
            interval_ns=interval_ns,
            alloc_rate=parse_size_bytes(alloc_rate),
            native_alloc=native_alloc,
            native=native,
            native_threads=native_threads,
            max_depth=max_depth,
            engine=engine,
            labels=tuple(sorted((str(k), str(v)) for k, v in dict(labels or {}).items())),
            asyncio=asyncio,
        )

    def to_spec(self) -> dict:
        """A JSON-safe dict of this config, for handing to child processes and workers."""
        return {
            "events": [e.label for e in self.events],
            "interval_ns": self.interval_ns,
            "alloc_rate": self.alloc_rate,
            "native_alloc": self.native_alloc,
            "native": self.native,
            "native_threads": self.native_threads,
            "max_depth": self.max_depth,
            "engine": self.engine,
            "labels": [list(kv) for kv in self.labels],
            "asyncio": self.asyncio,
        }

    @classmethod
    def from_spec(cls, spec: dict) -> "SamplerConfig":
        """The config ``to_spec`` described (extra keys of the spec are ignored)."""
        return cls(
            events=tuple(EventType.parse(e) for e in spec["events"]),
            interval_ns=int(spec["interval_ns"]),
            alloc_rate=int(spec["alloc_rate"]),
            native_alloc=bool(spec.get("native_alloc", True)),
            native=spec.get("native", False),
            native_threads=spec.get("native_threads", DEFAULT_NATIVE_THREADS),
            max_depth=int(spec["max_depth"]),
            engine=spec["engine"],
            labels=tuple(tuple(kv) for kv in spec.get("labels", ())),
            asyncio=spec.get("asyncio", "fold"),
        )
