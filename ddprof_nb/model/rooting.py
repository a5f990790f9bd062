"""Rooting: which frame a thread's stacks start at.

``reroot`` makes a chosen frame (a notebook cell's code, a script's) the root of every
stack of one thread, leaving out that thread's samples taken outside it; ``trim_prefix``
drops the frames that were already on the starting thread's stack when profiling began.
Both return new Profiles (``selection.map_stacks`` semantics: stacks that become equal
merge).  How a cell's frames are named is the session's business (``cells``): here a
renaming is a map from frame index to Frame.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from . import selection
from .data import Frame, Interner

__all__ = ["reroot", "trim_prefix"]


def reroot(
    profile: Profile,
    tid: int,
    is_root: Callable[[Frame], bool],
    *,
    drop: Callable[[Frame], bool] | None = None,
    outside: tuple[Frame, ...] | None = None,
    renamed: Mapping[int, Frame] | None = None,
) -> Profile:
    """Root the stacks of thread ``tid`` at their first frame for which ``is_root`` holds.

    For that thread's samples only: frames above the root are cut; a sample whose stack
    has no root frame is left out — or, when ``outside`` is given, attributed to the
    stack ``outside`` (e.g. the cell and an ``[await]`` frame for an async cell waiting
    in the event loop); a re-rooted stack holding a frame for which ``drop`` holds (the
    profiler's own code) is left out.  Other threads keep their stacks.  ``renamed``
    (frame index -> Frame) renames frames on the way.  Values of merged stacks add up;
    the metadata is kept.
    """
    nframes = len(profile.frames)
    root = np.fromiter((bool(is_root(f)) for f in profile.frames), dtype=bool, count=nframes)
    dropped = (np.fromiter((bool(drop(f)) for f in profile.frames), dtype=bool, count=nframes)
               if drop is not None else np.zeros(nframes, dtype=bool))
    renamed = renamed or {}
    mine_threads = [i for i, t in enumerate(profile.threads) if t.tid == tid]
    mine_rows = np.isin(profile.thread, mine_threads) if mine_threads else np.zeros(len(profile), dtype=bool)

    tables = Interner()
    frames = profile.frames

    def stack_id(ids) -> int:
        return tables.stack_id([tables.frame_id(renamed.get(i, frames[i])) for i in ids])

    new_stack = np.full(len(profile.stacks), -1, dtype=np.int64)  # other threads' stacks
    new_mine = np.full(len(profile.stacks), -1, dtype=np.int64)
    for s in np.unique(profile.stack[~mine_rows]).tolist():
        new_stack[s] = stack_id(profile.stacks[s])
    outside_id = tables.stack_of(outside) if outside is not None else -1
    for s in np.unique(profile.stack[mine_rows]).tolist():
        ids = profile.stacks[s]
        k = next((j for j, fid in enumerate(ids) if root[fid]), None)
        if k is None:
            new_mine[s] = outside_id
        elif not dropped[list(ids[k:])].any():
            new_mine[s] = stack_id(ids[k:])

    row_stack = (np.where(mine_rows, new_mine[profile.stack], new_stack[profile.stack]) if len(profile)
                 else np.zeros(0, dtype=np.int64))
    return selection.restacked(profile, tables, row_stack, keep=row_stack >= 0)


def trim_prefix(profile: Profile, thread_tid: int, prefix, keep_last: bool) -> Profile:
    """Drop ``prefix`` (frames that were already on the starting thread's stack) from the
    root of that thread's stacks, so the profiled code is the root.  ``keep_last`` keeps
    the frame that started profiling (e.g. the function holding a ``with`` block)."""
    prefix = list(prefix)
    if not prefix:
        return profile
    cut = len(prefix) - (1 if keep_last else 0)
    tids = {i for i, t in enumerate(profile.threads) if t.tid == thread_tid}
    if not tids:
        return profile
    rows_by_stack: dict[int, set[int]] = {}
    for s, t in zip(profile.stack.tolist(), profile.thread.tolist()):
        rows_by_stack.setdefault(s, set()).add(t)

    keys = [(f.name, f.filename, f.first_line) for f in profile.frames]  # (once per frame, not per stack)

    def trim(ids):
        if len(ids) > cut and all(keys[f] == p for f, p in zip(ids[:len(prefix)], prefix)):
            return ids[cut:]
        return ids

    # only the starting thread's stacks are trimmed; a stack shared with other threads
    # keeps its full form for them, so split by thread before mapping
    if any(len(ts - tids) and len(ts & tids) for ts in rows_by_stack.values()):
        other = selection.filter(profile, threads=[t.tid for i, t in enumerate(profile.threads) if i not in tids])
        mine = selection.filter(profile, threads=[thread_tid])
        return selection.merge(selection.map_stack_ids(mine, trim), other)
    return selection.map_stack_ids(profile, trim)
