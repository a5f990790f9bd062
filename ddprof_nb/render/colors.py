"""The one colour scheme: frames coloured by the package or file they belong to.

A module name hashes (crc32, never Python's salted ``hash``) to a hue, so a package
keeps its colour across profiles, sessions and outputs (explorer, HTML report, static
flame).  Pseudo-frames (GC, locks, threads...) have fixed colours by kind.  Every colour
is light enough for the dark node text ``TEXT_COLOR``.
"""

from __future__ import annotations

import colorsys
import functools
import os
import re
import sysconfig
import zlib

from ..events import FrameKind
from ..model import Frame

__all__ = [
    "module_of", "is_library", "color_for", "frame_color", "faded", "diff_color", "state_color",
    "ROOT_COLOR", "OTHER_COLOR", "TEXT_COLOR", "LINE", "HIT_LINE",
]

def _stdlib_dirs() -> tuple[str, ...]:
    dirs = set()
    for key in ("stdlib", "platstdlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.add(os.path.normpath(p))
            dirs.add(os.path.realpath(p))
    return tuple(sorted(dirs, key=len, reverse=True))


_STDLIB_DIRS = _stdlib_dirs()
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # ddprof_nb itself
_LIB_RE = re.compile(r"/lib/python\d\.\d+t?/(?:(site|dist)-packages/)?")
_ABI_TAG = re.compile(r"\.(cpython-[^.]*|abi3|pypy[^.]*)$")
_CELL_RE = re.compile(r"(?:ipykernel_\d+/\d+\.py$|^<ipython-input-|^<cell|^Cell In\[)")


def module_of(frame: Frame) -> str:
    """The top-level package (site-packages, stdlib) or file a frame belongs to.

    Pseudo-frames map to their bracketed kind, notebook cells to ``notebook``.  This is
    what colours hash, so a package keeps its colour across profiles and sessions.
    """
    return _module_of(frame.kind, frame.filename)


# Memoized by (kind, file), all the answer depends on: a chart's legend and node colours
# ask again for thousands of functions of a few hundred files at every redraw (the regexes
# and path walks cost ~0.1 s per redraw of a 4000-function profile).
@functools.lru_cache(maxsize=1 << 14)
def _module_of(kind: FrameKind, filename: str) -> str:
    if kind is FrameKind.NATIVE and filename:
        return _library_of(filename.replace("\\", "/"))
    if kind is not FrameKind.PYTHON:
        return f"[{kind.label}]"
    fn = (filename or "").replace("\\", "/")
    if not fn:
        return "?"
    if fn.startswith("<frozen "):
        return fn[len("<frozen ") : -1].split(".")[0]
    if _CELL_RE.search(fn):
        return "notebook"
    found = list(_LIB_RE.finditer(fn))  # the last one: a venv inside a project inside ...
    if found:
        m = found[-1]
        top = fn[m.end() :].split("/")[0]
        return top[:-3] if top.endswith(".py") else top
    for d in _STDLIB_DIRS:
        if fn.startswith(d + "/"):
            top = fn[len(d) + 1 :].split("/")[0]
            return top[:-3] if top.endswith(".py") else top
    base = fn.rsplit("/", 1)[-1]
    return base[:-3] if base.endswith(".py") else base


def _library_of(path: str) -> str:
    """A native frame's library as a module: an installed package's own (its extension modules
    and the libraries its wheel vendors, ``numpy.libs/``) is that package, coloured as its
    Python frames; any other is the file's name without its version (``libc``, ``libpython3.11``)."""
    found = list(_LIB_RE.finditer(path))
    if found:
        top = path[found[-1].end():].split("/")[0]
        return top[: -len(".libs")] if top.endswith(".libs") else top
    base = path.rsplit("/", 1)[-1]
    base = base.split(".so", 1)[0] if ".so" in base else base
    return _ABI_TAG.sub("", base)  # (an extension module: its name)


def is_library(frame: Frame) -> bool:
    """True for frames that are not the user's code: stdlib, site-packages, frozen, native,
    and ddprof_nb's own frames.  Pseudo-frames (GC, lock, ...) are not library frames."""
    if frame.kind is FrameKind.NATIVE:
        return True
    if frame.kind is not FrameKind.PYTHON:
        return False
    fn = (frame.filename or "").replace("\\", "/")
    if not fn or _CELL_RE.search(fn):
        return False
    if fn.startswith("<frozen ") or _LIB_RE.search(fn):
        return True
    if fn.startswith(_PKG_DIR + "/"):
        return True
    return any(fn.startswith(d + "/") for d in _STDLIB_DIRS)


_KIND_COLORS = {
    FrameKind.GC: "#c9b458",
    FrameKind.THREAD: "#a7a7a7",
    FrameKind.TRUNCATED: "#bdbdbd",
    FrameKind.ERROR: "#e57373",
    FrameKind.LOCK: "#e0a060",
    FrameKind.BLOCKER: "#d4a0d8",
    FrameKind.ALLOC_TYPE: "#8fc9c0",
    FrameKind.UNKNOWN: "#bdbdbd",
    FrameKind.NATIVE: "#b0a8c8",
}
ROOT_COLOR = "#9aa0a6"
OTHER_COLOR = "#c4c4c4"
TEXT_COLOR = "#1b1b1b"  # node text: every node colour is light enough for dark text
LINE = "rgba(255,255,255,0.6)"
HIT_LINE = "#d6006f"  # border of search matches


def _hsl(h: float, s: float, light: float) -> str:
    r, g, b = colorsys.hls_to_rgb(h % 1.0, light, s)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def color_for(module: str) -> str:
    """A stable colour for a module name: crc32 -> hue (never Python's salted ``hash``).

    Lightness 0.68-0.76 and saturation ~0.55 keep dark node text readable, and the
    blocks stand out on both light and dark notebook themes.
    """
    h = zlib.crc32(module.encode("utf-8", "surrogatepass"))
    hue = (h & 0xFFFF) / 0x10000
    sat = 0.45 + ((h >> 16) & 0xFF) / 255 * 0.2
    light = 0.68 + ((h >> 24) & 0xFF) / 255 * 0.08
    return _hsl(hue, sat, light)


def frame_color(frame: Frame) -> str:
    return _frame_color(frame.kind, frame.filename)


@functools.lru_cache(maxsize=1 << 14)
def _frame_color(kind: FrameKind, filename: str) -> str:
    if kind is FrameKind.NATIVE and filename:  # by library, as Python frames are by package
        return color_for(_module_of(kind, filename))
    return _KIND_COLORS.get(kind) or color_for(_module_of(kind, filename))


def faded(color: str) -> str:
    """The colour washed towards grey: non-matching nodes while searching."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    mix = lambda c: round(c * 0.25 + 0xD6 * 0.75)  # noqa: E731
    return f"#{mix(r):02x}{mix(g):02x}{mix(b):02x}"


def diff_color(rel: float) -> str:
    """Red for growth (rel > 0), blue for shrinkage; rel in [-1, 1]; white-ish near 0."""
    rel = max(-1.0, min(1.0, rel))
    t = abs(rel) ** 0.7
    if rel >= 0:  # towards #e8504a
        r, g, b = 0xF2 + (0xE8 - 0xF2) * t, 0xF2 + (0x50 - 0xF2) * t, 0xF2 + (0x4A - 0xF2) * t
    else:  # towards #4a7fe8
        r, g, b = 0xF2 + (0x4A - 0xF2) * t, 0xF2 + (0x7F - 0xF2) * t, 0xF2 + (0xE8 - 0xF2) * t
    return f"#{round(r):02x}{round(g):02x}{round(b):02x}"


_STATE_COLORS = {
    "cpu": "#3bab5a", "running": "#3bab5a", "on-cpu": "#3bab5a", "r": "#3bab5a",
    "off-cpu": "#9aa3ad", "sleep": "#8fa8c8", "sleeping": "#8fa8c8", "idle": "#b8bec5",
    "lock": "#e08a3c", "futex": "#e08a3c", "wait": "#e0b03c",
    "select": "#4a8fe0", "io": "#4a8fe0", "poll": "#4a8fe0", "epoll": "#4a8fe0", "socket": "#4a8fe0",
    "gil": "#a066d3", "samples": "#5c8fd6",
}


def state_color(state: str) -> str:
    return _STATE_COLORS.get(state.lower()) or color_for("state:" + state)


