"""loading.load(): format sniffing, and bad input that must end in a ValueError naming the file."""

from __future__ import annotations

import gzip
import os
import pickle
import random
import zlib

import pytest

from ddprof_nb import loading
from ddprof_nb.events import EventType
from ddprof_nb.exporters import folded, pprof, speedscope
from ddprof_nb.exporters import pprof_proto as pb
from ddprof_nb.model import Frame, Profile, ProfileBuilder

try:
    from test_exporters import canon, mock_metadata, mock_profile, per_stack_totals
except ImportError:  # collected as a package
    from .test_exporters import canon, mock_metadata, mock_profile, per_stack_totals


def small_profile() -> Profile:
    """Two rows: small enough to truncate at every byte."""
    b = ProfileBuilder(mock_metadata(notes=(), extra={}))
    t = b.thread_id(1, "main")
    b.add("cpu", b.stack_of([Frame("main", "m.py", 1, 1), Frame("f", "m.py", 5, 4)]), t, 0, 0, 1, 10)
    b.add("alloc", b.stack_of([Frame("main", "m.py", 1, 1)]), t, b.labels_id({"k": "v"}), 0, 2, 64)
    return b.build()


def small_files() -> dict[str, bytes]:
    p = small_profile()
    return {
        "pprof.gz": pprof.dumps(p),
        "pprof.raw": pb.encode(pprof.to_pprof(p)),
        "speedscope": speedscope.dumps(p).encode(),
        "folded": folded.dumps(p, "cpu").encode(),
    }


# --------------------------------------------------------------------------- sniffing


@pytest.mark.parametrize("misleading_name", ["profile.json", "profile.txt", "cpu.folded", "noext"])
def test_pprof_is_recognised_by_content_not_name(tmp_path, misleading_name):
    # GIVEN a gzipped pprof under a misleading name
    p = mock_profile()
    path = tmp_path / misleading_name
    path.write_bytes(pprof.dumps(p))
    # WHEN loaded  THEN it is read as pprof, exactly
    q = loading.load(path)
    assert canon(q) == canon(p) and q.metadata == p.metadata


def test_raw_protobuf_pprof_is_recognised(tmp_path):
    # GIVEN an uncompressed pprof
    p = mock_profile()
    path = tmp_path / "profile.pb"
    path.write_bytes(pb.encode(pprof.to_pprof(p)))
    # WHEN loaded  THEN it is read exactly
    assert canon(loading.load(path)) == canon(p)


@pytest.mark.parametrize("name", ["x.speedscope.json", "x.json", "x.txt"])
def test_speedscope_is_recognised_by_content(tmp_path, name):
    # GIVEN speedscope JSON (with leading whitespace and a BOM) under any name
    p = mock_profile()
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf \n" + speedscope.dumps(p).encode())
    # WHEN loaded  THEN it is read exactly
    q = loading.load(path)
    assert canon(q) == canon(p) and q.metadata == p.metadata


def test_folded_file_named_after_its_event_is_recognised(tmp_path):
    # GIVEN wall stacks saved as wall.folded
    p = mock_profile()
    path = tmp_path / "wall.folded"
    path.write_text(folded.dumps(p, "wall"))
    # WHEN loaded  THEN they are wall rows with the same per-stack totals
    q = loading.load(path)
    assert q.events == (EventType.WALL,)
    want = {k: v for k, v in per_stack_totals(p, frame_key=folded.frame_text).items() if k[0] is EventType.WALL}
    assert per_stack_totals(q, frame_key=folded.frame_text) == want


def test_folded_text_under_another_name_needs_the_event(tmp_path):
    # GIVEN folded stacks named stacks.txt
    path = tmp_path / "stacks.txt"
    path.write_text("main;f 10\n")
    # WHEN loaded without event=  THEN ValueError names the file and asks for the event
    with pytest.raises(ValueError, match=r"stacks\.txt: looks like folded stacks.*event="):
        loading.load(path)
    # AND with event= it loads
    assert loading.load(path, event="lock").events == (EventType.LOCK,)


