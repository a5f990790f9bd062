"""Notebook cells in profiles: name cell frames ``Cell In[N]`` and root stacks at the cell.

IPython compiles each cell under a generated file name and remembers which execution
count it belongs to in ``shell.compile._filename_map`` (IPython >= 8; its tracebacks
read ``Cell In[N], line L`` from it).  Terminal IPython names cells
``<ipython-input-N-<hash>>``; ipykernel names them after a hash of the cell's source
in a temporary folder (``/tmp/ipykernel_<pid>/<hash>.py``).  ``name_cells`` renames
the frames of such files so they read ``Cell In[N]`` — the cell's own line numbers
are kept (IPython compiles a cell with its first line as line 1).

``reroot`` is the companion transform the magics use: it makes a chosen frame (the
cell's code) the root of every stack of the thread that ran the cell, leaving out the
samples of that thread taken outside the cell (IPython's machinery, the profiler's own
start/stop).  Both return new Profiles (aggregate.map_stacks semantics: stacks that
become equal are merged).
"""

from __future__ import annotations

import re
from typing import Callable, Mapping

import numpy as np

from . import aggregate
from .model import Frame, Profile, ProfileBuilder, aggregate_columns, columns

__all__ = ["cell_number", "cell_label", "is_cell_file", "cell_frame", "name_cells", "reroot", "filename_map"]

_TERMINAL_CELL = re.compile(r"^<ipython-input-(\d+)-[0-9a-fA-F]+>$")


def _shell(shell=None):
    if shell is not None:
        return shell
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def filename_map(shell=None) -> Mapping[str, int]:
    """IPython's {cell file name: execution count}, or {} outside IPython."""
    shell = _shell(shell)
    compiler = getattr(shell, "compile", None)
    found = getattr(compiler, "_filename_map", None)
    return found if isinstance(found, Mapping) else {}


def cell_number(filename: str, shell=None, fmap: Mapping[str, int] | None = None) -> int | None:
    """The execution count of the cell compiled as ``filename``, or None if it is no cell."""
    if not filename:
        return None
    fmap = filename_map(shell) if fmap is None else fmap
    n = fmap.get(filename)
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    m = _TERMINAL_CELL.match(filename)
    return int(m.group(1)) if m else None


def cell_label(number: int) -> str:
    """``Cell In[12]``: how IPython's tracebacks name a cell."""
    return f"Cell In[{number}]"


def is_cell_file(filename: str, shell=None, fmap: Mapping[str, int] | None = None) -> bool:
    """Is ``filename`` the generated name of an IPython cell (or already ``Cell In[N]``)?"""
    return filename.startswith("Cell In[") or cell_number(filename, shell, fmap) is not None


def cell_frame(frame: Frame, number: int) -> Frame:
    """``frame`` renamed as code of cell ``number``: the file reads ``Cell In[N]`` and the
    cell's module-level code is named after the cell too."""
    label = cell_label(number)
    name = label if frame.name == "<module>" else frame.name
    return Frame(name, label, frame.line, frame.first_line, frame.kind)


def _renamer(profile: Profile, shell=None) -> dict[int, Frame]:
    fmap = filename_map(shell)
    renamed: dict[int, Frame] = {}
    numbers: dict[str, int | None] = {}
    for i, f in enumerate(profile.frames):
        if not f.filename or f.filename.startswith("Cell In["):
            continue
        if f.filename not in numbers:
            numbers[f.filename] = cell_number(f.filename, fmap=fmap)
        n = numbers[f.filename]
        if n is not None:
            renamed[i] = cell_frame(f, n)
    return renamed


def name_cells(profile: Profile, shell=None) -> Profile:
    """``profile`` with every cell frame renamed ``Cell In[N]`` (see the module docstring).

    Returns ``profile`` itself when it holds no cell frame.
    """
    renamed = _renamer(profile, shell)
    if not renamed:
        return profile
    frames = profile.frames
    return aggregate.map_stacks(profile, lambda fs, ids: tuple(renamed.get(i, frames[i]) for i in ids))


def reroot(
    profile: Profile,
    tid: int,
    is_root: Callable[[Frame], bool],
    *,
    drop: Callable[[Frame], bool] | None = None,
    outside: tuple[Frame, ...] | None = None,
    rename: bool | object = False,
) -> Profile:
    """Root the stacks of thread ``tid`` at their first frame for which ``is_root`` holds.

    For that thread's samples only: frames above the root are cut; a sample whose stack
    has no root frame is left out — or, when ``outside`` is given, attributed to the
    stack ``outside`` (e.g. the cell and an ``[await]`` frame for an async cell waiting
    in the event loop); a re-rooted stack holding a frame for which ``drop`` holds (the
    profiler's own code) is left out.  Other threads keep their stacks.  ``rename``
    (True, or an IPython shell) also applies ``name_cells``.  Values of merged stacks
    add up; the metadata is kept.
    """
    nframes = len(profile.frames)
    root = np.fromiter((bool(is_root(f)) for f in profile.frames), dtype=bool, count=nframes)
    dropped = (np.fromiter((bool(drop(f)) for f in profile.frames), dtype=bool, count=nframes)
               if drop is not None else np.zeros(nframes, dtype=bool))
    renamed = _renamer(profile, None if rename is True else rename) if rename else {}
    mine_threads = [i for i, t in enumerate(profile.threads) if t.tid == tid]
    mine_rows = np.isin(profile.thread, mine_threads) if mine_threads else np.zeros(len(profile), dtype=bool)

    builder = ProfileBuilder(profile.metadata)
    frames = profile.frames

    def frame(i: int) -> Frame:
        return renamed.get(i, frames[i])

    nst = len(profile.stacks)
    new_other = np.full(nst, -1, dtype=np.int64)
    new_mine = np.full(nst, -1, dtype=np.int64)
    for s in np.unique(profile.stack[~mine_rows]).tolist():
        new_other[s] = builder.stack_id([builder.frame_id(frame(i)) for i in profile.stacks[s]])
    outside_id = -1
    if outside is not None:
        outside_id = builder.stack_of(outside)
    for s in np.unique(profile.stack[mine_rows]).tolist():
        ids = profile.stacks[s]
        k = next((j for j, fid in enumerate(ids) if root[fid]), None)
        if k is None:
            new_mine[s] = outside_id
            continue
        rest = ids[k:]
        if dropped[list(rest)].any():
            continue
        new_mine[s] = builder.stack_id([builder.frame_id(frame(i)) for i in rest])

    new_stack = np.where(mine_rows, new_mine[profile.stack], new_other[profile.stack]) if len(profile) else \
        np.zeros(0, dtype=np.int64)
    keep = new_stack >= 0
    thread_map = np.array([builder.thread_id(t.tid, t.name) for t in profile.threads] or [0], dtype=np.int32)
    label_map = np.array([builder.labels_id(ls) for ls in profile.labelsets] or [0], dtype=np.int32)
    cols = aggregate_columns(
        profile.event[keep],
        new_stack[keep].astype(np.int32),
        thread_map[profile.thread[keep]] if keep.any() else profile.thread[keep],
        label_map[profile.labels[keep]] if keep.any() else profile.labels[keep],
        profile.time_ns[keep],
        profile.values[keep],
    )
    built = builder.build()
    return built.replace(**columns(cols), metadata=profile.metadata, tick_ns=profile.tick_ns)
