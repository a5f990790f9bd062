"""Fuzzing every loader: random and mutated input may only ever raise ValueError (naming the input).

Anything else — IndexError, KeyError, TypeError, OverflowError, RecursionError, a numpy
error — would be a crash a user sees on a corrupt file, so hypothesis hunts for it.
"""

from __future__ import annotations

import copy
import gzip
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddprof_nb import loading
from ddprof_nb.events import EventType, FrameKind
from ddprof_nb.exporters import folded, pprof, speedscope
from ddprof_nb.exporters import pprof_proto as pb
from ddprof_nb.model import Frame, Metadata, Profile, ProfileBuilder

NAME = "fuzz-input.bin"
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _seed_profile() -> Profile:
    """Every event, a pseudo-frame of every kind, labels, two threads: small but complete."""
    b = ProfileBuilder(Metadata(start_ns=10**18, end_ns=10**18 + 10**9, interval_ns=10**7, engine="fuzz",
                                python_version="3.11", pid=1, host="h", dropped={EventType.CPU: 1},
                                notes=("n",), extra={"k": "v"}))
    threads = [b.thread_id(1, "main"), b.thread_id(2, "w")]
    for i, (event, kind) in enumerate(zip(list(EventType) * 2, FrameKind)):
        stack = b.stack_of([Frame("main", "m.py", 1, 1), Frame(f"[{kind.label}]", kind=kind)])
        b.add(event, stack, threads[i % 2], b.labels_id({"i": str(i % 3)}), i * 3_000_000, i, i * 100)
    return b.build()


SEED = _seed_profile()
RAW_PPROF = pb.encode(pprof.to_pprof(SEED))
SEEDS = {
    "pprof": pprof.dumps(SEED),
    "raw-pprof": RAW_PPROF,
    "speedscope": speedscope.dumps(SEED).encode(),
    "folded": folded.dumps(SEED, "cpu").encode(),
}
LOADERS = {
    "pprof": lambda data: pprof.loads(data, name=NAME),
    "speedscope": lambda data: speedscope.loads(data, name=NAME),
    "folded": lambda data: folded.loads(data, event="cpu", name=NAME),
    "load": lambda data: loading.load(data, name=NAME),
}


def only_value_errors(loader: str, data: bytes) -> None:
    """The loader returns a Profile or raises ValueError naming the input — nothing else."""
    try:
        result = LOADERS[loader](data)
    except ValueError as e:
        assert NAME in str(e), f"{loader}: error does not name the input: {e}"
    else:
        assert isinstance(result, Profile)
        for _ in result.samples():  # the result is usable, not a time bomb
            pass


mutation = st.tuples(st.sampled_from(["flip", "set", "insert", "delete"]), st.integers(0, 1 << 20), st.integers(0, 255))


def mutate(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for op, pos, byte in edits:
        if not buf:
            buf.append(byte)
            continue
        i = pos % len(buf)
        if op == "flip":
            buf[i] ^= 1 << (byte % 8)
        elif op == "set":
            buf[i] = byte
        elif op == "insert":
            buf.insert(i, byte)
        else:
            del buf[i]
    return bytes(buf)


@FUZZ
@given(loader=st.sampled_from(sorted(LOADERS)), data=st.binary(max_size=4096))
def test_random_bytes_raise_only_value_errors(loader, data):
    # GIVEN arbitrary bytes  WHEN any loader reads them  THEN a Profile or a ValueError naming the input
    only_value_errors(loader, data)


@FUZZ
@given(
    loader=st.sampled_from(sorted(LOADERS)),
    seed=st.sampled_from(sorted(SEEDS)),
    edits=st.lists(mutation, min_size=1, max_size=8),
    cut=st.one_of(st.none(), st.integers(0, 1 << 16)),
)
def test_mutated_valid_files_raise_only_value_errors(loader, seed, edits, cut):
    # GIVEN a valid file of some format with a few bytes flipped, set, inserted or deleted,
    # maybe truncated
    data = mutate(SEEDS[seed], edits)
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    # WHEN any loader reads it  THEN a Profile or a ValueError naming the input
    only_value_errors(loader, data)


@FUZZ
@given(edits=st.lists(mutation, min_size=1, max_size=6))
def test_mutated_protobuf_inside_valid_gzip_raises_only_value_errors(edits):
    # GIVEN our pprof message with mutated bytes, re-gzipped so gzip checks pass and the
    # protobuf decoder and pprof mapping see the damage
    data = gzip.compress(mutate(RAW_PPROF, edits))
    # WHEN read by pprof and by load  THEN a Profile or a ValueError naming the input
    only_value_errors("pprof", data)
    only_value_errors("load", data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:6]):
            yield from _paths(v, prefix + (i,))


SPEEDSCOPE_DOC = json.loads(SEEDS["speedscope"])
SPEEDSCOPE_PATHS = list(_paths(SPEEDSCOPE_DOC))[1:]


@FUZZ
@given(path=st.sampled_from(SPEEDSCOPE_PATHS), value=json_values, drop_side_channel=st.booleans())
def test_speedscope_documents_with_a_wrong_value_anywhere_raise_only_value_errors(path, value, drop_side_channel):
    # GIVEN our speedscope document with one value anywhere replaced by arbitrary JSON
    # (with or without our side channel, so both readers are exercised)
    doc = copy.deepcopy(SPEEDSCOPE_DOC)
    if drop_side_channel:
        doc.pop("ddprof_nb", None)
    target = doc
    for key in path[:-1]:
        try:
            target = target[key]
        except (KeyError, IndexError, TypeError):
            return  # the path went away with the side channel
    try:
        target[path[-1]] = value
    except (KeyError, IndexError, TypeError):
        return
    data = json.dumps(doc).encode()
    # WHEN read  THEN a Profile or a ValueError naming the input
    only_value_errors("speedscope", data)
    only_value_errors("load", data)


GECKO_BYTES = (__import__("pathlib").Path(__file__).resolve().parents[1]
               / "data" / "other_tools" / "cpython-3.15.gecko.json").read_bytes()
GECKO_DOC = json.loads(GECKO_BYTES)
GECKO_PATHS = [p for p in _paths(GECKO_DOC) if "markers" not in p][1:]


@FUZZ
@given(path=st.sampled_from(GECKO_PATHS), value=json_values)
def test_gecko_documents_with_a_wrong_value_anywhere_raise_only_value_errors(path, value):
    # GIVEN CPython's Firefox Profiler document with one value anywhere replaced by arbitrary JSON
    doc = copy.deepcopy(GECKO_DOC)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    # WHEN loaded  THEN a Profile or a ValueError naming the input
    only_value_errors("load", json.dumps(doc).encode())


@FUZZ
@given(edits=st.lists(mutation, min_size=1, max_size=8))
def test_mutated_gecko_bytes_raise_only_value_errors(edits):
    only_value_errors("load", mutate(GECKO_BYTES, edits))
