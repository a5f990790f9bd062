"""Faults: CPU timers refused by the kernel, start and stop on different threads,
threads ending while being sampled.  Each scenario runs in its own interpreter.

Timer refusal is real, not simulated: every POSIX timer reserves a queued-signal entry
charged to RLIMIT_SIGPENDING, so with that limit at 0 timer_create fails with EAGAIN
(also for root).
"""

from __future__ import annotations

import textwrap

from nhelpers import run_script

# Leak probes shared by the scripts: our SIGPROF timers, kernel tasks, Python threads.
PROBES = """
import resource
from ddprof_nb.sampler import Sampler

def tasks():
    return len(os.listdir("/proc/self/task"))

def snapshot(like=None):
    # like: a snapshot to wait for (<= 2 s): a joined thread's task can outlive join() a moment
    deadline = time.monotonic() + 2
    while True:
        snap = {"timers": timers_of_ours(), "tasks": tasks(),
                "threads": sorted(t.name for t in threading.enumerate())}
        if like is None or snap == like or time.monotonic() > deadline:
            return snap
        time.sleep(0.01)

NAMES = {}  # native id -> name, of the threads the script starts (by tid: the engine
            # names threads it saw alive at a drain, and a slow build may miss one)

def named(t):
    NAMES[t.native_id] = t.name
    return t

def by_thread(p, event):
    return dict(totals(p, event, lambda s: NAMES.get(s.thread.tid, s.thread.name)))

def cpu_by_thread(p):
    return by_thread(p, EventType.CPU)

def wall_by_thread(p):
    return by_thread(p, EventType.WALL)
"""


def run(body: str, timeout: float = 60) -> dict:
    return run_script(PROBES + textwrap.dedent(body), timeout=timeout)


def test_timer_create_eagain_degrades_cpu_only_and_says_why():
    r = run(
        """
        before = snapshot()
        # (Python threads' timers are counted here: a pool thread's, armed at a tick, are left out)
        s = Sampler(events="cpu,wall,alloc", interval="10ms", native_threads="off")
        s.start()
        timers_running = timers_of_ours()
        # the kernel now refuses every new POSIX timer (EAGAIN)
        soft, hard = resource.getrlimit(resource.RLIMIT_SIGPENDING)
        resource.setrlimit(resource.RLIMIT_SIGPENDING, (0, hard))
        def work():
            junk = [bytes(1000) for _ in range(3000)]
            burn(0.2)
            time.sleep(0.1)
        ts = [threading.Thread(target=work, name=f"late{i}") for i in range(3)]
        for t in ts:
            t.start(); named(t)
        burn(0.3)
        for t in ts: t.join()
        timers_late = timers_of_ours()
        p = s.stop()
        after = snapshot(before)
        # a second session, limit still 0: starts, samples wall, no timer at all
        s2 = Sampler(events="cpu,wall", interval="10ms", native_threads="off")
        s2.start()
        burn(0.1)
        p2 = s2.stop()
        # limit restored: everything is back to normal
        resource.setrlimit(resource.RLIMIT_SIGPENDING, (soft, hard))
        s3 = Sampler(events="cpu,wall", interval="10ms")
        s3.start()
        t = threading.Thread(target=burn, args=(0.2,), name="restored"); t.start(); named(t); t.join()
        p3 = s3.stop()
        emit(before=before, after=after, timers_running=timers_running, timers_late=timers_late,
             cpu=cpu_by_thread(p), wall=wall_by_thread(p),
             alloc=by_thread(p, EventType.ALLOC),
             notes=p.metadata.notes, notes2=p2.metadata.notes, wall2=p2.total("wall"), cpu2=p2.total("cpu"),
             cpu3=cpu_by_thread(p3), notes3=p3.metadata.notes, final=snapshot(before))
        """
    )
    # THEN the thread running at start kept its timer and its CPU samples
    assert r["timers_running"] == 1, r
    assert r["timers_late"] == 1, r
    assert r["cpu"].get("MainThread", 0) > 0, r
    # AND the threads started afterwards have no CPU samples but full wall and alloc data
    late = [f"late{i}" for i in range(3)]
    assert not any(r["cpu"].get(n) for n in late), r["cpu"]
    for n in late:
        assert r["wall"].get(n, 0) > 0.1e9, r["wall"]
        assert r["alloc"].get(n, 0) > 0, (r["alloc"], r["notes"])  # (a miss once in CI on 3.12; notes for its cause)
    # AND the profile says how many threads lost their timer, and why
    note = [n for n in r["notes"] if "no CPU timer" in n]
    assert len(note) == 1, r["notes"]
    assert note[0].startswith("degraded: 3 thread(s) got no CPU timer"), note
    assert "EAGAIN" in note[0] and "RLIMIT_SIGPENDING = 0" in note[0], note
    # AND stop released everything
    assert r["after"] == r["before"], r
    # AND with no timer at all the session still runs and samples wall time
    assert r["cpu2"] == 0 and r["wall2"] > 0, r
    assert any(n.startswith("degraded: 1 thread(s) got no CPU timer") for n in r["notes2"]), r["notes2"]
    # AND once the limit is back, new threads get timers again and no note remains
    assert r["cpu3"].get("restored", 0) > 0, r["cpu3"]
    assert not any("no CPU timer" in n for n in r["notes3"]), r["notes3"]
    assert r["final"] == r["before"], r


