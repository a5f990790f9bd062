"""``python -m ddprof_nb record --pid PID``: sampling another process from outside.

The workload child has a known wall split: three threads alive for the whole recording,
one sleeping in ``a_sleeps`` (10 ms in ``a_short``, then 30 ms in ``a_long``, each wake
then waiting for the GIL: the child measures the real split), one burning CPU in
``b_burns`` (5 ms of its CPU clock in ``b_one``, then 15 ms in ``b_three``), the main
thread waiting in ``c_waits``: a third of the wall each, the CPU almost all
``b_burns``'s, a quarter of it in ``b_one``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ddprof_nb
from ddprof_nb import remote
from ddprof_nb.engines.native.binding import unavailable_reason
from ddprof_nb.events import EventType
from ddprof_nb.loading import load
from ddprof_nb.remote_record import record

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=f"native engine: {unavailable_reason()}")

REPO = str(Path(ddprof_nb.__file__).resolve().parent.parent)

WORKLOAD = textwrap.dedent("""\
    import json, sys, threading, time
    stop = threading.Event()

    def a_short():
        time.sleep(0.01)

    def a_long():
        time.sleep(0.03)

    spans = []  # the truth: (start, switch, end) of each a_short + a_long, epoch ns (waits for the GIL included)

    def a_sleeps():
        while not stop.is_set():
            t0 = time.time_ns()
            a_short()
            t1 = time.time_ns()
            a_long()
            spans.append((t0, t1, time.time_ns()))

    def burn(cpu_ns):
        end = time.thread_time_ns() + cpu_ns
        while time.thread_time_ns() < end:
            pass

    def b_one():
        burn(5_000_000)

    def b_three():
        burn(15_000_000)

    burns = []  # the truth: (start, end) epoch ns and the thread's CPU ns in b_one, in b_three

    def b_burns():
        while not stop.is_set():
            t0, c0 = time.time_ns(), time.thread_time_ns()
            b_one()
            c1 = time.thread_time_ns()
            b_three()
            burns.append((t0, time.time_ns(), c1 - c0, time.thread_time_ns() - c1))

    def c_waits():
        threads = [threading.Thread(target=a_sleeps), threading.Thread(target=b_burns)]
        for t in threads:
            t.start()
        print("ready", flush=True)
        if sys.argv[1] == "stdin":  # until the test closes our stdin
            sys.stdin.read()
        else:
            stop.wait(float(sys.argv[1]))
        stop.set()
        for t in threads:
            t.join()
        print("truth", json.dumps({"spans": spans, "burns": burns}), flush=True)

    c_waits()
""")


def start(tmp_path, lifetime="120"):
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    proc = subprocess.Popen([sys.executable, str(script), lifetime], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.stdout.readline().strip() == "ready"
    return proc


def samples_in(profile, event, func):
    """How many samples of ``event`` have ``func`` on their stack."""
    return sum(s.values[0] for s in profile.samples() if s.event is event and func in {f.name for f in s.stack})


def tolerance(share_pct, n):
    """5 points, or 3 standard errors of a share estimated from n samples when a loaded
    machine let the recorder take fewer (a share inside one thread rests on that thread's
    samples only).  The recordings are long enough (7 s: ~700 samples a thread at 100 Hz)
    that 3 standard errors of a quarter-share are under 5 points when the machine keeps up."""
    p = share_pct / 100
    return max(5.0, 300 * math.sqrt(p * (1 - p) / max(n, 1)))


def split(profile, event):
    """Share of the event's value (%) per workload function, and per (function, state)."""
    per_func, per_state, total = {}, {}, 0
    for s in profile.samples():
        if s.event is not event:
            continue
        total += s.values[1]
        names = {f.name for f in s.stack}
        for func in ("a_sleeps", "b_burns", "c_waits", "a_short", "a_long", "b_one", "b_three"):
            if func in names:
                per_func[func] = per_func.get(func, 0) + s.values[1]
                key = (func, s.labels.get("state"))
                per_state[key] = per_state.get(key, 0) + s.values[1]
    pct = {k: 100 * v / total for k, v in per_func.items()}
    return pct, per_state, total


