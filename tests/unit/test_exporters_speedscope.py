"""speedscope exporter: schema, golden file, exact round trip, other tools' files, bad input."""

from __future__ import annotations

import json

import pytest

from ddprof_nb.events import EventType, FrameKind
from ddprof_nb.exporters import speedscope

try:
    from test_exporters import DATA, canon, check_golden, mock_profile
except ImportError:  # collected as a package
    from .test_exporters import DATA, canon, check_golden, mock_profile

GOLDEN = DATA / "speedscope" / "mock.speedscope.json"

# The structure of https://www.speedscope.app/file-format-schema.json (file-format-spec.ts
# in jlfwong/speedscope), restated for the parts we write: required keys, types, units.
SCHEMA = {
    "type": "object",
    "required": ["$schema", "profiles", "shared"],
    "properties": {
        "$schema": {"enum": ["https://www.speedscope.app/file-format-schema.json"]},
        "name": {"type": "string"},
        "activeProfileIndex": {"type": "number"},
        "exporter": {"type": "string"},
        "shared": {
            "type": "object",
            "required": ["frames"],
            "properties": {"frames": {"type": "array", "items": {
                "type": "object", "required": ["name"],
                "properties": {"name": {"type": "string"}, "file": {"type": "string"},
                               "line": {"type": "number"}, "col": {"type": "number"}}}}},
        },
        "profiles": {"type": "array", "items": {
            "type": "object",
            "required": ["type", "name", "unit", "startValue", "endValue", "samples", "weights"],
            "properties": {
                "type": {"enum": ["sampled"]},
                "name": {"type": "string"},
                "unit": {"enum": ["bytes", "microseconds", "milliseconds", "nanoseconds", "none", "seconds"]},
                "startValue": {"type": "number"},
                "endValue": {"type": "number"},
                "samples": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                "weights": {"type": "array", "items": {"type": "number"}},
            },
        }},
    },
}


def test_output_follows_the_speedscope_schema():
    # GIVEN the mock profile  WHEN written as speedscope
    doc = json.loads(speedscope.dumps(mock_profile()))
    # THEN it validates against the schema's structure
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(doc, SCHEMA)
    # AND samples reference frames in range, one weight per sample
    n = len(doc["shared"]["frames"])
    for prof in doc["profiles"]:
        assert len(prof["samples"]) == len(prof["weights"])
        assert all(0 <= i < n for stack in prof["samples"] for i in stack)


def test_one_sampled_profile_per_event_and_thread_with_the_events_unit():
    # GIVEN the mock profile (6 events x 2 threads)  WHEN converted
    p = mock_profile()
    doc = speedscope.to_json(p)
    # THEN there is one profile per (event, thread) present, named after both, in the event's unit
    pairs = {(s.event, s.thread) for s in p.samples()}
    assert len(doc["profiles"]) == len(pairs)
    names = [prof["name"] for prof in doc["profiles"]]
    assert names[0] == "CPU time — MainThread (tid 101)"
    units = {prof["name"].split(" — ")[0]: prof["unit"] for prof in doc["profiles"]}
    assert units == {e.display_name: e.unit for e in EventType}
    # AND a profile's weights are the primary quantity, summing to the event's total per thread
    cpu_main = doc["profiles"][0]
    assert sum(cpu_main["weights"]) == sum(
        s.values[1] for s in p.samples() if s.event is EventType.CPU and s.thread.tid == 101)
    assert cpu_main["endValue"] == sum(cpu_main["weights"])


def test_frames_are_shared_with_name_file_and_line():
    # GIVEN the mock profile  WHEN converted
    frames = speedscope.to_json(mock_profile())["shared"]["frames"]
    # THEN Python frames carry file and line, pseudo-frames only a name, each frame once
    assert {"name": "Model.fit", "file": "/src/model.py", "line": 42} in frames
    assert {"name": "[gc]"} in frames
    assert len(frames) == len({json.dumps(f, sort_keys=True) for f in frames})


