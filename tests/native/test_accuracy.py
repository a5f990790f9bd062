"""Accuracy with loose bounds (the strict numbers belong to the benchmark)."""

from __future__ import annotations

import pytest

from nhelpers import run_script

# shares within 6 points of the truth: other processes on the CPUs move them
pytestmark = pytest.mark.alone


def test_cpu_split_between_three_functions_by_caller():
    # GIVEN three functions burning CPU 60/30/10 (burn() inlined so the leaf is the function),
    # in twenty labelled rounds
    r = run_script(
        """
        from ddprof_nb.labeling import labels
        def sixty():
            t = time.thread_time()
            while time.thread_time() - t < 0.090:
                pass
        def thirty():
            t = time.thread_time()
            while time.thread_time() - t < 0.045:
                pass
        def ten():
            t = time.thread_time()
            while time.thread_time() - t < 0.015:
                pass
        e = engine(interval="4ms", events=("cpu",))
        e.start()
        for i in range(20):  # 0.15 s of CPU each
            with labels(round=str(i)):
                sixty(); thirty(); ten()
        p = e.stop()
        rounds = collections.defaultdict(collections.Counter)
        for s in p.samples():
            if s.event is EventType.CPU and s.labels.get("round"):
                rounds[s.labels.get("round")][py_leaf(s)] += s.values[1]
        emit(rounds={k: dict(v) for k, v in rounds.items()})
        """
    )
    # WHEN each round's shares are averaged over the rounds
    rounds = [c for c in r["rounds"].values() if sum(c.values()) > 0]
    assert len(rounds) >= 16, r
    for name, want in (("sixty", 0.6), ("thirty", 0.3), ("ten", 0.1)):
        shares = [c.get(name, 0) / sum(c.values()) for c in rounds]
        mean = sum(shares) / len(shares)
        se = (sum((x - mean) ** 2 for x in shares) / (len(shares) - 1) / len(shares)) ** 0.5
        # THEN the mean is within 6 points of the truth, loaded box or not: a late timer signal
        # (the kernel checks a thread's CPU timer only at ticks it runs for) carries only the
        # CPU since the thread's previous sample, and the sampler thread makes a thread whose
        # timer lags sample itself (beside two CPU burners: se <= 0.008, where weights from the
        # timers' overruns gave se up to 0.45 and a mean off by 40 points)
        assert se <= 0.06, (name, shares)
        assert abs(mean - want) <= 0.06, (name, round(mean, 3), round(se, 3), shares)


def test_cpu_of_gil_releasing_threads_beside_a_sleeper():
    # GIVEN two threads hashing big buffers (GIL released) for 2:1 CPU and a sleeping main thread
    r = run_script(
        """
        import hashlib
        data = b"x" * (4 << 20)
        truth = {}
        def hasher(sec):
            t = time.thread_time()
            while time.thread_time() - t < sec:
                hashlib.sha256(data).digest()
            truth[threading.get_native_id()] = time.thread_time()
        e = engine(interval="4ms", events=("cpu",))
        main0 = time.thread_time()
        e.start()
        a = threading.Thread(target=hasher, args=(0.8,), name="A")
        b = threading.Thread(target=hasher, args=(0.4,), name="B")
        a.start(); b.start()
        while a.is_alive() or b.is_alive():
            time.sleep(0.05)
        p = e.stop()
        main_used = time.thread_time() - main0
        t = totals(p, EventType.CPU, lambda s: s.thread.name)
        emit(t=dict(t), total=p.total("cpu"), main_used=main_used)
        """
    )
    # WHEN the CPU profile is split by thread
    t, total = r["t"], r["total"]
    a, b = t.get("A", 0), t.get("B", 0)
    # THEN A:B is 2:1 within 6 points, and the sleeper has only its own CPU (its start and
    # stop work, a few % of the total on a loaded machine), never the hashers'
    assert abs(a / (a + b) - 2 / 3) <= 0.06, t
    assert t.get("MainThread", 0) <= r["main_used"] * 1e9 + 4e6, (t, r["main_used"])
    assert t.get("MainThread", 0) / total < 0.1, t


def test_wall_shares_of_three_threads_and_states():
    # GIVEN three threads alive for the same second: one spins, one sleeps, one waits on an Event
    r = run_script(
        """
        ev = threading.Event()
        deadline = time.monotonic() + 1.0  # all three live until the same moment
        def burner():
            while time.monotonic() < deadline:
                pass
        def sleeper(): time.sleep(max(0, deadline - time.monotonic()))
        def waiter(): ev.wait(max(0, deadline - time.monotonic()))
        e = engine(interval="10ms", events=("wall",))
        ths = [threading.Thread(target=f, name=f.__name__) for f in (burner, sleeper, waiter)]
        e.start()
        t0 = time.monotonic()
        for th in ths: th.start()
        for th in ths: th.join()
        elapsed = time.monotonic() - t0
        p = e.stop()
        t = totals(p, EventType.WALL, lambda s: s.thread.name)
        st = totals(p, EventType.WALL, lambda s: s.thread.name + ":" + (s.labels.get("state") or "?"))
        emit(t=dict(t), st=dict(st), elapsed=elapsed, duration=p.metadata.duration_ns,
             names=[th.name for th in p.threads])
        """
    )
    t = r["t"]
    three = sum(t.get(n, 0) for n in ("burner", "sleeper", "waiter"))
    # THEN each thread gets a third of the three threads' wall time (+-6 points)
    for n in ("burner", "sleeper", "waiter"):
        assert abs(t.get(n, 0) / three - 1 / 3) <= 0.06, t
    # AND the main thread's wall time covers the profile's duration (weights are time-based)
    assert abs(t["MainThread"] / r["duration"] - 1) < 0.1, (t, r["duration"])
    # AND states: the burner is mostly on CPU, the sleeper and waiter mostly off CPU
    st = r["st"]
    assert st.get("burner:cpu", 0) + st.get("burner:gil", 0) > 0.7 * t["burner"], st
    assert st.get("sleeper:off-cpu", 0) > 0.8 * t["sleeper"], st
    assert st.get("waiter:off-cpu", 0) > 0.8 * t["waiter"], st
    # AND the profiler's own thread never appears
    assert "ddprof_nb-drain" not in r["names"]


