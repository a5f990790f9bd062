"""CPU samples of a thread running an own-GIL subinterpreter (3.12+) hold that interpreter's
frames above the thread's own: the CPU signal's handler walks the thread state the thread
runs in now (the interpreter's thread-local), not only the one it registered with."""

from __future__ import annotations

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
        stacks = collections.Counter()
        for s in p.samples():
            if s.event is not EventType.CPU:
                continue
            names = [f.name for f in s.stack]
            if "work_in" in names:
                in_work += s.values[1]
                inside += s.values[1] * (names[-1] == "burn_inside" and names.index("work_in") < names.index("burn_inside"))
            stacks[" ; ".join(names[-4:])] += s.values[1]
        emit(in_work=in_work, inside=inside, main=sum(v for k, v in stacks.items() if k.endswith("burn")),
             stacks=stacks.most_common(6))
        """, timeout=120)
    # THEN that thread's CPU is under burn_inside, below the calling work_in; the main thread's
    #   stays its own
    assert r["in_work"] >= 0.5e9, r
    assert r["inside"] >= 0.9 * r["in_work"], r
    assert r["main"] >= 0.25e9, r