def test_a_directory_of_folded_files_is_recognised(tmp_path):
    # GIVEN the mock profile saved as a directory of folded files
    p = mock_profile()
    folded.write(p, tmp_path / "stacks")
    # WHEN the directory is loaded  THEN every event is there
    assert loading.load(tmp_path / "stacks").events == p.events


def test_sniff_names_the_formats():
    # GIVEN one small file per format  THEN sniff tells them apart (raw protobuf: None, tried last)
    files = small_files()
    assert loading.sniff(files["pprof.gz"]) == "gzip"
    assert loading.sniff(files["pprof.raw"]) is None
    assert loading.sniff(files["speedscope"]) == "json"
    assert loading.sniff(files["folded"]) == "folded"
    assert loading.sniff(b"hello world\n") is None


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kind", ["pprof.gz", "pprof.raw", "speedscope", "folded"])
def test_every_truncation_is_a_profile_or_a_value_error_naming_the_file(kind):
    # GIVEN a small valid file of each format
    data = small_files()[kind]
    if kind == "speedscope":
        data = data.rstrip()  # without its final newline: every shorter prefix lacks the closing brace
    name = "cpu.folded" if kind == "folded" else f"trunc.{kind}"
    outcomes = set()
    # WHEN it is truncated at every byte and loaded
    for n in range(len(data)):
        try:
            result = loading.load(data[:n], name=name)
        except ValueError as e:
            # THEN a failure is a ValueError that names the file
            assert name in str(e), (n, str(e))
            outcomes.add("error")
        else:
            assert isinstance(result, Profile)
            outcomes.add("profile")
    # AND formats with an end marker (gzip trailer, closing brace) never accept a proper prefix
    if kind in ("pprof.gz", "speedscope"):
        assert outcomes == {"error"}
    else:
        assert "error" in outcomes


