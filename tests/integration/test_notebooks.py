"""The demo notebooks (notebooks/NN-*.ipynb) and the quick start's headless command.

GIVEN the committed notebooks, THEN they are exactly what notebooks/_build.py writes,
with outputs cleared and no widget state, and each profiled cell names the functions its
summary must show.  The demo runner (``python -m ddprof_nb.demo``, the quick start's
headless form) names a failing cell and says when no profile was taken; the quick
start's first command (scripts/demo.sh) sets up its venv and runs notebook 01.

Every notebook runs headless in test_binder.py, in the venv Binder would build (the
checks are in notebook_expectations.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

# the checks shared with test_binder.py (same folder: pytest puts it on sys.path)
from notebook_expectations import NB_DIR, NOTEBOOKS, check_outputs, read  # noqa: E402

EXPECTED = NOTEBOOKS


# -- the committed files ------------------------------------------------------------------

@pytest.mark.pure_python  # (committed files and the demo runner's messages: nothing is sampled)
def test_the_eight_notebooks_are_there():
    assert sorted(p.stem for p in NB_DIR.glob("[0-9][0-9]-*.ipynb")) == EXPECTED


@pytest.mark.pure_python  # (committed files and the demo runner's messages: nothing is sampled)
@pytest.mark.parametrize("name", EXPECTED)
def test_committed_notebook_is_clean(name):
    # GIVEN a committed notebook THEN it has no outputs, counts or widget state (a saved
    # explorer state embeds megabytes of JavaScript and the profile of someone's machine)
    nb = read(name)
    nbformat.validate(nb)
    assert "widgets" not in nb.metadata, f"{name}: widget state stored; clear it (run notebooks/_build.py)"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{name} cell {i}: outputs not cleared"
            assert cell.execution_count is None, f"{name} cell {i}: execution count stored"
        assert "execution" not in cell.metadata, f"{name} cell {i}: execution timing metadata stored"


@pytest.mark.pure_python  # (committed files and the demo runner's messages: nothing is sampled)
def test_notebooks_are_generated_by_the_build_script():
    # WHEN _build.py --check compares what it would write with the committed files
    r = subprocess.run([sys.executable, str(NB_DIR / "_build.py"), "--check"], capture_output=True, text=True)
    # THEN they are identical (edit the stories in notebooks/_build.py, not the .ipynb files)
    assert r.returncode == 0, r.stderr + r.stdout


@pytest.mark.pure_python  # (committed files and the demo runner's messages: nothing is sampled)
@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_states_what_it_checks(name):
    # every profiled cell names the functions its summary must show; the first code cell
    # loads the extension
    nb = read(name)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].source.startswith("%load_ext ddprof_nb")
    profiled = [c for c in code if c.source.startswith("%%ddprof")]
    assert profiled, f"{name}: no %%ddprof cell"
    for cell in profiled:
        assert cell.metadata.get("ddprof_nb", {}).get("profiled") is True


# -- running them: test_binder.py runs every notebook headless, in a venv built from
# binder/'s files alone as Binder builds it (the same installs as the quick start's), with
# the checks of notebook_expectations.py and the time budget below.  Running them here
# as well, in the dev venv, doubled the minutes CI spends on notebooks for no new check.


@pytest.mark.pure_python  # (committed files and the demo runner's messages: nothing is sampled)
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


@pytest.mark.pure_python  # (committed files and the demo runner's messages: nothing is sampled)
def test_demo_says_when_no_profile_was_taken(tmp_path):
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), tmp_path / "plain.ipynb")
    r = subprocess.run([sys.executable, "-m", "ddprof_nb.demo", str(tmp_path / "plain.ipynb"), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "took no profile" in r.stderr, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "ddprof_nb.demo", str(tmp_path / "missing.ipynb"), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no such notebook" in r.stderr, r.stdout + r.stderr


# -- the quick start's first command, headless ------------------------------------------------

@pytest.mark.slow
def test_demo_sh_headless_runs_the_quickstart(quickstart_run):
    # GIVEN a fresh copy of the repository (no venv yet)
    # WHEN the quick start's first command runs in its headless form (started in the
    # background by the binder tests when they run first: see conftest.py)
    rc, output = quickstart_run.result()
    repo, out = quickstart_run.repo, quickstart_run.out
    log = output[-4000:]
    # THEN it set up its venv, executed the notebook and wrote the report
    assert rc == 0, log
    assert (repo / ".venvs" / "demo" / "bin" / "python").exists()
    executed = nbformat.read(out / "01-quickstart.ipynb", as_version=4)
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "not every cell ran"
    check_outputs("01-quickstart (demo.sh)", executed)
    report = (out / "01-quickstart.report.html").read_text(encoding="utf-8")
    assert report.lstrip().lower().startswith("<!doctype html") and "plotly" in report.lower()
    # and printed where they are and the top functions of the last profile
    assert "HTML report of the last profile" in output and "tokenize_fast" in output, log
