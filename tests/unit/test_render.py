"""render: Profile -> call trees, figure data, tables and HTML, checked without a browser.

Profiles are built from synthetic samples with ProfileBuilder; expected values are
computed by hand from those samples.
"""

from __future__ import annotations

import colorsys
import linecache
import re

import numpy as np
import pytest

from ddprof_nb.events import EventType, FrameKind
from ddprof_nb import render as F
from ddprof_nb.explorer.source_text import source_lines
from ddprof_nb.model import Frame, Metadata, ProfileBuilder

MS = 1_000_000
APP = "/home/user/app.py"
JSON = "/usr/lib/python3.11/json/decoder.py"
NUMPY = "/venv/lib/python3.11/site-packages/numpy/core/numeric.py"
NUMPY2 = "/venv/lib/python3.11/site-packages/numpy/linalg/linalg.py"
EVIL = "<script>alert(1)</script>"

main = Frame("main", APP, 12, 10)
f = Frame("f", APP, 22, 20)
g = Frame("g", APP, 32, 30)
decode = Frame("JSONDecoder.decode", JSON, 340, 332)
dot = Frame("dot", NUMPY, 80, 70)


def build(rows, duration_ms: int = 1000):
    """rows: (stack frames root first, event, count, quantity[, thread, labels, time_ms])."""
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=duration_ms * MS))
    for row in rows:
        stack, event, count, qty = row[:4]
        tid, tname = row[4] if len(row) > 4 else (1, "MainThread")
        labels = row[5] if len(row) > 5 else None
        t_ms = row[6] if len(row) > 6 else 0
        b.add(event, b.stack_of(stack), b.thread_id(tid, tname), b.labels_id(labels), t_ms * MS, count, qty)
    return b.build()


def basic():
    """main->f (50 ms, 5 samples), main->g (30 ms), main->f->decode (20 ms); 100 ms in all."""
    return build([
        ([main, f], EventType.CPU, 5, 50 * MS),
        ([main, g], EventType.CPU, 3, 30 * MS),
        ([main, f, decode], EventType.CPU, 2, 20 * MS),
    ])


def by_label(fd: F.FlameData) -> dict[str, int]:
    """Plotted value per label (labels assumed unique in the small test trees)."""
    return {lab: v for lab, v in zip(fd.labels, fd.values)}


def assert_consistent(fd: F.FlameData) -> None:
    """plotly's branchvalues='total' rule: children never outgrow their parent."""
    index = {i: k for k, i in enumerate(fd.ids)}
    kids: dict[int, int] = {}
    for k, p in enumerate(fd.parents):
        if p:
            kids[index[p]] = kids.get(index[p], 0) + fd.values[k]
    for k, s in kids.items():
        assert s <= fd.values[k], (fd.labels[k], s, fd.values[k])
    assert len(set(fd.ids)) == len(fd.ids)


# --- call tree ----------------------------------------------------------------------


def test_call_tree_totals_and_self_are_exact():
    # GIVEN three stacks under main
    tree = F.call_tree(basic(), "cpu")
    # WHEN the tree is built THEN totals include callees and self only the leaf's time
    names = {tree.frame(i).name if i else "root": i for i in range(len(tree))}
    total = {n: int(tree.total[i, 0]) for n, i in names.items()}
    self_ = {n: int(tree.self_[i, 0]) for n, i in names.items()}
    assert total == {"root": 100 * MS, "main": 100 * MS, "f": 70 * MS, "g": 30 * MS, "JSONDecoder.decode": 20 * MS}
    assert self_ == {"root": 0, "main": 0, "f": 50 * MS, "g": 30 * MS, "JSONDecoder.decode": 20 * MS}
    assert all(tree.parent[i] < i for i in range(1, len(tree)))


def test_frames_of_one_function_at_different_lines_merge_into_one_node():
    # GIVEN f sampled at two different lines
    f_other_line = Frame("f", APP, 25, 20)
    p = build([([main, f], EventType.CPU, 1, 10 * MS), ([main, f_other_line], EventType.CPU, 1, 15 * MS)])
    # WHEN the tree is built THEN f is one node holding both lines' time
    tree = F.call_tree(p, "cpu")
    assert len(tree) == 3
    assert int(tree.total[2, 0]) == 25 * MS


def test_value_index_zero_counts_samples():
    # GIVEN the basic profile WHEN the count value is chosen THEN values are sample counts
    fd = F.flame_data(F.call_tree(basic(), "cpu", value_index=0))
    assert by_label(fd)["f"] == 7 and by_label(fd)["g"] == 3
    assert fd.customdata[fd.labels.index("f")][3] == "7"


