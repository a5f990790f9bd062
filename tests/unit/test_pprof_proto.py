"""Tests for the hand-written pprof (profile.proto) codec."""

from __future__ import annotations

import contextlib
import gzip
import inspect
import random
import re
import shutil
import struct
import subprocess
import time
import tracemalloc
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from byte_mutations import MUTATION, mutate
from ddprof_nb.exporters import pprof_proto as pp
from ddprof_nb.exporters.pprof_proto import (
    Function, Label, Line, Location, Mapping, PprofProfile, Sample, ValueType,
)

# ----------------------------------------------------------------------------- helpers
# A tiny, independent protobuf writer/reader used to craft and inspect wire bytes.


def vint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def vi(field_no: int, n: int) -> bytes:
    """A varint field."""
    return vint(field_no << 3) + vint(n)


def ln(field_no: int, body: bytes) -> bytes:
    """A length-delimited field."""
    return vint(field_no << 3 | 2) + vint(len(body)) + body


def strtab(*strings: str) -> bytes:
    return b"".join(ln(6, s.encode()) for s in strings)


def top_level_fields(raw: bytes) -> list[tuple[int, int, object]]:
    """(field, wire type, int value or bytes payload) for each top-level field."""
    out, pos = [], 0

    def varint():
        nonlocal pos
        v = shift = 0
        while True:
            b = raw[pos]
            pos += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v

    while pos < len(raw):
        key = varint()
        if key & 7 == 0:
            out.append((key >> 3, 0, varint()))
        else:
            assert key & 7 == 2, "encoder only writes varint and length-delimited fields"
            n = varint()
            out.append((key >> 3, 2, raw[pos:pos + n]))
            pos += n
    return out


def sample_profile() -> PprofProfile:
    """A small profile touching every modelled field."""
    return PprofProfile(
        sample_types=[ValueType("samples", "count"), ValueType("cpu", "nanoseconds")],
        samples=[
            Sample([2, 1], [3, 30_000_000], [Label("thread", "MainThread")]),
            Sample([3, 2, 1], [-7, -(2 ** 63)], [Label("alloc", num=-42, num_unit="bytes"),
                                                Label("cell", num=12)]),
            Sample([1], [0, 2 ** 63 - 1], []),
            Sample([], [1, 1], [Label("ünïcødé ✓", "値🚀")]),
        ],
        locations=[
            Location(1, 0x401000, [Line(1, 3)], mapping_id=1),
            Location(2, 0, [Line(2, 12, 5), Line(3, -1)], is_folded=True),
            Location(3, 2 ** 64 - 1, []),
        ],
        functions=[
            Function(1, "main", "_main", "nb.py", 1),
            Function(2, "wörk", "work", "/tmp/ipykernel_1/123.py", -10),
            Function(3, "λ", "", "", 0),
        ],
        mappings=[Mapping(1, 0x400000, 0x500000, 0x1000, "/usr/bin/python3", "abc123",
                          has_functions=True, has_line_numbers=True)],
        time_nanos=1_700_000_000_123_456_789,
        duration_nanos=-5,
        period_type=ValueType("cpu", "nanoseconds"),
        period=10_000_000,
        comments=["first", "", "ünïcode comment", "first"],
        default_sample_type="cpu",
        drop_frames="runtime\\..*",
        keep_frames="main",
    )


@contextlib.contextmanager
def _peak_traced():
    """Traces Python allocations inside the block; yields a function giving their peak
    in bytes above the start."""
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    peak = []
    try:
        yield lambda: peak[0] - base
    finally:
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


def assert_value_error_named(fn, name: str, match: str | None = None) -> ValueError:
    with pytest.raises(ValueError) as info:
        fn()
    msg = str(info.value)
    assert msg.startswith(f"{name}: "), msg
    if match is not None:
        assert re.search(match, msg), msg
    return info.value


# ----------------------------------------------------------------------------- round trips


