"""Small native files, one job each: every C source and header in native/ has at most
MAX_NATIVE_LINES lines (docs/architecture.md, "Native files").  Read from the source, nothing
built."""

from __future__ import annotations

from pathlib import Path

NATIVE = Path(__file__).resolve().parents[2] / "native"
MAX_NATIVE_LINES = 800

SOURCES = sorted(p for p in NATIVE.iterdir() if p.suffix in (".c", ".h"))


def test_the_native_files_are_read():
    # a wrong NATIVE would find nothing and pass everything
    assert len(SOURCES) > 30 and NATIVE / "pyframes.c" in SOURCES and NATIVE / "ddprof.h" in SOURCES


def test_native_files_are_small():
    big = [f"native/{p.name}: {n} lines" for p in SOURCES
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_NATIVE_LINES]
    assert not big, (f"native files over {MAX_NATIVE_LINES} lines (split them by job):\n" + "\n".join(big))