def test_event_switch_changes_values_and_units():
    # GIVEN CPU samples and allocation samples on different stacks
    p = build([
        ([main, f], EventType.CPU, 1, 3 * MS),
        ([main, g], EventType.ALLOC, 2, 3 * 1024 * 1024),
    ])
    # WHEN each event's figure is built THEN only its stacks appear, in its unit
    cpu = F.flame_data(F.call_tree(p, "cpu"))
    alloc = F.flame_data(F.call_tree(p, "alloc"))
    assert "f" in cpu.labels and "g" not in cpu.labels
    assert "g" in alloc.labels and "f" not in alloc.labels
    assert cpu.customdata[cpu.labels.index("f")][3] == "3.00 ms"
    assert alloc.customdata[alloc.labels.index("g")][3] == "3.00 MiB"


# --- pruning -------------------------------------------------------------------------


def test_min_pct_folds_small_children_into_other():
    # GIVEN decode holds 20% of the total
    tree = F.call_tree(basic(), "cpu")
    # WHEN nodes under 25% are folded
    fd = F.flame_data(tree, min_pct=25)
    # THEN decode is gone and f has an [other] child carrying its 20 ms
    assert "JSONDecoder.decode" not in fd.labels
    k = fd.labels.index("[other]")
    assert fd.parents[k] == fd.ids[fd.labels.index("f")]
    assert fd.values[k] == 20 * MS and fd.raw[k][1] == 20 * MS
    assert_consistent(fd)
    # and with the default 0.5 % nothing is folded
    assert "[other]" not in F.flame_data(tree).labels


def test_max_nodes_caps_a_wide_tree_and_raises_the_threshold():
    # GIVEN 1000 leaves of different sizes under main
    rows = [([main, Frame(f"leaf{i}", APP, i + 100, i + 100)], EventType.CPU, 1, (i + 1) * MS) for i in range(1000)]
    tree = F.call_tree(build(rows), "cpu")
    # WHEN at most 50 items may be drawn (min % off)
    fd = F.flame_data(tree, min_pct=0, max_nodes=50)
    # THEN 50 items are drawn, the widest leaves kept, the rest folded into one [other]
    assert fd.node_count <= 50
    assert fd.labels.count("[other]") == 1
    assert "leaf999" in fd.labels and "leaf0" not in fd.labels
    assert fd.threshold > 0 and fd.folded_nodes == len(tree) - (fd.node_count - 1)
    assert sum(v for v, p in zip(fd.values, fd.parents) if p == fd.ids[fd.labels.index("main")]) == fd.total
    assert_consistent(fd)


def test_every_node_above_min_pct_is_kept():
    # GIVEN a random deep profile
    rng = np.random.default_rng(3)
    funcs = [Frame(f"fn{i}", APP, i, i) for i in range(40)]
    rows = [([funcs[j] for j in rng.integers(0, 40, size=rng.integers(1, 12))], EventType.CPU, 1,
             int(rng.integers(1, 100)) * MS) for _ in range(400)]
    tree = F.call_tree(build(rows), "cpu")
    # WHEN pruned at 1 %
    fd = F.flame_data(tree, min_pct=1.0, max_nodes=100_000)
    # THEN every tree node >= 1 % is drawn, none below, and sizes stay consistent
    big = {int(i) for i in np.flatnonzero(tree.total[:, 0] >= tree.total[0, 0] / 100)}
    drawn = {int(n) for n in fd.node if n >= 0}
    assert drawn == big
    assert_consistent(fd)


# --- flame / icicle, hover, escaping --------------------------------------------------


def test_flame_has_root_at_the_bottom_and_icicle_at_the_top():
    tree = F.call_tree(basic(), "cpu")
    flame = F.flame_figure(F.flame_data(tree, orientation="flame"))
    icicle = F.flame_figure(F.flame_data(tree, orientation="icicle"))
    assert flame.data[0].type == "icicle" and flame.data[0].tiling.orientation == "v"
    assert flame.data[0].tiling.flip == "y"
    assert icicle.data[0].tiling.flip is None
    with pytest.raises(ValueError, match="orientation"):
        F.flame_data(tree, orientation="sideways")


def test_every_label_is_dark_text_on_its_light_node_the_root_too():
    # plotly writes the root's label with outsidetextfont, else in the layout's mid-grey
    props = F.flame_trace_props(F.flame_data(F.call_tree(basic(), "cpu")))
    assert props["insidetextfont"]["color"] == props["outsidetextfont"]["color"] == F.TEXT_COLOR
    assert props["marker"]["colors"][0] == F.ROOT_COLOR


