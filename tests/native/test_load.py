"""Under load: dozens of threads that want the GIL, beside a drain that needs it."""

from __future__ import annotations

from nhelpers import run_script


def test_64_gil_bound_threads_at_100hz_lose_no_sample_and_every_thread_is_there():
    # GIVEN 64 threads running pure-Python loops (each wants the GIL all the time, so the
    # drain, which needs it too, gets it a few times a second at best) sampled at 100 Hz
    r = run_script(
        """
        from ddprof_nb.engines.native import session as _session
        stop, go = threading.Event(), threading.Event()
        def spin():
            go.wait()  # (all started first: each start behind a growing crowd of spinners took 20 s)
            x = 0
            while not stop.is_set():
                x += 1
        ths = [threading.Thread(target=spin, name=f"spin{i}") for i in range(64)]
        e = engine(interval="10ms")
        e.start()
        for t in ths: t.start()
        go.set()
        time.sleep(3)
        stop.set()
        for t in ths: t.join()
        p = e.stop()
        names = {s.thread.name for s in p.samples() if s.event is EventType.WALL}
        cpu_names = {s.thread.name for s in p.samples() if s.event is EventType.CPU}
        st = _session.Session.stats()
        emit(full=sum(st["dropped_full"].values()), names=sorted(names), cpu_names=sorted(cpu_names),
             notes=p.metadata.notes)
        """,
        timeout=120,
    )
    # THEN no sample was lost for want of room (torn reads of running threads, which carry
    # their time to the thread's next sample, are counted apart), and every thread has wall
    # samples (and CPU samples: each got ~3 s / 32 of CPU on 2 cores, ~9 CPU ticks)
    assert r["full"] == 0, r
    assert not any("buffer full" in n or "aggregate full" in n for n in r["notes"]), r["notes"]
    spins = {f"spin{i}" for i in range(64)}
    assert spins <= set(r["names"]), spins - set(r["names"])
    assert len(spins & set(r["cpu_names"])) >= 60, spins - set(r["cpu_names"])