def test_round_trip_is_exact_for_every_modelled_field():
    # GIVEN a profile using negatives, int64/uint64 extremes, num labels and unicode
    p = sample_profile()
    # WHEN it goes through the raw and the gzip codecs
    raw = pp.encode(p)
    gz = pp.dumps(p)
    # THEN both decode to an equal profile
    assert pp.decode(raw) == p
    assert pp.loads(raw) == p
    assert pp.loads(gz) == p
    assert gz[:2] == b"\x1f\x8b" and gzip.decompress(gz) == raw


def test_empty_profile_round_trips():
    # GIVEN the default, empty profile
    p = PprofProfile()
    # WHEN encoded
    raw = pp.encode(p)
    # THEN only the mandatory string table entry "" is written, and it decodes back
    assert raw == b"\x32\x00"
    assert pp.decode(raw) == p


def test_optional_message_presence_is_preserved():
    # GIVEN an all-empty period_type (present, but with default fields)
    p = PprofProfile(period_type=ValueType("", ""))
    # WHEN round tripped
    q = pp.decode(pp.encode(p))
    # THEN it is still present, distinct from None
    assert q.period_type == ValueType("", "")
    assert pp.decode(pp.encode(PprofProfile())).period_type is None


def test_empty_default_sample_type_means_unset():
    # GIVEN default_sample_type="" (index 0 is the proto3 default)
    # WHEN round tripped
    q = pp.decode(pp.encode(PprofProfile(default_sample_type="")))
    # THEN it reads back as unset
    assert q.default_sample_type is None


def test_dumps_is_deterministic():
    # GIVEN the same profile twice
    # WHEN gzipped
    # THEN the bytes are identical (mtime is pinned)
    assert pp.dumps(sample_profile()) == pp.dumps(sample_profile())


def test_loads_accepts_bytearray_and_memoryview():
    # GIVEN the profile bytes as other bytes-like objects
    gz = pp.dumps(sample_profile())
    # WHEN loaded
    # THEN they decode just like bytes
    assert pp.loads(bytearray(gz)) == sample_profile()
    assert pp.loads(memoryview(pp.encode(sample_profile()))) == sample_profile()


def test_multi_member_gzip_is_accepted():
    # GIVEN a protobuf split across two concatenated gzip members (valid gzip)
    raw = pp.encode(sample_profile())
    data = gzip.compress(raw[:50]) + gzip.compress(raw[50:])
    # WHEN loaded
    # THEN the members are joined
    assert pp.loads(data) == sample_profile()


# ----------------------------------------------------------------------------- wire format


def test_string_table_starts_with_empty_string_and_is_deduplicated():
    # GIVEN a profile that repeats strings ("cpu", "nanoseconds", "first", ...)
    raw = pp.encode(sample_profile())
    # WHEN the top-level string_table fields (6) are read back independently
    table = [payload.decode() for f, _, payload in top_level_fields(raw) if f == 6]
    # THEN index 0 is "", every string appears once, and all used strings are present
    assert table[0] == ""
    assert len(table) == len(set(table))
    assert {"cpu", "nanoseconds", "値🚀", "ünïcode comment", "runtime\\..*"} <= set(table)


def test_negative_int64_is_ten_byte_twos_complement():
    # GIVEN negative int64 scalars and sample values
    p = PprofProfile(sample_types=[ValueType("v", "count")], samples=[Sample([], [-2], [])],
                     time_nanos=-1)
    # WHEN encoded
    fields = top_level_fields(pp.encode(p))
    # THEN time_nanos is the 10-byte varint of 2**64-1 ...
    assert (9, 0, 2 ** 64 - 1) in fields
    assert vi(9, -1) == b"\x48" + b"\xff" * 9 + b"\x01"
    assert vi(9, -1) in pp.encode(p)
    # ... and the packed value list holds the 10-byte encoding of -2
    (sample,) = [payload for f, _, payload in fields if f == 2]
    assert sample == ln(2, b"\xfe" + b"\xff" * 8 + b"\x01")


