"""The native files' layering, as docs/architecture.md's "Native files" table states it.

Each file in native/ has one row naming what it may include; engines outside the core
(alloc.c, nalloc.c, waits.c) depend on it only through engine.h, and the core names no engine:
the session, the wall thread and the registry reach every engine, the core's own CPU and wall
engines included, through the table in engines.c.
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


# The core's engines and the files only they call: nothing below them may call them.
CORE_ENGINES = {"cpu.c", "thread_start.c", "osthreads.c", "wall.c"}


def _strip(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


def _calls() -> dict[str, set[str]]:
    """C file -> the C files whose functions or variables it names.  A file defines the names
    it declares at the start of a line without `static`/`extern`; it names every identifier it
    spells.  engines.c's table is where the core reaches the engines without naming them: its
    own edges are the inversion, not a dependency."""
    texts = {p.name: _strip(p.read_text()) for p in sorted(NATIVE.glob("*.c"))}
    owner = {}
    for name, text in texts.items():
        for m in re.finditer(r"^(?!static\b|extern\b|typedef\b|#)[A-Za-z_][\w \t*]*?\b([A-Za-z_]\w*)\s*[(=;\[]",
                             text, re.M):
            owner[m.group(1)] = name
    return {name: {owner[w] for w in set(re.findall(r"\b[A-Za-z_]\w*\b", text)) if w in owner} - {name}
            for name, text in texts.items() if name != "engines.c"} | {"engines.c": set()}


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_call_graph_is_read():
    calls = _calls()
    assert {"pyframes.c", "pycode.c", "pylayout.c"} <= calls["pyremote.c"]
    assert "alloclive.c" in calls["alloc.c"] and "records.c" in calls["alloc.c"]


def test_no_circle_among_native_files():
    circles = _circles(_calls())
    assert not circles, [sorted(c) for c in circles]


def test_the_core_reaches_its_engines_through_the_table_only():
    calls = _calls()
    for name in ("session.c", "sampler_thread.c", "threads.c", "records.c", "drain.c", "enginectl.c", "state.c"):
        named = calls[name] & CORE_ENGINES
        assert not named, f"native/{name} calls the engine files {sorted(named)}"
    for path in sorted(NATIVE.glob("*.c")):
        if path.name not in ("engines.c", "cpu.c", "wall.c"):
            named = re.findall(r"\bddp_(?:cpu|wall)_engine\b", _strip(path.read_text()))
            assert not named, f"native/{path.name} names {sorted(set(named))}"


def test_the_call_graph_sees_a_circle():
    assert _circles({"a.c": {"b.c"}, "b.c": {"c.c"}, "c.c": {"a.c"}, "d.c": {"a.c"}}) == [{"a.c", "b.c", "c.c"}]
