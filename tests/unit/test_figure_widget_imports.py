"""The explorer's FigureWidget class imports plotly without nbformat (whose jsonschema
import compiles a grammar for seconds with rfc3987-syntax installed), and plotly's own
MIME rendering still finds nbformat when it needs it.  Fresh interpreters: the test
process has imported both long ago."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("nbformat", reason="nbformat is not installed: nothing to leave unimported")

CHECK = """
import sys
from ddprof_nb.explorer.figure_widget import figure_widget_class
figure_widget_class()
print("nbformat" in sys.modules, "jsonschema" in sys.modules)
import plotly.graph_objects as go, plotly.io as pio
pio.show(go.Figure(go.Bar(y=[1, 2])), renderer="plotly_mimetype")  # checks nbformat's version
print("nbformat" in sys.modules)
"""


def _run(code: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_widget_class_leaves_nbformat_until_plotly_renders():
    before, jsonschema, after = (_run(CHECK)[i] for i in (0, 1, -1))
    assert (before, jsonschema, after) == ("False", "False", "True")


def test_an_imported_nbformat_is_left_as_it_is():
    out = _run("import nbformat\nimport plotly.io._renderers as r\n" + CHECK + "print(r.nbformat is sys.modules['nbformat'])")
    assert out[-1] == "True"


PRELOAD = """
import sys, types
from ddprof_nb.magics.display import preload
from ddprof_nb.explorer.figure_widget import figure_widget_class
from ddprof_nb.explorer.threads import KERNEL_THREAD_NAMES
print("plotly" in sys.modules, "ipywidgets" in sys.modules)
assert preload(types.SimpleNamespace(), "auto") is None  # no kernel: no explorer to prepare for
thread = preload(types.SimpleNamespace(kernel=object()), "auto")
asked = figure_widget_class()  # at once, while the thread imports: one class for both
thread.join(120)
print(KERNEL_THREAD_NAMES.match(thread.name) is not None, thread.is_alive())
print("plotly.graph_objs" in sys.modules, "ipywidgets" in sys.modules, "anywidget" in sys.modules,
      "ddprof_nb.explorer.widget" in sys.modules, asked is figure_widget_class())
"""


def test_preload_imports_the_explorers_modules_in_a_hidden_thread():
    out = _run(PRELOAD)
    assert out[:2] == ["False", "False"]  # nothing imported before
    assert out[2:4] == ["True", "False"]  # the profiler's thread, finished
    assert out[4:] == ["True"] * 5
