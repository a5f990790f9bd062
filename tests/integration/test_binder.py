"""The Binder environment (binder/): what repo2docker builds from it, and that it works.

Binder runs repo2docker on the repository.  With a ``binder/`` folder, repo2docker
installs ``binder/apt.txt``, then ``binder/requirements.txt`` (before copying the
repository, so that layer is cached), then runs ``binder/postBuild`` from the
repository root; it does NOT install the repository itself, so postBuild must.

GIVEN binder/, THEN repo2docker accepts it and its Dockerfile runs our postBuild; the
files install exactly what the quick start installs (pyproject's dependencies and the
``notebooks`` extra); and WHEN a fresh venv is built from those files alone, in
repo2docker's order, THEN every notebook in notebooks/ runs in it headless with no cell
error and the outputs notebook_expectations.py asks for (an explorer in each profiled
cell, naming its hot function).  The venv is built once per test session (on Python
binder/runtime.txt names) and shared by the notebook runs.  Its pip uses pip's download
cache (repo2docker's Dockerfile does not): what is installed is the same, and a fresh
download of every wheel cost this test about five minutes a run.

``repo2docker`` comes with the ``browser`` extra (CI's 3.11 venv has it); without it the
Dockerfile check is skipped.  ``DDPROF_NB_BINDER_JOBS`` (default 2) notebooks run at a time;
each run's time is printed, for people to judge (a shared machine makes any bound on it
either loose or flaky; the 900 s subprocess timeout only stops a hung run).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote

import pytest

# the notebook checks (same folder: pytest puts it on sys.path)
from notebook_expectations import (
    LABELS_NOTEBOOK, NOTEBOOKS, check_labels_follow_tasks, check_outputs, copy_tree,
)

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / "binder"


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _requirements(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line]


def _runtime_python() -> tuple[int, int]:
    m = re.fullmatch(r"python-(\d+)\.(\d+)", (BINDER / "runtime.txt").read_text(encoding="utf-8").strip())
    assert m, "binder/runtime.txt must read python-X.Y"
    return int(m.group(1)), int(m.group(2))


@pytest.mark.pure_python  # (the binder's files and what repo2docker reads: nothing is sampled)
def test_binder_files_say_what_repo2docker_needs():
    assert _runtime_python() == (3, 11)
    assert "build-essential" in (BINDER / "apt.txt").read_text(encoding="utf-8").split()
    post = BINDER / "postBuild"
    text = post.read_text(encoding="utf-8")
    assert text.startswith("#!/bin/bash\n")
    assert re.search(r"^set -e", text, re.M)
    assert os.access(post, os.X_OK), "binder/postBuild must be executable"
    # the repository itself, with the same extra as the quick start (scripts/demo.sh)
    assert re.search(r"^pip install --no-cache-dir \"?\.\[notebooks\]\"?\s*$", text, re.M), text
    demo = (ROOT / "scripts" / "demo.sh").read_text(encoding="utf-8")
    assert '".[notebooks]"' in demo, "the quick start's extra changed: update binder/postBuild"


@pytest.mark.pure_python  # (the binder's files and what repo2docker reads: nothing is sampled)
def test_binder_installs_what_the_quick_start_installs():
    # GIVEN pyproject's dependencies + the notebooks extra (what `pip install -e .[notebooks]`
    # brings in) THEN binder/requirements.txt lists exactly those, with the same bounds
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = {_name(r): r.replace(" ", "") for r in project["dependencies"] + project["optional-dependencies"]["notebooks"]}
    listed = {_name(r): r.replace(" ", "") for r in _requirements(BINDER / "requirements.txt")}
    assert listed == wanted, (
        "binder/requirements.txt must equal pyproject's dependencies + the notebooks extra;\n"
        f"missing: {sorted(set(wanted.items()) - set(listed.items()))}\n"
        f"extra: {sorted(set(listed.items()) - set(wanted.items()))}")
    # no local references: repo2docker then installs it before copying the repo (cached layer)
    assert not any(r.startswith((".", "-e", "file:")) for r in listed.values())


def _repo2docker() -> list[str]:
    exe = shutil.which("repo2docker", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if exe:
        return [exe]
    try:
        import repo2docker  # noqa: F401
    except ImportError:
        pytest.skip("repo2docker is not installed (pip install jupyter-repo2docker)")
    return [sys.executable, "-m", "repo2docker"]


@pytest.mark.pure_python  # (the binder's files and what repo2docker reads: nothing is sampled)
def test_repo2docker_builds_a_dockerfile_that_runs_our_postbuild():
    # WHEN repo2docker plans the image without Docker (--no-build prints the Dockerfile)
    r = subprocess.run(_repo2docker() + ["--no-run", "--no-build", str(ROOT)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    dockerfile = r.stdout
    # THEN it uses Python 3.11, installs the compiler, our requirements, and runs postBuild
    assert "python=3.11" in r.stderr + dockerfile
    assert "build-essential" in dockerfile
    assert 'pip install --no-cache-dir -r "binder/requirements.txt"' in dockerfile
    assert "./binder/postBuild" in dockerfile
    # requirements come before the repository is copied; postBuild after
    assert dockerfile.index("binder/requirements.txt") < dockerfile.index("./binder/postBuild")


BADGE_PLACEHOLDER = "REPLACE-WITH-GITHUB-OWNER"


@pytest.mark.pure_python  # (the binder's files and what repo2docker reads: nothing is sampled)
def test_readme_binder_badge_opens_the_quickstart_of_this_repository():
    # GIVEN the README's Binder badge
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    badge = re.search(r"\]\(https://mybinder\.org/v2/gh/([^/\s]+)/([^/\s]+)/HEAD\?labpath=([^)\s]+)\)", readme)
    assert badge, "README.md has no Binder badge (https://mybinder.org/v2/gh/OWNER/NAME/HEAD?labpath=...)"
    owner, name, labpath = badge.groups()
    # THEN it opens the quick-start notebook
    assert unquote(labpath) == "notebooks/01-quickstart.ipynb" and (ROOT / unquote(labpath)).is_file()
    # AND it names this repository: origin's GitHub owner/name, or, with no GitHub remote,
    # the marked placeholder (an invented owner would open someone else's repository)
    try:
        remote = subprocess.run(["git", "remote", "get-url", "origin"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        remote = ""
    m = re.search(r"github\.com[:/]([^/]+)/([^/]+?)(?:\.git)?/?$", remote)
    if m:
        assert (owner, name) == m.groups(), f"the badge opens {owner}/{name}, origin is {remote}"
    else:
        assert owner == BADGE_PLACEHOLDER, (
            f"no GitHub remote ({remote or 'none'}), yet the badge names owner {owner!r}: "
            f"use {BADGE_PLACEHOLDER} until the repository has its URL")


# -- a venv built from binder/ alone, and every notebook run in it ---------------------------

# Notebooks run this many at a time in the binder venv (each in its own process and kernel;
# they share no files or ports).  1 = one after the other.
JOBS = max(1, int(os.environ.get("DDPROF_NB_BINDER_JOBS", "2")))


def _binder_key() -> str:
    """What the binder venv is built from besides the package source: binder/ and pyproject."""
    digest = hashlib.sha256()
    for path in sorted(p for p in BINDER.iterdir() if p.is_file()) + [ROOT / "pyproject.toml"]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


class _Binder:
    """A fresh venv built as repo2docker builds the image, from a copy of the repository."""

    def __init__(self, base: Path):
        self.base = base
        self.repo = base / "repo"
        self.venv = base / "venv"
        self.python = str(self.venv / "bin" / "python")
        self.elsewhere = base / "elsewhere"  # a cwd outside the source tree
        home = base / "home"  # no user-level Jupyter/IPython config or kernels leak in
        self.env = dict(os.environ, PATH=f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                        VIRTUAL_ENV=str(self.venv), PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                        JUPYTER_CONFIG_DIR=str(home / "jupyter-config"), JUPYTER_DATA_DIR=str(home / "jupyter-data"),
                        IPYTHONDIR=str(home / "ipython"), JUPYTER_PLATFORM_DIRS="1",
                        PYDEVD_DISABLE_FILE_VALIDATION="1")
        for name in ("PYTHONPATH", "PYTHONHOME", "JUPYTER_PATH", "PIP_TARGET", "PIP_PREFIX"):
            self.env.pop(name, None)
        self.seconds: dict[str, float] = {}

    def step(self, label: str, cmd: list[str], cwd: Path, timeout: int = 1200) -> subprocess.CompletedProcess:
        start = time.perf_counter()
        r = subprocess.run(cmd, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout)
        self.seconds[label] = time.perf_counter() - start
        assert r.returncode == 0, f"{label}: {cmd} failed:\n{(r.stdout + r.stderr)[-4000:]}"
        return r

    def build(self) -> None:
        copy_tree(self.repo)
        self.elsewhere.mkdir()
        subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True)
        # repo2docker's order: requirements (before the repository is copied), then
        # postBuild from the repository root
        self.step("requirements", [str(self.venv / "bin" / "pip"), "install", "-r", "binder/requirements.txt"],
                  self.repo)
        os.chmod(self.repo / "binder" / "postBuild", 0o755)
        self.step("postBuild", ["./binder/postBuild"], self.repo)


@pytest.fixture(scope="session")
def binder(tmp_path_factory, quickstart_run):
    """The binder venv, built once per test session (all notebook runs share it); its folder
    is named by a hash of binder/ and pyproject.toml, the files it is built from.  The quick
    start's own setup (test_notebooks.py) starts first and runs meanwhile."""
    quickstart_run.start()
    if sys.version_info[:2] != _runtime_python():
        pytest.skip(f"binder/runtime.txt asks for Python {'.'.join(map(str, _runtime_python()))}; "
                    "the run on that version checks this")
    pytest.importorskip("nbformat")
    built = _Binder(tmp_path_factory.getbasetemp() / f"binder-{_binder_key()}")
    built.build()
    return built


