"""The Profile algebra: the data, and every operation that makes a Profile from Profiles.

- ``data``: interned frames, label sets, threads, metadata; the row columns and their
  aggregation; the interning tables (``Interner``);
- ``profile``: the immutable ``Profile`` and ``Profile.replace``; its methods call the modules below;
- ``builder``: ``ProfileBuilder``, raw samples in, a Profile out;
- ``selection``: filter, merge, map_stacks (which samples and frames a view keeps);
- ``calltree``: call-tree transforms (sandwich, inverted, merge/drop function, collapse);
- ``top``: the one top-row type, grouped by function, line or file, and the one diff;
- ``rooting``: which frame a thread's stacks start at (reroot, trim_prefix).

Imports inside go one way: data <- selection <- calltree, top, rooting; profile imports
selection, calltree and top for its methods; builder imports profile.
Every other module of the package makes Profiles through this package; files are written
by ``ddprof_nb.save`` (the exporters), never by a Profile.
"""

from .data import (
    EMPTY_LABELS, MAX_TICKS, MIN_TICK_NS, CSRStacks, Frame, Interner, LabelSet, Metadata, Sample, Thread,
    aggregate_columns, columns, tick_for,
)
from .profile import Profile
from .builder import ProfileBuilder

__all__ = [
    "Frame", "LabelSet", "Thread", "Metadata", "Sample", "Profile", "ProfileBuilder", "Interner", "CSRStacks",
    "MAX_TICKS", "MIN_TICK_NS", "EMPTY_LABELS", "aggregate_columns", "columns", "tick_for",
]
