"""The demo notebooks (notebooks/NN-*.ipynb) and the quick start's headless command.

GIVEN the committed notebooks, THEN they are exactly what notebooks/_build.py writes,
with outputs cleared and no widget state.  WHEN each runs headless (nbclient, kernel
python3, widget state stored, via ``ddprof_nb.demo``) in this environment, THEN no cell
raises, every profiled cell shows an explorer whose text summary names the cell's hot
function (the names are in each cell's ``metadata["ddprof_nb"]["expect"]``), and the
notebook finishes within the time budget.  Notebooks whose event types no engine here
can sample yet (alloc, lock, park) are skipped, saying so.

``DDPROF_NB_NOTEBOOK_BUDGET_S`` (default 60) is the per-notebook budget for running
the cells on a 2-core machine; raise it on a machine that is busy with other work.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
NB_DIR = ROOT / "notebooks"
EXPECTED = [
    "01-quickstart", "02-threads-and-the-gil", "03-memory", "04-locks-and-waiting",
    "05-labels-and-asyncio", "06-compare-two-versions", "07-export-and-share",
]
BUDGET_S = float(os.environ.get("DDPROF_NB_NOTEBOOK_BUDGET_S", "60"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _read(name: str):
    return nbformat.read(NB_DIR / f"{name}.ipynb", as_version=4)


def _needs(name: str) -> list[str]:
    return list(_read(name).metadata.get("ddprof_nb", {}).get("needs", ["cpu", "wall"]))


def _unsupported(events) -> str | None:
    """Why the engines here cannot sample ``events`` (None when they can)."""
    from ddprof_nb.config import SamplerConfig
    from ddprof_nb.errors import EngineUnavailableError
    from ddprof_nb.sampler import choose_engine

    try:
        choose_engine(SamplerConfig.make(events=list(events)))
    except EngineUnavailableError as exc:
        return str(exc)
    return None


def _output_text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return f"{output.get('ename')}: {output.get('evalue')}"
    return output.get("data", {}).get("text/plain", "")


# -- the committed files ------------------------------------------------------------------

def test_the_seven_notebooks_are_there():
    assert sorted(p.stem for p in NB_DIR.glob("[0-9][0-9]-*.ipynb")) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_committed_notebook_is_clean(name):
    # GIVEN a committed notebook THEN it has no outputs, counts or widget state (a saved
    # explorer state embeds megabytes of JavaScript and the profile of someone's machine)
    nb = _read(name)
    nbformat.validate(nb)
    assert "widgets" not in nb.metadata, f"{name}: widget state stored; clear it (run notebooks/_build.py)"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{name} cell {i}: outputs not cleared"
            assert cell.execution_count is None, f"{name} cell {i}: execution count stored"
        assert "execution" not in cell.metadata, f"{name} cell {i}: execution timing metadata stored"


def test_notebooks_are_generated_by_the_build_script():
    # WHEN _build.py --check compares what it would write with the committed files
    r = subprocess.run([sys.executable, str(NB_DIR / "_build.py"), "--check"], capture_output=True, text=True)
    # THEN they are identical (edit the stories in notebooks/_build.py, not the .ipynb files)
    assert r.returncode == 0, r.stderr + r.stdout


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_states_what_it_checks(name):
    # every profiled cell names the functions its summary must show; the first code cell
    # loads the extension
    nb = _read(name)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].source.startswith("%load_ext ddprof_nb")
    profiled = [c for c in code if c.source.startswith("%%ddprof")]
    assert profiled, f"{name}: no %%ddprof cell"
    for cell in profiled:
        assert cell.metadata.get("ddprof_nb", {}).get("profiled") is True


# -- running them -------------------------------------------------------------------------

_runs: dict[str, object] = {}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Run a notebook once per test session (a copy, so files it writes stay in tmp)."""

    def _run(name: str):
        if name not in _runs:
            from ddprof_nb.demo import CellFailed, run_notebook

            work = tmp_path_factory.mktemp(name)
            shutil.copy(NB_DIR / f"{name}.ipynb", work / f"{name}.ipynb")
            start = time.perf_counter()
            try:
                result = run_notebook(work / f"{name}.ipynb", work / "out", timeout=300)
            except CellFailed as exc:
                _runs[name] = exc
            else:
                result.seconds = time.perf_counter() - start
                _runs[name] = result
        got = _runs[name]
        if isinstance(got, Exception):
            pytest.fail(str(got), pytrace=False)
        return got

    return _run


def _check_outputs(name: str, nb) -> None:
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("ddprof_nb", {})
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{name} cell {i}: {errors[0].ename}: {errors[0].evalue}"
        text = "\n".join(_output_text(o) for o in cell.outputs)
        where = f"{name} cell {i} ({cell.source.splitlines()[0]})"
        if meta.get("profiled"):
            # THEN the cell shows an explorer widget, its state was stored, and its text
            # summary (the mimebundle's text/plain: the top table) names the hot function
            views = [o for o in cell.outputs if WIDGET_VIEW in o.get("data", {})]
            assert views, f"{where}: no explorer widget in the outputs:\n{text[:2000]}"
            model_id = views[-1].data[WIDGET_VIEW]["model_id"]
            assert model_id in state, f"{where}: the explorer's widget state was not stored"
            summary = views[-1].data.get("text/plain", "")
            assert summary.strip(), f"{where}: the explorer has no text summary"
            for expected in meta.get("expect", ()):
                assert expected in summary, f"{where}: {expected!r} not in the explorer's summary:\n{summary}"
        else:
            for expected in meta.get("expect", ()):
                assert expected in text, f"{where}: {expected!r} not in the output:\n{text[:2000]}"


