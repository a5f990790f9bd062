"""The stop pipeline: what happens to a session's samples between the engine and the user.

Each step is a named ``Profile -> Profile`` function of the profile and a ``StopContext``
(the facts the session gathered: the starting thread, its frames, the labels, the task
sampler's profile...); all are pure but ``merge_remote``, which collects what child
processes and Dask workers sent (their sources' ``collect``).  Each entry point picks an ordered list of steps
(``COLLECT``, ``PYTHON_API``, ``MAGIC``, ``CLI``) and ``Sampler.stop(steps, ...)`` runs it.
The lists differ only where an entry point must; each difference is written beside it.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Callable, Mapping

from . import cells
from .aio.fold import fold_loop_frames
from .model import Frame, Profile, rooting, selection

__all__ = [
    "Step", "StopContext", "run",
    "merge_tasks", "add_labels", "trim_caller", "drop_sampler_frames", "note_fallback", "merge_remote",
    "fold_asyncio", "name_cells", "reroot", "hide_threads",
    "COLLECT", "PYTHON_API", "MAGIC", "CLI", "live_steps",
]


@dataclass(frozen=True)
class StopContext:
    """What the steps may read.  The sampler fills the first group; a front end adds the
    rest through ``Sampler.stop(steps, **front_end_facts)``."""

    # from the sampler
    tid: int = 0  # native id of the thread that started profiling
    prefix: tuple = ()  # (name, file, first line) of its frames above the start call, root first
    keep_last: bool = True  # keep the frame that started profiling (the ``with`` block's function)
    labels: Mapping[str, str] = field(default_factory=dict)  # labels given for the whole session
    note: str | None = None  # why the engine is not the one asked for
    local: tuple = ()  # Profiles the sources took of this process (the asyncio task sampler's)
    remote: tuple = ()  # sources of other processes' samples (child processes, Dask workers): their collect()
    asyncio: str = "off"
    sampler_files: frozenset = frozenset()  # files of start()/stop() themselves
    # from a front end
    is_root: Callable[[Frame], bool] | None = None  # the frame to root the starting thread at (a cell, a script)
    drop: Callable[[Frame], bool] | None = None  # re-rooted stacks through these frames are left out
    outside: tuple | None = None  # the stack for samples of that thread outside every root frame
    rename: object = False  # True or an IPython shell: name cell frames ``Cell In[N]`` while re-rooting
    hide: str | None = None  # regex: threads that only ever ran frames matching it are hidden
    hide_reason: str = ""  # how the note about hidden threads ends (what keeps them)


Step = Callable[[Profile, StopContext], Profile]  # a plain function; its name says what it does


def run(profile: Profile, steps: tuple[Step, ...], ctx: StopContext) -> Profile:
    """``profile`` through ``steps`` in order."""
    for step in steps:
        profile = step(profile, ctx)
    return profile


def _with_note(profile: Profile, note: str) -> Profile:
    return profile.with_metadata(notes=profile.metadata.notes + (note,))


# ---------------------------------------------------------------------------------------
# steps


def merge_tasks(p: Profile, ctx: StopContext) -> Profile:
    """The sources' samples of this process (the asyncio task sampler's suspended tasks)
    join the engine's."""
    return selection.merge(p, *ctx.local) if ctx.local else p


def add_labels(p: Profile, ctx: StopContext) -> Profile:
    """The session's labels go on every sample."""
    return selection.merge(p, labels=[dict(ctx.labels)]) if ctx.labels else p


def trim_caller(p: Profile, ctx: StopContext) -> Profile:
    """The starting thread's stacks start at the code being profiled, not at its callers."""
    return rooting.trim_prefix(p, ctx.tid, ctx.prefix, ctx.keep_last)


def drop_sampler_frames(p: Profile, ctx: StopContext) -> Profile:
    """Samples taken inside start()/stop() themselves show the profiler, not the user's code."""
    if not ctx.sampler_files:
        return p
    return selection.filter(p, ignore="^(" + "|".join(re.escape(f) for f in sorted(ctx.sampler_files)) + ")$")


def note_fallback(p: Profile, ctx: StopContext) -> Profile:
    """Say why the engine is not the one asked for."""
    return _with_note(p, ctx.note) if ctx.note else p


def merge_remote(p: Profile, ctx: StopContext) -> Profile:
    """Child processes' and Dask workers' profiles join this one (each source's ``collect``)."""
    for source in ctx.remote:
        p = source.collect(p)
    return p


def fold_asyncio(p: Profile, ctx: StopContext) -> Profile:
    """The event loop's machinery folds into one ``[asyncio loop]`` frame."""
    return fold_loop_frames(p) if ctx.asyncio == "fold" else p


def name_cells(p: Profile, ctx: StopContext) -> Profile:
    """In IPython, frames of notebook cells read ``Cell In[N]``, as in its tracebacks."""
    return cells.name_cells(p) if "IPython" in sys.modules else p


def reroot(p: Profile, ctx: StopContext) -> Profile:
    """The starting thread's stacks start at the cell or script (``cells.reroot``)."""
    if ctx.is_root is None:
        return p
    return cells.reroot(p, ctx.tid, ctx.is_root, drop=ctx.drop, outside=ctx.outside, rename=ctx.rename)


def hide_threads(p: Profile, ctx: StopContext) -> Profile:
    """Threads that only ran ``ctx.hide`` frames (a kernel's idle machinery) are hidden, and
    a note says which."""
    if not ctx.hide:
        return p
    p, hidden = selection.drop_threads_only_in(p, ctx.hide, keep_tids=(ctx.tid,))
    if not hidden:
        return p
    return _with_note(p, f"hid {len(hidden)} idle kernel thread(s) ({', '.join(sorted(set(hidden)))})"
                         + (f"; {ctx.hide_reason}" if ctx.hide_reason else ""))



# ---------------------------------------------------------------------------------------
# the lists

# Every session: one profile from the sampler's parts.  ``Sampler.stop()`` runs this list
# unless told otherwise: a bare Sampler, and the sessions of child processes and Dask
# workers, whose whole stacks go to the parent, which names and roots them.  Labels go on before remote
# profiles join (children and workers carry their own labels); asyncio folds last so it
# sees the tasks' and the children's loop frames too.
COLLECT = (merge_tasks, add_labels, trim_caller, drop_sampler_frames, note_fallback, merge_remote, fold_asyncio)

# ``with profile()`` and ``@profiled``: the caller's frames were trimmed (trim_caller),
# so cells are only named.
PYTHON_API = COLLECT + (name_cells,)

# ``%%ddprof``/``%ddprof``: started with trim="none", then re-rooted at the cell, which
# also names cells (reroot's ``rename``), and the kernel's idle threads are hidden
# (a script run by the CLI has no such threads).
MAGIC = COLLECT + (reroot, hide_threads)

# ``python -m ddprof_nb record``: re-rooted at the script; no cells, no kernel threads.
CLI = COLLECT + (reroot,)


# A live view's snapshot (ddprof_nb.live) goes through the steps of its list that shape
# stacks, so it looks like the final profile: not those that collect (tasks, children,
# workers: joined at stop), add notes or labels, or hide threads (the view hides the
# profiler's and the kernel's threads itself, as the explorer does).
_LIVE = frozenset({trim_caller, drop_sampler_frames, fold_asyncio, name_cells, reroot})


def live_steps(steps: tuple[Step, ...]) -> tuple[Step, ...]:
    """The steps of ``steps`` a live snapshot goes through, in order."""
    return tuple(s for s in steps if s in _LIVE)