def test_deep_stacks_draw_a_limited_number_of_levels():
    # GIVEN a 100-frame deep recursion
    deep = [Frame(f"level{i}", APP, i, i) for i in range(100)]
    fd = F.flame_data(F.call_tree(build([(deep, EventType.CPU, 1, MS)]), "cpu"))
    # THEN every node is kept but plotly draws MAX_LEVELS levels at a time (click to go deeper)
    props = F.flame_trace_props(fd)
    assert fd.levels == 101 and props["maxdepth"] == F.MAX_LEVELS
    assert F.flame_layout(fd)["height"] <= 900
    assert F.flame_trace_props(F.flame_data(F.call_tree(basic(), "cpu")))["maxdepth"] == -1


def test_hover_shows_function_location_self_total_and_share():
    fd = F.flame_data(F.call_tree(basic(), "cpu"))
    name, loc, self_, total, pct = fd.customdata[fd.labels.index("f")]
    assert (name, loc, self_, total, pct) == ("f", f"{APP}:20", "50.0 ms", "70.0 ms", "70.00%")
    for key in ("customdata[0]", "customdata[1]", "customdata[2]", "customdata[3]", "customdata[4]"):
        assert key in fd.hovertemplate


@pytest.mark.parametrize(
    "value, unit, text",
    [
        (999, "nanoseconds", "999 ns"),
        (1_500, "nanoseconds", "1.50 µs"),
        (1_500_000, "nanoseconds", "1.50 ms"),
        (2_000_000_000, "nanoseconds", "2.00 s"),
        (512, "bytes", "512 B"),
        (1536, "bytes", "1.50 KiB"),
        (3 * 1024**2, "bytes", "3.00 MiB"),
        (5 * 1024**3, "bytes", "5.00 GiB"),
        (1234567, "count", "1,234,567"),
        # the edges: never an exponent, one precision per column, the unit a rounding reaches
        (999_500_000, "nanoseconds", "1.00 s"),
        (999_990_000, "nanoseconds", "1.00 s"),
        (999_499, "nanoseconds", "999 µs"),
        (999_500, "nanoseconds", "1.00 ms"),
        (999.5, "nanoseconds", "1.00 µs"),
        (9_996_000, "nanoseconds", "10.0 ms"),
        (3_000_000_000, "nanoseconds", "3.00 s"),
        (3_210_000_000, "nanoseconds", "3.21 s"),
        (3_004_000_000, "nanoseconds", "3.00 s"),
        (620_000_000, "nanoseconds", "620 ms"),
        (1_234_000_000_000, "nanoseconds", "1,234 s"),
        (0, "nanoseconds", "0 ns"),
        (-1_500, "nanoseconds", "-1.50 µs"),
        (1023, "bytes", "1,023 B"),
        (1.02e3 * 1024, "bytes", "0.996 MiB"),
        (1023.9 * 1024, "bytes", "1.00 MiB"),
        (1000 * 1024**3, "bytes", "0.977 TiB"),
        (12.345, "count", "12.3"),
    ],
)
def test_format_value_units(value, unit, text):
    assert F.format_value(value, unit) == text


@pytest.mark.parametrize("unit", ["nanoseconds", "bytes"])
def test_format_value_never_writes_an_exponent_or_more_than_three_digits(unit):
    # values from 1 to 10**13 and the 999.5 / 1024 boundaries of each unit: no "e+", at
    # most three significant digits, except whole numbers of the base unit (ns, B) and of
    # the largest (s, TiB), which print every digit
    values = [v * 10.0**k for k in range(13) for v in (1, 1.5, 9.994, 9.995, 9.996, 99.95, 999.4, 999.5, 999.99)]
    values += [1024.0**k * v for k in range(5) for v in (999.5, 1000, 1023.4, 1023.6)]
    for v in values:
        text = F.format_value(v, unit)
        number, name = text.split()
        assert "e" not in number, text
        whole = "." not in number and name in ("ns", "B", "s", "TiB")
        assert whole or len(number.replace(",", "").replace(".", "").lstrip("0")) <= 3, text
        if "." in number:  # decimals kept: three significant digits exactly
            assert len(number.replace(".", "").lstrip("0")) == 3, text


