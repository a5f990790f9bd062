"""Exporters: the shared mock profile, save() dispatch, file modes, and table coverage.

The other test_exporters_*.py modules import ``mock_profile`` and ``canon`` from here.
"""

from __future__ import annotations

import collections
import os
import stat
import sys
import types
from pathlib import Path

import pytest

import ddprof_nb
from ddprof_nb import exporters
from ddprof_nb.events import EventType, FrameKind
from ddprof_nb.exporters import folded, pprof, speedscope
from ddprof_nb.model import Frame, Metadata, Profile, ProfileBuilder

DATA = Path(__file__).resolve().parent.parent / "data"
START_NS = 1_700_000_000_000_000_000


def mock_metadata(**changes) -> Metadata:
    """Fixed metadata (no host/pid/version of the machine running the tests)."""
    meta = Metadata(
        start_ns=START_NS,
        end_ns=START_NS + 2_000_000_000,
        interval_ns=10_000_000,
        engine="mock",
        python_version="3.11.7",
        pid=4242,
        host="testhost",
        dropped={e: i for i, e in enumerate(EventType)},
        notes=("sampled at 100 Hz", "a note with = and\na newline"),
        extra={"cell": "7", "odd=key": "x;y"},
    )
    return meta.replace(**changes)


def leaf_frame(kind: FrameKind) -> Frame:
    """A leaf of ``kind``: a real function for python, else a pseudo-frame named after the kind."""
    if kind is FrameKind.PYTHON:
        return Frame("Model.step", "/src/model.py", 57, 50)
    if kind is FrameKind.NATIVE:
        return Frame("zlib.compress", kind=kind)  # unbracketed: folded adds brackets
    return Frame(f"[{kind.label}]", kind=kind)


def mock_profile(*, zero_row: bool = True, negative_row: bool = False) -> Profile:
    """A profile shaped like an engine's: every EventType x every FrameKind leaf, two
    threads, three label sets (one reusing reserved pprof keys), distinct time ticks,
    plus a (0, 0) row (its event is not implied by its values)."""
    b = ProfileBuilder(mock_metadata())
    threads = [b.thread_id(101, "MainThread"), b.thread_id(202, "worker-1")]
    labelsets = [
        b.labels_id(None),
        b.labels_id({"cell": "7"}),
        b.labels_id({"request": "a;b", "thread id": "user", "time_ns": "user", "ddprof_nb.event": "cpu"}),
    ]
    root = Frame("<module>", "/nb/cell7.py", 3, 1)
    mid = Frame("Model.fit", "/src/model.py", 42, 40)
    kinds = list(FrameKind)
    for i, event in enumerate(EventType):
        for j, kind in enumerate(kinds):
            stack = b.stack_of([root, mid, leaf_frame(kind)])
            tick = (i * len(kinds) + j) * 7_000_000
            b.add(event, stack, threads[j % 2], labelsets[j % 3], tick, j + 1, (j + 1) * 1000 * (i + 1))
    if zero_row:
        b.add(EventType.LOCK, b.stack_of([root]), threads[1], labelsets[2], 0, 0, 0)
    if negative_row:
        b.add(EventType.CPU, b.stack_of([root, mid]), threads[0], labelsets[0], 0, -1, -500)
    return b.build()


def canon(profile: Profile) -> collections.Counter:
    """Table-order-independent form of every row: what an exact round trip must keep."""
    return collections.Counter(
        (s.event, s.stack, s.thread, s.labels.items, s.time_ns, s.values) for s in profile.samples()
    )


def per_stack_totals(profile: Profile, value_index: int = 1, frame_key=Frame.label) -> dict:
    """{(event, frame keys root first): total}: what lossy formats must keep."""
    out: dict = collections.defaultdict(int)
    for s in profile.samples():
        out[(s.event, tuple(frame_key(f) for f in s.stack))] += s.values[value_index]
    return dict(out)


def check_golden(path: Path, text: str, update: bool) -> None:
    """Compare ``text`` with the golden file, or rewrite it under ``pytest --update``."""
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"{path} is missing: run pytest --update and review it"
    assert text == path.read_text(encoding="utf-8"), f"{path} differs: review, then pytest --update"


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# --------------------------------------------------------------------------- the mock itself


def test_mock_profile_covers_every_event_and_frame_kind():
    # GIVEN the mock profile used by every exporter test
    p = mock_profile()
    # THEN every event type and every frame kind appears, so a new row in events.h is exercised
    assert set(p.events) == set(EventType)
    assert {f.kind for f in p.frames} == set(FrameKind)