@pytest.fixture(scope="session")
def binder_runs(binder, request):
    """Every notebook run headless in the binder venv (``python -m ddprof_nb.demo``, the
    quick start's headless form), JOBS at a time: name -> (CompletedProcess, out dir, seconds)."""

    def run(name: str):
        out = binder.base / "out" / name
        out.parent.mkdir(exist_ok=True)
        start = time.perf_counter()
        r = subprocess.run([binder.python, "-m", "ddprof_nb.demo", str(binder.repo / "notebooks" / f"{name}.ipynb"),
                            "--out", str(out)], cwd=binder.elsewhere, env=binder.env, capture_output=True,
                           text=True, timeout=900)
        seconds = time.perf_counter() - start
        # kept for reading when a run fails (the executed notebook is in the same folder)
        (out.parent / f"{name}.log").write_text(f"{seconds:.1f} s, exit {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r, out, seconds

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        runs = dict(zip(NOTEBOOKS, pool.map(run, NOTEBOOKS)))
    # one line in the test log: where the binder test's minutes go
    reporter = request.config.pluginmanager.getplugin("terminalreporter")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(
                "\nbinder venv: " + ", ".join(f"{k} {v:.0f} s" for k, v in binder.seconds.items())
                + f"; notebooks ({JOBS} at a time) {time.perf_counter() - start:.0f} s: "
                + ", ".join(f"{n[:2]} {s:.0f} s{'' if r.returncode == 0 else ' FAILED'}" for n, (r, _, s) in runs.items()))
    return runs


@pytest.mark.slow
def test_the_binder_venv_holds_the_built_package_and_its_kernel(binder):
    # GIVEN the venv built from binder/'s files alone THEN ddprof_nb is installed into it
    # (not imported from the source tree) with its native sampler built
    r = binder.step("import", [binder.python, "-c", "import json, ddprof_nb, ddprof_nb.engines.native.binding as b; "
                               "print(json.dumps([ddprof_nb.__file__, b.unavailable_reason()]))"], binder.elsewhere)
    where, reason = json.loads(r.stdout.splitlines()[-1])
    assert where.startswith(str(binder.venv)), where
    assert reason is None, f"native sampler unavailable in the binder venv: {reason}"
    # AND the notebooks' kernel (python3) is that venv's interpreter
    r = binder.step("kernelspec", [binder.python, "-c", "import json; from jupyter_client.kernelspec import "
                                   "KernelSpecManager as M; print(json.dumps(M().get_kernel_spec('python3').argv))"],
                    binder.elsewhere)
    exe = json.loads(r.stdout.splitlines()[-1])[0]
    resolved = shutil.which(exe, path=binder.env["PATH"])
    assert resolved and Path(resolved).parent == binder.venv / "bin", (exe, resolved)


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_in_the_binder_venv(name, binder_runs):
    import nbformat

    # WHEN the notebook runs headless in the binder venv
    r, out, seconds = binder_runs[name]
    log = f"{name} ({seconds:.0f} s):\n{(r.stdout + r.stderr)[-4000:]}"
    # (the whole run's time, kernel start, imports and cells: a figure, not a gate)
    print(f"\n[binder] {name}: {seconds:.0f} s")
    assert r.returncode == 0, log
    # THEN no cell raised and each profiled cell shows an explorer whose text summary names
    # the cell's hot function (notebook_expectations.py)
    check_outputs(f"{name} (binder venv)", nbformat.read(out / f"{name}.ipynb", as_version=4))
    # AND the report of its last profile was written and its top functions printed
    assert (out / f"{name}.report.html").stat().st_size > 10_000, log
    assert "HTML report of the last profile" in r.stdout and "top functions by" in r.stdout, log


@pytest.mark.slow
def test_labels_follow_asyncio_tasks_in_the_binder_venv(binder_runs):
    import nbformat

    r, out, _ = binder_runs[LABELS_NOTEBOOK]
    assert r.returncode == 0, r.stderr[-4000:]
    check_labels_follow_tasks(nbformat.read(out / f"{LABELS_NOTEBOOK}.ipynb", as_version=4))
