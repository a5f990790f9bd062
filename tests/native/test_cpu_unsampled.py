"""A thread whose CPU clock says it used CPU in the session but whose CPU timer never
signalled it keeps that CPU in the profile (the CPU total is the threads' clocks').

A loaded kernel can check a thread's CPU timer at no tick the thread runs for (seen: a
0.1 s burst of the thread that started the session, and a spawned child of 0.6 s, with
no CPU sample at load 10-18 on 2 cores).  Here the same outcome is made certain, not
timed: the thread blocks SIGPROF, so its timer's signal stays pending and is discarded at
stop.  Assertions are on presence and on sums against the thread's own clock.
"""

from __future__ import annotations

import textwrap

from nhelpers import run_script

BODY = """
import signal
from ddprof_nb.sampler import Sampler

def unsignalled_burn(sec, box):
    # what a loaded kernel may do: the timer fires, no signal reaches the thread
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPROF})
    box["tid"] = threading.get_native_id()
    burn(sec)
    box["clock"] = time.thread_time_ns()  # its whole CPU so far (it was born in the session)
    box["burnt"].set()
    box["stopped"].wait()  # alive at stop: its clock is read then (an exited thread's, at its last read)

def quiet_worker():
    box = {"burnt": threading.Event(), "stopped": threading.Event()}
    w = threading.Thread(target=unsignalled_burn, args=(0.1, box), name="quiet")
    w.start()
    box["burnt"].wait()
    return w, box

def by_tid(p, tid):
    cpu = sum(s.values[1] for s in p.samples() if s.event is EventType.CPU and s.thread.tid == tid)
    leaves = sorted({py_leaf(s) for s in p.samples() if s.event is EventType.CPU and s.thread.tid == tid})
    names = {s.thread.name for s in p.samples() if s.thread.tid == tid}
    return cpu, leaves, sorted(names)
"""


def run(body: str) -> dict:
    return run_script(BODY + textwrap.dedent(body), timeout=60)


def test_cpu_only_thread_without_signal_is_sampled_by_the_sampler_thread():
    # GIVEN a CPU-only session and a worker whose timer never signals it (before the sampler
    #       thread walked a lagging thread's frames itself, it sent a SIGPROF, blocked here
    #       too, and the CPU went under '[cpu not sampled]')
    r = run(
        """
        s = Sampler(events="cpu", interval="10ms").start()
        w, box = quiet_worker()
        p = s.stop()
        box["stopped"].set(); w.join()
        cpu, leaves, names = by_tid(p, box["tid"])
        emit(cpu=cpu, clock=box["clock"], leaves=leaves, names=names, notes=list(p.metadata.notes))
        """
    )
    # THEN its CPU is in the profile, as much as its clock says (the few microseconds from
    # its clock read to the stop are the only difference), where it burnt it
    assert r["clock"] >= 0.1e9, r
    assert r["clock"] <= r["cpu"] <= r["clock"] + 5_000_000, r
    assert r["leaves"] == ["burn"], r
    assert r["names"] == ["quiet"], r
    assert any("taken by the sampler thread" in n for n in r["notes"]), r["notes"]


def test_thread_without_signal_gets_its_cpu_where_the_wall_sampler_saw_it_run():
    # GIVEN a CPU and wall session and a worker whose timer never signals it
    r = run(
        """
        s = Sampler(events="cpu,wall", interval="10ms").start()
        w, box = quiet_worker()
        p = s.stop()
        box["stopped"].set(); w.join()
        cpu, leaves, names = by_tid(p, box["tid"])
        emit(cpu=cpu, clock=box["clock"], leaves=leaves, notes=list(p.metadata.notes))
        """
    )
    # THEN its clock's CPU is where it burnt it: on the sampler thread's CPU samples of it (it
    # walks a lagging running thread's frames each tick), else split over its on-CPU wall stacks
    assert r["clock"] <= r["cpu"] <= r["clock"] + 5_000_000, r
    assert "burn" in r["leaves"], r
    assert "[cpu not sampled]" not in r["leaves"], r
    assert any("taken by the sampler thread" in n or "split over their wall samples taken while they were on CPU" in n
               for n in r["notes"]), r["notes"]