def test_start_and_stop_on_different_threads():
    r = run(
        """
        before = snapshot()
        box = {}
        def starter():
            box["s"] = Sampler(events="cpu,wall", interval="10ms").start(trim="none")
            burn(0.2)  # the starting thread works on, then ends while still profiled
        def worker():
            burn(0.2)
        a = threading.Thread(target=starter, name="starter"); a.start(); named(a); a.join()
        w = threading.Thread(target=worker, name="worker"); w.start(); named(w)
        burn(0.2)
        w.join()
        time.sleep(0.1)  # a few sampler ticks: exited threads' timers are deleted
        timers_mid = timers_of_ours()
        # stopped by a third thread
        b = threading.Thread(target=lambda: box.__setitem__("p", box["s"].stop()), name="stopper")
        b.start(); b.join()
        p = box["p"]
        after = snapshot(before)
        # and the reverse: started here, stopped by another thread, twice in a row
        rounds = []
        for _ in range(2):
            s = Sampler(events="cpu,wall", interval="10ms").start()
            burn(0.1)
            out = {}
            t = threading.Thread(target=lambda: out.__setitem__("p", s.stop())); t.start(); t.join()
            rounds.append(cpu_by_thread(out["p"]).get("MainThread", 0))
        emit(before=before, after=after, final=snapshot(before), timers_mid=timers_mid,
             cpu=cpu_by_thread(p), wall=wall_by_thread(p), rounds=rounds,
             leaves=sorted({py_leaf(s) for s in p.samples() if s.event is EventType.CPU}),
             running=Sampler(events="cpu").start().stop().metadata.engine)
        """
    )
    # THEN every thread's work is in the profile: the starter's, a worker's, the main thread's
    for name in ("starter", "worker", "MainThread"):
        assert r["cpu"].get(name, 0) > 0.05e9, r["cpu"]
    assert "burn" in r["leaves"], r["leaves"]
    # AND while running, only live threads held timers (the starter's went with it): the main
    # thread's and those of the threads that run no Python, there before (a BLAS pool)
    assert r["timers_mid"] == r["before"]["tasks"], r
    # AND stop on another thread released every timer and thread
    assert r["after"] == r["before"], r
    assert all(c > 0 for c in r["rounds"]), r["rounds"]
    assert r["final"] == r["before"], r
    assert r["running"] == "native"


def test_magic_start_and_stop_run_on_different_threads(tmp_path):
    # GIVEN an IPython shell whose cells run on whatever thread calls run_cell
    r = run(
        f"""
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config
        import ddprof_nb
        cfg = Config(); cfg.HistoryManager.enabled = False
        shell = InteractiveShell.instance(config=cfg, ipython_dir={str(tmp_path)!r})
        shell.run_cell("%load_ext ddprof_nb")
        shell.user_ns["burn"] = burn
        before = snapshot()
        def cell(code, name):
            out = {{}}
            t = threading.Thread(target=lambda: out.__setitem__("r", shell.run_cell(code, store_history=True)),
                                 name=name)
            t.start(); t.join()
            return out["r"].success
        ok = [cell("%ddprof start -e cpu,wall --no-show -o span", "kernel-a")]
        ok.append(shell.run_cell("burn(0.3)", store_history=True).success)
        ok.append(cell("%ddprof stop", "kernel-b"))
        p = ddprof_nb.history["span"]
        emit(ok=ok, before=before, after=snapshot(before), cpu=p.total("cpu"),
             leaves=sorted({{py_leaf(s) for s in p.samples() if s.event is EventType.CPU}}))
        """
    )
    # THEN the span profile holds the cell's work and nothing is left running
    assert r["ok"] == [True, True, True], r
    assert r["cpu"] > 0.15e9, r
    assert "burn" in r["leaves"], r
    assert r["after"] == r["before"], r


