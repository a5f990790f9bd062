"""Notebook cells in profiles: name cell frames ``Cell In[N]`` and root stacks at the cell.

IPython compiles each cell under a generated file name and remembers which execution
count it belongs to in ``shell.compile._filename_map`` (IPython >= 8; its tracebacks
read ``Cell In[N], line L`` from it).  Terminal IPython names cells
``<ipython-input-N-<hash>>``; ipykernel names them after a hash of the cell's source
in a temporary folder (``/tmp/ipykernel_<pid>/<hash>.py``).  ``name_cells`` renames
the frames of such files so they read ``Cell In[N]`` — the cell's own line numbers
are kept (IPython compiles a cell with its first line as line 1).

``reroot`` is the companion the magics use: ``model.rooting.reroot`` (the cell's code
the root of every stack of the thread that ran it) with cell frames named on the way.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping

from .model import Frame, Profile, rooting, selection

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
    return selection.map_stacks(profile, lambda fs, ids: tuple(renamed.get(i, frames[i]) for i in ids))


def reroot(
    profile: Profile,
    tid: int,
    is_root: Callable[[Frame], bool],
    *,
    drop: Callable[[Frame], bool] | None = None,
    outside: tuple[Frame, ...] | None = None,
    rename: bool | object = False,
) -> Profile:
    """``model.rooting.reroot``; ``rename`` (True, or an IPython shell) also names cell
    frames as ``name_cells`` does."""
    renamed = _renamer(profile, None if rename is True else rename) if rename else None
    return rooting.reroot(profile, tid, is_root, drop=drop, outside=outside, renamed=renamed)
