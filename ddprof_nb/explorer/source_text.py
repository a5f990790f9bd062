"""Source text for the explorer's source view: ``linecache`` and the IPython shell's cells."""

from __future__ import annotations

import linecache
import re

from ..cells import filename_map

__all__ = ["source_lines"]

_CELL_LABEL = re.compile(r"^Cell In\[(\d+)\]$")


def source_lines(filename: str) -> list[str]:
    """Source of ``filename`` from linecache; a cell renamed ``Cell In[N]`` (ddprof_nb.cells)
    is looked up under the name IPython compiled it with."""
    if not filename:
        return []
    lines = linecache.getlines(filename)
    m = _CELL_LABEL.match(filename)
    if lines or not m:
        return lines
    number = int(m.group(1))
    for real, n in filename_map().items():
        if n == number:
            return linecache.getlines(real)
    return []