def test_encoder_writes_repeated_ints_packed():
    # GIVEN a sample with several locations and values
    p = PprofProfile(sample_types=[ValueType("a", "b"), ValueType("c", "d")],
                     samples=[Sample([1, 300], [5, 6], [])],
                     locations=[Location(1), Location(300)])
    # WHEN encoded
    (sample,) = [payload for f, _, payload in top_level_fields(pp.encode(p)) if f == 2]
    # THEN both repeated fields use a single packed, length-delimited record
    assert sample == ln(1, vint(1) + vint(300)) + ln(2, vint(5) + vint(6))


def test_decoder_accepts_unpacked_repeated_fields_and_skips_unknown_fields():
    # GIVEN hand-built bytes: unpacked sample ids/values, comments both unpacked and
    # packed, and unknown fields of every skippable wire type at several levels
    unknown = (vi(99, 5) + vint(100 << 3 | 1) + b"\x01" * 8 + vint(101 << 3 | 5) + b"\x02" * 4
               + ln(102, b"\xff\xff garbage"))
    raw = (
        ln(1, vi(1, 1) + vi(2, 2))                                      # sample_type
        + ln(5, vi(1, 7) + vi(2, 3) + vi(4, 4) + vi(5, 2 ** 64 - 3) + unknown)  # function
        + ln(4, vi(1, 9) + ln(4, vi(1, 7) + vi(2, 42) + unknown) + vi(6, 1))  # location
        + ln(2, vi(1, 9) + vi(1, 9) + vi(2, 2 ** 64 - 5) + ln(4, b"\x0a\x01\x01")  # sample
             + ln(3, vi(1, 3) + vi(3, 8) + vi(4, 2) + unknown))
        + vi(13, 3) + ln(13, vint(4) + vint(1))                         # comments
        + unknown + vi(15, 2) + ln(16, vi(1, 1))                       # tick_unit, label_set
        + strtab("", "samples", "count", "main", "main.py")
    )
    # WHEN decoded
    p = pp.decode(raw)
    # THEN every known field is read and unknown ones are ignored
    assert p == PprofProfile(
        sample_types=[ValueType("samples", "count")],
        samples=[Sample([9, 9], [-5], [Label("main", num=8, num_unit="count")])],
        locations=[Location(9, lines=[Line(7, 42)])],
        functions=[Function(7, "main", "", "main.py", -3)],
        comments=["main", "main.py", "samples"],
    )


def test_loads_reads_raw_protobuf_without_gzip():
    # GIVEN an uncompressed protobuf
    raw = pp.encode(sample_profile())
    # WHEN loaded through the file-level API
    # THEN it is detected as protobuf and decoded
    assert pp.loads(raw, name="raw.pb") == sample_profile()


# ----------------------------------------------------------------------------- malformed input

NAME = "profile.pb.gz"
GOOD_TAIL = strtab("", "a")