def test_names_and_paths_are_escaped_in_labels_and_hover():
    # GIVEN a function named like a script tag in a file with a quote in its path
    evil = Frame(EVIL, "/home/u/it's<b>.py", 3, 1)
    fd = F.flame_data(F.call_tree(build([([main, evil], EventType.CPU, 1, MS)]), "cpu"))
    # THEN no raw tag reaches plotly's (HTML-interpreting) labels or hover
    blob = repr(fd.labels) + repr(fd.customdata)
    assert "<script>" not in blob and "<b>" not in blob
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in fd.labels


# --- colours -------------------------------------------------------------------------


def _luminance(color: str) -> float:
    def chan(c):
        c = c / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g_, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * chan(r) + 0.7152 * chan(g_) + 0.0722 * chan(b)


def test_colours_are_stable_per_package_and_not_random():
    # GIVEN two files of the same package and one of another
    a, b, c = (Frame("x", NUMPY, 1, 1), Frame("y", NUMPY2, 1, 1), Frame("z", JSON, 1, 1))
    # THEN the package decides the colour, and the colour is a fixed function of its name
    assert F.module_of(a) == F.module_of(b) == "numpy"
    assert F.module_of(c) == "json"
    assert F.frame_color(a) == F.frame_color(b) != F.frame_color(c)
    assert F.color_for("numpy") == F.color_for("numpy")
    # crc32-based: the same in every process (Python's str hash is salted per process)
    assert F.color_for("numpy") == "#a4d6df"


def test_native_frames_are_coloured_by_library():
    # GIVEN native frames of numpy's extension, of the BLAS its wheel vendors, of libc, of an
    #   extension module outside site-packages, and one with no library
    site = "/venv/lib/python3.11/site-packages/"
    ext = Frame("gemm", site + "numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so", kind=FrameKind.NATIVE)
    blas = Frame("dgemm_", site + "numpy.libs/libscipy_openblas64_-ff651d7f.so", kind=FrameKind.NATIVE)
    libc = Frame("memcpy", "/usr/lib/x86_64-linux-gnu/libc.so.6", kind=FrameKind.NATIVE)
    mine = Frame("work", "/tmp/build/_mine.cpython-311-x86_64-linux-gnu.so", kind=FrameKind.NATIVE)
    nowhere = Frame("[anon]+0x10", kind=FrameKind.NATIVE)
    # THEN an installed package's native frames are that package, coloured as its Python frames;
    #   others are their library's name; each library its own colour
    assert F.module_of(ext) == F.module_of(blas) == F.module_of(Frame("x", NUMPY, 1, 1)) == "numpy"
    assert F.frame_color(ext) == F.frame_color(Frame("x", NUMPY, 1, 1))
    assert (F.module_of(libc), F.module_of(mine), F.module_of(nowhere)) == ("libc", "_mine", "[native]")
    assert len({F.frame_color(f) for f in (ext, libc, mine, nowhere)}) == 4


def test_node_colours_keep_dark_text_readable():
    # GIVEN many module names WHEN coloured THEN dark node text keeps a 4.5:1 contrast
    text = _luminance(F.TEXT_COLOR)
    for name in [f"pkg{i}" for i in range(300)] + ["numpy", "json", "notebook", "threading"]:
        lum = _luminance(F.color_for(name))
        assert (lum + 0.05) / (text + 0.05) >= 4.5, name
    # and they are not washed out: some saturation survives for the dark theme
    r, g_, b = (int(F.color_for("numpy")[i : i + 2], 16) / 255 for i in (1, 3, 5))
    assert colorsys.rgb_to_hls(r, g_, b)[2] > 0.3


def test_module_of_and_is_library():
    assert F.module_of(Frame("f", "/tmp/ipykernel_123/456789.py", 1, 1)) == "notebook"
    assert F.module_of(Frame("f", "Cell In[3]", 1, 1)) == "notebook"
    assert F.module_of(Frame("[GC]", kind=FrameKind.GC)) == "[gc]"
    assert F.module_of(Frame("f", APP, 1, 1)) == "app"
    assert F.is_library(decode) and F.is_library(dot)
    assert F.is_library(Frame("_find_and_load", "<frozen importlib._bootstrap>", 1, 1))
    assert F.is_library(Frame("memcpy", kind=FrameKind.NATIVE))
    assert not F.is_library(main)
    assert not F.is_library(Frame("f", "/tmp/ipykernel_1/2.py", 1, 1))
    assert not F.is_library(Frame("[GC]", kind=FrameKind.GC))


# --- search --------------------------------------------------------------------------


