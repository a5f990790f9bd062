"""CPU samples of a thread running an own-GIL subinterpreter (3.12+) hold that interpreter's
frames above the thread's own: the CPU signal's handler walks the thread state the thread
runs in now (the interpreter's thread-local), not only the one it registered with, and
labels the sample ``interp=<id>``."""

from __future__ import annotations

import collections
import sys

import pytest

from nhelpers import run_script

pytestmark = [pytest.mark.skipif(sys.version_info < (3, 12), reason="no own-GIL subinterpreters before 3.12"),
              pytest.mark.alone]  # (a CPU share)

WORK = '''
import time
def burn_inside():
    t = time.thread_time()
    while time.thread_time() - t < 0.6:
        pass
burn_inside()
'''


def test_cpu_inside_a_subinterpreter_is_under_its_own_function():
    # GIVEN a thread running burn_inside (0.6 s of CPU) in an own-GIL subinterpreter, called
    #   from work_in, while the main thread burns 0.3 s in burn_main
    r = run_script(f"""
        try:
            import _interpreters as subs
        except ImportError:
            import _xxsubinterpreters as subs
        def work_in(interp):
            subs.run_string(interp, {WORK!r})
        interp = subs.create()
        e = NativeEngine(SamplerConfig.make(events=("cpu",), interval="10ms"))
        e.start()
        t = threading.Thread(target=work_in, args=(interp,)); t.start(); burn(0.3); t.join()
        p = e.stop()
        subs.destroy(interp)
        in_work = inside = 0
        stacks, interps = collections.Counter(), collections.Counter()
        for s in p.samples():
            if s.event is not EventType.CPU:
                continue
            names = [f.name for f in s.stack]
            if "work_in" in names:
                in_work += s.values[1]
                inside += s.values[1] * (names[-1] == "burn_inside" and names.index("work_in") < names.index("burn_inside"))
            stacks[" ; ".join(names[-4:])] += s.values[1]
            interps[(names[-1], s.labels.get("interp"))] += s.values[1]
        emit(in_work=in_work, inside=inside, main=sum(v for k, v in stacks.items() if k.endswith("burn")),
             stacks=stacks.most_common(6), interp=int(interp),
             interps=[[leaf, label, ns] for (leaf, label), ns in interps.items()])
        """, timeout=120)
    # THEN that thread's CPU is under burn_inside, below the calling work_in; the main thread's
    #   stays its own
    assert r["in_work"] >= 0.5e9, r
    assert r["inside"] >= 0.9 * r["in_work"], r
    assert r["main"] >= 0.25e9, r
    # AND the subinterpreter's samples carry interp=<its id>, the main thread's none
    labelled = {(leaf, label) for leaf, label, _ in r["interps"]}
    assert {label for leaf, label in labelled if leaf == "burn_inside"} == {str(r["interp"])}, r["interps"]
    assert {label for leaf, label in labelled if leaf == "burn"} == {None}, r["interps"]


POOL_WORK = '''
import time

def spin(sec):
    t = time.thread_time()
    while time.thread_time() - t < sec:
        pass
    return sec

def nap(sec):
    time.sleep(sec)
    return sec
'''


def pool_totals(tmp_path, event: str, fn: str, main_spin: float) -> dict:
    """An InterpreterPoolExecutor of 2 running fn(0.4) and fn(0.2) under `event` while the main
    thread spins `main_spin` s: each interpreter's label (or "main") to its time under fn, and
    the event's total."""
    (tmp_path / "pool_work.py").write_text(POOL_WORK)
    return run_script(f"""
        from concurrent.futures import InterpreterPoolExecutor
        from pool_work import {fn}, spin
        with InterpreterPoolExecutor(max_workers=2) as ex:
            list(ex.map({fn}, [0.01, 0.01]))  # (both workers' interpreters made before the session)
            e = NativeEngine(SamplerConfig.make(events=({event!r},), interval="10ms"))
            e.start()
            futures = [ex.submit({fn}, s) for s in (0.4, 0.2)]
            spin({main_spin})
            [f.result() for f in futures]
            p = e.stop()
        by = collections.Counter()
        for s in p.samples():
            if s.event is EventType[{event.upper()!r}] and s.stack[-1].name == {fn!r}:
                by[s.labels.get("interp") or "main"] += s.values[1]
        emit(by=by, total=p.total({event!r}))
        """, timeout=120, env={"PYTHONPATH": str(tmp_path)})


