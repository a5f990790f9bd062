"""Fixtures shared by the slow notebook tests (test_binder.py, test_notebooks.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from notebook_expectations import copy_tree


class QuickstartRun:
    """``bash scripts/demo.sh --headless OUT`` (the quick start's first command, headless) on
    a fresh copy of the repository, in the background from ``start()`` on."""

    def __init__(self, base: Path):
        self.repo = base / "repo"
        self.out = base / "out"
        self._log = base / "demo.log"
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        if self._proc is not None:
            return
        copy_tree(self.repo)
        env = dict(os.environ, PYTHON=sys.executable, PIP_DISABLE_PIP_VERSION_CHECK="1")
        env.pop("VIRTUAL_ENV", None)
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(["bash", "scripts/demo.sh", "--headless", str(self.out)], cwd=self.repo,
                                          env=env, stdout=log, stderr=subprocess.STDOUT)

    def result(self, timeout: float = 1200) -> tuple[int, str]:
        """(exit status, its output), waiting for it to end."""
        self.start()
        assert self._proc is not None
        rc = self._proc.wait(timeout=timeout)
        return rc, self._log.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


@pytest.fixture(scope="session")
def quickstart_run(tmp_path_factory):
    """One quick-start run per session.  The Binder venv build asks for it first and starts
    it, so the two setups overlap (they are pip and compiler bound, on 2 cores: that saves
    CI most of a minute); test_notebooks.py waits for its result."""
    run = QuickstartRun(tmp_path_factory.mktemp("quickstart"))
    yield run
    run.stop()
