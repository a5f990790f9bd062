"""The C task stepper (native/aiostep.c): built and used wherever the native module loads,
equal to the Python stepper on every outcome of a step, and never a crash on hostile
state (each risk runs in a fresh interpreter, so a crash fails the test, not the run)."""

import textwrap

import pytest

from nhelpers import run_script

from ddprof_nb import _native, labeling
from ddprof_nb import asyncio_support as A
from ddprof_nb.aio import stepper as S

STEPPERS = """
import asyncio, gc, weakref
from ddprof_nb import asyncio_support as A, labeling as L
from ddprof_nb.aio import stepper as S
from ddprof_nb.config import SamplerConfig
def session(events=()):
    ts = A.TaskSampler(SamplerConfig.make(events=events or ("wall",)) if events else
                       __import__("dataclasses").replace(SamplerConfig.make(), events=()))
    ts.start()
    return ts
class FakeTask:  # what a first step asks its name of (no running loop here)
    def get_name(self):
        return "t"
def proxy(cls, coro):
    p = cls(coro, 0)
    p._task = FakeTask()
    return p
def outcome(fn):
    try:
        return ["ok", repr(fn())]
    except StopIteration as e:
        return ["stop", repr(e.value), repr(e.args)]
    except BaseException as e:
        return ["raise", type(e).__name__, str(e)[:80]]
"""


def test_the_c_stepper_is_built_and_used():
    # The native tests run where the native module must load: the C stepper must too
    assert S._STEP_BASE is not None
    assert S._TaskCoro is S._CTaskCoro
    assert isinstance(labeling._slot_here(), _native.SlotBase)


def test_every_outcome_of_a_step_is_the_python_steppers():
    # GIVEN coroutines that yield, return (None, a value, a tuple), raise, and are sent to
    # after they finished, each driven by hand through both steppers while a session runs,
    # under a published label id
    r = run_script(
        STEPPERS
        + textwrap.dedent("""
        class Y:
            def __await__(self):
                return (yield "y")
        async def returns(v):
            await Y()
            return v
        async def raises():
            await Y()
            raise KeyError("k")
        def drive(cls, coro, sends):
            p = proxy(cls, coro)
            slot = L._slot_here()
            out = []
            for v in sends:
                L._set(slot, 77)
                out.append(outcome(lambda: p.send(v)) + [slot.id])
            return out
        res = {}
        for name, cls in (("c", S._CTaskCoro), ("py", S._PyTaskCoro)):
            ts = session()
            res[name] = [drive(cls, returns(None), [None, None, None]),
                         drive(cls, returns(5), [None, 1]),
                         drive(cls, returns((1, 2)), [None, 1]),
                         drive(cls, raises(), [None, None]),
                         ]
            ts.stop()
            # after the session: only forwards, labels untouched
            L._set(L._slot_here(), 5)
            res[name].append(drive(cls, returns(3), [None, None]))
        emit(**res)
        """)
    )
    # THEN both steppers give the same values, exceptions and restored slot ids
    assert r["c"] == r["py"], r
    assert r["c"][0][-1][0] == "raise" and r["c"][0][-1][1] == "RuntimeError"  # a finished coroutine
    assert r["c"][2][-1][:2] == ["stop", "(1, 2)"]  # a tuple returned stays one value
    assert r["c"][3][-1][:2] == ["raise", "KeyError"]
    assert all(step[-1] == 77 for run in r["c"][:4] for step in run)  # the id is restored each time


def test_hostile_state_raises_instead_of_crashing():
    # GIVEN each way the state a step reads could be wrong: a slot of the wrong type, a
    # first step that raises, a mirror that raises, a deleted or foreign view, bad
    # constructor and _bind arguments
    r = run_script(
        STEPPERS
        + textwrap.dedent("""
        from ddprof_nb import _native
        async def one():
            return 1
        here = L._slot_here()
        def step(cls=S._CTaskCoro):
            here.id = 99  # (no mirror written) so that the step publishes its own id
            return outcome(lambda: proxy(cls, one()).send(None))
        def state_with(**changed):
            fields = dict(slots=L._slots, new_slot=L._new_slot, push=L._push,
                          short_suspension=S._short_suspension, first_step=S._TaskCoroMethods._first_step)
            fields.update(changed)
            st = _native.StepState(**fields)
            st.tracker, st.timing = S._state.tracker, S._state.timing
            return st
        out = {}
        ts = session()
        ident = __import__("threading").get_ident()
        L._slots[ident] = object()
        out["slot_wrong_type"] = step()
        L._slots[ident] = here
        def bad_first(self):
            raise ValueError("first")
        S._STEP_BASE._bind(state_with(first_step=bad_first))
        out["first_step_raises"] = step()
        def bad_push(slot, ident):
            raise OSError("push")
        bad = state_with(push=bad_push)
        bad.mirrored = True
        S._STEP_BASE._bind(bad)
        slot = L._slot_here()
        slot.view = None
        out["push_raises"] = step()
        S._STEP_BASE._bind(S._state)
        del slot.view
        out["view_deleted"] = step()
        for name, make in (("view_bytes", lambda: memoryview(bytearray(1))),
                           ("view_readonly", lambda: memoryview(bytes(8)).cast("Q")),
                           ("view_str", lambda: "not a view")):
            slot.view = make()
            out[name] = step()
            slot.view = make()
            out[name + "_py"] = step(S._PyTaskCoro)
        slot.view = None
        out["fine_after"] = step()
        ts.stop()
        out["no_args"] = outcome(lambda: S._CTaskCoro())
        out["bad_bind"] = outcome(lambda: S._STEP_BASE._bind(1, 2))
        out["bind_not_state"] = outcome(lambda: S._STEP_BASE._bind({"_tracker": None}))
        out["gc"] = gc.collect() >= 0
        emit(**out)
        """)
    )
    # THEN each raises a clear error (the interpreter lives on), and a good state works again
    assert r["slot_wrong_type"][:2] == ["raise", "TypeError"], r
    assert r["first_step_raises"][:3] == ["raise", "ValueError", "first"], r
    assert r["push_raises"][:3] == ["raise", "OSError", "push"], r
    assert r["view_deleted"][:2] == ["stop", "1"], r  # no view: nothing to mirror into
    # foreign views: the generic store, `view[0] = id`, raising what it raises in Python
    assert r["view_bytes"][:2] == ["raise", "ValueError"], r  # a task's id does not fit a byte
    assert r["view_readonly"][:2] == ["raise", "TypeError"], r
    assert r["view_str"][:2] == ["raise", "TypeError"], r
    for name in ("view_bytes", "view_readonly", "view_str"):
        assert r[name] == r[name + "_py"], r
    assert r["fine_after"][:2] == ["stop", "1"], r
    assert r["no_args"][:2] == ["raise", "TypeError"], r
    assert r["bad_bind"][:2] == ["raise", "TypeError"], r
    assert r["bind_not_state"][:3] == ["raise", "TypeError", "StepBase._bind expects a StepState, not dict"], r


