"""The Binder environment (binder/): what repo2docker builds from it, and that it works.

Binder runs repo2docker on the repository.  With a ``binder/`` folder, repo2docker
installs ``binder/apt.txt``, then ``binder/requirements.txt`` (before copying the
repository, so that layer is cached), then runs ``binder/postBuild`` from the
repository root; it does NOT install the repository itself, so postBuild must.

GIVEN binder/, THEN repo2docker accepts it and its Dockerfile runs our postBuild; the
files install exactly what the quick start installs (pyproject's dependencies and the
``notebooks`` extra); and WHEN a fresh venv is built from those files alone, in
repo2docker's order, THEN notebooks/01-quickstart runs in it headless.  Nothing is
cached between runs (pip runs with --no-cache-dir, as repo2docker does).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_a_venv_built_from_binder_files_runs_the_quickstart(tmp_path):
    if sys.version_info[:2] != _runtime_python():
        pytest.skip(f"binder/runtime.txt asks for Python {'.'.join(map(str, _runtime_python()))}; "
                    "the run on that version checks this")
    from test_notebooks import _check_outputs, _copy_tree  # same folder (pytest rootdir-relative import)

    import nbformat

    # GIVEN a fresh copy of the repository and an empty venv
    repo = _copy_tree(tmp_path / "repo")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)

    def step(cmd, cwd):
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, f"{cmd} failed:\n{(r.stdout + r.stderr)[-4000:]}"
        return r

    # WHEN it is built as repo2docker does: requirements, then postBuild from the repo root
    step([str(venv / "bin" / "pip"), "install", "--no-cache-dir", "-r", "binder/requirements.txt"], repo)
    os.chmod(repo / "binder" / "postBuild", 0o755)
    step(["./binder/postBuild"], repo)
    # THEN ddprof_nb is installed into the venv (not imported from the source tree) with
    # its native sampler built
    where = tmp_path / "elsewhere"
    where.mkdir()
    r = step([str(venv / "bin" / "python"), "-c", "import ddprof_nb, ddprof_nb._native; print(ddprof_nb.__file__)"],
             where)
    assert str(venv) in r.stdout, r.stdout
    # AND the quick-start notebook runs headless in it (the kernel is that venv's python)
    out = tmp_path / "out"
    r = step([str(venv / "bin" / "python"), "-m", "ddprof_nb.demo", str(repo / "notebooks" / "01-quickstart.ipynb"),
              "--out", str(out)], where)
    executed = nbformat.read(out / "01-quickstart.ipynb", as_version=4)
    _check_outputs("01-quickstart (binder venv)", executed)
    assert (out / "01-quickstart.report.html").stat().st_size > 10_000
    assert "tokenize_fast" in r.stdout