@pytest.mark.parametrize("event", list(EventType))
def test_every_event_has_a_mapping_in_every_format(event):
    # GIVEN any event type
    # THEN folded has a file name for it, speedscope a unit, and pprof maps its value types back
    assert folded.file_name(event) == f"{event.label}.folded"
    assert folded.event_from_filename(folded.file_name(event)) is event
    assert event.unit in ("nanoseconds", "bytes")  # both are speedscope units
    assert speedscope.to_json(mock_profile())["profiles"]  # writer runs with every event present
    known = pprof._sample_type_map()
    for index, vt in enumerate(event.value_types):
        assert known[(vt.type, vt.unit)] == (event, index)


@pytest.mark.parametrize("kind", list(FrameKind))
def test_every_frame_kind_survives_pprof_and_speedscope(kind):
    # GIVEN a one-row profile whose leaf is of this kind
    b = ProfileBuilder(mock_metadata())
    b.add(EventType.CPU, b.stack_of([Frame("main", "m.py", 1, 1), leaf_frame(kind)]), b.thread_id(1, "t"), 0, 0, 1, 10)
    p = b.build()
    # WHEN it goes through pprof and speedscope
    back = [pprof.loads(pprof.dumps(p)), speedscope.loads(speedscope.dumps(p))]
    # THEN the leaf comes back with the same kind (and everything else)
    for q in back:
        assert [s.stack[-1].kind for s in q.samples()] == [kind]
        assert canon(q) == canon(p)


# --------------------------------------------------------------------------- save()


@pytest.mark.parametrize(
    "filename, reader",
    [
        ("run.pprof", pprof.read),
        ("run.pb.gz", pprof.read),
        ("RUN.PPROF", pprof.read),
        ("run.speedscope.json", speedscope.read),
    ],
)
def test_save_picks_the_format_from_the_name(tmp_path, filename, reader):
    # GIVEN a profile
    p = mock_profile()
    # WHEN saved under a name of a supported format
    path = tmp_path / filename
    exporters.save(p, path)
    # THEN that format's reader reads it back exactly, and the file is private (0600)
    assert canon(reader(path)) == canon(p)
    assert mode_of(path) == 0o600


def test_save_folded_file_takes_the_event_from_the_name_or_the_option(tmp_path):
    # GIVEN a profile with every event
    p = mock_profile()
    # WHEN saved as cpu.folded, run1.wall.folded, and stacks.folded with event="alloc"
    exporters.save(p, tmp_path / "cpu.folded")
    exporters.save(p, tmp_path / "run1.wall.folded")
    exporters.save(p, tmp_path / "stacks.folded", event="alloc")
    # THEN each file holds exactly that event's folded text, mode 0600
    assert (tmp_path / "cpu.folded").read_text() == folded.dumps(p, "cpu")
    assert (tmp_path / "run1.wall.folded").read_text() == folded.dumps(p, "wall")
    assert (tmp_path / "stacks.folded").read_text() == folded.dumps(p, "alloc")
    assert {mode_of(f) for f in tmp_path.iterdir()} == {0o600}


def test_save_folded_without_an_event_is_refused(tmp_path):
    # GIVEN a .folded name that names no event  WHEN saved without event=
    # THEN ValueError says how to name the event, and nothing is written
    with pytest.raises(ValueError, match=r"stacks\.folded.*cpu\.folded.*event="):
        exporters.save(mock_profile(), tmp_path / "stacks.folded")
    assert list(tmp_path.iterdir()) == []


def test_save_folded_for_an_absent_event_is_refused(tmp_path):
    # GIVEN a profile without park samples
    b = ProfileBuilder(mock_metadata())
    b.add("cpu", b.stack_of([Frame("f", "f.py", 1, 1)]), b.thread_id(1, "t"), 0, 0, 1, 5)
    # WHEN saved as park.folded  THEN ValueError names the events present
    with pytest.raises(ValueError, match=r"park\.folded.*no park samples.*cpu"):
        exporters.save(b.build(), tmp_path / "park.folded")


def test_save_to_an_existing_directory_writes_one_folded_file_per_event(tmp_path):
    # GIVEN an existing directory
    out = tmp_path / "stacks"
    out.mkdir()
    p = mock_profile()
    # WHEN the profile is saved to it
    exporters.save(p, out)
    # THEN there is one <event>.folded per event present, each 0600, with that event's stacks
    assert sorted(f.name for f in out.iterdir()) == sorted(f"{e.label}.folded" for e in EventType)
    for e in EventType:
        assert (out / f"{e.label}.folded").read_text() == folded.dumps(p, e)
        assert mode_of(out / f"{e.label}.folded") == 0o600


