"""The package's import directions (docs/architecture.md, "Layers"): read from the source
with ``ast``, nothing imported.

- an import at the top of a file goes to the same layer or a lower one;
- the graph of every import, those inside functions included, has no cycle;
- an import inside a function is one of the few listed below, each with its reason (a cost
  or an optional dependency: never a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "ddprof_nb"

# lowest first: a module may import its own layer and the ones before it
LAYERS = [
    ("facts", ["_native", "events", "config", "errors", "_steptypes"]),  # _native: the compiled native/
    ("model", ["model"]),
    ("render", ["render"]),
    ("exporters", ["exporters", "loading", "importers"]),
    ("sources", ["labeling", "engines", "sources", "aio", "asyncio_support",
                 "elfsyms", "nativesyms", "demangle", "demangle_rust_v0", "remote", "remote_layouts", "remote_walk",
                 "remote_record", "kernels"]),
    ("session", ["sampler", "pipeline", "cells", "history", "live"]),
    # sources that run a session (a Sampler) in other processes: above the session
    ("other processes", ["children", "dask_support"]),
    ("explorer", ["explorer"]),
    ("front ends", ["", "__main__", "magics", "cell_rewrite", "demo", "live_display"]),  # "": the package's __init__
]

# (importer, imported) -> why it sits inside a function
INNER_IMPORTS = {
    # ``import ddprof_nb`` imports the dispatcher (``ddprof_nb.save``): a format loads when a
    # file of it is written
    ("exporters", "exporters.folded"): "import cost",
    ("exporters", "exporters.pprof"): "import cost",
    ("exporters", "exporters.speedscope"): "import cost",
    ("exporters", "exporters.html"): "import cost",
    ("loading", "exporters.folded"): "readers load when a file of their format is read",
    ("loading", "exporters.pprof"): "readers load when a file of their format is read",
    ("loading", "exporters.speedscope"): "readers load when a file of their format is read",
    ("loading", "exporters.pprof_proto"): "readers load when a file of their format is read",
    # reading another process: the native binding only when the first target is opened
    ("remote", "engines.native.binding"): "a broken native build must not break import",
    ("loading", "importers.gecko"): "readers load when a file of their format is read",
    # a broken native build must not break ``import ddprof_nb``
    ("engines.native.binding", "_native"): "a broken native build must not break import: loaded once and checked",
    ("sampler", "engines.native"): "a broken native build must not break import",
    # asyncio_support imports asyncio (~0.3 s): only sessions that sample asyncio pay it
    ("aio.session_source", "aio.tasks"): "import cost",
    # every ``import ddprof_nb`` imports children and dask_support (their sources register):
    # the pprof format loads only when a child's or a worker's profile is written or read
    ("children", "exporters.pprof"): "import cost",
    ("dask_support", "exporters.pprof"): "import cost",
    # optional or heavy front-end pieces: ipywidgets, IPython
    ("", "explorer.widget"): "ipywidgets and plotly load when an Explorer is made",
    ("", "magics"): "IPython loads with the extension",
    ("", "history"): "``ddprof_nb.history`` is the History object, not the module",
    ("explorer", "explorer.widget"): "ipywidgets and plotly load when an Explorer is made",
    ("magics.display", "explorer.widget"): "ipywidgets and plotly load when an Explorer is made",
    ("magics.display", "explorer.figure_widget"): "plotly and anywidget load when a session will be shown as the explorer",
    ("explorer.live_view", "explorer.widget"): "ipywidgets and plotly load when an Explorer is made",
    ("live_display", "explorer.live_view"): "ipywidgets load when a live view is shown",
    # profile(live=True) picks where to show the samples so far: a front end's choice
    ("sampler", "live_display"): "the live view's display (IPython, ipywidgets) loads with a live session",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _layer(module: str) -> int:
    for i, (_, roots) in enumerate(LAYERS):
        for root in roots:
            if module == root or (root and module.startswith(root + ".")):
                return i
    raise AssertionError(f"ddprof_nb.{module} is in no layer: add it to LAYERS and docs/architecture.md")


def _targets(module: str, node) -> list[str]:
    """Internal modules an import statement reads ("" is the package itself)."""
    is_pkg = MODULES[module].name == "__init__.py"
    here = module.split(".") if module else []
    package = here if is_pkg else here[:-1]
    out = []
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = package[: len(package) - node.level + 1]
        elif (node.module or "").split(".")[0] == "ddprof_nb":
            base = []
        else:
            return []
        mod = ".".join(base + ([m for m in (node.module or "").split(".") if m] if node.level else
                                (node.module or "").split(".")[1:]))
        for alias in node.names:
            sub = f"{mod}.{alias.name}" if mod else alias.name
            out.append(sub if sub in MODULES or sub == "_native" else mod)
    else:
        for alias in node.names:
            if alias.name.split(".")[0] == "ddprof_nb":
                out.append(".".join(alias.name.split(".")[1:]))
    return [t for t in out if t != module and (t in MODULES or t == "" or t == "_native")]


def _imports():
    """(module, target, line, at_top) for every internal import."""
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top: set[int] = set()

        def collect(stmts):
            for s in stmts:
                if isinstance(s, (ast.Import, ast.ImportFrom)):
                    top.add(id(s))
                elif isinstance(s, (ast.If, ast.Try)):
                    collect(s.body)
                    collect(s.orelse)
                    collect(getattr(s, "finalbody", []))
                    for h in getattr(s, "handlers", []):
                        collect(h.body)

        collect(tree.body)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _targets(module, node):
                    yield module, t, node.lineno, id(node) in top


IMPORTS = list(_imports())


def test_the_parser_sees_the_imports_it_should():
    edges = {(m, t) for m, t, _, top in IMPORTS if top}
    assert ("model.selection", "model.data") in edges and ("render.tree", "model") in edges
    assert ("explorer.widget", "render") in edges and ("exporters.html", "render.static_html") in edges
    assert ("exporters", "exporters.pprof") in {(m, t) for m, t, _, top in IMPORTS if not top}


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)
    for _, t, _, _ in IMPORTS:
        _layer(t)


def test_imports_at_the_top_of_files_go_down_the_layers():
    wrong = [
        f"ddprof_nb/{MODULES[m].relative_to(PKG)}:{line} imports ddprof_nb.{t} "
        f"({LAYERS[_layer(m)][0]} -> {LAYERS[_layer(t)][0]})"
        for m, t, line, top in IMPORTS
        if top and _layer(t) > _layer(m)
    ]
    assert not wrong, "\n".join(wrong)


def _cycle(edges) -> list[str] | None:
    """One cycle of the graph ``edges`` ((importer, imported) pairs), or None."""
    graph: dict[str, set[str]] = {}
    for m, t in edges:
        graph.setdefault(m, set()).add(t)
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_cycles():
    # (a finder that never finds one would pass the tests below on any code)
    assert _cycle([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == ["a", "b", "c", "a"]
    assert _cycle([("a", "b"), ("b", "c"), ("a", "c")]) is None


def test_imports_at_the_top_of_files_have_no_cycle():
    found = _cycle((m, t) for m, t, _, top in IMPORTS if top)
    assert found is None, "import cycle: " + " -> ".join(found)


def test_no_cycle_even_through_imports_inside_functions():
    # an import inside a function still ties two modules together: a method that imports
    # the layer implementing it is a circle a reader has to hold in their head
    found = _cycle((m, t) for m, t, _, _ in IMPORTS)
    assert found is None, "import cycle (imports inside functions included): " + " -> ".join(found)


def test_imports_inside_functions_are_the_listed_ones():
    unlisted = [
        f"ddprof_nb/{MODULES[m].relative_to(PKG)}:{line} imports ddprof_nb.{t} inside a function"
        for m, t, line, top in IMPORTS
        if not top and (m, t) not in INNER_IMPORTS
    ]
    assert not unlisted, ("move these to the top of the file, or list them in INNER_IMPORTS with the "
                          "cycle or cost that keeps them inside:\n" + "\n".join(unlisted))


def test_every_listed_inner_import_is_still_there():
    # a stale entry would excuse an import nobody makes, and read as a reason that no longer holds
    inner = {(m, t) for m, t, _, top in IMPORTS if not top}
    assert not set(INNER_IMPORTS) - inner, sorted(set(INNER_IMPORTS) - inner)


def test_the_native_engines_internals_stay_in_its_package():
    # engines/native/ is one engine: the rest of the package sees NativeEngine (the package)
    # and, to read other processes, the binding; only the binding loads the compiled module
    outside = {(m, t) for m, t, _, _ in IMPORTS
               if t.startswith("engines.native.") and not m.startswith("engines.native")}
    assert outside <= {("remote", "engines.native.binding")}, outside
    loaders = {m for m, t, _, _ in IMPORTS if t == "_native"} - {"_steptypes"}
    assert loaders == {"engines.native.binding"}, loaders


def test_render_and_model_never_import_upwards_even_inside_functions():
    # the pure layers: render reads Profiles and returns strings and data
    for m, t, line, _ in IMPORTS:
        if m.startswith("render"):
            assert _layer(t) <= _layer(m), f"render module {m}:{line} imports {t}"
        if m in ("events", "config", "errors"):
            assert _layer(t) == 0, f"{m}:{line} imports {t}"


def test_render_reads_no_files_and_no_shell():
    # render is pure: source text, cells and files are read by its callers (explorer.source_text)
    for module, path in MODULES.items():
        if not module.startswith("render"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names.add((node.module or "").split(".")[0])
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "open", f"{module} opens a file"
        assert not names & {"IPython", "ipywidgets", "linecache", "ipykernel"}, (module, names)