def test_speedscope_output_matches_the_golden_file(update_golden):
    # GIVEN the mock profile  WHEN written with indentation
    text = speedscope.dumps(mock_profile(), name="mock", indent=1)
    doc = json.loads(text)
    # THEN it equals tests/data/speedscope/mock.speedscope.json (exporter version aside)
    assert doc["exporter"].startswith("ddprof_nb")
    doc["exporter"] = "ddprof_nb"
    check_golden(GOLDEN, json.dumps(doc, indent=1, ensure_ascii=False) + "\n", update_golden)


def test_golden_file_reads_back_to_the_mock_profile():
    # GIVEN the committed golden file  WHEN read  THEN it is exactly the mock profile
    p = mock_profile()
    q = speedscope.read(GOLDEN)
    assert canon(q) == canon(p) and q.metadata == p.metadata


def test_round_trip_is_exact():
    # GIVEN a profile with every event and kind, labels, ticks, a zero row and a negative row
    p = mock_profile(zero_row=True, negative_row=True)
    # WHEN written as speedscope and read back
    q = speedscope.loads(speedscope.dumps(p), name="mock.speedscope.json")
    # THEN rows (stacks incl. kinds and first lines, threads, labels, ticks, both values),
    # metadata and tick are identical
    assert canon(q) == canon(p)
    assert q.metadata == p.metadata
    assert q.tick_ns == p.tick_ns


# --------------------------------------------------------------------------- other tools' files

TWO_SAMPLED = {
    "$schema": "https://www.speedscope.app/file-format-schema.json",
    "name": "Two Samples",
    "activeProfileIndex": 1,
    "profiles": [
        {"type": "sampled", "name": "one", "unit": "milliseconds", "startValue": 0, "endValue": 14,
         "samples": [[0, 1, 2], [0, 1, 2], [0, 1, 3], [0, 1]], "weights": [1, 1.5, 4, 5]},
        {"type": "sampled", "name": "two", "unit": "none", "startValue": 0, "endValue": 2,
         "samples": [[0, 1, 2]], "weights": [2]},
    ],
    "shared": {"frames": [{"name": "a"}, {"name": "b", "file": "b.py", "line": 3}, {"name": "c"}, {"name": "d"}]},
}


def test_reads_other_tools_sampled_profiles():
    # GIVEN a file in the shape of speedscope's own sample (one time profile, one unit-less)
    p = speedscope.loads(json.dumps(TWO_SAMPLED), name="two.speedscope.json")
    # THEN each profile is a thread; milliseconds become wall nanoseconds, unit-less weights
    # become cpu sample counts at the default 10 ms interval; count 1 per sample
    rows = sorted((s.event.label, s.thread.name, tuple(f.name for f in s.stack), s.values) for s in p.samples())
    assert rows == [
        ("cpu", "two", ("a", "b", "c"), (1, 20_000_000)),
        ("wall", "one", ("a", "b"), (1, 5_000_000)),
        ("wall", "one", ("a", "b", "c"), (2, 2_500_000)),
        ("wall", "one", ("a", "b", "d"), (1, 4_000_000)),
    ]
    frame_b = next(s for s in p.samples()).stack[1]
    assert (frame_b.filename, frame_b.line, frame_b.kind) == ("b.py", 3, FrameKind.PYTHON)
    assert p.metadata.interval_ns == 10_000_000
    assert any("Two Samples" in n for n in p.metadata.notes)


def test_event_option_forces_the_event_of_foreign_profiles():
    # GIVEN the same file  WHEN read with event="alloc"  THEN every row is an alloc row
    p = speedscope.loads(json.dumps(TWO_SAMPLED), event="alloc")
    assert p.events == (EventType.ALLOC,)


