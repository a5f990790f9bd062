"""The explorer's figures get plotly's widget code with a plotly.js of icicle and bar only
(``plotly_partial``): the vendored file is the one its build script makes, the swap happens
on the installed plotly's bundle, keeps the widget code, and leaves any bundle that reads
otherwise (or another plotly.js major version) whole."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess

import pytest

pytest.importorskip("plotly")
pytest.importorskip("anywidget")

from ddprof_nb.explorer import figure_widget as fw  # noqa: E402
from ddprof_nb.explorer import icicle_patch as ip  # noqa: E402
from ddprof_nb.explorer import plotly_partial as pp  # noqa: E402

HERE = pp.PARTIAL_JS.parent


def _whole() -> str:
    import plotly.graph_objects as go

    return str(go.FigureWidget._esm)


def test_the_vendored_file_is_the_one_its_build_records():
    sums = dict(reversed(line.split()) for line in (HERE / "SHA256SUMS").read_text().splitlines() if line)
    assert hashlib.sha256(pp.PARTIAL_JS.read_bytes()).hexdigest() == sums[pp.PARTIAL_JS.name]
    pinned = json.loads((HERE / "package.json").read_text())["dependencies"]["plotly.js"]
    lock = json.loads((HERE / "package-lock.json").read_text())["packages"]["node_modules/plotly.js"]
    assert pp.partial_version() == pinned == lock["version"]  # an exact version, locked
    assert (HERE / "LICENSE-plotly.js").read_text().startswith("MIT License")


def test_the_installed_plotlys_bundle_gets_the_partial_plotly():
    whole = _whole()
    out = pp.with_partial_plotly(whole)
    assert out is not whole and len(out) < len(whole) / 2, (len(out), len(whole))
    assert pp.PARTIAL_JS.read_text(encoding="utf-8") in out
    # the icicle and bar traces are in; traces the explorer never draws are not
    for trace in ("icicle", "bar"):
        assert f'src/traces/{trace}/index.js"' in out
    for trace in ("scattergl", "treemap", "sunburst", "scatter3d", "choroplethmap"):
        assert f'src/traces/{trace}/index.js"' in whole and f'src/traces/{trace}/index.js"' not in out
    # plotly's widget code (everything after its plotly.js) is as the installed plotly made it
    tail = whole[pp._CHUNK_END.search(whole).end():]
    assert out.endswith(tail) and "FigureModel" in tail
    assert "window.Plotly=" not in out  # the page's own Plotly, if any, stays


def test_the_icicle_changes_apply_to_the_partial_plotly():
    out = ip.lighter_icicle(pp.with_partial_plotly(_whole()))
    icicle = out[out.index(ip._ICICLE):][:5000]
    assert f"Math.max({ip.NARROW_LABEL_PX},{ip.LABEL_PX_PER_CHAR}*" in icicle
    assert out.count("__ddprofTextBox(") == 2  # defined, called once


def test_the_page_gets_the_partial_bundle_under_its_own_key():
    fw.figure_widget_class()
    bundle = fw._classes["bundle"]
    assert len(bundle) < 2_000_000 and b"__ddprofPlotly" in bundle
    assert "+icicle-bar" in fw._classes["figure"]._esm  # never a page's module of the whole plotly.js


def test_the_spliced_bundle_parses_as_a_module(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is missing: the bundle's syntax is checked where node is installed")
    path = tmp_path / "bundle.mjs"
    path.write_bytes(fw._classes["bundle"] if "bundle" in fw._classes else
                     ip.lighter_icicle(pp.with_partial_plotly(_whole())).encode())
    run = subprocess.run([node, "--check", str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


WRAPPED = ('var LQ=fbe((DQ,hA)=>{(function(Q,ne){typeof hA=="object"&&hA.exports?hA.exports=ne():Q.moduleName=ne()})'
           '(self,()=>{var Ve;Ve.version="%s";return window.Plotly=Q,Q})});var Md=dbe(LQ());widget()')


def test_a_small_bundle_gets_the_partial_with_its_module_wiring():
    partial = '"use strict";var __ddprofPlotly=(()=>{var x="4.1.1";return{version:x}})();\nversion="4.1.1"'
    out = pp.with_partial_plotly(WRAPPED % "4.0.2", partial)
    assert out == f'var LQ=fbe((DQ,hA)=>{{{partial}\n;hA.exports=__ddprofPlotly}});var Md=dbe(LQ());widget()'


@pytest.mark.parametrize("bundle", [
    "no plotly here",
    WRAPPED % "3.0.1",  # another major version of plotly.js: its own
    (WRAPPED % "4.0.2").replace("return window.Plotly=Q,Q", "return Q"),  # reads otherwise
    (WRAPPED % "4.0.2").replace("hA.exports?hA.exports=ne()", "hA.exports?hA.exports=ne(1)"),
])
def test_other_bundles_are_left_whole(bundle):
    assert pp.with_partial_plotly(bundle, 'var __ddprofPlotly=1;version="4.1.1"') is bundle


def test_a_missing_partial_leaves_the_bundle_whole(monkeypatch, tmp_path):
    monkeypatch.setattr(pp, "PARTIAL_JS", tmp_path / "absent.js")
    whole = WRAPPED % "4.0.2"
    assert pp.with_partial_plotly(whole) is whole


def test_the_build_script_pins_what_it_fetches():
    script = (HERE / "build.sh").read_text()
    assert "npm ci" in script and "sha256sum -c" in script  # the lockfile's versions, the recorded sum
    assert re.search(r'"esbuild": "\d+\.\d+\.\d+"', (HERE / "package.json").read_text())
