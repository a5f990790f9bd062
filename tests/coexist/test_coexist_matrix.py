"""ddprof_nb beside other tools: every tool x event set x start order x stop order.

One interpreter per (tool, event set) runs the four order cells (ours/theirs first to start x
ours/theirs first to stop), each followed by nothing else of ours, then a fresh session of
ours alone (coexist_tools.run_matrix).  The cells share the interpreter while they pass (as
tools come and go in one notebook kernel); after a failing cell the remaining ones run again
in a new interpreter, so a crash or hang names its cell and hides none of the others.

A cell passes when the process survives it (every interpreter runs under a timeout), ours
either sampled the workload for every event of the set or was refused with a ProfilerError
naming the other tool or resource (never "busy"), or says in a note that the other tool
degraded that event (CPU samples while another SIGPROF handler is installed; lock/park
unhookable under ASan), the other tool's own results are intact, with native frames on
(the "all" set) every event's samples but WALL carry them, it keeps working after our
stop when it outlives our session, and a fresh session of ours alone samples afterwards.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile

import pytest

from coexist_helpers import SANITIZED, installed, run_snippet

# (lock/park cells accept "no wait function could be hooked" under ASan: coexist_tools.SANITIZED)
EVENT_SETS = ["cpu_wall", "alloc_live", pytest.param("lock_park", marks=pytest.mark.lockpark),
              pytest.param("all", marks=pytest.mark.lockpark)]
CELLS = ["start:ours-first/stop:ours-first", "start:ours-first/stop:theirs-first",
         "start:theirs-first/stop:ours-first", "start:theirs-first/stop:theirs-first"]


def _needs(module=None, min_py=None):
    """The reason a tool cannot run here, or None."""
    if min_py and sys.version_info < min_py:
        return f"needs Python {'.'.join(map(str, min_py))}+"
    if module and not installed(module):
        return f"{module} is not installed (pip install -e .[coexist])"
    return None


# tool name in coexist_tools.TOOLS, extra environment, why it cannot run here (None: it can)
TOOLS = {
    "tracemalloc": ({}, None),
    "cProfile": ({}, None),
    "profile": ({}, None),
    "sys.monitoring": ({}, _needs(min_py=(3, 12))),
    "coverage-ctrace": ({"COVERAGE_CORE": "ctrace"}, _needs("coverage")),
    "coverage-sysmon": ({"COVERAGE_CORE": "sysmon"}, _needs("coverage", (3, 12))),
    "faulthandler": ({}, None),
    "itimer_prof": ({}, None),
    "itimer_real": ({}, None),
    "yappi": ({}, _needs("yappi")),
    "pyinstrument": ({}, _needs("pyinstrument")),
    "memray": ({}, _needs("memray")),
    "loader_storm": ({}, None),
}


def faulthandler_watchdog_crash(run, crash_file) -> bool:
    """The interpreter died of a SIGSEGV (once seen: a SIGBUS) in faulthandler's own watchdog thread.

    CPython's dump_traceback_later thread walks the other threads' frames without the GIL and
    now and then reads a frame being pushed or popped: measured here with faulthandler alone
    (no ddprof_nb), a 20 ms repeat beside this workload crashed 2 of 9 twenty-second runs.
    That thread blocks every signal, so the kernel kills the process without running
    faulthandler's fatal handler: its crash file stays empty.  Every thread that runs code of
    ours leaves SIGSEGV deliverable (the wall thread unblocks it for its guarded reads; the
    signal handlers run on Python threads; the sampler thread leaves SIGBUS deliverable too), so
    a fault of ours always writes a report."""
    if run.rc not in (-signal.SIGSEGV, -signal.SIGBUS):
        return False
    with open(crash_file) as f:
        return f.read() == ""


def run_cells(tool, events, env):
    """Every cell's outcome, {cell: [problems]}, plus the fresh sessions' problems.

    The cells run in one interpreter while they pass; after a failing cell (problems, a crash
    or a hang) the remaining ones run again in a new interpreter, so each cell is judged on
    its own and a crash in one does not hide the others.  A crash of faulthandler's own
    watchdog thread (see faulthandler_watchdog_crash) runs the cells again, at most twice."""
    name = tool.split("-")[0]  # coverage-ctrace / coverage-sysmon: one tool, two cores
    outcome, fresh, pending = {}, [], list(range(len(CELLS)))
    crash_file = tempfile.NamedTemporaryFile(prefix="coexist_crash_", delete=False).name
    env = {**env, "COEXIST_CRASH_FILE": crash_file}
    retries = 2
    while pending:
        open(crash_file, "w").close()
        run = run_snippet(
            f"run_matrix({name!r}, {events!r}, cells={pending!r})",
            # (a hang detector: ASan slows every cell, and faulthandler's cells each wait for a
            # crashing child's sanitizer report)
            timeout=90 if SANITIZED else 45,
            # one dump_traceback_later timer per process: the tool's own would cancel the
            # watchdog (the hard timeout still applies)
            watchdog=name != "faulthandler",
            env=env,
        )
        if name == "faulthandler" and retries and faulthandler_watchdog_crash(run, crash_file):
            retries -= 1
            continue
        r = run.result
        done = [i for i in pending if CELLS[i] in r]
        for i in done:
            outcome[CELLS[i]] = r[CELLS[i]]["problems"]
        if run.rc != 0:
            # the cell it died or hung in: the first one without a result (or the fresh session)
            where = next((i for i in pending if i not in done), None)
            why = [f"{run.how} (stderr tail: {run.stderr[-1500:]!r})"]
            if where is None:
                fresh.append(f"after {CELLS[done[-1]]}: {why[0]}")
            else:
                outcome[CELLS[where]] = why
                done.append(where)
        elif "fresh" in r and r["fresh"]["problems"]:
            fresh.append(f"after {CELLS[done[-1]] if done else '-'}: {r['fresh']['problems']}")
        pending = [i for i in pending if i > max(done)] if done else []
    os.unlink(crash_file)
    return outcome, fresh


@pytest.mark.parametrize("events", EVENT_SETS)
@pytest.mark.parametrize("tool", list(TOOLS))
def test_beside(tool, events):
    env, why_not = TOOLS[tool]
    if why_not:
        pytest.skip(why_not)
    outcome, fresh = run_cells(tool, events, env)
    # THEN every cell ran to its end: the process survived it, with no hang (a crash or a hang
    # is that cell's failure), ours sampled the workload for every event of the set or was
    # refused naming the other tool, and the other tool's results are intact (and it kept
    # working after our stop)
    assert set(outcome) == set(CELLS), outcome
    failed = {c: p for c, p in outcome.items() if p}
    assert not failed, "\n".join(f"{c}: {p}" for c, p in failed.items())
    # AND a fresh session of ours alone started and sampled every event afterwards
    assert not fresh, fresh


def test_cpu_workload_spans_wall_ticks_however_sparse():
    # GIVEN a WALL session whose wall thread ticks once a second: as sparse, against the 0.15 s
    # cpu_workload, as a loaded machine's wall ticks can be (its first tick comes a second
    # after the start: on a quiet machine the workload's CPU alone is burnt before it, and
    # WALL would not name the workload).  WALL only: a 1 s CPU period need not expire in the
    # CPU a loaded machine gives the workload.
    run = run_snippet(
        """
        import coexist_tools
        with ddprof_nb.profile(events=("wall",), interval="1s") as h:
            cpu_workload()
        sparse = dict(coexist_tools.MEASURED)
        emit(sparse=sparse, problems=profile_problems(h.profile, ("wall",)),
             wall_count=sum(s.values[0] for s in h.profile.samples()
                            if s.event is EventType.WALL and any(f.name == "cpu_workload" for f in s.stack)))
        # and a wall thread that finishes fewer ticks than asked within the wait is reported
        coexist_tools.WALL_WAIT_S = 0.3
        with ddprof_nb.profile(events=("wall",), interval="1s") as h:
            cpu_workload()
        emit(stalled=profile_problems(h.profile, ("wall",)))
        # and outside a session the workload is its CPU only
        cpu_workload(0.01)
        emit(outside=dict(coexist_tools.MEASURED))
        """,
        timeout=40,
    )
    r = run.ok()
    # THEN the workload went on until the wall thread had finished its ticks inside it, and
    # WALL names it in as many samples as complete ticks fell inside (the first may not)
    assert r["sparse"]["wall_ticks_inside"] >= 3, r
    assert not r["problems"], r
    assert r["wall_count"] >= r["sparse"]["wall_ticks_inside"] - 1, r
    # AND the stalled case fails with the count it measured
    assert any("wall thread finished" in p and "stalled" in p for p in r["stalled"]), r
    # AND outside a session nothing is waited for
    assert r["outside"] == {}, r
