"""A thread whose CPU timer signals late still gets fine-grained CPU samples, each where it
burnt that CPU: the sampler thread, which reads every thread's CPU clock each tick, samples
a thread that ran two intervals past its last accounted CPU (ten when samples carry native
frames, which its walk from outside cannot see), and each sample weighs the CPU its thread's
clock used since the previous one.

A loaded kernel's lateness is not reproducible, so the test makes it certain: the CPU timers'
period is fifty intervals (a test knob of the session), and the work is two phases of 0.3 s of
CPU each, in f1 then f2.  Timer signals alone would give at most a couple of 0.5 s samples,
landing wherever the thread is when they come; the assertions are on the split between the
phases, the number of samples, and the kick count the stats and notes report.
"""

from __future__ import annotations

import pytest

from nhelpers import run_script


@pytest.mark.parametrize("events,native", [(("cpu",), False), (("cpu", "wall"), False), (("cpu",), True)],
                         ids=["cpu", "cpu+wall", "native-frames"])
def test_late_timer_cpu_goes_where_the_thread_burnt_it(events, native):
    # (with native frames a thread is kicked only 10 intervals late, since a walk from outside
    # sees no native frames: fifty-interval timers still need kicks)
    # GIVEN CPU timers fifty intervals long, and a thread burning 0.3 s in f1 then 0.3 s in f2
    r = run_script(
        f"""
        def f1():
            t = time.thread_time()
            while time.thread_time() - t < 0.3:
                pass
        def f2():
            t = time.thread_time()
            while time.thread_time() - t < 0.3:
                pass
        e = NativeEngine(SamplerConfig.make(events={events!r}, interval="10ms", native={native!r}))
        e._session_knobs["cpu_timer_scale"] = 50
        e.start()
        f1(); f2()
        p = e.stop()
        me = threading.get_native_id()
        mine = [s for s in p.samples() if s.event is EventType.CPU and s.thread.tid == me]
        by_leaf = collections.Counter()
        for s in mine:
            by_leaf[py_leaf(s)] += s.values[1]
        # (a kicked sample's native frames are unknown: with native frames its stack ends in a cut)
        cut = sum(s.values[0] for s in mine if s.stack[-1].name == "[truncated]"
                  and not any(f.kind is FrameKind.NATIVE for f in s.stack))
        emit(by_leaf=dict(by_leaf), n=sum(s.values[0] for s in mine), kicks=int(p.metadata.extra["cpu_kicks"]), cut=cut,
             notes=list(p.metadata.notes))
        """
    )
    total = sum(r["by_leaf"].values())
    # THEN the sampler thread's signals took samples, and the notes say so (0.6 s of CPU: about
    # 30 kicks 2 intervals late, 6 kicks 10 intervals late)
    least = 4 if native else 10
    assert r["kicks"] >= least, r
    assert any("sample(s) taken by the sampler thread" in n for n in r["notes"]), r["notes"]
    # AND the thread's CPU is in many samples (timer signals alone: two at most in 0.6 s)
    assert r["n"] >= least, r
    # AND with native frames, the kicked samples (no native frames seen) say their stack is cut;
    #   without, no sample is
    assert (r["cut"] >= r["kicks"] // 2) if native else r["cut"] == 0, r
    # AND each phase keeps about its half: a late signal's CPU is not put on the function
    # running when it comes (each sample is off by at most the CPU since the previous one)
    for name in ("f1", "f2"):
        assert 0.3 <= r["by_leaf"].get(name, 0) / total <= 0.7, r


def test_a_lagging_thread_sampled_by_the_sampler_never_sees_its_sleeps_cut_short():
    # GIVEN CPU timers 5,000 intervals long (they practically never fire: every sample is the
    #       sampler thread's), and a thread alternating 0.2 ms of CPU with 0.2 ms nanosleeps
    #       called from C (libc, no retry): /proc often says "running" just before it sleeps
    # WHEN it runs for 3 s of wall time in a session (the old kick: 7 EINTR in 1 of 2 runs of 2 s)
    # THEN no nanosleep returned EINTR (a SIGPROF sent after the /proc read cut some short), and
    #      the sampler thread still took samples of it
    r = run_script(
        """
        import ctypes, ctypes.util
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        class timespec(ctypes.Structure):
            _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]
        req = timespec(0, 200_000)
        counts = collections.Counter()
        def worker():
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                burn(0.0002)
                if libc.nanosleep(ctypes.byref(req), None) != 0:
                    counts["eintr" if ctypes.get_errno() == 4 else "other"] += 1
                counts["sleeps"] += 1
        e = engine(interval="1ms", events=("cpu",))
        e._session_knobs["cpu_timer_scale"] = 5000
        e.start()
        t = threading.Thread(target=worker); t.start(); t.join()
        p = e.stop()
        emit(counts=dict(counts), kicks=int(p.metadata.extra["cpu_kicks"]))
        """
    )
    assert r["counts"]["sleeps"] > 500, r
    assert r["counts"].get("eintr", 0) == 0 and r["counts"].get("other", 0) == 0, r
    assert r["kicks"] >= 10, r
