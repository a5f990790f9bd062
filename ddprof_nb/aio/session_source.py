"""The asyncio task sampler as a session source (``sources.register``), as child processes
and Dask workers register theirs: registered when the package is imported, loaded when a
session samples asyncio."""

from __future__ import annotations

from .. import sources


def _task_sampler(config, _value) -> "sources.Source | None":
    if config.asyncio == "off":
        return None
    # the task sampler imports asyncio (~0.3 s): only sessions that sample asyncio pay it
    from .tasks import TaskSampler

    return TaskSampler(config)


sources.register("asyncio", _task_sampler)  # (from the config, not an option: sampled unless asyncio="off")
