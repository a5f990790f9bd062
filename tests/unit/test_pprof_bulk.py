"""The bulk sample reader (pprof_samples) and the column row builder (pprof_rows) give
exactly what the one-by-one decoder gives, fall back to it for unusual layouts, and turn
any corrupted input into a ValueError naming the input."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from byte_mutations import MUTATION, mutate
from ddprof_nb.exporters import pprof, pprof_rows
from ddprof_nb.exporters import pprof_proto as pp
from ddprof_nb.exporters.pprof_proto import Function, Label, Line, Location, PprofProfile, Sample, ValueType
from ddprof_nb.exporters.pprof_samples import bulk_samples, samples_of_table


def _profile(samples, sample_types=None) -> PprofProfile:
    return PprofProfile(
        sample_types=sample_types or [ValueType("samples", "count"), ValueType("cpu", "nanoseconds")],
        samples=samples,
        locations=[Location(i, 0, [Line(i, 10 * i)]) for i in (1, 2, 3, 300)],
        functions=[Function(i, f"f{i}", "", "m.py", i) for i in (1, 2, 3, 300)],
        time_nanos=1_000,
    )


def _many_samples(n: int, seed: int = 0) -> list[Sample]:
    rnd = random.Random(seed)
    stacks = [[1], [2, 1], [300, 2, 1], [3, 300, 300, 1], []]
    out = []
    for i in range(n):
        labels = [Label("thread id", num=rnd.choice([1, 2, 70_000])), Label("thread name", str="T")]
        if rnd.random() < 0.7:
            labels.append(Label("time_ns", num=rnd.randrange(1 << 20) * 1_000_000, num_unit="nanoseconds"))
        if rnd.random() < 0.3:  # absolute (start is 1000 ns), some before the start
            labels.append(Label("end_timestamp_ns", num=rnd.choice([500, 1_000 + rnd.randrange(1 << 20) * 1_000_000])))
        if rnd.random() < 0.3:
            labels.insert(0, Label("state", str=rnd.choice(["a", "b"])))
        if rnd.random() < 0.1:
            labels.append(Label("bytes", num=-rnd.randrange(1 << 63), num_unit="bytes"))
        vals = [rnd.choice([0, 1, 2]), rnd.choice([0, 10_000_000, 1 << 62, -5])]
        out.append(Sample(rnd.choice(stacks), vals, labels))
    return out


def _spans(raw: bytes):
    top = pp._parse(raw, 0, len(raw), "t", pp._K_PROFILE)
    return top[2] or ((), ())


def test_bulk_reader_takes_encoder_output_and_matches_the_one_by_one_decoder():
    # GIVEN a profile of varied samples (empty stacks, negative and 10-byte values, labels)
    raw = pp.encode(_profile(_many_samples(2_000)))
    objects = pp.decode(raw)
    # WHEN its samples are read in bulk
    starts, stops = _spans(raw)
    table = bulk_samples(raw, starts, stops, 2, {1, 2, 3, 300}, [""] * 200 + ["x"])
    # THEN the bulk path is taken (not the fallback), and gives the same samples
    assert table is not None and len(table) == 2_000
    cols = pp.decode(raw, columns=True)
    assert cols.samples == [] and samples_of_table(cols.sample_table, Sample, Label) == objects.samples


def test_unusual_layouts_fall_back_to_the_careful_decoder():
    # GIVEN samples with unpacked location ids, a field given twice, an unknown field,
    # and a label with a length-delimited field (all valid protobuf)
    def vint(n):
        out = bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)

    def ln(f, body):
        return vint(f << 3 | 2) + vint(len(body)) + body

    head = ln(1, b"\x08\x01\x10\x02") + ln(4, b"\x08\x01\x22\x02\x08\x01") + ln(5, b"\x08\x01\x10\x01")
    tail = b"".join(ln(6, s) for s in (b"", b"samples", b"count", b"k"))
    bodies = [
        b"\x08\x01\x08\x01" + ln(2, b"\x05"),  # unpacked location ids
        ln(1, b"\x01") + ln(1, b"\x01") + ln(2, b"\x05"),  # packed field given twice
        ln(1, b"\x01") + ln(2, b"\x05") + ln(9, b"zz"),  # unknown length-delimited field
        ln(1, b"\x01") + ln(2, b"\x05") + ln(3, b"\x08\x03" + ln(7, b"q")),  # label with an unknown bytes field
    ]
    for body in bodies:
        raw = head + ln(2, body) + tail
        starts, stops = _spans(raw)
        # WHEN decoded  THEN the bulk reader declines, and the columns still match the objects
        assert bulk_samples(raw, starts, stops, 1, {1}, ["", "samples", "count", "k"]) is None
        objects = pp.decode(raw)
        assert samples_of_table(pp.decode(raw, columns=True).sample_table, Sample, Label) == objects.samples


def _count_by_time(p) -> dict[int, int]:
    out: dict[int, int] = {}
    for t, c in zip(p.time_ns.tolist(), p.values[:, 0].tolist()):
        out[t] = out.get(t, 0) + c
    return out


def test_rows_match_a_one_by_one_reading_of_the_labels():
    # GIVEN another tool's samples whose labels set the time in several ways
    samples = _many_samples(3_000, seed=5)
    prof = pprof.loads(pp.dumps(_profile(samples)))
    # WHEN the same samples are added one by one, each one's labels parsed alone (the reference)
    ref = pprof.ProfileBuilder(prof.metadata)
    stack = ref.stack_id([ref.frame_id(pprof.Frame("f"))])
    for s in samples:
        if any(s.values):
            th, lb, t, _ = pprof_rows.parse_labels(s.labels, False, True, 1_000, ref, "ref")
            ref.add_many(pprof.EventType.CPU, [stack], [th], [lb], np.array([t]), np.array([s.values]))
    ref = ref.build(end_ns=prof.metadata.end_ns)
    # THEN the profile holds the same counts at the same times, threads and labels
    assert _count_by_time(prof) == _count_by_time(ref)
    assert prof.threads == ref.threads and prof.labelsets == ref.labelsets
    assert int(prof.values[:, 0].sum()) == sum(s.values[0] for s in samples)


def test_label_groups_do_not_rely_on_the_hash(monkeypatch):
    # GIVEN a profile read with the hash grouping
    blob = pp.dumps(_profile(_many_samples(1_500, seed=9)))
    hashed = pprof.loads(blob)
    # WHEN the hash check is made to fail (as a collision would)
    monkeypatch.setattr(pprof_rows, "_same_as_rep", lambda *a: False)
    exact = pprof.loads(blob)
    # THEN the exact grouping gives the same profile
    assert exact.threads == hashed.threads and exact.labelsets == hashed.labelsets
    assert np.array_equal(exact.time_ns, hashed.time_ns) and np.array_equal(exact.values, hashed.values)
    assert np.array_equal(exact.thread, hashed.thread) and np.array_equal(exact.labels, hashed.labels)


_RAW = pp.encode(_profile(_many_samples(40, seed=3)))
_MUTATIONS = st.lists(MUTATION, min_size=1, max_size=4)


def _outcome(fn):
    try:
        return "ok", fn()
    except ValueError as e:
        return "error", str(e)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_MUTATIONS)
def test_corrupted_samples_give_the_same_answer_in_bulk_and_one_by_one(ops):
    # GIVEN a profile's bytes with a few bytes flipped, set, inserted, deleted or cut
    data = mutate(_RAW, ops)
    # WHEN decoded to columns and to objects
    kind_c, cols = _outcome(lambda: pp.decode(data, name="fuzz", columns=True))
    kind_o, objs = _outcome(lambda: pp.decode(data, name="fuzz"))
    # THEN both fail with the same clear ValueError, or both give the same samples
    assert kind_c == kind_o
    if kind_c == "error":
        assert cols == objs and cols.startswith("fuzz: ")
    else:
        assert samples_of_table(cols.sample_table, Sample, Label) == objs.samples
        # and building a Profile from them only ever fails with a ValueError
        _outcome(lambda: pprof.from_pprof(cols, name="fuzz"))


@pytest.mark.parametrize("cut", range(1, len(_RAW), 7))
def test_every_truncation_raises_a_value_error_in_bulk_mode(cut):
    with pytest.raises(ValueError, match=r"^cut: "):
        pp.decode(_RAW[:cut], name="cut", columns=True)