SLOW = [pytest.param(n, marks=pytest.mark.slow) for n in EXPECTED]


@pytest.mark.parametrize("name", SLOW)
def test_notebook_runs_headless(name, run):
    missing = _unsupported(_needs(name))
    if missing:
        pytest.skip(f"{name} samples {', '.join(_needs(name))}: {missing}")
    result = run(name)
    _check_outputs(name, result.notebook)
    cells_s = sum(result.cell_seconds)
    assert cells_s < BUDGET_S, (
        f"{name}: the cells took {cells_s:.1f} s (budget {BUDGET_S:.0f} s; per cell: "
        + ", ".join(f"{s:.1f}" for s in result.cell_seconds) + ")")
    # the report of the last profile was written next to the executed notebook
    assert result.report_path is not None and result.report_path.stat().st_size > 10_000
    assert result.executed_path.exists()


@pytest.mark.slow
def test_labels_follow_asyncio_tasks(run):
    # GIVEN 05's service, where each request's handler runs under labels(endpoint=...) and
    # awaits before rendering, THEN the renderers' CPU samples carry their own endpoint
    if _unsupported(_needs("05-labels-and-asyncio")):
        pytest.skip("cpu/wall not available")
    result = run("05-labels-and-asyncio")
    text = "\n".join(_output_text(o) for c in result.notebook.cells if c.cell_type == "code" for o in c.outputs)
    shares = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+)\s+([\d.]+)% of its CPU samples", text, re.M)}
    assert set(shares) == {"render_search", "sign_receipt"}, text[-2000:]
    assert all(share >= 80 for share in shares.values()), shares


def test_demo_names_the_failing_cell(tmp_path):
    # GIVEN a notebook whose second code cell raises
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# broken"),
                                         nbformat.v4.new_code_cell("x = 1"),
                                         nbformat.v4.new_code_cell("def f():\n    return 1 / 0\nf()")])
    nbformat.write(nb, tmp_path / "broken.ipynb")
    # WHEN the demo runner executes it
    r = subprocess.run([sys.executable, "-m", "ddprof_nb.demo", str(tmp_path / "broken.ipynb"), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    # THEN it fails with one message naming the cell and the error, and keeps the executed
    # notebook (with the traceback) for reading
    assert r.returncode == 1, r.stdout + r.stderr
    assert "code cell 2 of 2" in r.stderr and "ZeroDivisionError: division by zero" in r.stderr, r.stderr
    assert "cell starts: def f():" in r.stderr
    executed = nbformat.read(tmp_path / "out" / "broken.ipynb", as_version=4)
    assert executed.cells[2].outputs[-1].output_type == "error"


def test_demo_says_when_no_profile_was_taken(tmp_path):
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), tmp_path / "plain.ipynb")
    r = subprocess.run([sys.executable, "-m", "ddprof_nb.demo", str(tmp_path / "plain.ipynb"), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "took no profile" in r.stderr, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "ddprof_nb.demo", str(tmp_path / "missing.ipynb"), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no such notebook" in r.stderr, r.stdout + r.stderr


# -- the quick start's first command, headless ------------------------------------------------

def _copy_tree(dest: Path) -> Path:
    """The working tree's source files (tracked and new, not ignored) copied to ``dest``:
    what a fresh clone would hold, without venvs or build products."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
            ".git", ".venv*", ".venvs", "build", "dist", "*.egg-info", "__pycache__", "*.so", "out", "exports"))
        return dest
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.mark.slow
def test_demo_sh_headless_runs_the_quickstart(tmp_path):
    # GIVEN a fresh copy of the repository (no venv yet)
    repo = _copy_tree(tmp_path / "repo")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("VIRTUAL_ENV", None)
    # WHEN the quick start's first command runs in its headless form
    r = subprocess.run(["bash", "scripts/demo.sh", "--headless", str(out)], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=1200)
    log = (r.stdout + r.stderr)[-4000:]
    # THEN it set up its venv, executed the notebook and wrote the report
    assert r.returncode == 0, log
    assert (repo / ".venvs" / "demo" / "bin" / "python").exists()
    executed = nbformat.read(out / "01-quickstart.ipynb", as_version=4)
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "not every cell ran"
    _check_outputs("01-quickstart (demo.sh)", executed)
    report = (out / "01-quickstart.report.html").read_text(encoding="utf-8")
    assert report.lstrip().lower().startswith("<!doctype html") and "plotly" in report.lower()
    # and printed where they are and the top functions of the last profile
    assert "HTML report of the last profile" in r.stdout and "tokenize_fast" in r.stdout, log
