"""The public Python API end to end on the portable engine (no native code involved)."""

import threading
import time

import pytest

import ddprof_nb
from ddprof_nb import EventType


def burn(seconds):
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        x += 1
    return x


def hot():
    return burn(0.45)


def cold():
    return burn(0.15)


@pytest.mark.quick
def test_profile_context_manager_finds_the_hot_function():
    # GIVEN a block that burns 3x more CPU in hot() than in cold()
    with ddprof_nb.profile(engine="python", interval="5ms") as p:
        hot()
        cold()
    prof = p.profile
    # THEN the profile says which engine took it, and hot() leads the CPU top table
    assert prof.metadata.engine == "python"
    top = [r for r in prof.top("cpu", n=None) if r.name in ("hot", "cold")]
    # (the python engine charges a thread's CPU since its previous sample to the stack it
    # reads now: the heaviest sample says how late the sampler thread ran)
    heaviest = max((s.values[1] for s in prof.samples() if s.event is EventType.CPU), default=0)
    assert top[0].name == "hot", ({r.name: r.total for r in top}, f"heaviest CPU sample {heaviest} ns",
                                  prof.metadata.notes)
    share = top[0].total / (top[0].total + top[1].total)
    assert 0.6 < share < 0.9, share
    # the caller (this test function) is the root of the starting thread's stacks
    roots = {s.stack[0].name for s in prof.samples() if s.event is EventType.CPU}
    assert roots == {"test_profile_context_manager_finds_the_hot_function"}


def test_labels_tag_samples_inside_the_block():
    with ddprof_nb.profile(engine="python", interval="5ms") as p:
        with ddprof_nb.labels(request="a"):
            burn(0.2)
        burn(0.2)
    labelled = p.profile.filter(labels={"request": "a"}).total("cpu")
    assert 0.25 < labelled / p.profile.total("cpu") < 0.75


def test_profile_survives_an_exception_and_second_start_is_refused():
    holder = {}
    with pytest.raises(ZeroDivisionError):
        with ddprof_nb.profile(engine="python") as p:
            holder["p"] = p
            with pytest.raises(ddprof_nb.ProfilerBusyError, match="already running"):
                ddprof_nb.Sampler(engine="python").start()
            burn(0.05)
            1 / 0
    assert holder["p"].profile is not None and len(holder["p"].profile) > 0
    with pytest.raises(ddprof_nb.NotRunningError):
        ddprof_nb.Sampler(engine="python").stop()


def test_profiled_decorator_keeps_the_last_profile():
    @ddprof_nb.profiled(engine="python", interval="5ms")
    def job():
        return hot()

    job()
    prof = job.last_profile
    assert prof is not None
    roots = {s.stack[0].name for s in prof.samples() if s.event is EventType.CPU and s.thread.name == threading.current_thread().name}
    assert len(roots) == 1 and roots.pop().endswith(".job")


def test_threads_are_sampled_with_their_names():
    def worker():
        burn(0.3)

    with ddprof_nb.profile(engine="python", interval="5ms") as p:
        t = threading.Thread(target=worker, name="crunch")
        t.start()
        t.join()
    names = {th.name for th in p.profile.threads}
    assert "crunch" in names
    assert p.profile.filter(threads=["crunch"]).total("cpu") > 0.15e9