@pytest.mark.quick
def test_record_pid_wall_split_per_thread_is_the_truth(tmp_path):
    proc = start(tmp_path, lifetime="stdin")
    out = tmp_path / "remote.pprof"
    try:
        result = subprocess.run([sys.executable, "-m", "ddprof_nb", "record", "--pid", str(proc.pid), "--duration", "7",
                                 "-o", str(out)], capture_output=True, text=True, timeout=120,
                                env=dict(os.environ, PYTHONPATH=REPO))
        assert result.returncode == 0, result.stderr
        proc.stdin.close()  # the workload ends after the recording, whatever the time it took to start
        word, spans = proc.stdout.readline().split(" ", 1)
        assert word == "truth" and proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    profile = load(str(out))
    wall, wall_states, wall_total = split(profile, EventType.WALL)
    print("wall split %", {k: round(v, 1) for k, v in wall.items()})
    for func in ("a_sleeps", "b_burns", "c_waits"):
        assert abs(wall[func] - 100 / 3) <= 5, wall
    # inside the sleeper: a_short's share of its time, as the child measured it over the recording
    meta = profile.metadata
    truths = json.loads(spans)
    inside = [(t0, t1, t2) for t0, t1, t2 in truths["spans"] if meta.start_ns <= t0 and t2 <= meta.end_ns]
    short = 100 * wall["a_short"] / (wall["a_short"] + wall["a_long"])
    truth = 100 * sum(t1 - t0 for t0, t1, _ in inside) / sum(t2 - t0 for t0, _, t2 in inside)
    n = samples_in(profile, EventType.WALL, "a_sleeps")
    print(f"a_short's share of the sleeper: {short:.1f}% (truth {truth:.1f}%, {n} samples)")
    assert abs(short - truth) <= tolerance(truth, n)
    # three threads for ~7 s: ~21 s of wall in all (the sampler's ticks cover the recording)
    assert 3 * 6.3e9 <= wall_total <= 3 * 7.7e9
    # states: the waiter is off CPU; the sleeper too, or waiting for the GIL the burner holds
    # after each sleep; the burner on CPU (running or runnable)
    a_off = (wall_states.get(("a_sleeps", "off-cpu"), 0) + wall_states.get(("a_sleeps", "gil"), 0)) / sum(v for (f, _), v in wall_states.items() if f == "a_sleeps")
    b_on = wall_states.get(("b_burns", "cpu"), 0) / sum(v for (f, _), v in wall_states.items() if f == "b_burns")
    c_off = wall_states.get(("c_waits", "off-cpu"), 0) / sum(v for (f, _), v in wall_states.items() if f == "c_waits")
    print(f"a off-cpu {a_off:.2f}, b cpu {b_on:.2f}, c off-cpu {c_off:.2f}")
    assert a_off >= 0.6 and c_off >= 0.95 and b_on >= 0.8
    assert wall_states.get(("a_sleeps", "gil"), 0) > 0
    cpu, _, cpu_total = split(profile, EventType.CPU)
    print("cpu split %", {k: round(v, 1) for k, v in cpu.items()}, "cpu s", cpu_total / 1e9)
    assert cpu.get("b_burns", 0) >= 80
    # inside the burner: b_one's share of its CPU (the /proc CPU time spread over its samples),
    # against the thread CPU clock's split measured by the workload over the recording (/proc
    # counts CPU in 10 ms steps, each spread over the thread's samples since the last step)
    burns = [b for b in truths["burns"] if meta.start_ns <= b[0] and b[1] <= meta.end_ns]
    cpu_truth = 100 * sum(b[2] for b in burns) / sum(b[2] + b[3] for b in burns)
    cpu_one = 100 * cpu["b_one"] / (cpu["b_one"] + cpu["b_three"])
    n = samples_in(profile, EventType.WALL, "b_burns")
    print(f"b_one's share of the burner's CPU: {cpu_one:.1f}% (truth {cpu_truth:.1f}%, {n} samples)")
    assert abs(cpu_one - cpu_truth) <= tolerance(cpu_truth, n)
    assert cpu_total <= 7.7e9  # one burning thread: at most the recording's length of CPU


