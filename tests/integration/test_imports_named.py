"""Imports and short-lived code are named: no ``[unknown]`` frames.

A module's ``<module>`` code is freed as soon as its import ends, and pytest compiles test
modules and drops their code the same way: the drain sees such code only after it died.
Each scenario runs in a fresh interpreter, so every module is imported for the first time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddprof_nb.engines.native import binding as _binding

pytestmark = pytest.mark.skipif(_binding.unavailable_reason() is not None, reason="needs the native engine")

# stdlib packages, imported only if this interpreter has not imported them yet
STDLIB = ("email.mime.multipart", "http.server", "xml.dom.minidom", "decimal", "sqlite3", "unittest.mock",
          "pydoc", "tarfile", "imaplib", "xmlrpc.server", "statistics", "fractions", "zipfile", "difflib")

COUNT = textwrap.dedent(
    """
    import collections, json, sys
    from ddprof_nb.events import FrameKind

    def report(p):
        total, unknown = collections.Counter(), collections.Counter()
        modules = {}  # file name -> samples with its <module> frame
        for s in p.samples():
            ev = s.event.name
            total[ev] += s.values[0]
            if any(f.kind is FrameKind.UNKNOWN or f.name == "[unknown]" for f in s.stack):
                unknown[ev] += s.values[0]
            for f in set(s.stack):
                if f.name == "<module>":
                    modules[f.filename] = modules.get(f.filename, 0) + s.values[0]
        print("RESULT " + json.dumps({"total": total, "unknown": unknown, "modules": modules}))
    """
)


def _run(code: str, cwd: Path, timeout: float = 240) -> dict:
    proc = subprocess.run([sys.executable, "-c", COUNT + textwrap.dedent(code)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _assert_named(r: dict, events: tuple[str, ...]) -> None:
    for ev in events:
        assert r["total"].get(ev, 0) >= 50, r["total"]
        share = r["unknown"].get(ev, 0) / r["total"][ev]
        assert share <= 0.01, (ev, r["unknown"], r["total"])


def test_importing_packages_never_imported_before_names_every_module(tmp_path):
    # GIVEN a package of modules whose module-level code burns CPU (each freed once its
    #       import ends), and stdlib packages this interpreter has not imported
    pkg = tmp_path / "imp27"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    burn = "import time\n_t = time.thread_time()\nwhile time.thread_time() - _t < 0.03:\n    pass\n"
    for i in range(12):
        (pkg / f"m{i}.py").write_text(burn + f"def f{i}():\n    return {i}\n")
    r = _run(
        f"""
        import ddprof_nb
        fresh = [m for m in {STDLIB!r} if m not in sys.modules]
        with ddprof_nb.profile(events=("cpu", "wall"), interval="1ms") as p:
            for i in range(12):
                __import__(f"imp27.m{{i}}")
            for m in fresh:
                __import__(m)
        report(p.profile)
        """,
        cwd=tmp_path,
    )
    # WHEN the profile is read / THEN at most 1 % of samples have an [unknown] frame, and
    # every module's <module> frame carries its file name
    _assert_named(r, ("CPU", "WALL"))
    for i in range(12):
        assert r["modules"].get(str(pkg / f"m{i}.py"), 0) > 0, sorted(r["modules"])
    stdlib_dir = Path(textwrap.__file__).parent
    assert sum(1 for f in r["modules"] if Path(f).parent.is_relative_to(stdlib_dir)) >= 5, sorted(r["modules"])


def test_a_pytest_run_over_a_small_suite_names_its_frames(tmp_path):
    # GIVEN a small test suite (assertions rewritten: pytest compiles each module, runs it
    #       and drops its code) run by pytest under the profiler from the command line
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.fixture
        def data():
            return list(range(20_000))
    """))
    for i in range(4):
        (suite / f"test_s{i}.py").write_text(textwrap.dedent(f"""
            import pytest

            TABLE = sorted(str(k) for k in range(60_000))  # module-level work: its <module> frame is sampled

            def work(n):
                return sum(k * k for k in range(n))

            @pytest.mark.parametrize("n", [50_000, 80_000, 120_000])
            def test_sum_{i}(n, data):
                assert work(n) > len(data)

            def test_sorted_{i}(data):
                assert sorted(data, key=lambda k: -k)[0] == data[-1]
        """))
    out = tmp_path / "run.pprof"
    cmd = [sys.executable, "-m", "ddprof_nb", "record", "-e", "cpu,wall,alloc", "-i", "1ms", "-o", str(out),
           "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    r = _run(f"""
        from ddprof_nb.loading import load
        report(load({str(out)!r}))
        """, cwd=tmp_path)
    # WHEN the profile is read / THEN at most 1 % of samples have an [unknown] frame, and
    # the test modules' <module> frames carry their file names
    _assert_named(r, ("CPU", "WALL"))
    if r["total"].get("ALLOC"):
        assert r["unknown"].get("ALLOC", 0) <= max(1, 0.01 * r["total"]["ALLOC"]), r
    assert any(Path(f).name.startswith("test_s") for f in r["modules"]), sorted(r["modules"])