def test_label_block_samples_carry_the_label():
    # GIVEN CPU burnt inside and outside a labels block
    r = run_script(
        """
        from ddprof_nb.labeling import labels
        def inside(): burn(0.3)
        def outside(): burn(0.3)
        with labels(req="pre"):
            pass
        e = engine(interval="4ms")
        e.start()
        with labels(req="a"):
            inside()
        outside()
        p = e.stop()
        where = lambda s: "inside" if any(f.name == "inside" for f in s.stack) else ("outside" if any(f.name == "outside" for f in s.stack) else "other")
        t = totals(p, EventType.CPU, lambda s: (where(s), s.labels.get("req")))
        emit(t=[[k[0], k[1], v] for k, v in t.items()])
        """
    )
    rows = r["t"]
    inside = {req: v for name, req, v in rows if name == "inside"}
    outside = {req: v for name, req, v in rows if name == "outside"}
    # THEN every sample of the block carries req=a and none outside does
    assert set(inside) == {"a"} and inside["a"] > 0, rows
    assert "a" not in outside and sum(outside.values()) > 0, rows


def test_merged_wall_records_give_the_same_profile_as_one_record_per_sample():
    # GIVEN idle threads (blocked, or napping now and then) beside a main thread that burns
    # CPU then sleeps, sampled at 2 ms while the profile's tick grows from 1 to 8 ms
    r = run_script(
        """
        import numpy as np
        from ddprof_nb.engines.native import binding as _binding, decode as _decode, session as _session
        from ddprof_nb.model import Metadata, ProfileBuilder
        stop = threading.Event()
        def idle(): stop.wait()
        def napper():
            while not stop.is_set(): time.sleep(0.03)
        ths = [threading.Thread(target=idle, name=f"idle{i}") for i in range(4)]
        ths.append(threading.Thread(target=napper, name="napper"))
        for t in ths: t.start()
        cap = 1 << 15
        s = _session.Session(2_000_000, 16, ("wall",), ring_records=cap, merge_shadow=True)
        s.start()
        burn(0.6); time.sleep(0.6)
        s.stop()
        stop.set()
        buf = _binding.ffi.new("char[]", s.record_size * cap)
        n = _binding.lib.ddp_drain(buf, cap)
        st = s.stats()
        s.release()
        hdr = np.frombuffer(_binding.ffi.buffer(buf, n * s.record_size), dtype=_decode._record_dtype(s.record_size))
        raw = np.frombuffer(_binding.ffi.buffer(buf, n * s.record_size), dtype=np.uint8).reshape(n, s.record_size)
        duration = st["stop_mono_ns"] - st["start_mono_ns"]
        rows, records = {}, {}
        for which, name in ((0, "merged"), (1, "per_sample")):
            sel = np.ascontiguousarray(raw[hdr["aux"] == which])
            records[name] = len(sel)
            conv = _decode.RecordConverter(ProfileBuilder(), st["start_mono_ns"])
            conv.feed(_binding.ffi.from_buffer(sel), len(sel), s.record_size)
            conv.builder.metadata = Metadata(start_ns=0, end_ns=duration, interval_ns=2_000_000)
            p = conv.builder.build(end_ns=duration)
            rows[name] = sorted([s.thread.name, [f.name for f in s.stack], [list(kv) for kv in s.labels.items], s.time_ns,
                                 list(s.values)] for s in p.samples())
            tick = p.time_ns[p.time_ns > 0].min() if len(p) else 0
        emit(rows=rows, records=records, samples=st["samples"][EventType.WALL], tick=int(tick),
             merged_count=int(hdr["count"][hdr["aux"] == 0].sum()), unchanged=st["wall_unchanged"])
        """
    )
    # THEN both ways give exactly the same Profile rows (stack, thread, labels, tick, values)
    assert r["rows"]["merged"] == r["rows"]["per_sample"]
    # AND merging happened (the final tick holds several 2 ms samples) and counts every sample
    assert r["tick"] >= 4_000_000, r["tick"]
    assert r["records"]["merged"] < 0.75 * r["records"]["per_sample"], r["records"]
    assert r["merged_count"] == r["samples"] == r["records"]["per_sample"]
    # AND most samples of the idle threads reused their last stack without a walk
    assert r["unchanged"] > r["samples"] / 2, r