def test_starting_thread_stopped_from_another_thread_right_after_an_unsignalled_burst():
    # GIVEN the shape that lost a round under load: started here, a short burst, stopped elsewhere
    r = run(
        """
        main = threading.get_native_id()
        out = []
        for events in ("cpu", "cpu,wall"):
            s = Sampler(events=events, interval="10ms").start()
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPROF})
            c0 = time.thread_time_ns()
            burn(0.1)
            used = time.thread_time_ns() - c0
            box = {}
            t = threading.Thread(target=lambda: box.__setitem__("p", s.stop())); t.start(); t.join()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGPROF})
            out.append((used, by_tid(box["p"], main)[0]))
        emit(rounds=out)
        """
    )
    # THEN every round has the main thread's burst in its CPU (at least what the burst used)
    for used, cpu in r["rounds"]:
        assert cpu >= used > 0, r["rounds"]


def test_calibration_counts_each_thread_once_and_leaves_no_clock_cpu_out():
    from ddprof_nb.engines.native.cpu_totals import calibrate_cpu
    from ddprof_nb.events import EventType
    from ddprof_nb.model import Frame, Metadata, ProfileBuilder

    ms = 1_000_000
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=100 * ms, interval_ns=10 * ms))
    work, wait = b.stack_of([Frame("work", "w.py", 1)]), b.stack_of([Frame("wait", "w.py", 9)])
    plain, on_cpu, off_cpu = b.labels_id({"k": "v"}), b.labels_id({"k": "v", "state": "cpu"}), b.labels_id({"state": "off-cpu"})
    # GIVEN tid 7 under two names (renamed mid-session), with CPU samples under both
    for name in ("old", "new"):
        b.add(EventType.CPU, work, b.thread_id(7, name), plain, 0, 1, 10 * ms)
    # AND tid 9 with no CPU sample, on CPU in 3 wall samples of one stack and 1 of another
    t9 = b.thread_id(9, "w9")
    b.add(EventType.WALL, work, t9, on_cpu, 0, 3, 30 * ms)
    b.add(EventType.WALL, wait, t9, on_cpu, 0, 1, 10 * ms)
    b.add(EventType.WALL, wait, t9, off_cpu, 0, 5, 50 * ms)
    profile = b.build()
    # WHEN calibrated against clocks that include tid 11, never seen in any row
    totals = {7: (40 * ms, 20 * ms), 9: (8 * ms, 0), 11: (15 * ms, 0), 12: (1 * ms, 0)}
    out, notes = calibrate_cpu(profile, totals, names={11: "ghost"}, base_labels={"k": "v"})
    by = {}
    for s in out.samples():
        if s.event is EventType.CPU:
            key = (s.thread.tid, s.stack[-1].name, tuple(sorted(s.labels.as_dict().items())))
            by[key] = by.get(key, 0) + s.values[1]
    # THEN every thread's CPU is its clock's: tid 7 once (not once per name), tid 9 split 3:1
    # over its on-CPU wall stacks without the state label, tid 11 under the pseudo-frame
    assert sum(v for (tid, _, _), v in by.items() if tid == 7) == 40 * ms, by
    assert by[(9, "work", (("k", "v"),))] == 6 * ms and by[(9, "wait", (("k", "v"),))] == 2 * ms, by
    assert by[(11, "[cpu not sampled]", (("k", "v"),))] == 15 * ms, by
    assert by[(12, "[cpu not sampled]", (("k", "v"),))] == 1 * ms, by
    assert {t.name for t in out.threads if t.tid == 11} == {"ghost"}
    assert out.total("cpu") == sum(u for u, _ in totals.values())
    assert len(notes) == 3, notes
    assert "1 thread(s) used 15.0 ms of CPU" in notes[2], notes  # (tid 12's 1 ms: under one interval, not noted)
