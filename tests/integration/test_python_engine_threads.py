"""The python engine's handling of threads, labels, depth, errors and CPU clocks."""

import _thread
import hashlib
import os
import sys
import threading
import time

import pytest

import ddprof_nb
from ddprof_nb import EventType, FrameKind
from ddprof_nb.config import SamplerConfig
from ddprof_nb.engines import python as pyengine
from ddprof_nb.engines.python import PythonEngine

ENGINE_FILE = os.path.abspath(pyengine.__file__)


def burn(cpu_seconds):
    end = time.thread_time() + cpu_seconds
    x = 0
    while time.thread_time() < end:
        for _ in range(50):
            x += 1
    return x


_BLOCK = b"x" * (1 << 20)


def burn_gil_free(cpu_seconds):
    """CPU burnt in C with the GIL released (hashlib), so the python engine's sampler
    thread need not win the GIL from busy threads to tick (it waits up to the switch
    interval for each handoff and, among several busy threads, often more)."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        hashlib.sha256(_BLOCK).digest()


def measured_burn(cpu_seconds, out, key):
    t0 = time.thread_time()
    burn(cpu_seconds)
    out[key] = time.thread_time() - t0


def run_engine(work, **options):
    """Profile ``work()`` with a PythonEngine driven directly (no Sampler trimming)."""
    engine = PythonEngine(SamplerConfig.make(engine="python", **options))
    engine.start()
    try:
        work()
    finally:
        prof = engine.stop()
    return engine, prof


def test_the_sampler_thread_never_appears():
    def worker():
        # in hashlib with the GIL released: with two threads burning under the GIL, the
        # sampler thread (which needs it) could miss the worker's short life entirely
        burn_gil_free(0.1)

    def work():
        t = threading.Thread(target=worker, name="worker")
        t.start()
        burn(0.1)
        t.join()

    _, prof = run_engine(work, interval="5ms")
    names = {t.name for t in prof.threads}
    assert pyengine.THREAD_NAME not in names
    assert {"MainThread", "worker"} <= names
    # the only engine frames allowed are start() and stop() on the thread that called
    # them (a busy machine may let a tick land inside them); never the sampler's own
    engine_frames = {f.name for f in prof.frames if f.filename == ENGINE_FILE}
    assert engine_frames <= {"PythonEngine.start", "PythonEngine.stop"}, engine_frames
    assert not any(f.name.endswith(("._run", "._tick", "._sample")) for f in prof.frames)


def test_thread_names_tids_and_renames():
    seen = {}

    # (GIL-free burns: what is tested is names and ids, not the GIL's fairness to the sampler)
    def worker(key):
        seen[key] = threading.get_native_id()
        burn_gil_free(0.08)
        threading.current_thread().name = "renamed"
        burn_gil_free(0.08)

    def raw_worker(done):
        seen["raw"] = threading.get_native_id()
        burn_gil_free(0.1)
        done.release()

    def work():
        t = threading.Thread(target=worker, args=("named",), name="original")
        t.start()
        done = _thread.allocate_lock()
        done.acquire()
        _thread.start_new_thread(raw_worker, (done,))
        t.join()
        done.acquire()
        time.sleep(0.03)  # let the raw thread unwind

    _, prof = run_engine(work, interval="5ms")
    by_tid = {}
    for t in prof.threads:
        by_tid.setdefault(t.tid, set()).add(t.name)
    # a thread keeps its OS id; its samples carry the name it had when they were taken
    assert by_tid[seen["named"]] <= {"original", "renamed"}
    assert "renamed" in by_tid[seen["named"]] and "original" in by_tid[seen["named"]]
    assert prof.filter(threads=["renamed"]).total("cpu") > 0.04e9
    # a thread that threading does not know is still sampled, under its OS id
    assert seen["raw"] in by_tid, (by_tid, prof.metadata.notes)
    assert prof.filter(threads=[seen["raw"]]).total("cpu") > 0.03e9  # sampled under its own tid
    assert prof.filter(threads=["MainThread"]).total("wall") > 0


def test_a_foreign_thread_first_seen_late_keeps_its_cpu_since_birth():
    """A thread born while profiling that the sampler first sees late (it waited for the
    GIL, or the thread is short) still gets all of its CPU: its clock began at zero."""
    seen, burnt, park = {}, _thread.allocate_lock(), _thread.allocate_lock()
    burnt.acquire()
    park.acquire()

    def raw_worker():
        seen["raw"] = threading.get_native_id()
        seen["cpu"] = burn(0.06) and time.thread_time()
        burnt.release()
        with park:  # blocked, alive, until the profile is taken
            pass

    engine = PythonEngine(SamplerConfig.make(engine="python", interval="1s"))
    engine.start()
    try:
        _thread.start_new_thread(raw_worker, ())
        burnt.acquire()
        engine._tick()  # the sampler's first look at the thread, after its burn
    finally:
        prof = engine.stop()
        park.release()
    got = prof.filter(threads=[seen["raw"]]).total("cpu") / 1e9
    assert got >= 0.06 and got <= seen["cpu"] + 0.005, (got, seen["cpu"], prof.metadata.notes)


def _stale_dummy_idents(n=3):
    """``n`` foreign threads that each made threading register a _DummyThread, then exited:
    threading (3.11, 3.12) keeps those entries, and glibc hands their stacks, hence their
    pthread idents, to the next threads it starts."""
    gate = _thread.allocate_lock()
    gate.acquire()
    idents = []

    def register(ready):
        threading.current_thread()
        idents.append(threading.get_ident())
        ready.release()
        with gate:
            pass

    for _ in range(n):
        ready = _thread.allocate_lock()
        ready.acquire()
        _thread.start_new_thread(register, (ready,))
        ready.acquire()
    gate.release()
    time.sleep(0.05)  # let them exit
    return idents


def test_a_foreign_thread_on_a_stale_dummy_threads_ident_is_sampled_as_itself():
    # GIVEN threading entries of foreign threads that exited (what test_labeling.py leaves
    # behind: it was the cause of this test file's 1-in-5 flake)
    stale = _stale_dummy_idents()
    seen = {}

    def raw_worker(done):
        seen["ident"], seen["tid"] = threading.get_ident(), threading.get_native_id()
        burn(0.12)
        done.release()

    def work():
        done = _thread.allocate_lock()
        done.acquire()
        _thread.start_new_thread(raw_worker, (done,))
        done.acquire()
        time.sleep(0.03)

    # WHEN a foreign thread started while profiling gets one of their idents
    _, prof = run_engine(work, interval="5ms")
    assert seen["ident"] in stale, "setup: glibc did not reuse a stale ident (the case under test)"
    # THEN its samples carry its own OS id and name, not the dead thread's, and its CPU
    threads = {t.tid: t.name for t in prof.threads}
    assert seen["tid"] in threads, threads
    assert not threads[seen["tid"]].startswith("Dummy-"), threads
    assert prof.filter(threads=[seen["tid"]]).total("cpu") > 0.06e9


def test_exited_threads_and_reused_idents():
    truth = {}
    idents = []

    def job(key, secs):
        idents.append(threading.get_ident())
        measured_burn(secs, truth, key)

    def work():
        for key, secs in (("first", 0.2), ("second", 0.1), ("third", 0.15)):
            t = threading.Thread(target=job, args=(key, secs), name=key)
            t.start()
            t.join()  # the next thread usually gets the same ident (and stack) back

    engine, prof = run_engine(work, interval="5ms")
    for key, secs in truth.items():
        got = prof.filter(threads=[key]).total("cpu") / 1e9
        # each thread's CPU is its own: a reused ident never carries the old clock over
        assert abs(got - secs) < 0.03 + 0.1 * secs, (key, got, secs, idents)
    tids = {t.name: t.tid for t in prof.threads if t.name in truth}
    assert len(set(tids.values())) == 3, tids
    # exited threads are forgotten by the engine
    assert all(st.owner is None or st.owner.name not in truth for st in engine._states.values())


def burn_releasing_gil(cpu_seconds):
    """CPU burnt in C with the GIL released (hashlib on large buffers), so the sampler
    thread is not starved of the GIL by two Python burners taking turns."""
    data = b"x" * (1 << 20)
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        hashlib.sha256(data).digest()


def test_labels_tag_the_thread_that_set_them():
    # The engine weights a sample by the thread's CPU since its previous sample; when the
    # sampler thread waits long for the GIL, CPU spent before a label change is charged to
    # the labels at the sample (a documented limit), so the worker here releases the GIL.
    def worker():
        with ddprof_nb.labels(role="worker"):
            burn_releasing_gil(0.15)

    def work():
        t = threading.Thread(target=worker, name="labelled-worker")
        t.start()
        with ddprof_nb.labels(request="a"):
            burn(0.15)
        burn(0.15)
        t.join()

    _, prof = run_engine(work, interval="5ms")
    cpu = prof.filter(events=["cpu"])
    main_a = cpu.filter(threads=["MainThread"], labels={"request": "a"}).total("cpu")
    main_all = cpu.filter(threads=["MainThread"]).total("cpu")
    assert 0.35 < main_a / main_all < 0.65, (main_a, main_all)
    worker_role = cpu.filter(labels={"role": "worker"})
    assert {prof.threads[i].name for i in set(worker_role.thread.tolist())} == {"labelled-worker"}
    assert worker_role.total("cpu") > 0.06e9  # of 0.15 s burnt; the engine loses up to a tick at thread exit
    # wall samples carry the same labels plus the thread state
    wall_a = prof.filter(events=["wall"], labels={"request": "a"})
    assert {ls.get("state") for ls in (wall_a.labelsets[i] for i in set(wall_a.labels.tolist()))} <= {"cpu", "off-cpu"}


def recurse(n):
    if n == 0:
        return burn(0.15)
    return recurse(n - 1)


def test_depth_cap_keeps_the_leaf_under_a_truncated_root():
    _, prof = run_engine(lambda: recurse(60), interval="5ms", max_depth=20)
    deep = [s for s in prof.samples() if s.event is EventType.CPU and s.stack[-1].name == "burn"]
    assert deep
    for s in deep:
        assert len(s.stack) == 21, [f.name for f in s.stack]
        assert s.stack[0].kind is FrameKind.TRUNCATED and s.stack[0].name == "[truncated]"
        assert all(f.kind is FrameKind.PYTHON for f in s.stack[1:])
        assert [f.name for f in s.stack[1:-1]] == ["recurse"] * 19
    shallow = [s for s in prof.samples() if len(s.stack) < 20]
    assert all(f.kind is FrameKind.PYTHON for s in shallow for f in s.stack)


@pytest.mark.alone  # (0.2 s of CPU at 5 ms: beside other tests at load 10 no CPU sample was kept)
def test_errors_inside_the_sampler_are_counted_and_sampling_goes_on(monkeypatch):
    calls = {"n": 0}
    real = PythonEngine._stack_id

    def flaky(self, frame):
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise ValueError("boom")
        return real(self, frame)

    monkeypatch.setattr(PythonEngine, "_stack_id", flaky)
    _, prof = run_engine(lambda: burn(0.2), interval="5ms")
    notes = " | ".join(prof.metadata.notes)
    assert "sampling error(s)" in notes and "ValueError: boom" in notes, notes
    assert prof.metadata.dropped.get(EventType.WALL, 0) > 0
    assert prof.total("cpu") > 0.05e9  # the other samples are kept


def test_an_error_outside_the_per_thread_loop_is_counted_too(monkeypatch):
    real = sys._current_frames
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("frames unavailable")
        return real()

    monkeypatch.setattr(sys, "_current_frames", flaky)
    _, prof = run_engine(lambda: burn(0.1), interval="5ms")
    assert any("RuntimeError: frames unavailable (x1)" in n for n in prof.metadata.notes), prof.metadata.notes


def two_threads_2_to_1():
    truth = {}
    ts = [threading.Thread(target=measured_burn, args=(s, truth, n), name=n) for n, s in (("two", 0.4), ("one", 0.2))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return truth


@pytest.mark.xfail(strict=False, reason="known limit: the psutil clock path (for platforms without "
                   "pthread_getcpuclockid) misattributes CPU between functions run back to back; "
                   "seen 0-50 % off in CI on Linux. The Linux path (thread CPU clocks) is exact.")
def test_psutil_clock_where_pthread_getcpuclockid_is_missing(monkeypatch):
    psutil = pytest.importorskip("psutil")
    if sys.platform == "darwin":
        pytest.skip("psutil's macOS thread ids are indexes, not OS ids")
    monkeypatch.delattr(time, "pthread_getcpuclockid", raising=False)
    assert pyengine.cpu_clock_source().kind == "psutil"
    truth = {}
    _, prof = run_engine(lambda: truth.update(two_threads_2_to_1()), interval="10ms")
    assert prof.metadata.extra["cpu_clock"] == "psutil"
    assert any("psutil" in n for n in prof.metadata.notes)
    got = {n: prof.filter(threads=[n]).total("cpu") for n in truth}
    share = got["two"] / (got["two"] + got["one"])
    want = truth["two"] / (truth["two"] + truth["one"])
    assert abs(share - want) < 0.1, (got, truth)  # psutil's clock ticks are 10 ms here
    assert psutil  # keep the import visible


def test_no_cpu_clock_means_no_cpu_events_and_a_note(monkeypatch):
    monkeypatch.delattr(time, "pthread_getcpuclockid", raising=False)
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil -> ImportError
    assert pyengine.cpu_clock_source().kind == ""
    _, prof = run_engine(lambda: burn(0.1), interval="5ms")
    assert EventType.CPU not in prof.events
    assert prof.total("wall") > 0.05e9
    assert any("CPU not sampled" in n for n in prof.metadata.notes), prof.metadata.notes
    assert all(ls.get("state") is None for ls in prof.labelsets)


def test_stop_twice_or_without_start_is_refused():
    engine = PythonEngine(SamplerConfig.make(engine="python"))
    with pytest.raises(ddprof_nb.NotRunningError):
        engine.stop()
    engine.start()
    engine.stop()
    with pytest.raises(ddprof_nb.NotRunningError):
        engine.stop()