def test_reads_evented_profiles_as_time_per_stack():
    # GIVEN an evented profile: a opens at 0, b at 2, b closes at 5, a closes at 10 (µs)
    doc = {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": [{"name": "a"}, {"name": "b"}]},
        "profiles": [{"type": "evented", "name": "trace", "unit": "microseconds", "startValue": 0, "endValue": 10,
                      "events": [{"type": "O", "frame": 0, "at": 0}, {"type": "O", "frame": 1, "at": 2},
                                 {"type": "C", "frame": 1, "at": 5}, {"type": "C", "frame": 0, "at": 10}]}],
    }
    # WHEN read
    p = speedscope.loads(json.dumps(doc))
    # THEN a has 2+5 µs of self time in two intervals, a;b 3 µs
    rows = sorted((tuple(f.name for f in s.stack), s.values) for s in p.samples())
    assert rows == [(("a",), (2, 7_000)), (("a", "b"), (1, 3_000))]


@pytest.mark.parametrize(
    "doc, message",
    [
        ([], "the document must be an object"),
        ({"profiles": []}, "not a speedscope file"),
        ({"$schema": "https://example.com/x", "profiles": [], "shared": {"frames": []}}, "not speedscope's"),
        ({"profiles": [], "shared": {"frames": [{"file": "x"}]}}, "frame 0 name must be a string"),
        ({"profiles": [{"type": "sampled", "unit": "parsecs", "samples": [], "weights": []}],
          "shared": {"frames": []}}, "unknown unit 'parsecs'"),
        ({"profiles": [{"type": "sampled", "unit": "none", "samples": [[0]], "weights": [1]}],
          "shared": {"frames": []}}, "frame index out of range"),
        ({"profiles": [{"type": "sampled", "unit": "none", "samples": [[0]], "weights": []}],
          "shared": {"frames": [{"name": "a"}]}}, "1 samples but 0 weights"),
        ({"profiles": [{"type": "sampled", "unit": "none", "samples": [[0]], "weights": ["x"]}],
          "shared": {"frames": [{"name": "a"}]}}, "must be a number"),
        ({"profiles": [{"type": "sampled", "unit": "seconds", "samples": [[0]], "weights": [1e300]}],
          "shared": {"frames": [{"name": "a"}]}}, "weight overflows|64 bits"),
        ({"profiles": [{"type": "flat", "unit": "none"}], "shared": {"frames": []}}, "unknown profile type"),
        ({"profiles": [{"type": "evented", "unit": "none", "events": [{"type": "C", "frame": 0, "at": 1}]}],
          "shared": {"frames": [{"name": "a"}]}}, "closes a frame that is not open"),
        ({"profiles": [{"type": "evented", "unit": "none", "events": [
            {"type": "O", "frame": 0, "at": 5}, {"type": "C", "frame": 0, "at": 1}]}],
          "shared": {"frames": [{"name": "a"}]}}, "goes backwards"),
        ({"profiles": [], "shared": {"frames": []}, "ddprof_nb": {"format": 99}}, "unsupported ddprof_nb format"),
    ],
)
def test_invalid_documents_are_value_errors_naming_the_file(doc, message):
    # GIVEN a malformed speedscope document  WHEN read  THEN ValueError names the input and the problem
    with pytest.raises(ValueError, match=f"bad.json: .*({message})"):
        speedscope.loads(json.dumps(doc), name="bad.json")


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "not valid JSON"),
        ('{"profiles": [NaN]}', "non-finite"),
        ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
        (b"\xff\xfe{}", "not UTF-8"),
        ('{"a": 1' + "0" * 5000 + "}", "not valid JSON"),
    ],
)
def test_unparseable_json_is_a_value_error(text, message):
    # GIVEN text that is not (acceptable) JSON  WHEN read  THEN ValueError names the input
    with pytest.raises(ValueError, match=f"x.json: ({message})"):
        speedscope.loads(text, name="x.json")


def test_a_tampered_side_channel_is_a_clear_error():
    # GIVEN our file with the side channel no longer matching its profiles
    doc = speedscope.to_json(mock_profile())
    doc["ddprof_nb"]["profiles"].pop()
    # WHEN read  THEN ValueError says what does not match
    with pytest.raises(ValueError, match="x.json: ddprof_nb.profiles does not match profiles"):
        speedscope.loads(json.dumps(doc), name="x.json")