def test_record_pid_agrees_with_the_in_process_engine(tmp_path):
    # the same workload recorded at the same time from inside (the native engine, by the command
    # line's record) and from outside: the same split of the workload threads' wall
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    inside, outside = tmp_path / "inside.pprof", tmp_path / "outside.pprof"
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.Popen([sys.executable, "-m", "ddprof_nb", "record", "-e", "wall,cpu", "--engine", "native",
                             "-o", str(inside), "--", str(script), "stdin"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        result = subprocess.run([sys.executable, "-m", "ddprof_nb", "record", "--pid", str(proc.pid), "--duration",
                                 "7", "-o", str(outside)], capture_output=True, text=True, timeout=120, env=env)
        assert result.returncode == 0, result.stderr
        _, err = proc.communicate(input="", timeout=60)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    def workload_split(profile):
        wall, _, _ = split(profile, EventType.WALL)
        total = sum(wall[f] for f in ("a_sleeps", "b_burns", "c_waits"))  # the profiler's own threads left out
        return {k: 100 * v / total for k, v in wall.items()}

    inner, outer = load(str(inside)), load(str(outside))
    # the in-process profile over the outside recording's time only (the load changes over time)
    lo = outer.metadata.start_ns - inner.metadata.start_ns
    inner = inner.filter(time_range=(lo, lo + outer.metadata.duration_ns))
    a, b = workload_split(inner), workload_split(outer)
    print("in-process", {k: round(v, 1) for k, v in a.items()}, "outside", {k: round(v, 1) for k, v in b.items()})
    # both sides are estimates: 5 points, or 3 standard errors of the difference of two
    # shares (the outside recorder's few samples on a loaded machine weigh most)
    n = sum(samples_in(outer, EventType.WALL, f) for f in ("a_sleeps", "b_burns", "c_waits"))
    for func in ("a_sleeps", "b_burns", "c_waits", "a_short", "a_long", "b_one", "b_three"):
        p = b[func] / 100
        assert abs(a[func] - b[func]) <= max(5.0, 300 * math.sqrt(2 * p * (1 - p) / max(n, 1))), (func, a, b, n)


def test_record_stops_with_a_note_when_the_target_exits(tmp_path):
    proc = start(tmp_path, lifetime="1.0")
    target = remote.Target(proc.pid)
    profile = record(target, duration_s=30)
    proc.wait(timeout=30)
    assert profile.metadata.duration_ns < 20e9
    assert any("stopped early" in n and "exited" in n for n in profile.metadata.notes), profile.metadata.notes
    wall, _, _ = split(profile, EventType.WALL)
    assert {"a_sleeps", "b_burns", "c_waits"} <= set(wall)


def test_record_pid_refuses_a_script_too(tmp_path):
    result = subprocess.run([sys.executable, "-m", "ddprof_nb", "record", "--pid", "1", "--", "x.py"],
                            capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO))
    assert result.returncode == 2 and "give it no script" in result.stderr


def test_record_pid_events_are_cpu_and_wall_only(tmp_path):
    proc = start(tmp_path)
    env = dict(os.environ, PYTHONPATH=REPO)
    try:
        out = tmp_path / "wall.pprof"
        result = subprocess.run([sys.executable, "-m", "ddprof_nb", "record", "--pid", str(proc.pid), "-e", "wall",
                                 "--duration", "0.5", "-o", str(out)], capture_output=True, text=True, env=env)
        assert result.returncode == 0, result.stderr
        assert load(str(out)).events == (EventType.WALL,)
        result = subprocess.run([sys.executable, "-m", "ddprof_nb", "record", "--pid", str(proc.pid), "-e", "cpu,alloc",
                                 "--duration", "0.5", "-o", str(out)], capture_output=True, text=True, env=env)
        assert result.returncode == 2 and "alloc need the in-process sampler" in result.stderr, result.stderr
    finally:
        proc.kill()
        proc.wait()
