"""The plotly bundle the explorer's figures share: its icicle leaves out labels too narrow
to show and measures plain labels without a layout (plotly forced one per label), and
only there: the treemap's code and any plotly whose code reads otherwise stay as they are."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("plotly")
pytest.importorskip("anywidget")

from ddprof_nb.explorer import figure_widget as fw  # noqa: E402
from ddprof_nb.explorer import icicle_patch as ip  # noqa: E402

ICICLE = '"src/traces/icicle/draw_descendants.js"'
TREEMAP = '"src/traces/treemap/draw_descendants.js"'
SMALL = ICICLE + ' x U.x0===U.x1||U.y0===U.y1?U._text="":U._text=f(U,m)||"";var q;U.textBB=i.bBox(Y.node()),z;'


def _module(bundle: str, marker: str) -> str:
    start = bundle.index(marker)
    return bundle[start:start + 5000]


def test_the_installed_plotlys_icicle_is_changed_in_both_places():
    import plotly.graph_objects as go

    plain = str(go.FigureWidget._esm)
    patched = ip.lighter_icicle(plain)
    icicle = _module(patched, ICICLE)
    # a plotly upgrade that moved this code fails here rather than silently losing the change
    narrow = re.search(r'(\w+)\._text=\w+\([\w,]*\)\|\|"",Math\.abs\(\1\.x1-\1\.x0\)<Math\.max\((\d+),(\d+)\*\1\._text\.length\)'
                       r'&&\(\1\._text=""\);', icicle)
    assert narrow is not None
    assert (int(narrow[2]), int(narrow[3])) == (ip.NARROW_LABEL_PX, ip.LABEL_PX_PER_CHAR)
    assert re.search(r"\w+\.textBB=__ddprofTextBox\((\w+)\.node\(\),\(\)=>\w+\.bBox\(\1\.node\(\)\)\)", icicle)
    assert patched.startswith("function __ddprofTextBox(")
    assert _module(patched, TREEMAP) == _module(plain, TREEMAP)
    assert "i.bBox(" in _module(plain, ICICLE) and patched.count("__ddprofTextBox(") == 2  # defined, called once


def test_the_page_gets_the_changed_bundle():
    fw.figure_widget_class()
    bundle = fw._classes["bundle"]
    assert f"Math.max({ip.NARROW_LABEL_PX},".encode() in bundle and b"=__ddprofTextBox(" in bundle


def test_a_small_icicle_module_gets_both_changes():
    out = ip.lighter_icicle(SMALL)
    assert out.endswith(ICICLE + ' x U.x0===U.x1||U.y0===U.y1?U._text="":U._text=f(U,m)||"",'
                        'Math.abs(U.x1-U.x0)<Math.max(10,3*U._text.length)&&(U._text="");var q;'
                        'U.textBB=__ddprofTextBox(Y.node(),()=>i.bBox(Y.node())),z;')


@pytest.mark.parametrize("bundle", [
    "no plotly here",
    SMALL.replace("U.y1?", "U.y2?").replace("i.bBox(Y.node())", "i.bBox(Y)"),  # reads otherwise
    ICICLE + " " * 6000 + SMALL[len(ICICLE):],  # too far: another module's code
])
def test_other_code_is_left_unchanged(bundle):
    assert ip.lighter_icicle(bundle) == bundle