def test_threads_ending_mid_sample_leave_an_intact_profile():
    # GIVEN threads that die all the time, some unwinding deep stacks by an exception,
    # sampled at 1 kHz (CPU) with every thread walked on each wall tick
    r = run(
        """
        from ddprof_nb.engines.native import NativeEngine
        before = snapshot()
        def deep(n):
            if n == 0:
                burn(0.002)
                raise ValueError("unwind")
            return deep(n - 1)
        def short(i):
            try:
                deep(50 + i % 50)
            except ValueError:
                pass
        e = engine(interval="1ms", wall_threads_per_tick=4096)
        e.start()
        # 1 s, and at least 200 threads however slowly a loaded machine starts them
        t_end = time.monotonic() + 1.0
        n = 0
        while time.monotonic() < t_end or (n < 200 and time.monotonic() < t_end + 20):
            batch = [threading.Thread(target=short, args=(n + k,)) for k in range(20)]
            for t in batch: t.start()
            for t in batch: t.join()
            n += len(batch)
        p = e.stop()
        bad = []
        for s in p.samples():
            names = [f.name for f in s.stack if f.kind is FrameKind.PYTHON]
            # a stack of these threads is threading's bootstrap, then short/deep*, maybe burn
            if "short" in names:
                tail = names[names.index("short") + 1:]
                if any(x not in ("deep", "burn") for x in tail):
                    bad.append(names[-6:])
        emit(before=before, after=snapshot(before), n=n, threads=len(p.threads), bad=bad[:5],
             cpu=p.total("cpu"), wall=p.total("wall"), notes=p.metadata.notes,
             dropped={k.label: v for k, v in p.metadata.dropped.items()})
        """,
        timeout=90,
    )
    assert r["n"] >= 100, r
    # THEN every sample's stack is a real one (no frame read from a freed thread state)
    assert r["bad"] == [], r
    assert r["threads"] > 20 and r["cpu"] > 0 and r["wall"] > 0, r
    # AND nothing outlives stop()
    assert r["after"] == r["before"], r


def test_the_wall_threads_proc_files_are_few_closed_at_stop_and_not_kept_by_a_fork_child():
    r = run(
        """
        import re
        def syscall_files():
            n = 0
            for fd in os.listdir("/proc/self/fd"):
                try:
                    n += bool(re.fullmatch(r"/proc/\\d+/task/\\d+/syscall", os.readlink(f"/proc/self/fd/{fd}")))
                except OSError:
                    pass
            return n
        before = syscall_files()
        stop = threading.Event()
        # 40 blocked threads: each one's first wall sample reads its state from /proc
        ts = [threading.Thread(target=stop.wait, name=f"blocked{i}") for i in range(40)]
        for t in ts:
            t.start(); named(t)
        s = Sampler(events="cpu,wall", interval="10ms")
        s.start()
        burn(0.3)
        during = syscall_files()
        rd, wr = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.write(wr, str(syscall_files()).encode())
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        in_child = int(os.read(rd, 64))
        p = s.stop()
        stop.set()
        for t in ts: t.join()
        wall = totals(p, EventType.WALL, lambda s: NAMES.get(s.thread.tid, "other") + ":" + (s.labels.get("state") or "?"))
        blocked = sum(v for k, v in wall.items() if k.startswith("blocked"))
        off = sum(v for k, v in wall.items() if k.startswith("blocked") and k.endswith(":off-cpu"))
        emit(before=before, during=during, in_child=in_child, after=syscall_files(), blocked=blocked, off=off)
        """
    )
    # THEN the wall thread keeps some threads' files open while it samples, never more than 32,
    # plus the one it may have open for a moment for a thread beyond them (41 threads here)
    assert r["before"] == 0 and 0 < r["during"] <= 32 + 1, r
    # AND a fork child does not hold the parent's, and stop closes them all
    assert r["in_child"] == 0 and r["after"] == 0, r
    # AND the blocked threads' wall time is off-CPU (their states were read through those files)
    assert r["blocked"] > 0 and r["off"] > 0.95 * r["blocked"], r
