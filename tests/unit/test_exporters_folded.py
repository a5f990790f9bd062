"""Folded stacks: golden files, round trip of stacks and totals, escaping, reading."""

from __future__ import annotations

import pytest

from ddprof_nb.events import EventType, FrameKind
from ddprof_nb.exporters import folded
from ddprof_nb.model import Frame, ProfileBuilder

try:
    from test_exporters import DATA, check_golden, leaf_frame, mock_metadata, mock_profile, per_stack_totals
except ImportError:  # collected as a package
    from .test_exporters import DATA, check_golden, leaf_frame, mock_metadata, mock_profile, per_stack_totals

GOLDEN = DATA / "folded"


def _totals(profile):
    """Per-stack totals keyed by the frames' folded text (native names gain brackets)."""
    return per_stack_totals(profile, frame_key=folded.frame_text)


@pytest.mark.parametrize("event", list(EventType))
def test_folded_output_matches_the_golden_file(tmp_path, update_golden, event):
    # GIVEN the mock profile  WHEN written as folded files into a directory
    written = folded.write(mock_profile(), tmp_path)
    # THEN there is one file per event, and this event's text equals tests/data/folded/<event>.folded
    assert sorted(p.name for p in written) == sorted(f"{e.label}.folded" for e in EventType)
    check_golden(GOLDEN / f"{event.label}.folded", (tmp_path / f"{event.label}.folded").read_text(), update_golden)


def test_lines_are_root_first_with_file_and_line_and_primary_values():
    # GIVEN the mock profile
    p = mock_profile()
    # WHEN its cpu stacks are folded
    lines = folded.dumps(p, "cpu").splitlines()
    # THEN a Python leaf reads "qualname (file:line)", pseudo-frames their bracketed name,
    # the value is nanoseconds (the primary quantity), and lines are sorted
    assert "<module> (/nb/cell7.py:3);Model.fit (/src/model.py:42);Model.step (/src/model.py:57) 1000" in lines
    assert "<module> (/nb/cell7.py:3);Model.fit (/src/model.py:42);[gc] 3000" in lines
    assert "<module> (/nb/cell7.py:3);Model.fit (/src/model.py:42);[zlib.compress] 2000" in lines
    assert lines == sorted(lines)


def test_the_same_stack_on_several_threads_and_ticks_is_one_line():
    # GIVEN one stack sampled on two threads at two ticks with two label sets
    b = ProfileBuilder(mock_metadata())
    s = b.stack_of([Frame("main", "m.py", 1, 1), Frame("f", "m.py", 5, 4)])
    b.add("wall", s, b.thread_id(1, "a"), 0, 0, 1, 10)
    b.add("wall", s, b.thread_id(2, "b"), b.labels_id({"k": "v"}), 50_000_000, 1, 32)
    # WHEN folded  THEN one line carries the sum
    assert folded.dumps(b.build(), "wall") == "main (m.py:1);f (m.py:5) 42\n"


def test_separators_in_names_cannot_corrupt_the_format():
    # GIVEN frame names and files holding ';', newlines and other line breaks
    b = ProfileBuilder(mock_metadata())
    s = b.stack_of([Frame("a;b", "x;y.py", 1, 1), Frame("c\nd\re\u2028f", "g\nh.py", 2, 2),
                    Frame("[weird;gc]", kind=FrameKind.GC)])
    b.add("cpu", s, b.thread_id(1, "t"), 0, 0, 1, 7)
    # WHEN folded
    text = folded.dumps(b.build(), "cpu")
    # THEN it is one line of three frames, with ';' -> ',' and line breaks -> ' '
    assert text == "a,b (x,y.py:1);c d e f (g h.py:2);[weird,gc] 7\n"
    # AND it reads back as three frames
    (sample,) = folded.loads(text, event="cpu").samples()
    assert [f.name for f in sample.stack] == ["a,b", "c d e f", "[weird,gc]"]


def test_round_trip_keeps_every_stack_and_its_total():
    # GIVEN the mock profile with every event
    p = mock_profile()
    # WHEN each event is folded and read back
    for event in p.events:
        q = folded.loads(folded.dumps(p, event), event=event)
        # THEN each stack's frames (name, file, line) and total primary value are kept
        want = {k: v for k, v in _totals(p).items() if k[0] is event and v}
        assert _totals(q) == want


@pytest.mark.parametrize("kind", [k for k in FrameKind if k is not FrameKind.PYTHON])
def test_reading_infers_pseudo_frame_kinds_from_their_names(kind):
    # GIVEN a folded line whose leaf is the bracketed label of a frame kind
    text = f"main (m.py:1);[{kind.label}] 5\n"
    # WHEN read  THEN the leaf has that kind and the Python frame is a Python frame
    (sample,) = folded.loads(text, event="cpu").samples()
    assert [f.kind for f in sample.stack] == [FrameKind.PYTHON, kind]
    assert sample.stack[0] == Frame("main", "m.py", 1, 0, FrameKind.PYTHON)


