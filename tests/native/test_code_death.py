"""Code that dies before the drain resolves it keeps its name (the graveyard).

Samples keep code pointers; the drain names them later.  Code freed in between (exec'd
strings, their lambdas and generators, code dropped right after a session stops) is
resolved just before it is freed: by a code watcher on 3.12+, by a wrapper of
PyCode_Type's tp_dealloc on 3.11.  Each scenario runs in a fresh interpreter.
"""

from __future__ import annotations

import sys

import pytest

from nhelpers import run_script

PY311 = sys.version_info[:2] == (3, 11)

# Runs `make(i)`'s source, exec'd under its own file name, `n` times, in a fresh namespace
# each time and collected at once: every code object it made dies within the session.
EXEC_DYING = """
import gc
from ddprof_nb.events import FrameKind

def run_dying(make, n, interval="1ms"):
    e = engine(interval=interval)
    e.start()
    for i in range(n):
        ns = {"burn": burn}
        exec(compile(make(i), f"<dying-{i}>", "exec"), ns)
        del ns
        gc.collect()  # functions and their globals form a cycle: free them now, not after stop
    p = e.stop()
    samples = unknown = 0
    names = collections.Counter()
    for s in p.samples():
        samples += s.values[0]
        if any(f.kind is FrameKind.UNKNOWN for f in s.stack):
            unknown += s.values[0]
        for f in set(s.stack):
            if f.filename.startswith("<dying-"):
                names[f.name] += s.values[0]
    files = sorted({f.filename for f in p.frames if f.filename.startswith("<dying-")})
    emit(samples=samples, unknown=unknown, names=names, files=len(files), n=n)
"""


def _check_named(r: dict, *names: str) -> None:
    assert r["samples"] >= 100, r
    assert r["unknown"] == 0, r  # none of the dying code's samples lost its name
    assert r["files"] >= r["n"] * 0.8, r  # (a run whose code took no sample may be missing)
    for name in names:  # (qualnames: "<listcomp>.<lambda>" on 3.11, "<lambda>" once inlined)
        assert any(q.split(".")[-1] == name for q in r["names"]), (name, r)


def test_exec_d_strings_are_named_after_they_die():
    # GIVEN 30 exec'd strings whose module code burns CPU, each freed right after it ran
    r = run_script(EXEC_DYING + """
run_dying(lambda i: "burn(0.01)\\ndef f():\\n    burn(0.005)\\nf()\\n", 30)
""")
    # WHEN the drain names their samples after they died / THEN every frame has its name
    _check_named(r, "<module>", "f")


def test_lambdas_in_comprehensions_are_named_after_they_die():
    # GIVEN exec'd comprehensions calling lambdas (3.11: a <listcomp> code object of its own;
    #       3.12+: inlined), freed with their module code
    r = run_script(EXEC_DYING + """
run_dying(lambda i: "r = [(lambda k: burn(0.001))(k) for k in range(12)]\\n"
                    "s = {k: (lambda: burn(0.001))() for k in range(4)}\\n", 25)
""")
    # WHEN resolved after their death / THEN the lambdas keep their names
    _check_named(r, "<lambda>", "<module>")
    if PY311:
        assert r["names"].get("<listcomp>", 0) > 0 and r["names"].get("<dictcomp>", 0) > 0, r


def test_finished_generators_are_named_after_they_die():
    # GIVEN exec'd generator functions and generator expressions that run to their end and
    #       are freed (with their code) long before the drain's next look
    r = run_script(EXEC_DYING + """
run_dying(lambda i: "def gen(n):\\n    for k in range(n):\\n        burn(0.001)\\n        yield k\\n"
                    "total = sum(gen(12))\\n"
                    "total += sum(burn(0.001) or k for k in range(8))\\n", 25)
""")
    # WHEN resolved after their death / THEN the generator frames keep their names
    _check_named(r, "gen", "<genexpr>")