def test_a_wrong_state_fails_when_it_is_built_not_at_a_step():
    # GIVEN the helpers and tables the C stepper calls back, each missing or of the wrong kind
    good = dict(slots={}, new_slot=labeling._new_slot, push=labeling._push,
                short_suspension=S._short_suspension, first_step=S._TaskCoroMethods._first_step)
    for name in good:
        fields = {k: v for k, v in good.items() if k != name}
        # THEN building the state says which one is missing
        with pytest.raises(TypeError, match=f"missing required keyword '{name}'"):
            _native.StepState(**fields)
        with pytest.raises(TypeError, match=f"'{name}' must be (a dict|callable), not NoneType"):
            _native.StepState(**{**fields, name: None})
    with pytest.raises(TypeError, match="positional"):
        _native.StepState(*good.values())
    # AND its helpers are fixed once built (only the flags Python writes can change)
    st = _native.StepState(**good)
    with pytest.raises(AttributeError):
        st.push = print
    st.tracker, st.timing, st.mirrored = object(), True, True
    assert st.timing is True and st.mirrored is True


@pytest.mark.parametrize("module,name", [("labeling", "_push"), ("labeling", "_new_slot"), ("labeling", "_slots"),
                                         ("aio.stepper", "_short_suspension")])
def test_renaming_a_private_the_stepper_calls_fails_at_import(module, name):
    # GIVEN a private the stepper's state names, gone (as after a rename that missed it)
    target = "S" if module == "aio.stepper" else "L"
    r = run_script(f"""
        import ddprof_nb.labeling as L
        import ddprof_nb.aio.stepper as S
        del {target}.{name}
        try:
            S._make_step_state()
        except (AttributeError, NameError) as e:  # (NameError: a module global of its own)
            emit(error=str(e))
        else:
            emit(error=None)
        """)
    # THEN building the state (at import) fails, naming it
    assert r["error"] and name in r["error"], r


def test_many_tasks_through_the_c_stepper_leak_nothing():
    # GIVEN 35,000 tasks of a few steps each (timed: a session with wall and park, the
    # task sampler ticking), run in rounds on one loop, each returning a shared sentinel
    r = run_script(
        STEPPERS
        + textwrap.dedent("""
        import tracemalloc, sys
        SENT = object()
        async def task(i):
            await asyncio.sleep(0)
            if i % 7 == 0:
                try:
                    raise KeyError(i)
                except KeyError:
                    pass
            await asyncio.sleep(0)
            return SENT
        refs = []
        tasks_seen = []  # the first task, kept: which stepper ran it
        async def rounds(n):
            for _ in range(n):
                tasks = [asyncio.ensure_future(task(i)) for i in range(1000)]
                if not tasks_seen:
                    tasks_seen.append(tasks[0])
                refs.append(weakref.ref(tasks[0]))
                refs.append(weakref.ref(tasks[0].get_coro()._coro))  # the coroutine inside the proxy
                await asyncio.gather(*tasks)
        ts = session(events=("wall", "park"))
        asyncio.run(rounds(10))  # warm-up
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        rc0 = sys.getrefcount(SENT)
        asyncio.run(rounds(25))
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        ts.stop()
        kind = type(tasks_seen[0].get_coro()).__name__
        tasks_seen.clear()
        gc.collect()
        emit(grown=grown, rc=sys.getrefcount(SENT) - rc0, alive=sum(r() is not None for r in refs), proxy=kind)
        """),
        timeout=120,
    )
    # THEN no proxy, coroutine or sentinel reference is kept, and memory stays flat
    assert r["proxy"] == "_CTaskCoro", r
    assert r["alive"] == 0, r
    assert r["rc"] <= 0, r
    print("grown", r["grown"], "bytes over 25,000 tasks")
    assert r["grown"] < 1_000_000, r  # 25,000 tasks: under 40 bytes each
