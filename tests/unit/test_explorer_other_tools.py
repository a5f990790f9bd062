"""The explorer opens every profile written by another tool (tests/data/other_tools):
each event, the sandwich of its top function, inverted, and a transform, without error."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")

import ddprof_nb  # noqa: E402
from ddprof_nb.explorer.widget import Explorer  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "other_tools"
FILES = {  # file -> what load() needs beyond the path
    "py-spy.raw.txt": dict(event="cpu"),
    "py-spy.speedscope.json": {},
    "pyinstrument.speedscope.json": {},
    "cpython-3.15.gecko.json": {},
    "go/cpu.pprof": {},
    "go/cpu-uncompressed.pprof": {},
    "go/heap.pprof": {},
    "go/mutex.pprof": {},
}


def test_every_profile_file_of_the_folder_is_listed():
    found = {str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.suffix in (".json", ".pprof", ".txt")}
    assert found == set(FILES)


@pytest.mark.parametrize("name", sorted(FILES))
def test_the_explorer_opens_a_file_from_another_tool(name):
    p = ddprof_nb.load(str(DATA / name), **FILES[name])
    ex = Explorer(p)
    assert ex.flame_data.total > 0 and ex.top_table.rows and ex.last_error == ""
    for label, value in ex.event_dd.options:
        ex.event_dd.value = value
        assert ex.flame_data.total > 0, label
        # the sandwich of the top function holds its total
        row = ex.drawing.top_rows[0]
        ex.top_table.selected = 0
        if ex.top_group_tb.value == "function" and ex.state.selected is not None:
            assert ex.sandwich.data is not None and ex.sandwich.data.total == row.total
        ex.inverted_tb.value = True
        assert ex.flame_data.total > 0
        ex.inverted_tb.value = False
    ex.transform_bar.add("collapse recursion")
    assert ex.flame_data.total > 0
    bundle = ex._repr_mimebundle_()
    assert "<svg" in bundle["text/html"]
