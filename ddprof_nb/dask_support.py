"""Dask: profile every worker of a dask.distributed cluster alongside the local process.

``DaskProfiler(client, config)`` is a ``sources.Source`` (``Sampler(dask=client)``):
``start()`` runs ``_worker_start`` on every worker through ``client.run`` (same code for
LocalCluster and remote clusters: only the function and plain options travel);
``collect(local_profile)`` runs ``_worker_stop``, which returns the worker's profile as
pprof bytes (never a pickled Profile), and merges them, labelled by ``worker`` address
and ``pid``, with the local profile.

A worker that leaves the cluster (or fails to answer) mid-profile loses only its own
samples: the merged profile is partial and its notes name the worker.  Workers that
join after start are not profiled (noted).  Workers living in the client's own process
(``LocalCluster(processes=False)``) are covered by the local profile and skipped.

Cost on the workers is the sampler's own (nothing per task, nothing shipped until stop).
Its per-second costs grow with every sampled thread (a wall sample per thread per tick,
each converted in Python by the drain), so the worker's machinery threads that only
wait for shutdown (``_IDLE_MACHINERY``) are left out of the sampling: their wall
samples would be one unchanging blocked stack, and they use no CPU.
"""

from __future__ import annotations

import os
import re
import socket
import threading

from . import sources
from .model import selection
from . import sampler as _sampler
from .config import SamplerConfig
from .errors import ProfilerError

# dask's worker-process threads that block for the whole life of the worker (the
# Nanny's stop-queue reader, distributed.process's parent-death watcher)
_IDLE_MACHINERY = re.compile(r"Nanny stop queue watch$|.*\(monitor_parent\)$")

# one profile per worker process, keyed by the client's token so two clients sharing
# a cluster do not stop each other's profiles
_worker_samplers: dict[str, object] = {}


def _worker_start(spec: dict, token: str) -> dict:
    """Runs on a worker: start sampling this worker process."""
    if os.getpid() == spec["client_pid"]:
        return {"pid": os.getpid(), "skipped": "in-process worker (covered by the local profile)"}
    config = SamplerConfig.from_spec(spec)
    # A client process runs one profile at a time, so a sampler left here by an earlier
    # profile of the same client (same token prefix) is an orphan: that profile's collect
    # skipped this worker because the scheduler briefly lost it (a heartbeat missed under
    # load).  Stop it, or every later profile would find this process busy.
    stale = [t for t in _worker_samplers if t == token or t.split("/")[0] == token.split("/")[0]]
    for t in stale:
        old = _worker_samplers.pop(t)
        if old.running:
            old.stop()
    s = _sampler.Sampler(config)
    s.start(trim="none")
    _worker_samplers[token] = s
    return {"pid": os.getpid(), "engine": s.engine_name, "unsampled": _exclude_idle_machinery(s)}


def _exclude_idle_machinery(s) -> list[str]:
    """Stop sampling dask's forever-blocked machinery threads (where the engine can); their names."""
    return sorted(t.name for t in threading.enumerate()
                  if t.native_id and _IDLE_MACHINERY.match(t.name) and s.exclude_thread(t.native_id))


def _worker_stop(token: str) -> dict:
    """Runs on a worker: stop sampling, return ``{"pid", "pprof": bytes}``."""
    from .exporters import pprof  # (import cost: every `import ddprof_nb` imports this module)

    s = _worker_samplers.pop(token, None)
    if s is None or not s.running:
        return {"pid": os.getpid(), "pprof": None}
    profile = s.stop()
    return {"pid": os.getpid(), "pprof": pprof.dumps(profile)}


def _spec(config, client_pid: int) -> dict:
    # a worker's event loop runs dask's own machinery (comms, heartbeats, one task per
    # executing key), never the user's coroutines: sampling its tasks only adds noise and cost
    return {"client_pid": client_pid, **config.to_spec(), "asyncio": "off"}