def test_search_highlights_matches_and_reports_their_share():
    # GIVEN f (70 %) with decode (20 %) nested inside it
    tree = F.call_tree(basic(), "cpu")
    plain = F.flame_data(tree)
    # WHEN searching a pattern matching both f and decode ("^f$|decode")
    fd = F.flame_data(tree, search="^f$|decode")
    # THEN the share counts nested matches once (70 %), matches keep their colour and get a
    # border, the others fade
    assert fd.search_share == pytest.approx(0.70)
    assert "70.0%" in fd.title
    k_f, k_g = fd.labels.index("f"), fd.labels.index("g")
    assert fd.colors[k_f] == plain.colors[k_f] and fd.line_colors[k_f] == F.HIT_LINE
    assert fd.colors[k_g] != plain.colors[k_g] and fd.line_colors[k_g] != F.HIT_LINE
    assert fd.search_matches == 2


def test_search_text_that_is_not_a_regex_is_matched_literally():
    p = build([([main, Frame("f(", APP, 1, 1)], EventType.CPU, 1, MS), ([main, g], EventType.CPU, 1, MS)])
    fd = F.flame_data(F.call_tree(p, "cpu"), search="f(")
    assert fd.search_share == pytest.approx(0.5)


# --- only my code --------------------------------------------------------------------


def test_only_my_code_folds_library_frames_into_their_caller():
    # GIVEN f calls json's decode (stdlib), which calls numpy (site-packages) -> back to g (user)
    p = build([
        ([main, f, decode, dot], EventType.CPU, 1, 20 * MS),
        ([main, f, decode, dot, g], EventType.CPU, 1, 5 * MS),
        ([main, f], EventType.CPU, 1, 50 * MS),
    ])
    # WHEN only my code is shown
    tree = F.call_tree(p, "cpu", only_my_code=True)
    fd = F.flame_data(tree)
    # THEN library frames are gone and their time is f's self time; g hangs under f
    assert "JSONDecoder.decode" not in fd.labels and "dot" not in fd.labels
    k_f = fd.labels.index("f")
    assert fd.raw[k_f].tolist() == [70 * MS, 75 * MS]
    assert fd.parents[fd.labels.index("g")] == fd.ids[k_f]
    # and the full view still has them
    assert "dot" in F.flame_data(F.call_tree(p, "cpu")).labels


def test_only_my_code_keeps_a_library_root():
    # GIVEN a thread whose stacks start in threading (stdlib) and run user code
    boot = Frame("Thread._bootstrap", "/usr/lib/python3.11/threading.py", 995, 990)
    run = Frame("Thread.run", "/usr/lib/python3.11/threading.py", 975, 970)
    p = build([([boot, run, f], EventType.CPU, 1, 10 * MS)])
    fd = F.flame_data(F.call_tree(p, "cpu", only_my_code=True))
    # THEN the root frame stays (its value must go somewhere) and the rest folds
    assert fd.labels == ["all (CPU time)", "Thread._bootstrap", "f"]


# --- diff ----------------------------------------------------------------------------


def diff_pair():
    """before: f 60 ms, g 40 ms (100); after: f 150 ms, g 40 ms, h 10 ms (200)."""
    h = Frame("h", APP, 42, 40)
    before = build([([main, f], EventType.CPU, 6, 60 * MS), ([main, g], EventType.CPU, 4, 40 * MS)])
    after = build([
        ([main, f], EventType.CPU, 15, 150 * MS),
        ([main, g], EventType.CPU, 4, 40 * MS),
        ([main, h], EventType.CPU, 1, 10 * MS),
    ])
    return before, after


def test_diff_absolute_values_are_exact():
    before, after = diff_pair()
    tree = F.diff_tree(before, after, "cpu")
    fd = F.flame_data(tree, normalize=False)
    raw = {lab: fd.raw[k].tolist() for k, lab in enumerate(fd.labels)}
    # columns: before total, after total, change, before self, after self
    assert raw["f"] == [60 * MS, 150 * MS, 90 * MS, 60 * MS, 150 * MS]
    assert raw["g"] == [40 * MS, 40 * MS, 0, 40 * MS, 40 * MS]
    assert raw["h"] == [0, 10 * MS, 10 * MS, 0, 10 * MS]
    assert raw["main"][:3] == [100 * MS, 200 * MS, 100 * MS]
    # widths hold the larger of the two sides, so both growth and shrinkage are visible
    assert by_label(fd)["f"] == 150 * MS and by_label(fd)["g"] == 40 * MS
    assert_consistent(fd)
    assert fd.customdata[fd.labels.index("h")][5] == "new"