@pytest.mark.skipif(sys.version_info < (3, 14), reason="InterpreterPoolExecutor is new in 3.14")
def test_interpreter_pool_executor_work_is_under_its_function_with_each_interpreters_label(tmp_path):
    # GIVEN an InterpreterPoolExecutor of 2 whose workers spin 0.4 s and 0.2 s of their CPU
    #   clocks while the main thread spins 0.2 s: a truth of 50 / 25 / 25 %
    r = pool_totals(tmp_path, "cpu", "spin", 0.2)
    # THEN each worker's CPU is under spin with its interpreter's label, the main thread's
    #   without one, and the split is the truth's within 5 points
    by, total = r["by"], r["total"]
    assert len(by) == 3 and "main" in by, r
    shares = sorted(100 * v / total for k, v in by.items() if k != "main")
    assert abs(shares[0] - 25) <= 5 and abs(shares[1] - 50) <= 5, (shares, r)
    assert abs(100 * by["main"] / total - 25) <= 5, r


@pytest.mark.skipif(sys.version_info < (3, 14), reason="InterpreterPoolExecutor is new in 3.14")
def test_interpreter_pool_executor_waits_are_under_their_function_in_wall_samples(tmp_path):
    # GIVEN an InterpreterPoolExecutor of 2 whose workers sleep 0.4 s and 0.2 s inside their
    #   interpreters, under the wall event (taken from outside the workers)
    r = pool_totals(tmp_path, "wall", "nap", 0)
    # THEN each worker's sleep is under nap with its own interpreter's label, about as long as it slept
    by = r["by"]
    assert len(by) == 2 and "main" not in by, r
    short, long = sorted(by.values())
    assert 0.15e9 <= short <= 0.3e9 and 0.35e9 <= long <= 0.5e9, r


WAIT = '''
import time
def wait_inside():
    time.sleep(0.5)
def burn_inside():
    t = time.thread_time()
    while time.thread_time() - t < 0.3:
        pass
wait_inside()
burn_inside()
'''


@pytest.mark.skipif(sys.version_info < (3, 13), reason="3.12 runs every entry in the interpreter's first thread "
                                                       "state, bound to its creator: found from outside from 3.13")
def test_wall_samples_inside_a_subinterpreter_are_under_its_own_functions():
    # GIVEN a thread that, in an own-GIL subinterpreter called from work_in, sleeps 0.5 s in
    #   wait_inside then burns 0.3 s in burn_inside, under the wall event (taken from outside the
    #   thread, where its interpreter's thread-local cannot be read)
    r = run_script(f"""
        try:
            import _interpreters as subs
        except ImportError:
            import _xxsubinterpreters as subs
        def work_in(interp):
            subs.run_string(interp, {WAIT!r})
        interp = subs.create()
        e = NativeEngine(SamplerConfig.make(events=("wall",), interval="10ms"))
        e.start()
        t = threading.Thread(target=work_in, args=(interp,)); t.start(); t.join()
        p = e.stop()
        subs.destroy(interp)
        by_leaf = collections.Counter()
        for s in p.samples():
            names = [f.name for f in s.stack]
            if s.event is EventType.WALL and "work_in" in names:
                by_leaf[(names[-1], s.labels.get("interp"), s.labels.get("state"))] += s.values[1]
        emit(interp=int(interp), by_leaf=[[*k, v] for k, v in by_leaf.items()])
        """, timeout=120)
    leaf = collections.Counter()
    for name, label, state, ns in r["by_leaf"]:
        leaf[name] += ns
        # THEN every sample inside carries interp=<its id>, and those outside none
        assert (label == str(r["interp"])) == (name in ("wait_inside", "burn_inside", "<module>")), r
    # AND the thread's wall time is under the subinterpreter's functions, not at the calling line
    total = sum(leaf.values())
    assert total >= 0.75e9, r
    assert leaf["wait_inside"] >= 0.4e9 and leaf["burn_inside"] >= 0.2e9, r
    assert leaf["wait_inside"] + leaf["burn_inside"] >= 0.85 * total, r