def test_save_html_dispatches_to_the_html_exporter(tmp_path, monkeypatch):
    # GIVEN a stand-in html exporter (html.py is another module's job)
    calls = []
    fake = types.ModuleType("ddprof_nb.exporters.html")
    fake.write = lambda profile, path, **options: calls.append((profile, Path(path), options))
    monkeypatch.setitem(sys.modules, "ddprof_nb.exporters.html", fake)
    monkeypatch.setattr(exporters, "html", fake, raising=False)
    p = mock_profile()
    # WHEN saved as report.html with an option
    exporters.save(p, tmp_path / "report.html", title="x")
    # THEN html.write got the profile, the path and the option
    assert calls == [(p, tmp_path / "report.html", {"title": "x"})]


@pytest.mark.parametrize("filename", ["run.txt", "run.json", "run", "run.pprof.bak", "run.gz"])
def test_save_refuses_unknown_names_and_lists_the_supported_ones(tmp_path, filename):
    # GIVEN a name of no supported format  WHEN saved  THEN ValueError lists what is supported
    with pytest.raises(ValueError) as err:
        exporters.save(mock_profile(), tmp_path / filename)
    for supported in (".pprof", ".pb.gz", ".speedscope.json", ".folded", ".html", "directory"):
        assert supported in str(err.value)
    assert filename in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_save_replaces_atomically_and_makes_an_existing_file_private(tmp_path):
    # GIVEN an existing world-readable file at the target
    path = tmp_path / "run.pprof"
    path.write_bytes(b"old")
    os.chmod(path, 0o644)
    # WHEN a profile is saved over it
    exporters.save(mock_profile(), path)
    # THEN it holds the new profile, is 0600, and no temporary file is left behind
    assert pprof.read(path).events == tuple(EventType)
    assert mode_of(path) == 0o600
    assert [f.name for f in tmp_path.iterdir()] == ["run.pprof"]


def test_a_failed_write_leaves_neither_a_torn_file_nor_a_temporary(tmp_path, monkeypatch):
    # GIVEN an existing good file, and a disk that fails during the write
    path = tmp_path / "run.pprof"
    exporters.save(mock_profile(), path)
    before = path.read_bytes()

    def failing_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    # WHEN saving again fails
    with pytest.raises(OSError):
        exporters.save(mock_profile(negative_row=True), path)
    # THEN the old file is intact and no temporary file remains
    assert path.read_bytes() == before
    assert [f.name for f in tmp_path.iterdir()] == ["run.pprof"]


def test_the_public_save_is_the_dispatcher_and_a_profile_writes_no_files(tmp_path):
    # GIVEN a profile  WHEN ddprof_nb.save is called with a speedscope name
    p = mock_profile()
    ddprof_nb.save(p, tmp_path / "x.speedscope.json")
    # THEN the file is speedscope, readable exactly; files are the exporters' job, not a Profile's
    assert canon(speedscope.read(tmp_path / "x.speedscope.json")) == canon(p)
    assert ddprof_nb.save is exporters.save
    assert not hasattr(p, "save") and not hasattr(p, "to_html")


def test_save_with_a_format_ignores_the_name_and_refuses_unknown_formats(tmp_path):
    # GIVEN a profile  WHEN saved with format= under names that say another format (or none)
    p = mock_profile()
    exporters.save(p, tmp_path / "report.txt", format="html")
    exporters.save(p, tmp_path / "x.bin", format="speedscope")
    exporters.save(p, tmp_path / "stacks.txt", format="folded", event="cpu")
    # THEN each file is in the format asked for
    assert "<html" in (tmp_path / "report.txt").read_text().lower()
    assert canon(speedscope.read(tmp_path / "x.bin")) == canon(p)
    assert (tmp_path / "stacks.txt").read_text().strip()
    # AND an unknown format is refused, naming the ones there are
    with pytest.raises(ValueError, match="pprof, speedscope, folded, html"):
        exporters.save(p, tmp_path / "x.pprof", format="svg")


def test_writers_accept_binary_file_objects():
    # GIVEN an in-memory binary file  WHEN each writer writes to it  THEN the bytes are the format's
    import io

    p = mock_profile()
    buf = io.BytesIO()
    pprof.write(p, buf)
    assert buf.getvalue() == pprof.dumps(p)
    buf = io.BytesIO()
    speedscope.write(p, buf)
    assert buf.getvalue().decode() == speedscope.dumps(p)
    buf = io.BytesIO()
    folded.write(p, buf, event="cpu")
    assert buf.getvalue().decode() == folded.dumps(p, "cpu")