def test_diff_normalised_by_total_is_exact_and_coloured():
    before, after = diff_pair()
    fd = F.flame_data(F.diff_tree(before, after, "cpu"), normalize=True)
    raw = {lab: fd.raw[k].tolist() for k, lab in enumerate(fd.labels)}
    # before is scaled by 200/100: f 120 -> 150 (+30), g 80 -> 40 (-40), h 0 -> 10
    assert raw["f"][:3] == [120 * MS, 150 * MS, 30 * MS]
    assert raw["g"][:3] == [80 * MS, 40 * MS, -40 * MS]
    assert raw["h"][:3] == [0, 10 * MS, 10 * MS]
    assert raw["main"][2] == 0
    # growth is red, shrinkage blue, an unchanged node near-white
    r, g_, b = (int(fd.colors[fd.labels.index("f")][i : i + 2], 16) for i in (1, 3, 5))
    assert r > g_ and r > b
    r, g_, b = (int(fd.colors[fd.labels.index("g")][i : i + 2], 16) for i in (1, 3, 5))
    assert b > r and b > g_
    assert fd.customdata[fd.labels.index("g")][4] == "−40.0 ms"
    assert "normalised" in fd.title
    assert_consistent(fd)


def test_diff_of_identical_profiles_is_all_zero():
    before, _ = diff_pair()
    fd = F.flame_data(F.diff_tree(before, before, "cpu"))
    assert all(d == 0 for d in fd.raw[:, 2])


# --- timeline ------------------------------------------------------------------------


def test_timeline_has_a_lane_per_thread_coloured_by_state():
    # GIVEN two threads; worker is on CPU for 2 ms then waits on a lock for 2 ms
    p = build([
        ([main, f], EventType.WALL, 1, MS, (1, "MainThread"), {"state": "cpu"}, 0),
        ([main, f], EventType.WALL, 1, MS, (2, "worker"), {"state": "cpu"}, 0),
        ([main, f], EventType.WALL, 1, MS, (2, "worker"), {"state": "cpu"}, 1),
        ([main, g], EventType.WALL, 3, 3 * MS, (2, "worker"), {"state": "lock"}, 2),
        ([main, g], EventType.WALL, 3, 3 * MS, (2, "worker"), {"state": "lock"}, 3),
    ], duration_ms=10)
    td = F.timeline_data(p, "wall")
    # THEN one lane per thread (MainThread first, though worker is busier) and runs
    # split where the state changes
    assert td.lanes == ["MainThread (1)", "worker (2)"]
    assert sorted(td.states) == ["cpu", "lock"]
    runs = sorted((td.lanes[ln], td.states[s], b, n) for ln, s, b, n in zip(td.lane, td.state, td.base, td.length))
    assert runs == [("MainThread (1)", "cpu", 0.0, 1.0), ("worker (2)", "cpu", 0.0, 2.0), ("worker (2)", "lock", 2.0, 2.0)]
    fig = F.timeline_figure(p, "wall")
    assert {t.name for t in fig.data} == {"cpu", "lock"}
    assert fig.layout.yaxis.fixedrange is True


def test_timeline_without_states_has_one_trace():
    td = F.timeline_data(basic(), "cpu")
    assert td.states == ["samples"] and td.lanes == ["MainThread (1)"]


# --- source view ---------------------------------------------------------------------


SOURCE = """\
import time


def work(n):
    total = 0
    for i in range(n):
        total += i * i
    time.sleep(0)
    return total


def other():
    pass
"""


def test_source_view_shows_per_line_values(tmp_path):
    # GIVEN work() sampled at lines 6 and 7 (7 also calls into the stdlib)
    path = tmp_path / "mod.py"
    path.write_text(SOURCE)
    fn = str(path)
    l6, l7 = Frame("work", fn, 6, 4), Frame("work", fn, 7, 4)
    p = build([
        ([main, l6], EventType.CPU, 1, 10 * MS),
        ([main, l7], EventType.CPU, 1, 30 * MS),
        ([main, l7, decode], EventType.CPU, 1, 5 * MS),
    ])
    sv = F.source_view(p, "cpu", ("work", fn, 4), read_lines=source_lines)
    # THEN the function's lines are listed, from its def to its last line, with values
    assert [ln.line for ln in sv.lines] == list(range(4, 10))
    by_line = {ln.line: ln for ln in sv.lines}
    assert by_line[7].text.strip() == "total += i * i"
    assert (by_line[6].self, by_line[6].total) == (10 * MS, 10 * MS)
    assert (by_line[7].self, by_line[7].total) == (30 * MS, 35 * MS)
    assert sv.total == 45 * MS and sv.has_source
    html = F.source_html(sv)
    assert "total += i * i" in html and "35.0 ms" in html


