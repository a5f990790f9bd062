"""What an executed demo notebook (notebooks/NN-*.ipynb) must show: one place for the
checks that test_binder.py applies to every notebook run headless in a venv built from
binder/, and test_notebooks.py to the quick start's run by scripts/demo.sh.

The per-cell expectations live in the notebooks themselves (notebooks/_build.py writes
them): ``cell.metadata["ddprof_nb"] = {"profiled": True, "expect": [names]}``.  A profiled
cell must show an explorer widget whose text summary names each expected function; any
other cell's output must contain each expected string.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = [
    "01-quickstart", "02-threads-and-the-gil", "03-memory", "04-locks-and-waiting",
    "05-labels-and-asyncio", "06-compare-two-versions", "07-export-and-share", "08-watching-a-long-cell",
]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

# 05's story: each request's handler runs under labels(endpoint=...) and awaits before
# rendering; the renderers' CPU samples carry their own endpoint (labels follow tasks).
LABELS_NOTEBOOK = "05-labels-and-asyncio"


def read(name: str):
    import nbformat

    return nbformat.read(NB_DIR / f"{name}.ipynb", as_version=4)


def output_text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return f"{output.get('ename')}: {output.get('evalue')}"
    return output.get("data", {}).get("text/plain", "")


def check_outputs(name: str, nb) -> None:
    """Assert that the executed notebook ``nb`` raised nowhere and shows what each cell expects."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code), f"{name}: not every code cell ran"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("ddprof_nb", {})
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{name} cell {i}: {errors[0].ename}: {errors[0].evalue}"
        text = "\n".join(output_text(o) for o in cell.outputs)
        where = f"{name} cell {i} ({cell.source.splitlines()[0]})"
        if meta.get("live"):
            check_live_view(where, cell, state, meta.get("expect", ()))
        elif meta.get("profiled"):
            # the cell shows an explorer widget, its state was stored, and its text summary
            # (the mimebundle's text/plain: the top table) names the hot function
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


def check_live_view(where: str, cell, state: dict, expect) -> None:
    """A ``--live`` cell shows one live view (a VBox of class ddprof-live) whose stored state
    says it refreshed and holds, as its only child, the explorer of the profile, whose
    figures' stored state names each expected function."""
    import json

    views = [o for o in cell.outputs if WIDGET_VIEW in o.get("data", {})]
    assert len(views) == 1, f"{where}: {len(views)} widget views, expected the live view alone"
    live = state.get(views[0].data[WIDGET_VIEW]["model_id"], {}).get("state", {})
    assert "ddprof-live" in live.get("_dom_classes", []), f"{where}: the widget shown is not the live view"
    children = [c.removeprefix("IPY_MODEL_") for c in live.get("children", [])]
    assert len(children) == 1, f"{where}: the live view did not become the explorer: {children}"
    explorer = state.get(children[0], {}).get("state", {})
    assert "ddprof-explorer" in explorer.get("_dom_classes", []), f"{where}: the live view's child is not the explorer"
    refreshed = [s for s in state.values() if "data-refreshes=" in str(s.get("state", {}).get("value", ""))]
    counts = [int(re.search(r"data-refreshes='(\d+)'", s["state"]["value"]).group(1)) for s in refreshed]
    assert counts and max(counts) >= 1, f"{where}: the live view never refreshed"
    text = json.dumps(state)
    for expected in expect:
        assert expected in text, f"{where}: {expected!r} not in the explorer's stored figures"


def check_labels_follow_tasks(nb) -> None:
    """05: the renderers' CPU samples carry their own endpoint label (>= 80 % each)."""
    text = "\n".join(output_text(o) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    shares = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+)\s+([\d.]+)% of its CPU samples", text, re.M)}
    assert set(shares) == {"render_search", "sign_receipt"}, text[-2000:]
    assert all(share >= 80 for share in shares.values()), shares


def copy_tree(dest: Path) -> Path:
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
