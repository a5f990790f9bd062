"""Pseudo-frames explained where a reader meets them (chart hover, static SVG, legend),
from one table; the colour legend lists no entry that rounds to 0 %."""

from __future__ import annotations

import re
from pathlib import Path

from ddprof_nb import render as F
from ddprof_nb.events import EventType, FrameKind
from ddprof_nb.model import Frame, Metadata, ProfileBuilder

MS = 1_000_000
PKG = Path(F.__file__).resolve().parents[1]
MAIN = Frame("main", "/home/user/app.py", 3, 1)
UNSAMPLED = Frame("[cpu not sampled]", kind=FrameKind.ERROR)
IDLE = Frame("[idle]", kind=FrameKind.BLOCKER)
GC = Frame("[GC]", kind=FrameKind.GC)


def profile(rows):
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=1000 * MS))
    t = b.thread_id(1, "MainThread")
    for stack, ms in rows:
        b.add(EventType.CPU, b.stack_of(stack), t, 0, 0, 1, ms * MS)
    return b.build()


def test_every_pseudo_frame_the_package_makes_has_a_meaning():
    made = set()
    for path in PKG.rglob("*.py"):
        made |= set(re.findall(r'Frame\("(\[[^"\]]+\])"', path.read_text(encoding="utf-8")))
    assert {"[idle]", "[cpu not sampled]", "[GC]", "[truncated]"} <= made  # the scan finds them
    assert made <= set(F.PSEUDO_FRAMES), made - set(F.PSEUDO_FRAMES)
    for kind in FrameKind:
        assert kind is FrameKind.PYTHON or F.explain_kind(kind)


def test_the_hover_of_a_pseudo_frame_says_what_it_means():
    p = profile([([MAIN], 500), ([MAIN, UNSAMPLED], 300), ([MAIN, IDLE], 150), ([MAIN, GC], 50)])
    fd = F.flame_data(F.call_tree(p, EventType.CPU), min_pct=0)
    hover = {cd[0]: cd[1] for cd in fd.customdata}
    assert hover["[cpu not sampled]"] == F.esc(F.PSEUDO_FRAMES["[cpu not sampled]"])
    assert hover["[idle]"].startswith("the asyncio event loop waiting")
    assert hover["[GC]"] == F.esc(F.PSEUDO_FRAMES["[GC]"])
    assert hover["main"] == "/home/user/app.py:1"  # a function keeps its file:line
    svg = F.static_flame_html(fd)
    assert "no sample caught" in svg  # the static chart's tooltips too


def test_the_legend_has_no_empty_entry_and_explains_pseudo_kinds():
    # [error] holds 0.1 % of self: shown as "0 %" it would say nothing
    p = profile([([MAIN], 699), ([MAIN, IDLE], 300), ([MAIN, UNSAMPLED], 1)])
    tree = F.call_tree(p, EventType.CPU)
    legend = F.color_legend(tree)
    assert [m for m, _, _ in legend] == ["app", "[blocker]"]
    html = F.legend_html(tree)
    assert "[error]" not in html and " 0%" not in html
    assert f"title='{F.esc(F.explain_kind(FrameKind.BLOCKER))}'" in html