def test_truncated_files_on_disk_name_the_path(tmp_path):
    # GIVEN a pprof file cut in half on disk
    data = pprof.dumps(small_profile())
    path = tmp_path / "half.pprof"
    path.write_bytes(data[: len(data) // 2])
    # WHEN loaded  THEN ValueError names the path
    with pytest.raises(ValueError, match=str(path)):
        loading.load(path)


@pytest.mark.parametrize("seed", range(40))
def test_random_bytes_are_a_value_error_naming_the_file(seed):
    # GIVEN random bytes of random length, some starting with the gzip magic or a JSON brace
    rng = random.Random(seed)
    data = rng.choice([b"", b"\x1f\x8b", b"{", b"\n\x04"]) + rng.randbytes(rng.randrange(1, 3000))
    # WHEN loaded  THEN ValueError names the file
    with pytest.raises(ValueError, match=r"random\.bin"):
        loading.load(data, name="random.bin")


def test_empty_file_is_a_value_error(tmp_path):
    path = tmp_path / "empty.pprof"
    path.write_bytes(b"")
    # GIVEN an empty file  WHEN loaded  THEN ValueError names it and lists the formats
    with pytest.raises(ValueError, match=r"empty\.pprof: empty file.*pprof.*speedscope.*folded"):
        loading.load(path)


def test_text_that_is_no_format_is_a_value_error_listing_formats(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just some notes\nnothing to see\n")
    # GIVEN plain text  WHEN loaded  THEN ValueError names it and lists what was expected
    with pytest.raises(ValueError, match=r"notes\.txt: not a profile ddprof_nb can read \(expected .*speedscope"):
        loading.load(path)


def test_json_that_is_not_speedscope_is_a_value_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"answer": 42}')
    # GIVEN JSON of another kind  WHEN loaded  THEN ValueError says it is not speedscope
    with pytest.raises(ValueError, match=r"config\.json: JSON, but neither a speedscope file"):
        loading.load(path)


def test_a_decompression_bomb_is_refused(tmp_path):
    # GIVEN a 20 KiB gzip file that inflates to 8 MiB
    path = tmp_path / "bomb.pprof"
    path.write_bytes(gzip.compress(b"\0" * (8 << 20)))
    assert path.stat().st_size < 40_000
    # WHEN loaded with a 1 MiB cap  THEN ValueError names the file and says why
    with pytest.raises(ValueError, match=r"bomb\.pprof: decompressed size exceeds 1 MiB"):
        loading.load(path, max_decompressed=1 << 20)


@pytest.mark.slow
def test_the_default_decompression_cap_holds(tmp_path):
    # GIVEN a ~600 KB gzip stream that would inflate to 600 MiB
    path = tmp_path / "bomb.pprof"
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    chunk = b"\0" * (1 << 20)
    with open(path, "wb") as f:
        for _ in range(600):
            f.write(comp.compress(chunk))
        f.write(comp.flush())
    # WHEN loaded with the default cap  THEN ValueError stops it at MAX_DECOMPRESSED
    assert loading.MAX_DECOMPRESSED == 512 << 20
    with pytest.raises(ValueError, match=r"bomb\.pprof: decompressed size exceeds 512 MiB"):
        loading.load(path)


def test_files_over_the_size_limit_are_refused_before_reading(tmp_path, monkeypatch):
    # GIVEN a size limit of 1 KiB and a 2 KiB file
    monkeypatch.setattr(loading, "MAX_FILE_BYTES", 1024)
    path = tmp_path / "big.pprof"
    path.write_bytes(b"\0" * 2048)
    # WHEN loaded  THEN ValueError names the file and the limit
    with pytest.raises(ValueError, match=r"big\.pprof: file is 2048 bytes, more than the 1024 bytes limit"):
        loading.load(path)


def test_the_real_limit_is_one_gib():
    assert loading.MAX_FILE_BYTES == 1 << 30


def test_non_regular_files_are_refused():
    # GIVEN a character device  WHEN loaded  THEN ValueError, without blocking on it
    with pytest.raises(ValueError, match="/dev/null: not a regular file"):
        loading.load("/dev/null")


def test_a_missing_file_is_an_os_error(tmp_path):
    # GIVEN no file  WHEN loaded  THEN FileNotFoundError (the input is absent, not malformed)
    with pytest.raises(FileNotFoundError):
        loading.load(tmp_path / "nope.pprof")


class _Boom:
    """Unpickling this would create a file: proof that a loader executed code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_loading_never_executes_code(tmp_path):
    # GIVEN a pickle that creates a file when unpickled, under profile-looking names
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Boom(str(marker)))
    for name in ("evil.pprof", "evil.speedscope.json", "cpu.folded"):
        path = tmp_path / name
        path.write_bytes(payload)
        # WHEN loaded  THEN ValueError, and the payload never ran
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            loading.load(path)
    assert not marker.exists()


def test_wrong_event_name_in_a_folded_file_name(tmp_path):
    # GIVEN folded stacks in a file named after no event but looking like one
    path = tmp_path / "gpu.folded"
    path.write_text("main;f 10\n")
    # WHEN loaded  THEN ValueError names the file and the valid event names
    with pytest.raises(ValueError, match=r"gpu\.folded: .*<event>\.folded"):
        loading.load(path)


def test_load_accepts_bytes_with_a_name():
    # GIVEN pprof bytes  WHEN loaded from memory  THEN the profile is read
    assert loading.load(pprof.dumps(small_profile()), name="mem.pprof").events == (EventType.CPU, EventType.ALLOC)


def test_load_results_do_not_depend_on_the_working_directory(tmp_path, monkeypatch):
    # GIVEN a relative path  WHEN loaded from its directory  THEN errors still name it
    (tmp_path / "bad.pprof").write_bytes(b"\x1f\x8bnot really gzip")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^bad\.pprof: "):
        loading.load("bad.pprof")
    assert os.getcwd() == str(tmp_path)