def test_code_freed_after_stop_and_before_the_final_drain_is_named():
    # GIVEN a session with no drain thread whose one function burned CPU, stopped, and the
    #       function freed after the stop, before the final drain: the drain never saw it alive
    r = run_script("""
import gc
from ddprof_nb.engines.native.decode import RecordConverter
from ddprof_nb.engines.native.session import Session
from ddprof_nb.model import ProfileBuilder
s = Session(1_000_000, 64, ("cpu", "wall"))
s.start()
ns = {"burn": burn}
exec(compile("def late_fn():\\n    burn(0.3)\\n", "<late>", "exec"), ns)
ns["late_fn"]()
s.stop()
del ns
gc.collect()
conv = RecordConverter(ProfileBuilder(), 0)
s.drain(conv, final=True)
s.release()
names = sorted({f.name for f in conv.builder.build().frames})
emit(unknown=conv.unknown_frames, names=names)
""")
    # WHEN it drains / THEN the function was recorded as it died and keeps its name
    assert r["unknown"] == 0, r
    assert "late_fn" in r["names"], r


def test_code_never_sampled_leaves_the_graveyard_empty():
    # GIVEN a session during which 20,000 code objects die that no sample names
    r = run_script("""
import gc
from ddprof_nb.engines.native.binding import lib
e = engine(interval="1s", events=("wall",))
e.start()
active = lib.ddp_code_watcher_active()
co = compile("x = 1", "<never>", "exec")
for i in range(20_000):
    co.replace(co_name=f"n{i}")
buried = lib.ddp_graveyard_len
e.stop()
emit(active=active, buried=buried, after=lib.ddp_code_watcher_active())
""")
    # WHEN the graveyard is looked at / THEN none was kept (the bloom filter turned them
    # away), and deaths were watched during the session only
    assert r["active"] == 1 and r["after"] == 0, r
    assert r["buried"] <= 2, r  # (a bloom false positive at most)


# a session running code compiled on the spot, which dies before the final drain: how many
# samples have an [unknown] frame, and how many of its file names the profile kept
NAMES_DYING_CODE = """
import gc
from ddprof_nb.events import FrameKind
def session_names_dying_code(tag):
    e = engine(interval="1ms")
    e.start()
    for i in range(8):
        ns = {"burn": burn}
        exec(compile("burn(0.01)", f"<{tag}-{i}>", "exec"), ns)
        del ns
    gc.collect()
    p = e.stop()
    unknown = sum(s.values[0] for s in p.samples() if any(f.kind is FrameKind.UNKNOWN for f in s.stack))
    named = len({f.filename for f in p.frames if f.filename.startswith(f"<{tag}-")})
    return {"unknown": unknown, "named": named}
"""


def test_a_fork_child_frees_code_unharmed_and_names_dying_code_in_its_own_session():
    # GIVEN a process forked while its session records code deaths
    r = run_script(NAMES_DYING_CODE + """
import gc
from ddprof_nb.engines.native.binding import lib
from ddprof_nb.events import FrameKind
e = engine(interval="1ms")
e.start()
rd, wr = os.pipe()
pid = os.fork()
if pid == 0:
    out = {"watching": lib.ddp_code_watcher_active()}
    co = compile("x = 1", "<child>", "exec")
    for i in range(5000):
        co.replace(co_name=f"c{i}")      # deaths in the child, the parent's hook disarmed
    out["buried"] = lib.ddp_graveyard_len
    out.update(session_names_dying_code("child"))
    os.write(wr, json.dumps(out).encode())
    os._exit(0)
os.close(wr)
_, status = os.waitpid(pid, 0)
child = json.loads(os.read(rd, 4096) or b"{}")
e.stop()
emit(status=status, child=child)
""")
    # WHEN the child frees code and profiles itself / THEN it exits cleanly, recorded no
    # death for the parent's session, and its own session names its dying code
    assert r["status"] == 0, r
    assert r["child"]["watching"] == 0 and r["child"]["buried"] == 0, r
    assert r["child"]["unknown"] == 0 and r["child"]["named"] >= 4, r


# ---- 3.11: PyCode_Type.tp_dealloc, wrapped, beside another tool's wrapper -------------------
SLOT = NAMES_DYING_CODE + """
import ctypes, gc, types
from ddprof_nb.engines.native.binding import lib
from ddprof_nb.events import FrameKind
TP_DEALLOC = 6 * ctypes.sizeof(ctypes.c_void_p)  # refcnt, type, size, tp_name, basicsize, itemsize
def slot():
    return ctypes.c_void_p.from_address(id(types.CodeType) + TP_DEALLOC).value
def holder():
    return {0: "other", 1: "ours", 2: "foreign"}[lib.ddp_test_code_dealloc_foreign(4)]
def churn(n=2000):  # code objects die, through whatever the slot holds
    co = compile("x = 1", "<churn>", "exec")
    for i in range(n):
        co.replace(co_name=f"c{i}")
"""


