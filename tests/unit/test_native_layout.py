"""The native files' layering, as docs/architecture.md's "Native files" table states it.

Each file in native/ has one row naming what it may include; engines (alloc.c, waits.c)
depend on the core only through engine.h, and the core names no engine (it reaches them
through the table in engines.c).
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
ENGINES = {"alloc.c", "nalloc.c", "waits.c"}


def _table() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("### Native files", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in section.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = cells[0].strip("`")
        rows[name] = set(re.findall(r"`([\w.]+\.h)`", cells[2]))
    return rows


def _includes(path: Path) -> set[str]:
    found = re.findall(r'^#include [<"]([\w/.]+)[>"]', path.read_text(), re.M)
    return {f for f in found if f == "Python.h" or (NATIVE / f).exists()}


def test_every_native_file_has_one_row():
    on_disk = {p.name for p in NATIVE.iterdir() if p.suffix in (".c", ".h")}
    assert set(_table()) == on_disk


def test_files_include_only_what_their_row_allows():
    table = _table()
    for name, allowed in table.items():
        extra = _includes(NATIVE / name) - allowed
        assert not extra, f"native/{name} includes {sorted(extra)}, its row allows {sorted(allowed)}"


def test_engines_stay_outside_the_core():
    core = {n for n, allowed in _table().items() if "core.h" in allowed}
    assert {"session.c", "wall.c", "threads.c"} <= core
    assert not core & ENGINES
    for name in sorted(core):
        text = (NATIVE / name).read_text()
        named = re.findall(r"\bddp_(?:alloc|nalloc|waits)_\w+", text)
        assert not named, f"native/{name} names engine internals {sorted(set(named))}"