MALFORMED = [
    # (id, bytes, regex the message must match)
    ("empty", b"", r"empty input"),
    ("text", b"hello, world\n", r"not a pprof profile \(not gzip and not protobuf\)"),
    ("json", b'{"samples": []}', r"not a pprof profile \(not gzip and not protobuf\)"),
    ("truncated varint", GOOD_TAIL + b"\x48\xff\xff", r"truncated varint at byte \d+"),
    ("varint > 10 bytes", GOOD_TAIL + b"\x48" + b"\xff" * 10 + b"\x01", r"longer than 10 bytes"),
    ("varint overflow", GOOD_TAIL + b"\x48" + b"\xff" * 9 + b"\x7f", r"overflows 64 bits"),
    ("packed varint > 10 bytes", strtab("") + ln(2, ln(2, b"\x01" + b"\xff" * 10 + b"\x01")),
     r"varint longer than 10 bytes at byte 7"),
    ("packed varint overflow", strtab("") + ln(2, ln(2, b"\xff" * 9 + b"\x7f")),
     r"varint at byte 6 overflows 64 bits"),
    ("truncated packed varint", strtab("") + ln(2, ln(2, b"\x05\xff")), r"truncated varint at byte 7"),
    ("group start", GOOD_TAIL + vint(20 << 3 | 3), r"group wire type 3"),
    ("group end", GOOD_TAIL + vint(20 << 3 | 4), r"group wire type 4"),
    ("wire type 6", GOOD_TAIL + vint(20 << 3 | 6), r"invalid wire type 6"),
    ("field number 0", GOOD_TAIL + b"\x00\x00", r"field number 0"),
    ("huge declared length", GOOD_TAIL + b"\x12" + vint(2 ** 40) + b"abc",
     r"declares 1099511627776 bytes but only 3 remain"),
    ("length past end", b"\x32\x05ab", r"declares 5 bytes but only 2 remain"),
    ("truncated fixed64", GOOD_TAIL + vint(20 << 3 | 1) + b"1234", r"truncated fixed64"),
    ("wrong wire type", GOOD_TAIL + vi(2, 1), r"field 2 .* unexpected wire type varint"),
    ("no string table", ln(1, vi(1, 1)), r"missing string table"),
    ("string_table[0] not empty", strtab("x"), r"string_table\[0\] must be the empty string"),
    ("bad utf-8", strtab("") + ln(6, b"\xff\xfe"), r"not valid UTF-8"),
    ("string index out of range", strtab("", "a") + ln(1, vi(1, 2)),
     r"string index 2 in sample_type out of range"),
    ("negative string index", strtab("", "a") + vi(7, -1), r"string index \d+ in drop_frames out of range"),
    ("unknown location", strtab("") + ln(4, vi(1, 1)) + ln(2, ln(1, vint(2))),
     r"unknown location id 2"),
    ("location id 0 in sample", strtab("") + ln(4, vi(1, 1)) + ln(2, ln(1, vint(0))),
     r"unknown location id 0"),
    ("unknown function", strtab("") + ln(4, vi(1, 1) + ln(4, vi(1, 5))), r"unknown function id 5"),
    ("unknown mapping", strtab("") + ln(4, vi(1, 1) + vi(2, 3)), r"unknown mapping id 3"),
    ("duplicate location", strtab("") + ln(4, vi(1, 1)) + ln(4, vi(1, 1)), r"duplicate location id 1"),
    ("zero function id", strtab("") + ln(5, vi(2, 0)), r"function id must be nonzero"),
    ("value count mismatch", strtab("", "a") + ln(1, vi(1, 1)) + ln(2, ln(2, vint(1) + vint(2))),
     r"sample #0 has 2 values for 1 sample types"),
    ("gzip of text", gzip.compress(b"hello, world"), r"gzip data is not a pprof profile"),
    ("truncated gzip", pp.dumps(PprofProfile(comments=["x" * 50]))[:-12], r"truncated gzip stream"),
    ("corrupt gzip", b"\x1f\x8b\x08\x00" + b"\x00" * 6 + b"\xff" * 20, r"corrupt gzip data"),
    ("bad gzip crc", pp.dumps(PprofProfile())[:-8] + b"\0\0\0\0" + pp.dumps(PprofProfile())[-4:],
     r"corrupt gzip data"),
    ("gzip trailing garbage", pp.dumps(PprofProfile()) + b"junk", r"trailing garbage after gzip"),
]