@pytest.mark.skipif(not PY311, reason="3.12+ use a code watcher, not the dealloc slot")
def test_the_dealloc_slot_is_ours_only_during_a_session_and_restored_exactly():
    # GIVEN the slot's value before any session
    r = run_script(SLOT + """
before, held_before = slot(), holder()
e = engine(); e.start()
held_during = holder()
e.stop()
emit(before=before, after=slot(), held_before=held_before, held_during=held_during, held_after=holder())
""")
    # WHEN a session starts and ends / THEN ours is in the slot during it only, and the
    # original value is back after it, exactly
    assert (r["held_before"], r["held_during"], r["held_after"]) == ("other", "ours", "other"), r
    assert r["after"] == r["before"], r


@pytest.mark.skipif(not PY311, reason="3.12+ use a code watcher, not the dealloc slot")
def test_a_tool_wrapping_the_slot_after_ours_is_chained_and_never_unhooked():
    # GIVEN a tool that wraps the slot during a session (over ours) and unwraps politely later
    r = run_script(SLOT + """
before = slot()
out = {}
e = engine(interval="1ms"); e.start()
lib.ddp_test_code_dealloc_foreign(1)
e.stop()
out["held_after_1"] = holder()            # ours stays in, under the tool's: a pass-through
calls = lib.ddp_test_code_dealloc_foreign(3)
churn()
out["tool_calls"] = lib.ddp_test_code_dealloc_foreign(3) - calls
out["second"] = session_names_dying_code("second")  # ours still in the chain: names kept
lib.ddp_test_code_dealloc_foreign(0)      # the tool leaves: ours is on top again
out["held_after_tool"] = holder()
out["third"] = session_names_dying_code("third")
out["restored"] = slot() == before
emit(**out)
""")
    # WHEN both come and go / THEN every code death went through the tool's wrapper, ours kept
    # naming dying code under it, and the original value is back once both left
    assert r["held_after_1"] == "foreign" and r["tool_calls"] >= 2000, r
    assert r["second"] == {"unknown": 0, "named": r["second"]["named"]} and r["second"]["named"] >= 4, r
    assert r["held_after_tool"] == "ours", r
    assert r["third"]["unknown"] == 0 and r["third"]["named"] >= 4, r
    assert r["restored"], r


@pytest.mark.skipif(not PY311, reason="3.12+ use a code watcher, not the dealloc slot")
def test_a_tool_that_restores_blindly_never_makes_a_loop_and_ours_comes_back():
    # GIVEN a tool that wrapped the slot before our session and, during it, puts back the
    #       value it saved (taking ours out of the chain), then wraps again
    r = run_script(SLOT + """
before = slot()
out = {}
lib.ddp_test_code_dealloc_foreign(1)
e = engine(interval="1ms"); e.start()
lib.ddp_test_code_dealloc_foreign(2)      # blind: ours is out of the chain now
churn()
e.stop()
out["held_unlinked"] = holder()
lib.ddp_test_code_dealloc_foreign(1)      # wraps again: the slot holds what ours calls
out["again"] = session_names_dying_code("again")  # ours goes back on top, over the tool
calls = lib.ddp_test_code_dealloc_foreign(3)
churn()
out["tool_calls"] = lib.ddp_test_code_dealloc_foreign(3) - calls
out["held_end"] = holder()
lib.ddp_test_code_dealloc_foreign(0)
out["restored"] = slot() == before
emit(**out)
""")
    # WHEN sessions and the tool alternate / THEN nothing loops or crashes, ours names dying
    # code again once it could go back safely, and the slot ends as it began
    assert r["held_unlinked"] == "other", r
    assert r["again"]["unknown"] == 0 and r["again"]["named"] >= 4, r
    assert r["tool_calls"] >= 2000 and r["held_end"] == "foreign", r
    assert r["restored"], r