def test_source_view_of_a_notebook_cell_comes_from_linecache():
    # GIVEN a cell registered in linecache the way IPython does it
    name = "<ipython-input-7-0123456789ab>"
    cell = "x = 1\nfor _ in range(10):\n    x = x * 3 % 7  # <hot>\nprint(x)\n"
    linecache.cache[name] = (len(cell), None, cell.splitlines(True), name)
    try:
        fr = Frame("<module>", name, 3, 1)
        sv = F.source_view(build([([fr], EventType.CPU, 1, 10 * MS)]), "cpu", fr, read_lines=source_lines)
    finally:
        del linecache.cache[name]
    # THEN its lines show, with the value on line 3, and the code is escaped in HTML
    assert sv.has_source and sv.lines[2].line == 3 and sv.lines[2].total == 10 * MS
    html = F.source_html(sv)
    assert "&lt;hot&gt;" in html and "<hot>" not in html


def test_source_view_without_source_lists_sampled_lines():
    fr = Frame("gone", "/nonexistent/file.py", 9, 5)
    sv = F.source_view(build([([fr], EventType.CPU, 1, MS)]), "cpu", fr, read_lines=source_lines)
    assert not sv.has_source and [(ln.line, ln.text) for ln in sv.lines] == [(9, None)]


# --- static fallbacks ----------------------------------------------------------------


def test_static_flame_html_is_plain_svg_and_escaped():
    evil = Frame(EVIL, "/x/<img src=x onerror=alert(2)>.py", 3, 1)
    p = build([([main, evil], EventType.CPU, 1, 10 * MS), ([main, f], EventType.CPU, 1, 10 * MS)])
    html = F.static_flame_html(F.flame_data(F.call_tree(p, "cpu")))
    assert "<svg" in html and "<rect" in html
    assert "<script" not in html and "<img" not in html
    assert "&lt;script&gt;" in html
    # the flame's root sits on the bottom row
    ys = [int(m) for m in re.findall(r"<rect x='[0-9.]+' y='(\d+)'", html)]
    assert ys[0] == max(ys)


def test_top_table_text_and_html():
    from ddprof_nb.model import top

    p = basic()
    rows = top.top(p, "cpu")
    text = F.top_table(p, EventType.CPU, n=10, value_index=1, rows=rows)
    assert text.splitlines()[2].split() == ["50.0", "ms", "50.0%", "70.0", "ms", "70.0%", "f", "…/home/user/app.py:20"]
    assert text == F.top_table(p, "cpu")  # the rows given are the rows it would compute
    html = F.top_table_html([r._replace(name=EVIL) for r in rows], EventType.CPU, 1, p.total("cpu"))
    assert "<script>" not in html and "&lt;script&gt;" in html


# ---------------------------------------------------------------------------------------
# the filter fast paths the explorer relies on keep selection.filter's semantics


def _rows_by_key(p) -> dict[tuple, tuple[int, int]]:
    """Every row keyed by (event, stack as frames, thread, labels, time); asserts keys are unique."""
    out = {}
    for s in p.samples():
        key = (s.event, s.stack, s.thread, s.labels, s.time_ns)
        assert key not in out, f"duplicate row {key}"
        out[key] = s.values
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hide_matches_a_frame_by_frame_rewrite_and_merges_equal_stacks(seed):
    from ddprof_nb.model import selection

    rng = np.random.default_rng(seed)
    frames = [Frame(f"fn{i}", f"/app/m{i % 3}.py" if i % 4 else f"/lib/python3.11/site-packages/pkg{i}.py", i, i)
              for i in range(12)]
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10 * 10**9))
    for _ in range(300):
        stack = [frames[int(i)] for i in rng.integers(0, 12, size=int(rng.integers(0, 7)))]
        b.add(EventType.CPU if rng.random() < 0.7 else EventType.WALL, b.stack_of(stack),
              b.thread_id(int(rng.integers(1, 3))), b.labels_id({"k": str(int(rng.integers(0, 2)))}),
              int(rng.integers(0, 4)) * 10**9, 1, int(rng.integers(1, 100)))
    p = b.build()
    for pattern in ("site-packages", "^fn[13579]$", "fn", "nomatch"):
        rx = re.compile(pattern)
        hidden = selection.filter(p, hide=pattern)
        expected = selection.map_stacks(
            p, lambda fs, _ids: [f for f in fs if not (rx.search(f.name) or rx.search(f.filename))])
        assert _rows_by_key(hidden) == _rows_by_key(expected), pattern
        assert len(set(hidden.stacks)) == len(hidden.stacks)  # equal stacks merged
        flat, offsets = hidden.flat_stacks()
        assert [tuple(flat[a:b].tolist()) for a, b in zip(offsets[:-1], offsets[1:])] == list(hidden.stacks)
        # hide combined with a row filter: the same as hiding, then filtering
        both = selection.filter(p, hide=pattern, threads=[1])
        assert _rows_by_key(both) == _rows_by_key(selection.filter(expected, threads=[1]))


