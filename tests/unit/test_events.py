"""The one event model: native/events.h parsed by Python, every row fully mapped."""

import re

import pytest

from ddprof_nb import EventType, FrameKind
from ddprof_nb import events as events_mod
from ddprof_nb.config import parse_events


def test_event_ids_are_dense_and_match_the_header():
    # GIVEN the header text  WHEN we read the enum values  THEN they are 0..n-1 in table order
    assert [e.value for e in EventType] == list(range(len(EventType)))
    assert [k.value for k in FrameKind] == list(range(len(FrameKind)))
    text = events_mod.HEADER_PATH.read_text()
    header_events = re.findall(r"^\s*X\((\w+),\s*(\d+),", text.split("DDP_EVENT_TYPES(X)")[1], re.M)
    assert [(n, int(v)) for n, v in header_events] == [(e.name, e.value) for e in EventType]


@pytest.mark.parametrize("event", list(EventType))
def test_every_event_has_every_mapping(event):
    # GIVEN any event type  THEN it has a label, display name/unit, two pprof value types and a leaf kind
    assert event.label and event.label == event.label.lower()
    assert event.display_name and event.display_unit
    count, quantity = event.value_types
    assert count.unit == "count"
    assert quantity.unit in ("nanoseconds", "bytes")
    assert event.unit == quantity.unit
    assert isinstance(event.leaf_kind, FrameKind)
    assert EventType.parse(event.label) is event
    assert EventType.from_id(event.value) is event


def test_pprof_sample_type_names_are_unique():
    names = [vt.type for e in EventType for vt in e.value_types]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("kind", list(FrameKind))
def test_every_frame_kind_has_label_and_description(kind):
    assert kind.label and kind.description
    assert FrameKind.parse(kind.label) is kind
    assert FrameKind.from_id(kind.value) is kind


@pytest.mark.parametrize("bad", [-1, len(EventType), 99, True, 1.0, "0", None])
def test_unknown_event_ids_raise(bad):
    with pytest.raises(ValueError, match="unknown EventType"):
        EventType.from_id(bad)


def test_unknown_names_raise_listing_valid_ones():
    with pytest.raises(ValueError, match="expected one of: cpu, wall, alloc, live, lock, park"):
        EventType.parse("cpuu")
    with pytest.raises(ValueError):
        FrameKind.parse("pythn")


def test_parse_events_accepts_strings_lists_and_folds_live_into_alloc():
    assert parse_events("cpu,wall") == (EventType.CPU, EventType.WALL)
    assert parse_events(["park", "lock"]) == (EventType.LOCK, EventType.PARK)
    assert parse_events("live") == (EventType.ALLOC,)
    with pytest.raises(ValueError):
        parse_events("")


def test_native_table_matches_python_when_built():
    # GIVEN the compiled module (built by pip install)  THEN its table equals the parsed header
    native = pytest.importorskip("ddprof_nb._native", reason="native module not built in this environment")
    ffi, lib = native.ffi, native.lib
    assert lib.ddp_event_count() == len(EventType)
    assert lib.ddp_frame_kind_count() == len(FrameKind)
    for e in EventType:
        assert ffi.string(lib.ddp_event_name(e.value)).decode() == e.label
        got = [ffi.string(lib.ddp_event_value_type(e.value, i)).decode() for i in range(4)]
        assert got == [e.value_types[0].type, e.value_types[0].unit, e.value_types[1].type, e.value_types[1].unit]
        assert lib.ddp_event_leaf_kind(e.value) == e.leaf_kind.value
    for k in FrameKind:
        assert ffi.string(lib.ddp_frame_kind_name(k.value)).decode() == k.label
    assert lib.ddp_event_name(len(EventType)) == ffi.NULL
    assert lib.ddp_event_leaf_kind(-1) == -1