THREAD_INSIDE = '''
import threading, time
def burn_in_thread(sec):
    t = time.thread_time()
    while time.thread_time() - t < sec:
        pass
def grow_in_thread(n):
    return [bytearray(65536) for _ in range(n)]
def work():
    grow_in_thread(800)
    burn_in_thread(0.5)
th = threading.Thread(target=work)
th.start(); th.join()
'''


def samples_inside(code: str, events: tuple) -> dict:
    """``code`` run in a fresh own-GIL subinterpreter under a session of ``events``: the
    interpreter's id, and each sample as [event, frame names, interp label, value]."""
    return run_script(f"""
        try:
            import _interpreters as subs
        except ImportError:
            import _xxsubinterpreters as subs
        interp = subs.create()
        e = NativeEngine(SamplerConfig.make(events={events!r}, interval="10ms"))
        e.start()
        subs.run_string(interp, {code!r})
        p = e.stop()
        subs.destroy(interp)
        emit(interp=int(interp), samples=[[s.event.name, [f.name for f in s.stack], s.labels.get("interp"), s.values[1]]
                                          for s in p.samples()])
        """, timeout=120)


def test_a_thread_started_inside_a_subinterpreter_has_its_frames_and_label():
    # GIVEN a thread started by threading inside an own-GIL subinterpreter (listed by that
    #   interpreter only, so sampled as a thread that runs no Python) that allocates 800 blocks of
    #   64 KiB (52 MB) in grow_in_thread, then burns 0.5 s of CPU in burn_in_thread
    r = samples_inside(THREAD_INSIDE, ("cpu", "alloc"))
    by = collections.Counter()
    for event, names, label, value in r["samples"]:
        leaf = next((n for n in reversed(names) if n in ("burn_in_thread", "grow_in_thread")), names[-1] if names else "")
        by[(event, leaf, label, "[native threads]" in names)] += value
    cpu = {(leaf, label, native): v for (ev, leaf, label, native), v in by.items() if ev == "CPU"}
    alloc = {(leaf, label, native): v for (ev, leaf, label, native), v in by.items() if ev == "ALLOC"}
    me = str(r["interp"])
    # THEN its CPU is under burn_in_thread (once: its allocations' samples gave it no second
    #   timer), labelled with its interpreter, not under [native threads]
    assert 0.42e9 <= cpu.get(("burn_in_thread", me, False), 0) <= 0.58e9, cpu
    assert not any(v for (leaf, label, _), v in cpu.items() if leaf == "burn_in_thread" and label != me), cpu
    assert not any(v >= 0.05e9 for (leaf, label, native), v in cpu.items() if native), cpu
    # AND its allocations are under grow_in_thread with the same label (an estimate: 52 MB +-40 %)
    assert 31e6 <= alloc.get(("grow_in_thread", me, False), 0) <= 73e6, alloc


NAP_INSIDE = '''
import threading, time
def nap_in_thread(sec):
    time.sleep(sec)
th = threading.Thread(target=nap_in_thread, args=(0.6,))
th.start(); th.join()
'''


@pytest.mark.skipif(sys.version_info < (3, 13), reason="wall samples find a subinterpreter's thread states from "
                                                       "outside from 3.13")
def test_a_thread_started_inside_a_subinterpreter_has_its_frames_in_wall_samples():
    # GIVEN a thread started by threading inside an own-GIL subinterpreter that sleeps 0.6 s in
    #   nap_in_thread, under cpu and wall (its wall samples taken from outside it)
    r = samples_inside(NAP_INSIDE, ("cpu", "wall"))
    by = collections.Counter()
    for event, names, label, value in r["samples"]:
        if event == "WALL" and "nap_in_thread" in names:
            by[label] += value
    # THEN its wall time is under nap_in_thread, labelled with its interpreter
    assert set(by) == {str(r["interp"])}, by
    assert 0.4e9 <= by[str(r["interp"])] <= 0.75e9, by
