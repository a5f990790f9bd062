"""load() on real files written by other tools (tests/data/other_tools, see its README):
each loads with the right events, units, totals, threads and labels; a truncated or
garbled file of each kind is a ValueError naming the file and the format problem."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import ddprof_nb
from ddprof_nb import loading
from ddprof_nb.events import EventType

DATA = Path(__file__).resolve().parents[1] / "data" / "other_tools"


def functions(profile) -> set[str]:
    return {f.name for f in profile.frames}


def thread_names(profile) -> set[str]:
    return {profile.threads[i].name for i in set(profile.thread.tolist())}


# --------------------------------------------------------------------------- one load


def test_the_top_level_load_is_loading_load():
    assert ddprof_nb.load is loading.load


def test_load_takes_event_for_an_unnamed_folded_file(tmp_path):
    # GIVEN folded stacks in a file whose name names no event
    path = tmp_path / "stacks.txt"
    path.write_text("main;work 30\nmain 12\n")
    # WHEN loaded without event=  THEN the error says to pass event=
    with pytest.raises(ValueError, match=r"stacks\.txt: .*pass event="):
        ddprof_nb.load(path)
    # WHEN loaded with event= (positionally or by name)  THEN the numbers are that event's quantities
    p = ddprof_nb.load(path, event="cpu")
    assert p.events == (EventType.CPU,) and p.total("cpu") == 42
    assert ddprof_nb.load(path, "lock").events == (EventType.LOCK,)


def test_interval_ns_reads_folded_numbers_as_sample_counts(tmp_path):
    path = tmp_path / "stacks.txt"
    path.write_text("main;work 3\nmain 1\n")
    p = ddprof_nb.load(path, event="wall", interval_ns=10_000_000)
    assert p.total("wall", 0) == 4 and p.total("wall") == 40_000_000
    with pytest.raises(ValueError, match="interval_ns must be a positive integer"):
        ddprof_nb.load(path, event="wall", interval_ns=0)


# --------------------------------------------------------------------------- py-spy


def test_py_spy_raw_loads_as_sample_counts():
    path = DATA / "py-spy.raw.txt"
    lines = [ln for ln in path.read_text().splitlines() if ln]
    samples = sum(int(ln.rsplit(" ", 1)[1]) for ln in lines)
    # WHEN read at py-spy's rate (-r 200: 5 ms a sample)
    p = ddprof_nb.load(path, event="cpu", interval_ns=5_000_000)
    # THEN every sample is counted, and worth 5 ms of CPU time
    assert p.events == (EventType.CPU,) and EventType.CPU.unit == "nanoseconds"
    assert samples > 0 and p.total("cpu", 0) == samples and p.total("cpu") == samples * 5_000_000
    assert {"fib", "spin", "main"} <= functions(p)
    assert any(f.name == "fib" and f.filename == "work.py" and f.line in (4, 5) for f in p.frames)


def test_py_spy_speedscope_loads_threads_as_cpu():
    path = DATA / "py-spy.speedscope.json"
    doc = json.loads(path.read_text())
    p = ddprof_nb.load(path)
    # THEN py-spy's non-idle samples are CPU time, one thread per profile, named from "Thread <tid> "<name>""
    assert p.events == (EventType.CPU,)
    expected = {}
    for prof in doc["profiles"]:
        tid = int(prof["name"].split()[1])
        expected[tid] = (len(prof["samples"]), round(sum(prof["weights"]) * 1e9))
    assert len(expected) == 2
    got = {}
    for t in expected:
        rows = [i for i, th in enumerate(p.threads) if th.tid == t]
        assert len(rows) == 1
        view = p.filter(threads=[t])
        got[t] = (view.total("cpu", 0), view.total("cpu"))
    assert got == expected
    assert "worker" in thread_names(p)
    assert {"fib", "spin"} <= functions(p)


# --------------------------------------------------------------------------- pyinstrument


def test_pyinstrument_evented_speedscope_loads_as_wall_time():
    path = DATA / "pyinstrument.speedscope.json"
    doc = json.loads(path.read_text())
    (prof,) = doc["profiles"]
    assert prof["type"] == "evented"
    p = ddprof_nb.load(path)
    assert p.events == (EventType.WALL,) and EventType.WALL.unit == "nanoseconds"
    # THEN the total is the time the outermost frame was open (seconds -> ns)
    opens = [e["at"] for e in prof["events"]]
    assert p.total("wall") == pytest.approx((max(opens) - min(opens)) * 1e9, rel=1e-6)
    assert p.total("wall") > 0
    assert {"fib", "spin", "main"} <= functions(p)
    assert thread_names(p) == {prof["name"]}


# --------------------------------------------------------------------------- CPython gecko


def test_cpython_gecko_loads_threads_times_and_wall_time():
    path = DATA / "cpython-3.15.gecko.json"
    doc = json.loads(path.read_text())
    interval_ns = round(doc["meta"]["interval"] * 1e6)
    p = ddprof_nb.load(path)
    assert p.events == (EventType.WALL,)
    for t in doc["threads"]:
        n = sum(s is not None for s in t["samples"]["stack"])
        view = p.filter(threads=[t["tid"]])
        # THEN each thread keeps its name and tid, one count per sample, each worth the interval
        assert {th.name for th in view.threads if th.tid == t["tid"]} == {t["name"]}
        assert n > 0 and view.total("wall", 0) == n and view.total("wall") == n * interval_ns
    # AND the samples keep their times (a time axis), within the profile's span
    assert p.time_ns.max() > 0 and p.metadata.duration_ns > p.time_ns.max()
    assert p.metadata.interval_ns == interval_ns
    fib_lines = {f.line for f in p.frames if f.name == "fib" and f.filename.endswith("work.py")}
    assert fib_lines and fib_lines <= {4, 5}


def test_gzipped_gecko_loads_like_the_plain_file():
    data = (DATA / "cpython-3.15.gecko.json").read_bytes()
    a = ddprof_nb.load(data, name="plain.json")
    b = ddprof_nb.load(gzip.compress(data), name="profile.json.gz")
    assert a.total("wall") == b.total("wall") > 0 and len(a) == len(b)


def test_gecko_event_can_be_forced():
    p = ddprof_nb.load(DATA / "cpython-3.15.gecko.json", event="cpu")
    assert p.events == (EventType.CPU,) and p.total("cpu") > 0


# --------------------------------------------------------------------------- Go pprof


@pytest.mark.parametrize("name", ["cpu.pprof", "cpu-uncompressed.pprof"])
def test_go_cpu_profile_loads_with_its_labels(name):
    raw = (DATA / "go" / name).read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == (name == "cpu.pprof")
    p = ddprof_nb.load(DATA / "go" / name)
    assert p.events == (EventType.CPU,) and p.total("cpu") > 0 and p.total("cpu", 0) > 0
    # THEN pprof.Do's labels are LabelSets, and each phase has its own CPU time
    by_phase = {ph: p.filter(labels={"phase": ph}).total("cpu") for ph in ("load", "train")}
    assert all(v > 0 for v in by_phase.values())
    assert p.filter(labels={"phase": "load", "worker": "a"}).total("cpu") == by_phase["load"]
    assert p.filter(labels={"phase": "train", "worker": "b"}).total("cpu") == by_phase["train"]
    assert "main.burn" in functions(p)
    assert p.metadata.interval_ns == 10_000_000  # Go's 100 Hz period


def test_gzipped_and_raw_go_profiles_are_the_same():
    a = ddprof_nb.load(DATA / "go" / "cpu.pprof")
    b = ddprof_nb.load(DATA / "go" / "cpu-uncompressed.pprof")
    assert a.total("cpu") == b.total("cpu") and a.total("cpu", 0) == b.total("cpu", 0)


def test_go_heap_profile_loads_its_four_sample_types():
    p = ddprof_nb.load(DATA / "go" / "heap.pprof")
    assert p.events == (EventType.ALLOC, EventType.LIVE)
    assert EventType.ALLOC.unit == EventType.LIVE.unit == "bytes"
    for e in p.events:
        assert p.total(e, 0) > 0 and p.total(e, 1) > 0  # objects and bytes
    assert p.total("alloc") >= p.total("live")
    assert "main.allocate" in functions(p)


def test_go_mutex_profile_loads_as_lock_wait():
    p = ddprof_nb.load(DATA / "go" / "mutex.pprof")
    assert p.events == (EventType.LOCK,) and p.total("lock") > 0 and p.total("lock", 0) > 0
    assert any(name.startswith("main.contend") for name in functions(p))


# --------------------------------------------------------------------------- bad files


TRUNCATED = {
    "py-spy.raw.txt": r"not a folded-stack line",
    "py-spy.speedscope.json": r"(not valid JSON .*|JSON cut short inside a character )\(?the file looks truncated",
    "pyinstrument.speedscope.json": r"(not valid JSON .*|JSON cut short inside a character )\(?the file looks truncated",
    "cpython-3.15.gecko.json": r"(not valid JSON .*|JSON cut short inside a character )\(?the file looks truncated",
    "go/cpu.pprof": r"truncated gzip stream",
    "go/heap.pprof": r"truncated gzip stream",
    "go/mutex.pprof": r"truncated gzip stream",
    "go/cpu-uncompressed.pprof": r"not a profile ddprof_nb can read .*truncated",
}


@pytest.mark.parametrize("name", sorted(TRUNCATED))
@pytest.mark.parametrize("keep", [0.3, 0.5, 0.77, 0.97])
def test_a_truncated_file_of_each_kind_names_the_file_and_the_problem(tmp_path, name, keep):
    data = (DATA / name).read_bytes()
    path = tmp_path / Path(name).name
    path.write_bytes(data[: int(len(data) * keep)])
    options = {"event": "cpu"} if name.endswith(".txt") else {}
    with pytest.raises(ValueError) as err:
        ddprof_nb.load(path, **options)
    assert str(err.value).startswith(str(path)) and __import__("re").search(TRUNCATED[name], str(err.value))


def _gecko():
    return json.loads((DATA / "cpython-3.15.gecko.json").read_text())


def _broken(edit):
    doc = _gecko()
    edit(doc)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("edit, problem", [
    (lambda d: d["threads"][0]["stackTable"]["prefix"].__setitem__(0, 5), r"stackTable\.prefix\[0\] does not point to an earlier stack"),
    (lambda d: d["threads"][0].pop("funcTable"), r"thread 0: no funcTable"),
    (lambda d: d["threads"][0]["samples"]["stack"].__setitem__(0, 10**6), r"samples\.stack\[0\] is out of range"),
    (lambda d: d["threads"][0]["frameTable"]["func"].pop(), r"frameTable\.func has \d+ entries, not \d+"),
    (lambda d: d["threads"][0]["samples"].__setitem__("weightType", "watts"), r"unknown samples\.weightType 'watts'"),
    (lambda d: d["meta"].__setitem__("interval", "fast"), r"meta\.interval must be a finite number"),
    (lambda d: d["shared"].__setitem__("stringArray", [1, 2]), r"is not a string|is out of range"),
    (lambda d: d["threads"][0].__setitem__("samples", {"schema": {"stack": 0, "time": 1}, "data": []}),
     r"raw \(unprocessed\) gecko profile"),
])
def test_garbled_gecko_files_name_the_format_problem(edit, problem):
    with pytest.raises(ValueError, match=r"^bad\.json: Firefox Profiler \(gecko\) file: .*" + problem):
        ddprof_nb.load(_broken(edit), name="bad.json")


def test_json_of_another_kind_names_both_json_formats(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"answer": 42}')
    with pytest.raises(ValueError, match=r"config\.json: JSON, but neither a speedscope file .* nor a Firefox Profiler file"):
        ddprof_nb.load(path)


# --------------------------------------------------------------------------- what loads is usable

ALL_FILES = {
    "py-spy.raw.txt": {"event": "cpu", "interval_ns": 5_000_000},
    "py-spy.speedscope.json": {},
    "pyinstrument.speedscope.json": {},
    "cpython-3.15.gecko.json": {},
    "go/cpu.pprof": {},
    "go/heap.pprof": {},
    "go/mutex.pprof": {},
}


@pytest.mark.parametrize("name", sorted(ALL_FILES))
def test_other_tools_profiles_save_and_reload_in_every_format(tmp_path, name):
    p = ddprof_nb.load(DATA / name, **ALL_FILES[name])
    for out in ("x.pprof", "x.speedscope.json"):
        ddprof_nb.save(p, tmp_path / out)
        q = ddprof_nb.load(tmp_path / out)
        assert {e: q.total(e) for e in q.events} == {e: p.total(e) for e in p.events}, out
    (tmp_path / "folded").mkdir()
    ddprof_nb.save(p, tmp_path / "folded")
    q = ddprof_nb.load(tmp_path / "folded")
    assert {e: q.total(e) for e in q.events} == {e: p.total(e) for e in p.events if p.total(e)}


@pytest.mark.parametrize("name", ["py-spy.raw.txt", "py-spy.speedscope.json", "pyinstrument.speedscope.json",
                                  "cpython-3.15.gecko.json"])
def test_sandwich_of_fib_in_other_tools_profiles(name):
    p = ddprof_nb.load(DATA / name, **ALL_FILES[name])
    (event,) = p.events
    fib_total = next(r.total for r in p.top(event, n=None) if r.name == "fib")
    callers, callees = p.sandwich("fib")
    # THEN each side holds all of fib's time once, however deep it recursed
    assert callers.total(event) == callees.total(event) == fib_total > 0
    # AND fib's callers are spin (its only caller besides itself, counted at the outermost call)
    direct = {callers.stack_frames(s)[1].name for s in set(callers.stack.tolist()) if len(callers.stacks[s]) > 1}
    assert direct == {"spin"}
    # AND with recursion collapsed, fib appears once per stack and keeps its total
    flat = p.collapse_recursion()
    assert max(sum(f.name == "fib" for f in flat.stack_frames(s)) for s in set(flat.stack.tolist())) == 1
    assert next(r.total for r in flat.top(event, n=None) if r.name == "fib") == fib_total


def test_every_cut_of_a_json_file_says_it_looks_truncated():
    data = (DATA / "pyinstrument.speedscope.json").read_bytes().rstrip()
    for n in range(1, len(data)):
        with pytest.raises(ValueError, match=r"^cut\.json: .*the file looks truncated"):
            ddprof_nb.load(data[:n], name="cut.json")
    # a file broken in the middle says what is wrong, not that it was cut
    with pytest.raises(ValueError, match=r"not valid JSON \(Expecting") as err:
        ddprof_nb.load(data.replace(b'"profiles":', b'"profiles" 1:', 1), name="cut.json")
    assert "truncated" not in str(err.value)


def test_gecko_tables_shared_between_threads_load():
    # GIVEN the document with one thread's stack, frame and function tables moved to "shared"
    doc = _gecko()
    t = doc["threads"][0]
    for key in ("stackTable", "frameTable", "funcTable"):
        doc["shared"][key] = t.pop(key)
    p = ddprof_nb.load(json.dumps(doc).encode(), name="shared.json")
    # THEN it loads as the original does
    q = ddprof_nb.load(DATA / "cpython-3.15.gecko.json")
    assert p.filter(threads=[t["tid"]]).total("wall") == q.filter(threads=[t["tid"]]).total("wall") > 0
    assert p.top("wall", n=None) == q.top("wall", n=None) and p.total("wall") == q.total("wall")
