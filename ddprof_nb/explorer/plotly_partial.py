"""plotly's widget bundle with a plotly.js of only the trace types the explorer draws.

plotly's FigureWidget bundle (``widgetbundle.js``, ~5 MB) is plotly's widget code with the
whole plotly.js inside it (every trace type: maps, 3D, WebGL).  Evaluating it is the page's
longest task in a new kernel (~3 s of Chromium CPU on a loaded 2-core box) and nothing
draws meanwhile.  The explorer draws icicles (flame charts) and bars (the timeline), so
``with_partial_plotly`` swaps the plotly.js inside plotly's bundle for
``plotly_js/plotly-icicle-bar.min.js`` (plotly.js's core, icicle and bar; 1.3 MB; built
reproducibly by ``plotly_js/build.sh``), leaving plotly's widget code, the part that talks
to the Python FigureWidget, as the installed plotly made it.

The swap applies only where the bundle reads as expected: plotly.js is one CommonJS module
of the bundle (esbuild's wrapper around plotly.js's UMD build), and its major version is
the partial's (the widget code calls plotly.js's public API only: newPlot, restyle,
relayout, update, ...).  Otherwise the bundle is left whole.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["PARTIAL_JS", "with_partial_plotly", "partial_version"]

PARTIAL_JS = Path(__file__).with_name("plotly_js") / "plotly-icicle-bar.min.js"
_GLOBAL = "__ddprofPlotly"  # the partial's IIFE result (build.sh: --global-name)

# ``var LQ=fbe((DQ,hA)=>{(function(Q,ne){typeof hA=="object"&&hA.exports?hA.exports=ne():...``
# esbuild's CommonJS wrapper (LQ = its require, hA = its ``module``) around plotly.js's UMD
_CHUNK_START = re.compile(
    r'var ([\w$]+)=([\w$]+)\(\(([\w$]+),([\w$]+)\)=>\{\(function\(([\w$]+),([\w$]+)\)\{'
    r'typeof \4=="object"&&\4\.exports\?\4\.exports=\6\(\):\5\.moduleName=\6\(\)\}\)')
# the UMD's end: plotly.js's factory returns the module (and sets window.Plotly)
_CHUNK_END = re.compile(r'return window\.Plotly=([\w$]+),\1\}\)\}\);')
_VERSION = re.compile(r'\bversion="(\d+)\.\d+\.\d+"')


def partial_version() -> str:
    """The partial plotly.js's version (from its banner), e.g. ``"4.1.1"``."""
    with PARTIAL_JS.open(encoding="utf-8") as f:
        head = f.read(200)
    m = re.search(r"plotly\.js v(\d+\.\d+\.\d+)", head)
    return m[1] if m else ""


def with_partial_plotly(bundle: str, partial: str | None = None) -> str:
    """``bundle`` (plotly's widget bundle) with the partial plotly.js in place of the
    whole one, or ``bundle`` as it is where it does not read as expected."""
    start = _CHUNK_START.search(bundle)
    if start is None:
        return bundle
    end = _CHUNK_END.search(bundle, start.end())
    if end is None:
        return bundle
    whole = _VERSION.search(bundle, start.end(), end.start())
    if partial is None:
        try:
            partial = PARTIAL_JS.read_text(encoding="utf-8")
        except OSError:  # an install without the package data: the whole plotly.js
            return bundle
    ours = _VERSION.search(partial)
    if whole is None or ours is None or whole[1] != ours[1]:
        return bundle
    req, wrap, exports, module = start[1], start[2], start[3], start[4]
    chunk = f"var {req}={wrap}(({exports},{module})=>{{{partial}\n;{module}.exports={_GLOBAL}}});"
    return bundle[: start.start()] + chunk + bundle[end.end():]