@pytest.mark.parametrize("collide", [False, True])
def test_intern_segments_is_exact_even_when_hashes_collide(collide, monkeypatch):
    from ddprof_nb.model import selection

    rng = np.random.default_rng(5)
    segs = [tuple(rng.integers(0, 4, size=int(rng.integers(0, 5))).tolist()) for _ in range(400)]
    lengths = [len(s) for s in segs]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = np.array([f for s in segs for f in s], dtype=np.int32)
    if collide:  # every multiplier 1: segments with equal sums collide, and must still be told apart
        monkeypatch.setattr(selection, "_HASH_MULT", np.ones(64, dtype=np.uint64))
    ids, first = selection.intern_segments(flat, offsets)
    # THEN ids are a dict interning in order of first appearance
    expected: dict = {}
    assert ids.tolist() == [expected.setdefault(s, len(expected)) for s in segs]
    assert [segs[i] for i in first] == list(expected)


def test_csr_stacks_behave_as_the_tuple_table():
    import pickle

    from ddprof_nb.model import CSRStacks

    table = ((0, 1), (), (2,), (0, 1, 2))
    flat = np.array([f for s in table for f in s], dtype=np.int32)
    offsets = np.array([0, 2, 2, 3, 6])
    st = CSRStacks(flat, offsets)
    assert len(st) == 4 and list(st) == list(table) and st[3] == (0, 1, 2) and st[-1] == (0, 1, 2)
    assert st[1:3] == table[1:3] and st == table
    with pytest.raises(IndexError):
        st[4]
    assert pickle.loads(pickle.dumps(st)) == table


def test_value_labels_name_what_each_value_counts():
    labels = {e.label: (F.value_label(e, 0), F.value_label(e, 1)) for e in EventType}
    assert labels == {"cpu": ("samples", "time"), "wall": ("samples", "time"), "alloc": ("objects", "bytes"),
                      "live": ("objects", "bytes"), "lock": ("waits", "time"), "park": ("waits", "time")}


def test_flame_titles_name_the_event_and_its_total_once():
    p = basic()
    assert F.flame_data(F.call_tree(p, "cpu", 1)).title == "CPU time: 100 ms"
    assert F.flame_data(F.call_tree(p, "cpu", 0)).title.startswith("CPU time (samples): ")


def test_source_view_of_a_function_without_samples_of_the_event_is_empty():
    # GIVEN g sampled for CPU only, as the leaf (a line beyond every wall-sampled line)
    p = build([([main, g], EventType.CPU, 1, MS), ([main], EventType.WALL, 1, MS)])
    # THEN its wall source view has no values (and does not index past its lines)
    sv = F.source_view(p, "wall", g)
    assert sv.total == 0 and all(line.total == 0 for line in sv.lines)


def test_source_view_of_a_pseudo_frame_says_so_without_a_line_0_row():
    main = Frame("main", APP, 3, 1)
    gc = Frame("[GC]", "", 0, 0, FrameKind.GC)
    sv = F.source_view(build([([main, gc], EventType.CPU, 1, 10 * MS)]), "cpu", gc, read_lines=source_lines)
    html = F.source_html(sv)
    assert f"Not Python source: {F.esc(F.PSEUDO_FRAMES['[GC]'])}; no lines" in html and "no source file" in html
    assert ":0<" not in html and "<td" not in html
    # a file without line numbers (folded stacks): its row says "?" rather than "0"
    nolines = Frame("work", APP, 0, 0)
    html = F.source_html(F.source_view(build([([nolines], EventType.CPU, 1, MS)]), "cpu", nolines,
                                       read_lines=lambda _: None))
    assert ">?</td>" in html and ">0</td>" not in html
