"""sources: what the sampler runs beside its engine, driven through one interface, in one order."""

from __future__ import annotations

import pytest

from ddprof_nb import sources
from ddprof_nb.model import selection
from ddprof_nb.asyncio_support import TaskSampler
from ddprof_nb.children import ChildCollector
from ddprof_nb.config import SamplerConfig
from ddprof_nb.dask_support import DaskProfiler
from ddprof_nb.engines.python import PythonEngine
from ddprof_nb.events import EventType
from ddprof_nb.model import Frame, Metadata, ProfileBuilder
from ddprof_nb.sampler import Sampler, active


class FakeClient:
    def run(self, *a, **k):
        return {}

    def scheduler_info(self, **k):
        return {"workers": {}}


def test_the_three_sources_fulfil_the_interface():
    config = SamplerConfig.make(events=("wall",), engine="python")
    for src in (TaskSampler(config), ChildCollector(config), DaskProfiler(FakeClient(), config)):
        assert isinstance(src, sources.Source), type(src).__name__
    assert not TaskSampler.remote and ChildCollector.remote and DaskProfiler.remote


def one_sample(name):
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=1))
    b.add(EventType.WALL, b.stack_of([Frame(name, "/x.py", 1, 1)]), b.thread_id(7, "t"), 0, 0, 1, 10)
    return b.build()


class Recording:
    """A source that writes down each call, and what the engine was doing then."""

    def __init__(self, log, name, remote=False, provides=frozenset(), fail_start=False):
        self.log, self.name, self.remote, self.provides, self.fail_start = log, name, remote, provides, fail_start

    def start(self):
        self.log.append((self.name, "start"))
        if self.fail_start:
            raise RuntimeError(f"{self.name} cannot start")

    def stop(self):
        self.log.append((self.name, "stop"))
        return None if self.remote else one_sample(f"local-{self.name}")

    def release(self):
        self.log.append((self.name, "release"))

    def collect(self, profile):
        self.log.append((self.name, "collect"))
        return selection.merge(profile, one_sample(f"remote-{self.name}"))

    def abort(self):
        self.log.append((self.name, "abort"))


@pytest.fixture
def log(monkeypatch):
    log = []
    monkeypatch.setattr(sources, "_factories", dict(sources._factories))
    real_start, real_stop = PythonEngine.start, PythonEngine.stop

    def start(self):
        log.append(("engine", "start"))
        real_start(self)

    def stop(self):
        log.append(("engine", "stop"))
        return real_stop(self)

    monkeypatch.setattr(PythonEngine, "start", start)
    monkeypatch.setattr(PythonEngine, "stop", stop)
    return log


def names(profile):
    return {f.name for s in range(len(profile.stacks)) for f in profile.stack_frames(s)}


def test_the_sampler_drives_sources_in_their_order_and_merges_what_they_give(log):
    sources.register("local", lambda config, _v: Recording(log, "local"))
    sources.register("remote", lambda config, _v: Recording(log, "remote", remote=True))
    s = Sampler(events=("wall",), engine="python", asyncio="off")
    s.start()
    p = s.stop()
    assert log == [("engine", "start"), ("local", "start"), ("remote", "start"),
                   ("local", "stop"), ("remote", "stop"), ("engine", "stop"),
                   ("local", "release"), ("remote", "release"), ("remote", "collect")]
    assert {"local-local", "remote-remote"} <= names(p)
    assert "local-remote" not in names(p) and "remote-local" not in names(p)


def test_a_source_that_fails_to_start_stops_the_others_and_the_engine(log):
    sources.register("first", lambda config, _v: Recording(log, "first"))
    sources.register("broken", lambda config, _v: Recording(log, "broken", fail_start=True))
    s = Sampler(events=("wall",), engine="python", asyncio="off")
    with pytest.raises(RuntimeError, match="broken cannot start"):
        s.start()
    assert ("first", "abort") in log and ("engine", "stop") in log and ("broken", "abort") not in log
    assert active() is None and not s.running


def test_what_a_source_provides_the_engine_need_not_sample(log):
    # the python engine cannot sample park: a source that does lets the session run
    sources.register("parks", lambda config, _v: Recording(log, "parks", provides=frozenset({EventType.PARK})))
    s = Sampler(events=("wall", "park"), engine="python", asyncio="off")
    s.start()
    assert s._engine.config.events == (EventType.WALL,)
    s.stop()
    assert sources.engine_events((EventType.WALL, EventType.PARK), {EventType.PARK}, {EventType.PARK}) == \
        (EventType.WALL, EventType.PARK)


def test_an_option_no_source_handles_is_an_error_naming_it():
    with pytest.raises(ValueError, match="no source handles the option.*gpu"):
        sources.make_sources(SamplerConfig.make(events=("wall",)), {"gpu": True})


def test_a_factory_that_gives_no_source_is_caught(monkeypatch):
    monkeypatch.setattr(sources, "_factories", {"bad": lambda config, _v: object()})
    with pytest.raises(TypeError, match="'bad' factory made a object, not a Source"):
        sources.make_sources(SamplerConfig.make(events=("wall",)), {})


def test_excluding_a_thread_asks_the_engine():
    s = Sampler(events=("wall",), engine="python", asyncio="off")
    assert s.exclude_thread(1) is False  # not running
    s.start()
    try:
        assert s.exclude_thread(1) is False  # the python engine cannot: callers filter instead
    finally:
        s.stop()


def test_the_native_engine_leaves_an_excluded_thread_out():
    import threading
    import time

    from ddprof_nb.engines.native import NativeEngine

    if NativeEngine.unavailable_reason():
        pytest.skip(NativeEngine.unavailable_reason())
    # GIVEN two threads waiting alike, one of them excluded once the session runs
    done = threading.Event()
    waiters = [threading.Thread(target=done.wait, name=n) for n in ("excluded", "kept")]
    for t in waiters:
        t.start()
    s = Sampler(events=("wall",), engine="native", interval="1ms", asyncio="off")
    s.start()
    try:
        assert s.exclude_thread(waiters[0].native_id) is True
        time.sleep(0.3)
    finally:
        p = s.stop()
        done.set()
        for t in waiters:
            t.join()
    # THEN the excluded one has only what was sampled before it was excluded, the other
    # its whole wait (both waited the same time)
    wall = {t.name: int(selection.filter(p, threads=[t.native_id]).values[:, 1].sum()) for t in waiters}
    assert wall["kept"] >= 250_000_000 and wall["excluded"] < wall["kept"] / 2, wall