class DaskProfiler:
    """A ``sources.Source``: starts the sampler on every worker of ``client``'s cluster;
    ``collect`` stops them and merges their profiles."""

    name = "dask"
    provides = frozenset()
    remote = True

    def __init__(self, client, config, *, timeout_s: float = 30.0):
        if not hasattr(client, "run") or not hasattr(client, "scheduler_info"):
            raise ValueError(f"dask= expects a dask.distributed Client, got {type(client).__name__}")
        self.client = client
        self.config = config
        self.timeout_s = timeout_s
        self.token = f"{socket.gethostname()}:{os.getpid()}/{id(self):x}"  # client process / this profile
        self.started: dict[str, int] = {}  # worker address -> pid
        self.seen: set[str] = set()  # every worker that answered start
        self.notes: list[str] = []

    def start(self) -> None:
        try:
            results = self.client.run(_worker_start, _spec(self.config, os.getpid()), self.token, on_error="return")
        except Exception as exc:  # noqa: BLE001 - scheduler unreachable, closed client, ...
            raise ProfilerError(f"dask: could not start profiling on the workers: {exc}") from exc
        self.seen = set(results)
        unsampled: set[str] = set()
        for addr, r in results.items():
            if isinstance(r, BaseException):
                self.notes.append(f"dask worker {addr}: could not start profiling: {r}")
            elif r.get("skipped"):
                self.notes.append(f"dask worker {addr}: {r['skipped']}")
            else:
                self.started[addr] = r["pid"]
                if r.get("unsampled"):
                    unsampled.update(r["unsampled"])
        if unsampled:
            self.notes.append("dask workers: idle machinery thread(s) not sampled: " + ", ".join(sorted(unsampled)))

    def abort(self) -> None:
        try:
            self.client.run(_worker_stop, self.token, workers=list(self.started), on_error="ignore")
        except Exception:  # noqa: BLE001
            pass

    def stop(self) -> None:
        """The workers keep sampling until ``collect`` asks for their profiles."""

    def release(self) -> None:
        pass

    def collect(self, profile):
        """``profile`` merged with each worker's profile (labels ``worker``, ``pid``)."""
        from .exporters import pprof  # (import cost: every `import ddprof_nb` imports this module)

        notes = list(self.notes)
        alive = set(self._current_workers())
        gone = [a for a in self.started if a not in alive]
        asked = [a for a in self.started if a in alive]
        results = {}
        if asked:
            try:
                results = self.client.run(_worker_stop, self.token, workers=asked, on_error="return")
            except Exception as exc:  # noqa: BLE001 - e.g. the scheduler is gone
                notes.append(f"dask: could not collect worker profiles: {exc}")
        parts, labels = [profile], [{"pid": str(os.getpid()), "worker": "client"}]
        for addr in asked:
            r = results.get(addr)
            pid = self.started[addr]
            if r is None:
                gone.append(addr)
                continue
            if isinstance(r, BaseException):
                notes.append(f"dask worker {addr} (pid {pid}): could not stop profiling: {r}; its samples are missing")
                continue
            if r.get("pprof") is None or r.get("pid") != pid:
                # a restarted worker at the same address: the old process and its samples are gone
                notes.append(f"dask worker {addr} (pid {pid}) restarted during profiling; its samples are missing")
                continue
            try:
                wp = pprof.loads(r["pprof"], name=f"worker {addr}")
            except Exception as exc:  # noqa: BLE001
                notes.append(f"dask worker {addr}: unreadable profile ({exc})")
                continue
            parts.append(wp)
            labels.append({"pid": str(pid), "worker": addr})
        for addr in gone:
            notes.append(f"dask worker {addr} (pid {self.started[addr]}) left the cluster during profiling "
                         f"(died?); its samples are missing")
        new = sorted(alive - self.seen)
        if new:
            notes.append(f"dask: {len(new)} worker(s) joined after profiling started and are not profiled: "
                         + ", ".join(new))
        merged = selection.merge(*parts, labels=labels)
        extra = dict(profile.metadata.extra)
        extra["dask_workers"] = str(len(parts) - 1)
        return merged.with_metadata(extra=extra, pid=profile.metadata.pid,
                                    notes=merged.metadata.notes + tuple(notes))

    def _current_workers(self) -> list[str]:
        try:
            return list(self.client.scheduler_info(n_workers=-1)["workers"])
        except TypeError:  # older distributed: no n_workers
            return list(self.client.scheduler_info()["workers"])
        except Exception:  # noqa: BLE001
            return list(self.started)


sources.register("dask", lambda config, client: DaskProfiler(client, config) if client is not None else None)