@pytest.mark.parametrize("data,match", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_input_raises_value_error_naming_the_file(data, match):
    # GIVEN a malformed file
    # WHEN loaded
    # THEN a ValueError names the file and says what is wrong
    assert_value_error_named(lambda: pp.loads(data, name=NAME), NAME, match)


def test_decode_refuses_gzip_and_empty_input_with_a_hint():
    # GIVEN gzip bytes passed to the protobuf-level decoder
    # WHEN decoded
    # THEN the error points at loads()
    assert_value_error_named(lambda: pp.decode(pp.dumps(PprofProfile()), name="x"), "x", r"use loads\(\)")
    assert_value_error_named(lambda: pp.decode(b"", name="x"), "x", r"empty input")


def test_huge_declared_length_is_refused_without_allocating():
    # GIVEN a field declaring ~1 EiB of payload in a 20-byte input
    data = GOOD_TAIL + b"\x32" + vint(2 ** 60) + b"x"
    # WHEN decoded
    with _peak_traced() as peak:
        assert_value_error_named(lambda: pp.decode(data, name="big"), "big", r"declares \d+ bytes")
    # THEN it fails before allocating anything of the declared size
    assert peak() < 1 << 20, peak()


def test_every_truncation_of_a_profile_raises_value_error():
    # GIVEN a small profile, raw and gzipped
    raw = pp.encode(sample_profile())
    gz = pp.dumps(sample_profile())
    # WHEN every strict prefix is decoded
    # THEN each raises ValueError naming the input, never another exception or a result
    for blob in (raw, gz):
        for cut in range(len(blob)):
            assert_value_error_named(lambda: pp.loads(blob[:cut], name=f"cut{cut}"), f"cut{cut}")
    for cut in range(1, len(raw)):
        assert_value_error_named(lambda: pp.decode(raw[:cut], name="d"), "d")


def test_random_bytes_raise_value_error():
    # GIVEN many seeded random byte strings, some starting like a profile or gzip
    rnd = random.Random(1234)
    prefixes = [b"", b"\x0a", b"\x32\x00", b"\x1f\x8b", b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"]
    for i in range(3000):
        data = rnd.choice(prefixes) + rnd.randbytes(rnd.randint(0, 64))
        # WHEN loaded
        # THEN only ValueError (or, rarely, a valid decode) can come out
        try:
            result = pp.loads(data, name="rnd")
        except ValueError as e:
            assert str(e).startswith("rnd: ")
        else:
            assert isinstance(result, PprofProfile)


def _zero_gzip_bomb(total: int, block: int = 1 << 20) -> bytes:
    """A valid gzip file of ``total`` zero bytes, ~1000x smaller than its content.

    compressobj with a full flush resets the compressor, so each block of zeros
    compresses to identical bytes; we compress one block and repeat it.
    """
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    zeros = bytes(block)
    one_block = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    assert c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH) == one_block
    crc = 0
    for _ in range(total // block):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return (header + one_block * (total // block) + c.flush(zlib.Z_FINISH)
            + struct.pack("<II", crc, total & 0xFFFFFFFF))


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    return _zero_gzip_bomb(1 << 30)


def test_gzip_bomb_fixture_is_genuine(gzip_bomb):
    # GIVEN the 1 GiB bomb
    # WHEN its start is inflated by a stock decompressor
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    head = d.decompress(gzip_bomb, 4 << 20)
    # THEN it is small on disk but really expands to zeros
    assert len(gzip_bomb) < 2 << 20
    assert head == bytes(4 << 20)


def test_gzip_bomb_is_refused_quickly(gzip_bomb):
    # GIVEN a 1 GiB-of-zeros gzip file and a 32 MiB cap
    # WHEN loaded
    with _peak_traced() as peak:
        assert_value_error_named(
            lambda: pp.loads(gzip_bomb, name="bomb.pb.gz", max_uncompressed=32 << 20),
            "bomb.pb.gz", r"decompressed size exceeds 32 MiB \(decompression bomb\?\)")
    # THEN inflation stops at the cap instead of expanding the whole gigabyte: the memory
    # it took is the cap's order (the output and a chunk), far below the bomb's 1 GiB
    assert peak() < 128 << 20, peak()


def test_default_decompression_cap_is_512_mib():
    # GIVEN the public signature
    # WHEN inspected
    default = inspect.signature(pp.loads).parameters["max_uncompressed"].default
    # THEN the cap is 512 MiB and a just-too-large payload is refused with that wording
    assert default == pp.MAX_UNCOMPRESSED == 512 * 1024 * 1024
    small = pp.dumps(PprofProfile(comments=["x" * 2000]))
    assert_value_error_named(lambda: pp.loads(small, name="f", max_uncompressed=1000), "f",
                             r"decompressed size exceeds 1000 bytes")
    assert_value_error_named(lambda: pp.loads(pp.encode(PprofProfile(comments=["x" * 2000])),
                                              name="f", max_uncompressed=1000), "f", r"size exceeds")


# ----------------------------------------------------------------------------- encoder checks

ST = [ValueType("samples", "count")]


@pytest.mark.parametrize("profile,exc,match", [
    (PprofProfile(ST, [Sample([], [1, 2], [])]), ValueError, r"2 values for 1 sample types"),
    (PprofProfile(ST, [Sample([5], [1], [])]), ValueError, r"unknown location id 5"),
    (PprofProfile(locations=[Location(1, lines=[Line(9)])]), ValueError, r"unknown function id 9"),
    (PprofProfile(locations=[Location(1, mapping_id=4)]), ValueError, r"unknown mapping id 4"),
    (PprofProfile(locations=[Location(1), Location(1)]), ValueError, r"duplicate location id 1"),
    (PprofProfile(functions=[Function(0, "f")]), ValueError, r"function id must be nonzero"),
    (PprofProfile(mappings=[Mapping(1), Mapping(1)]), ValueError, r"duplicate mapping id 1"),
    (PprofProfile(ST, [Sample([], [2 ** 63], [])]), ValueError, r"out of range for int64"),
    (PprofProfile(ST, [Sample([], [-(2 ** 63) - 1], [])]), ValueError, r"out of range for int64"),
    (PprofProfile(locations=[Location(1, address=-1)]), ValueError, r"out of range for uint64"),
    (PprofProfile(locations=[Location(2 ** 64)]), ValueError, r"out of range for uint64"),
    (PprofProfile(ST, [Sample([], [1], [Label("k", "s", num=1)])]), ValueError, r"both str and num"),
    (PprofProfile(ST, [Sample([], [1.5], [])]), TypeError, r"expected int"),
    (PprofProfile([ValueType(b"cpu", "ns")]), TypeError, r"expected str"),
])
def test_encode_refuses_invalid_profiles(profile, exc, match):
    # GIVEN a profile decode() would refuse (or that cannot be represented)
    # WHEN encoded
    # THEN the encoder refuses it up front
    with pytest.raises(exc, match=match):
        pp.encode(profile)


# ----------------------------------------------------------------------------- properties

I64 = st.integers(-(2 ** 63), 2 ** 63 - 1)
U64 = st.integers(0, 2 ** 64 - 1)
IDS = st.lists(st.integers(1, 2 ** 64 - 1), unique=True, max_size=5)
TEXT = st.text(max_size=6)


@st.composite
def profiles(draw) -> PprofProfile:
    fn_ids, map_ids, loc_ids = draw(IDS), draw(IDS), draw(IDS)
    functions = [Function(i, draw(TEXT), draw(TEXT), draw(TEXT), draw(I64)) for i in fn_ids]
    mappings = [Mapping(i, draw(U64), draw(U64), draw(U64), draw(TEXT), draw(TEXT),
                        *draw(st.tuples(*[st.booleans()] * 4))) for i in map_ids]
    lines = st.builds(Line, st.sampled_from([0, *fn_ids]), I64, I64)
    locations = [Location(i, draw(U64), draw(st.lists(lines, max_size=3)),
                          draw(st.sampled_from([0, *map_ids])), draw(st.booleans()))
                 for i in loc_ids]
    sample_types = draw(st.lists(st.builds(ValueType, TEXT, TEXT), max_size=3))
    labels = st.one_of(st.builds(Label, TEXT, TEXT),
                       st.builds(Label, TEXT, num=I64, num_unit=TEXT))
    samples = draw(st.lists(st.builds(
        Sample,
        st.lists(st.sampled_from(loc_ids), max_size=6) if loc_ids else st.just([]),
        st.lists(I64, min_size=len(sample_types), max_size=len(sample_types)),
        st.lists(labels, max_size=3)), max_size=5))
    return PprofProfile(
        sample_types=sample_types, samples=samples, locations=locations,
        functions=functions, mappings=mappings,
        time_nanos=draw(I64), duration_nanos=draw(I64),
        period_type=draw(st.none() | st.builds(ValueType, TEXT, TEXT)),
        period=draw(I64), comments=draw(st.lists(TEXT, max_size=3)),
        default_sample_type=draw(st.none() | st.text(min_size=1, max_size=6)),
        drop_frames=draw(TEXT), keep_frames=draw(TEXT),
    )


@settings(max_examples=200, deadline=None)
@given(profiles())
def test_property_round_trip(p):
    # GIVEN any valid profile
    # WHEN encoded and decoded (raw and gzip)
    # THEN it comes back equal, and re-encoding is byte-identical
    raw = pp.encode(p)
    assert pp.decode(raw) == p
    assert pp.loads(pp.dumps(p)) == p
    assert pp.encode(pp.decode(raw)) == raw


def _only_value_error(data: bytes) -> None:
    for fn in (lambda: pp.loads(data, name="fuzz"), lambda: pp.decode(data, name="fuzz")):
        try:
            result = fn()
        except ValueError as e:
            assert str(e).startswith("fuzz: "), str(e)
        else:
            assert isinstance(result, PprofProfile)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_only_raise_value_error(data):
    # GIVEN arbitrary bytes  WHEN loaded/decoded  THEN only ValueError escapes
    _only_value_error(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profiles(), st.lists(MUTATION, min_size=1, max_size=4), st.booleans())
def test_fuzz_mutated_profiles_only_raise_value_error(p, ops, regzip):
    # GIVEN a valid encoding with a few random byte mutations (the mutated protobuf
    # optionally re-gzipped so it reaches the decoder through the gzip path)
    mutated = mutate(pp.encode(p), ops)
    # WHEN loaded  THEN only ValueError escapes
    _only_value_error(gzip.compress(mutated) if regzip else mutated)
    _only_value_error(mutate(pp.dumps(p), ops))


# ----------------------------------------------------------------------------- scale


def _big_profile(n: int = 50_000, depth: int = 12) -> PprofProfile:
    rnd = random.Random(7)
    functions = [Function(i, f"mod.func_{i}", f"func_{i}", f"/src/m{i % 97}.py", i % 900)
                 for i in range(1, 5001)]
    locations = [Location(i, 0, [Line(rnd.randint(1, 5000), rnd.randint(1, 2000))])
                 for i in range(1, n + 1)]
    samples = [Sample([rnd.randint(1, n) for _ in range(depth)],
                      [rnd.randint(1, 100), rnd.randint(1, 10 ** 8)],
                      [Label("thread", "MainThread"), Label("cell", num=i % 50, num_unit="count")])
               for i in range(n)]
    return PprofProfile([ValueType("samples", "count"), ValueType("cpu", "nanoseconds")],
                        samples, locations, functions)


def test_encode_and_decode_50k_samples_scale_linearly():
    # GIVEN 50,000 samples (12 frames each) over 50,000 locations
    p = _big_profile()
    # WHEN encoded and decoded (their CPU time is printed for people to judge: ~0.35 s
    # and ~1 s on a 2-vCPU VM; quadratic behaviour would show as minutes)
    t0 = time.process_time()
    raw = pp.encode(p)
    t1 = time.process_time()
    q = pp.decode(raw)
    t2 = time.process_time()
    print(f"pprof_proto 50k samples: encode {t1 - t0:.2f} s CPU, decode {t2 - t1:.2f} s CPU")
    # THEN they agree
    assert q == p


# ----------------------------------------------------------------------------- go tool pprof

GO = shutil.which("go")


def _go_profile() -> PprofProfile:
    functions = [Function(1, "main", "main", "nb.py", 1), Function(2, "work", "work", "nb.py", 10),
                 Function(3, "crunch_ünï", "crunch", "nb.py", 20)]
    locations = [Location(i, 0, [Line(i, 10 * i)]) for i in (1, 2, 3)]
    samples = [
        Sample([2, 1], [10, 250_000_000], [Label("thread", "MainThread")]),
        Sample([3, 2, 1], [20, 500_000_000], [Label("alloc", num=42, num_unit="bytes")]),
        Sample([3, 1], [30, 750_000_000], []),
    ]
    return PprofProfile([ValueType("samples", "count"), ValueType("cpu", "nanoseconds")],
                        samples, locations, functions, time_nanos=1_700_000_000_000_000_000,
                        duration_nanos=2_000_000_000, period_type=ValueType("cpu", "nanoseconds"),
                        period=10_000_000, comments=["made by ddprof_nb"], default_sample_type="cpu")


def _go_duration_ns(text: str) -> int:
    """Parse pprof's scaled durations ("1.50s", "1500ms", "0") to nanoseconds."""
    m = re.fullmatch(r"(-?[\d.]+)(ns|us|µs|ms|s|m|h|hrs|)", text)
    assert m, f"unexpected pprof duration {text!r}"
    scale = {"": 1, "ns": 1, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9,
             "hrs": 3600e9}[m[2]]
    return round(float(m[1]) * scale)


def _go_pprof(*args: str) -> str:
    res = subprocess.run([GO, "tool", "pprof", *args], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.skipif(GO is None, reason="`go` not on PATH (apt-get install golang-go) - "
                                       "cannot cross-check with go tool pprof")
@pytest.mark.parametrize("compressed", [True, False], ids=["gzip", "raw"])
def test_go_tool_pprof_reads_our_profiles(tmp_path, compressed):
    # GIVEN a profile with two sample types whose totals are 60 samples and 1.5 s of CPU
    p = _go_profile()
    path = tmp_path / ("cpu.pb.gz" if compressed else "cpu.pb")
    path.write_bytes(pp.dumps(p) if compressed else pp.encode(p))

    # WHEN go tool pprof dumps it raw
    raw = _go_pprof("-raw", str(path))
    # THEN the sample types, per-column totals, labels, functions and comment survive
    assert re.search(r"^samples/count cpu/nanoseconds\[dflt\]$", raw, re.M), raw
    rows = re.findall(r"^\s+(-?\d+)\s+(-?\d+): [\d ]+$", raw, re.M)
    assert len(rows) == 3, raw
    assert sum(int(a) for a, _ in rows) == 60
    assert sum(int(b) for _, b in rows) == 1_500_000_000
    assert "thread:[MainThread]" in raw and "alloc:[42 bytes]" in raw
    assert "crunch_ünï nb.py:30" in raw and "made by ddprof_nb" in raw
    assert "PeriodType: cpu nanoseconds" in raw and "Period: 10000000" in raw

    # WHEN it computes a top table on the second sample type, and on the first
    top_cpu = _go_pprof("-top", "-sample_index=1", str(path))
    top_count = _go_pprof("-top", "-sample_index=0", str(path))
    # THEN the totals parse back to the values we wrote
    assert re.search(r"^Type: cpu$", top_cpu, re.M), top_cpu
    total = re.search(r"of (\S+) total", top_cpu)
    assert total and _go_duration_ns(total[1]) == 1_500_000_000, top_cpu
    assert re.search(r"^Type: samples$", top_count, re.M), top_count
    assert re.search(r"\bof 60 total", top_count), top_count
    flat = {m[2]: _go_duration_ns(m[1]) for m in re.finditer(
        r"^\s*(\S+)\s+\S+%\s+\S+%\s+\S+\s+\S+%\s+(\S+)$", top_cpu, re.M)}
    assert flat == {"crunch_ünï": 1_250_000_000, "work": 250_000_000, "main": 0}, top_cpu
