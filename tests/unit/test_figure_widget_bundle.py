"""The plotly bundle the explorer's figures share leaves out the icicle's labels on
slices too narrow to show them (plotly measured each label with a forced layout), and
only there: the treemap's code and any plotly whose code reads otherwise stay as they are."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("plotly")
pytest.importorskip("anywidget")

from ddprof_nb.explorer import figure_widget as fw  # noqa: E402

ICICLE = '"src/traces/icicle/draw_descendants.js"'
TREEMAP = '"src/traces/treemap/draw_descendants.js"'


def _module(bundle: str, marker: str) -> str:
    start = bundle.index(marker)
    return bundle[start:start + 5000]


def test_the_installed_plotlys_icicle_skips_narrow_labels():
    import plotly.graph_objects as go

    plain = str(go.FigureWidget._esm)
    patched = fw.skip_narrow_labels(plain)
    # a plotly upgrade that moved this code fails here rather than silently losing the change
    test = re.search(r'(\w+)\._text=\w+\([\w,]*\)\|\|"",Math\.abs\(\1\.x1-\1\.x0\)<Math\.max\((\d+),(\d+)\*\1\._text\.length\)'
                     r'&&\(\1\._text=""\);', _module(patched, ICICLE))
    assert test is not None
    assert (int(test[2]), int(test[3])) == (fw.NARROW_LABEL_PX, fw.LABEL_PX_PER_CHAR)
    assert _module(patched, TREEMAP) == _module(plain, TREEMAP)
    assert patched.replace(test[0], test[0].split(",Math")[0] + ";") == plain  # nothing else changed


def test_the_page_gets_the_patched_bundle():
    fw.figure_widget_class()
    assert f"Math.max({fw.NARROW_LABEL_PX},".encode() in fw._classes["bundle"]


@pytest.mark.parametrize("bundle", [
    "no plotly here",
    ICICLE + " other code; " + 'U.x0===U.x1||U.y0===U.y2?U._text="":U._text=f(U,m)||"";',  # reads otherwise
    ICICLE + " " * 6000 + 'U.x0===U.x1||U.y0===U.y1?U._text="":U._text=f(U,m)||"";',  # another module's
])
def test_other_code_is_left_unchanged(bundle):
    assert fw.skip_narrow_labels(bundle) == bundle