def test_unknown_bracketed_leaves_take_the_events_leaf_kind():
    # GIVEN an alloc stack ending in an allocated type, and a cpu stack ending in a native name
    alloc = folded.loads("main (m.py:1);[list] 64\n", event="alloc")
    cpu = folded.loads("main (m.py:1);[memcpy] 9\n", event="cpu")
    # THEN alloc's leaf is an alloc_type frame and cpu's a native frame
    assert next(alloc.samples()).stack[-1].kind is FrameKind.ALLOC_TYPE
    assert next(cpu.samples()).stack[-1].kind is FrameKind.NATIVE


def test_reading_other_tools_output():
    # GIVEN flamegraph.pl-style lines (no files), CRLF endings, a BOM, blank lines, repeats
    text = "\ufeffmain;foo;bar 10\r\nmain;foo 5\r\n\r\nmain;foo;bar 3\n"
    # WHEN read as wall stacks
    p = folded.loads(text, event="wall")
    # THEN stacks are root first and repeated lines add up; one "all threads" thread; count 0
    rows = sorted((tuple(f.name for f in s.stack), s.values, s.thread.name) for s in p.samples())
    assert rows == [(("main", "foo"), (0, 5), "all threads"), (("main", "foo", "bar"), (0, 13), "all threads")]
    assert p.metadata.extra == {"source_format": "folded"}


def test_read_takes_the_event_from_the_file_name(tmp_path):
    # GIVEN lock stacks saved as run1.lock.folded
    path = tmp_path / "run1.lock.folded"
    path.write_text("main;[lock] 100\n")
    # WHEN read without event=  THEN the rows are lock rows
    assert folded.read(path).events == (EventType.LOCK,)


def test_read_without_an_event_name_is_refused(tmp_path):
    # GIVEN a folded file whose name names no event
    path = tmp_path / "stacks.folded"
    path.write_text("main;f 1\n")
    # WHEN read without event=  THEN ValueError names the file and the accepted names
    with pytest.raises(ValueError, match=r"stacks\.folded.*<event>\.folded.*cpu, wall"):
        folded.read(path)


def test_read_directory_combines_every_event(tmp_path):
    # GIVEN the mock profile written as a directory of folded files
    p = mock_profile()
    folded.write(p, tmp_path / "out")
    # WHEN the directory is read
    q = folded.read(tmp_path / "out")
    # THEN every event is back with its per-stack totals
    assert q.events == p.events
    assert _totals(q) == {k: v for k, v in _totals(p).items() if v}


def test_read_directory_refuses_stray_or_missing_files(tmp_path):
    # GIVEN an empty directory, and one with a .folded file named after no event
    (tmp_path / "empty").mkdir()
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "cpu.folded").write_text("a 1\n")
    (tmp_path / "odd" / "mystery.folded").write_text("a 1\n")
    # WHEN read  THEN ValueErrors name the directory or the stray file
    with pytest.raises(ValueError, match=r"empty: no <event>\.folded files"):
        folded.read(tmp_path / "empty")
    with pytest.raises(ValueError, match=r"mystery\.folded: not named after an event"):
        folded.read(tmp_path / "odd")


@pytest.mark.parametrize(
    "text, where",
    [
        ("main;f\n", ":1:"),  # no value
        ("main;f 1\nmain;g ten\n", ":2:"),  # not an integer
        ("main;f 1.5\n", ":1:"),  # not an integer
        ("main;f 99999999999999999999\n", ":1:"),  # more than 64 bits
        ("main;f 9223372036854775807\nmain;f 1\n", ":2:"),  # total overflows
    ],
)
def test_malformed_lines_are_value_errors_naming_file_and_line(text, where):
    # GIVEN a malformed folded text  WHEN read  THEN ValueError names the input and the line
    with pytest.raises(ValueError, match=f"cpu.folded{where}"):
        folded.loads(text, event="cpu", name="cpu.folded")


def test_binary_input_is_a_value_error():
    # GIVEN bytes that are not UTF-8  WHEN read  THEN ValueError names the input
    with pytest.raises(ValueError, match=r"x\.folded: not UTF-8"):
        folded.loads(b"\xff\xfe\x00garbage 1\n", event="cpu", name="x.folded")


def test_every_kind_label_is_a_valid_frame_for_the_reader():
    # GIVEN every kind's leaf frame as the mock writes it  WHEN folded and read
    b = ProfileBuilder(mock_metadata())
    for i, kind in enumerate(FrameKind):
        b.add("cpu", b.stack_of([leaf_frame(kind)]), b.thread_id(1, "t"), 0, 0, 1, i + 1)
    q = folded.loads(folded.dumps(b.build(), "cpu"), event="cpu")
    # THEN every kind comes back (native's "[zlib.compress]" through cpu's fallback)
    kinds = {s.values[1] - 1: s.stack[-1].kind for s in q.samples()}
    assert [kinds[i] for i in range(len(FrameKind))] == list(FrameKind)
