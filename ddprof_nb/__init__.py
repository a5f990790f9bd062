"""ddprof_nb: a native sampling profiler for Jupyter.

``%load_ext ddprof_nb`` then ``%%ddprof`` around a cell, or in plain Python::

    with ddprof_nb.profile(events=("cpu", "wall")) as p:
        work()
    p.profile.top("cpu")
    ddprof_nb.save(p.profile, "run.pprof")

Public names only here; heavy modules (explorer, magics) load on first use.
"""

from .config import SamplerConfig
from .errors import EngineUnavailableError, NotRunningError, ProfilerBusyError, ProfilerError
from .events import EventType, FrameKind
from .exporters import save
from .labeling import labels
from .loading import load
from .model import Frame, LabelSet, Profile
from .sampler import Sampler, profile, profiled

# the sources register themselves (ddprof_nb.sources), in merge order: asyncio's task sampler,
# then those behind Sampler's children= and dask= options
from .aio import session_source as _aio_source  # noqa: E402,F401
from . import children as _children  # noqa: E402,F401  (after sampler: they run one in other processes)
from . import dask_support as _dask_support  # noqa: E402,F401

__version__ = "0.1.0"

__all__ = [
    "EventType", "FrameKind", "Profile", "Frame", "LabelSet", "SamplerConfig", "Sampler",
    "profile", "profiled", "labels", "load", "save", "Explorer", "history",
    "ProfilerError", "ProfilerBusyError", "NotRunningError", "EngineUnavailableError",
]


def __getattr__(name):
    if name == "Explorer":
        from .explorer.widget import Explorer

        return Explorer
    if name == "history":
        from .history import history

        return history
    raise AttributeError(f"module 'ddprof_nb' has no attribute {name!r}")


def load_ipython_extension(ipython):
    """``%load_ext ddprof_nb``: register the %%ddprof / %ddprof magics."""
    from .magics import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython):
    from .magics import unload_ipython_extension as _unload

    _unload(ipython)
