"""CPU and wall accuracy, and overhead, of ddprof_nb beside cProfile, pyinstrument and py-spy.

    python benchmarks/bench_cpu.py [--engine auto|native|python] [--quick]
                                   [--sections accuracy,overhead] [--tools ddprof,cprofile,pyinstrument,pyspy]

Accuracy: every tool profiles the same ground-truth workloads (benchmarks/workloads.py),
whose truth is measured during the run (thread_time around each call, perf_counter
around each thread's life); each table compares measured with truth.
Overhead: fixed slices of work (~0.2 s) timed in pairs in ONE process, one slice with
the tool running and one without (order alternating), the tool's start/stop excluded
from the timing; the result is the median with/without ratio over >= 30 pairs, with its
interquartile range.  All samplers run at 100 Hz.
"""

from __future__ import annotations

import os

# one BLAS thread: a 2-core box with BLAS threads competing with the sampler measures the
# scheduler, not the profiler (set the variables yourself to override)
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import cProfile
import gc
import json
import platform
import pstats
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads  # noqa: E402
from clocks import run_queue_wait  # noqa: E402

import ddprof_nb  # noqa: E402

TOOLS = ("ddprof", "cprofile", "pyinstrument", "pyspy")
RATE_HZ = 100
TOL = 0.03  # +-3 points


# -- table -------------------------------------------------------------------------------------

@dataclass
class Row:
    tool: str
    check: str
    measured: str
    truth: str
    error: str
    goal: str
    ok: bool | None  # None: no goal for this tool / cannot be measured
    conclusive: bool = True  # False: the goal lies within the measurement's noise

    @property
    def verdict(self) -> str:
        if self.ok is None:
            return "—"
        return ("yes" if self.ok else "NO") + ("" if self.conclusive else "*")


def print_table(title: str, rows: list[Row], notes: list[str] = ()) -> None:
    header = ["tool", "check", "measured", "truth", "error", "goal", "pass?"]
    body = [[r.tool, r.check, r.measured, r.truth, r.error, r.goal, r.verdict] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    print(f"\n### {title}\n")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for b in body:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(b, widths)) + " |")
    for n in notes:
        print(f"- {n}")
    sys.stdout.flush()


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def pts(x: float) -> str:
    return f"{100 * x:+.1f} pts"


def missing_verdict(tool: str) -> bool | None:
    """ddprof_nb not seeing a function or thread fails its check; for the other tools it is
    a limitation the table states ("not seen"), with no goal to fail."""
    return False if tool == "ddprof_nb" else None


def share_rows(tool: str, measured: dict, truth: dict, tol: float = TOL, label: str = "{} share") -> list[Row]:
    """Rows comparing shares (value / sum of values) of each key; a None measured value
    means the tool did not see that item at all."""
    t_sum = sum(truth.values())
    seen = {k: v for k, v in measured.items() if v is not None}
    m_sum = sum(seen.values())
    rows = []
    for k, tv in truth.items():
        ts = tv / t_sum if t_sum else 0.0
        mv = measured.get(k)
        if mv is None or m_sum == 0:
            rows.append(Row(tool, label.format(k), "not seen", pct(ts), "—", f"±{tol * 100:.0f} pts",
                            missing_verdict(tool)))
            continue
        ms = mv / m_sum
        rows.append(Row(tool, label.format(k), pct(ms), pct(ts), pts(ms - ts), f"±{tol * 100:.0f} pts",
                        abs(ms - ts) <= tol))
    return rows


# -- accuracy: (a) three functions 60/30/10 ------------------------------------------------------

BURNERS = list(workloads.CPU_SHARES)


def acc_cpu3_ddprof(engine: str, cpu_s: float, info: dict) -> list[Row]:
    with ddprof_nb.profile(events=("cpu", "wall"), interval=1 / RATE_HZ, engine=engine) as h:
        truth = workloads.cpu_functions(cpu_s)
    prof = h.profile
    info["engine"] = prof.metadata.engine
    info["notes"] = list(prof.metadata.notes)
    tops = {r.name: r.total for r in prof.top("cpu", n=None)}
    measured = {n: tops.get(n, 0) / 1e9 or None for n in BURNERS}
    mine = prof.filter(events="cpu", threads=[truth["tid"]])
    n_samples = int(mine.values[:, 0].sum())
    true_cpu = sum(truth["cpu_s"].values())
    rows = share_rows("ddprof_nb", measured, truth["cpu_s"], label="{} CPU share")
    total = mine.total("cpu") / 1e9
    rows.append(Row("ddprof_nb", "total CPU of the thread", f"{total:.3f} s", f"{true_cpu:.3f} s",
                    f"{100 * (total / true_cpu - 1):+.1f}%", "—", None))
    info["cpu_rate"] = n_samples / true_cpu
    rows.append(Row("ddprof_nb", "CPU samples per CPU-second (see notes)", f"{n_samples / true_cpu:.1f}/s", f"{RATE_HZ}/s",
                    f"{100 * (n_samples / true_cpu / RATE_HZ - 1):+.1f}%", "—", None))
    return rows


def acc_cpu3_cprofile(cpu_s: float) -> list[Row]:
    pr = cProfile.Profile()  # default timer: perf_counter, i.e. wall time of the thread
    pr.enable()
    truth = workloads.cpu_functions(cpu_s)
    pr.disable()
    stats = pstats.Stats(pr).stats
    measured = dict.fromkeys(BURNERS)
    for (fname, _line, name), (_cc, _nc, tottime, _ct, _callers) in stats.items():
        if name in measured and Path(fname).name == "workloads.py":
            measured[name] = tottime
    return share_rows("cProfile", measured, truth["cpu_s"], label="{} CPU share")


def _pyinstrument_times(session, names) -> dict:
    """Seconds pyinstrument attributes to stacks holding each name (wall time per sample)."""
    out = dict.fromkeys(names)
    for stack, seconds in session.frame_records:
        fns = {f.split("\x00", 1)[0] for f in stack}
        for n in names:
            if n in fns:
                out[n] = (out[n] or 0.0) + seconds
    return out


def acc_cpu3_pyinstrument(cpu_s: float) -> list[Row]:
    from pyinstrument import Profiler

    p = Profiler(interval=1 / RATE_HZ)
    p.start()
    truth = workloads.cpu_functions(cpu_s)
    p.stop()
    measured = _pyinstrument_times(p.last_session, BURNERS)
    return share_rows("pyinstrument", measured, truth["cpu_s"], label="{} CPU share")


def pyspy_path() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return found if Path(found).exists() else None


def run_pyspy(args: list[str], idle: bool) -> tuple[dict | None, list[tuple[list[str], int]] | str]:
    """Run a workloads.py command under ``py-spy record``; (truth, [(frames, count)]) or
    (None, reason) when py-spy could not run or attach."""
    exe = pyspy_path()
    if exe is None:
        return None, "py-spy not installed"
    with tempfile.TemporaryDirectory() as tmp:
        raw, truth_file = Path(tmp, "pyspy.txt"), Path(tmp, "truth.json")
        cmd = [exe, "record", "--format", "raw", "--rate", str(RATE_HZ), "--threads", "-o", str(raw)]
        cmd += ["--idle"] if idle else []
        cmd += ["--", sys.executable, workloads.__file__, *args, "--json", str(truth_file)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not raw.exists() or not truth_file.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return None, f"py-spy failed (exit {proc.returncode}): {tail[0][:120]}"
        truth = json.loads(truth_file.read_text())
        stacks = []
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                stacks.append(([f.split(" (", 1)[0] for f in stack.split(";")], int(count)))
        return truth, stacks


def pyspy_counts(stacks, names) -> dict:
    out = dict.fromkeys(names)
    for frames, count in stacks:
        for n in names:
            if n in frames:
                out[n] = (out[n] or 0) + count
    return out


def acc_cpu3_pyspy(cpu_s: float) -> list[Row]:
    truth, stacks = run_pyspy(["cpu3", "--cpu", str(cpu_s)], idle=False)
    if truth is None:
        return [Row("py-spy", "CPU shares", f"could not run: {stacks}", "", "", "", None)]
    return share_rows("py-spy", pyspy_counts(stacks, BURNERS), truth["cpu_s"], label="{} CPU share")


# -- accuracy: (b) CPU split between GIL-releasing threads, (c) wall per thread -----------------

THREADS = ("hash_worker", "compress_worker", "main")
MAIN_FOCUS = "threads_workload"


def thread_rows(tool: str, cpu: dict, wall: dict, truth: dict, sleeper_limit: float = 0.01) -> tuple[list[Row], list[Row]]:
    """(b) rows: CPU shares over the three threads + the sleeper's share < limit;
    (c) rows: each thread's wall / elapsed against alive / elapsed."""
    t = truth["threads"]
    cpu_rows = share_rows(tool, cpu, {k: t[k]["cpu_s"] for k in THREADS}, label="{} CPU share")
    main_row = cpu_rows.pop()  # the sleeper has its own goal: almost no CPU beyond its own
    main_row.check = "main (sleeper) CPU share"
    # measured against its true share, not 0: on a loaded machine the sleeper's own wake-ups
    # cost more than 1 % of the threads' CPU, and that is not the profiler's error
    true_share = t["main"]["cpu_s"] / sum(t[k]["cpu_s"] for k in THREADS)
    main_row.goal = f"< true + {sleeper_limit * 100:.0f} pt"
    seen = sum(v for v in cpu.values() if v is not None)
    if cpu.get("main") is not None and seen:
        main_row.ok = cpu["main"] / seen < true_share + sleeper_limit
    cpu_rows.append(main_row)
    elapsed = truth["elapsed_s"]
    wall_rows = []
    for k in THREADS:
        ts = t[k]["alive_s"] / elapsed
        if wall.get(k) is None:
            wall_rows.append(Row(tool, f"{k} wall / elapsed", "not seen", pct(ts), "—", "±3 pts", missing_verdict(tool)))
            continue
        ms = wall[k] / elapsed
        wall_rows.append(Row(tool, f"{k} wall / elapsed", pct(ms), pct(ts), pts(ms - ts), "±3 pts", abs(ms - ts) <= TOL))
    return cpu_rows, wall_rows


def acc_threads_ddprof(engine: str, unit: float, info: dict):
    with ddprof_nb.profile(events=("cpu", "wall"), interval=1 / RATE_HZ, engine=engine) as h:
        truth = workloads.threads_workload(unit)
    prof = h.profile
    t = truth["threads"]
    cpu, wall, rates = {}, {}, []
    for k in THREADS:
        mine = prof.filter(threads=[t[k]["tid"]])
        if k == "main":  # main lives before and after the workload: keep the workload's part
            mine = mine.filter(focus=f"^{MAIN_FOCUS}$")
        cpu[k] = mine.total("cpu") / 1e9 if len(mine.filter(events="cpu")) else (0.0 if k == "main" else None)
        w = mine.filter(events="wall")
        wall[k] = w.total("wall") / 1e9 if len(w) else None
        rates.append(f"{k} {int(w.values[:, 0].sum()) / t[k]['alive_s']:.0f}/s")
    info["wall_rates"] = rates
    return thread_rows("ddprof_nb", cpu, wall, truth)


def acc_threads_cprofile(unit: float):
    pr = cProfile.Profile()
    pr.enable()
    truth = workloads.threads_workload(unit)
    pr.disable()
    stats = pstats.Stats(pr).stats
    found = {name: (tt, ct) for (f, _l, name), (_cc, _nc, tt, ct, _c) in stats.items() if Path(f).name == "workloads.py"}
    # cProfile hooks only the thread that enabled it; its clock is wall time
    cpu = {k: (found[k][0] if k in found else None) for k in ("hash_worker", "compress_worker")}
    cpu["main"] = None  # a wall clock cannot tell a sleeping thread's CPU
    wall = {k: (found[k][1] if k in found else None) for k in ("hash_worker", "compress_worker")}
    wall["main"] = found[MAIN_FOCUS][1] if MAIN_FOCUS in found else None
    return thread_rows("cProfile", cpu, wall, truth)


def acc_threads_pyinstrument(unit: float):
    from pyinstrument import Profiler

    p = Profiler(interval=1 / RATE_HZ)
    p.start()
    truth = workloads.threads_workload(unit)
    p.stop()
    times = _pyinstrument_times(p.last_session, ("hash_worker", "compress_worker", MAIN_FOCUS))
    # pyinstrument's times are wall time; it has no CPU split
    cpu = {"hash_worker": None, "compress_worker": None, "main": None}
    wall = {"hash_worker": times["hash_worker"], "compress_worker": times["compress_worker"], "main": times[MAIN_FOCUS]}
    return thread_rows("pyinstrument", cpu, wall, truth)


def acc_threads_pyspy(unit: float):
    names = ("hash_worker", "compress_worker", MAIN_FOCUS)
    truth, stacks = run_pyspy(["threads", "--unit", str(unit)], idle=False)
    if truth is None:
        r = Row("py-spy", "threads", f"could not run: {stacks}", "", "", "", None)
        return [r], [r]
    c = pyspy_counts(stacks, names)
    cpu = {"hash_worker": c["hash_worker"], "compress_worker": c["compress_worker"], "main": c[MAIN_FOCUS] or 0}
    cpu_rows, _ = thread_rows("py-spy", cpu, {}, truth)
    truth_w, stacks_w = run_pyspy(["threads", "--unit", str(unit)], idle=True)
    if truth_w is None:
        return cpu_rows, [Row("py-spy", "wall (--idle)", f"could not run: {stacks_w}", "", "", "", None)]
    c = pyspy_counts(stacks_w, names)
    wall = {"hash_worker": c["hash_worker"], "compress_worker": c["compress_worker"], "main": c[MAIN_FOCUS]}
    wall = {k: (v / RATE_HZ if v is not None else None) for k, v in wall.items()}  # samples -> seconds
    _, wall_rows = thread_rows("py-spy", {}, wall, truth_w)
    return cpu_rows, wall_rows


# -- overhead ----------------------------------------------------------------------------------

class Tool:
    """What paired_ratios needs from a profiler: start, stop, and the CPU of any process
    of its own (py-spy); in-process profilers have none."""

    def external_cpu(self, handle) -> float:
        return 0.0


class DdprofTool(Tool):
    name = "ddprof_nb"

    def __init__(self, engine: str):
        self.engine = engine
        self.samples = 0
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.used_engine = ""
        self.stop_s: list[float] = []

    def start(self):
        return ddprof_nb.Sampler(events=("cpu", "wall"), interval=1 / RATE_HZ, engine=self.engine).start()

    def stop(self, sampler, wall_s, cpu_s):
        t0 = time.perf_counter()
        prof = sampler.stop()
        self.stop_s.append(time.perf_counter() - t0)
        self.used_engine = prof.metadata.engine
        cpu = prof.filter(events="cpu")
        self.samples += int(cpu.values[:, 0].sum())
        self.cpu_s += cpu_s
        self.wall_s += wall_s

    def rate(self) -> str:
        if not self.wall_s:
            return ""
        return (f"{self.samples / self.wall_s:.0f} CPU samples per wall second, {self.samples / self.cpu_s:.0f} per "
                f"CPU-second of the main thread ({self.used_engine} engine); stop() (untimed: final drain and "
                f"Profile build) took a median {1e3 * statistics.median(self.stop_s):.1f} ms per slice")


class CProfileTool(Tool):
    name = "cProfile"

    def start(self):
        pr = cProfile.Profile()
        pr.enable()
        return pr

    def stop(self, pr, wall_s, cpu_s):
        pr.disable()

    def rate(self) -> str:
        return "deterministic (every call)"


class PyinstrumentTool(Tool):
    name = "pyinstrument"

    def __init__(self):
        from pyinstrument import Profiler

        self.Profiler = Profiler
        self.samples = 0
        self.wall_s = 0.0

    def start(self):
        p = self.Profiler(interval=1 / RATE_HZ)
        p.start()
        return p

    def stop(self, p, wall_s, cpu_s):
        p.stop()
        self.samples += len(p.last_session.frame_records)
        self.wall_s += wall_s

    def rate(self) -> str:
        return f"{self.samples / self.wall_s:.0f} samples/s" if self.wall_s else ""


class PyspyTool(Tool):
    """py-spy attached to this process (``record --pid``) for the 'with' slice only; its
    attach time is excluded (the slice starts once py-spy says it is sampling)."""

    name = "py-spy"

    def __init__(self):
        self.exe = pyspy_path()
        self.tmp = tempfile.mkdtemp(prefix="bench_pyspy_")
        self.samples = 0
        self.wall_s = 0.0

    def start(self):
        out = Path(self.tmp, "raw.txt")
        proc = subprocess.Popen([self.exe, "record", "--pid", str(os.getpid()), "--rate", str(RATE_HZ),
                                 "--format", "raw", "-o", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 15
        seen = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                line = proc.stdout.readline()
                seen += line
                if "Sampling process" in line:
                    return proc, out
                if not line:
                    break
            if proc.poll() is not None:
                break
        proc.kill()
        proc.wait()
        raise RuntimeError(f"py-spy could not attach: {seen.strip()[-200:] or 'no output'}")

    def external_cpu(self, handle) -> float:
        """CPU seconds py-spy's own process has used so far (schedstat), 0 once it is gone."""
        try:
            with open(f"/proc/{handle[0].pid}/schedstat") as fh:
                return int(fh.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0

    def stop(self, handle, wall_s, cpu_s):
        proc, out = handle
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        if out.exists():
            for line in out.read_text().splitlines():
                count = line.rpartition(" ")[2]
                self.samples += int(count) if count.isdigit() else 0
            out.unlink()
        self.wall_s += wall_s

    def rate(self) -> str:
        return f"{self.samples / self.wall_s:.0f} samples/s" if self.wall_s else ""


class NoTool(Tool):
    """The A/A control: both slices of a pair run without any profiler, so the spread of
    its ratios is the noise floor of this measurement on this machine right now."""

    name = "none (A/A control)"

    def start(self):
        return None

    def stop(self, handle, wall_s, cpu_s):
        pass

    def rate(self) -> str:
        return ""


def paired_ratios(tool, work, units: int, pairs: int) -> dict[str, list[float]]:
    """with/without ratios for ``pairs`` pairs of slices (one warm-up pair dropped), of:

    - ``wall``: perf_counter;
    - ``ready``: wall minus the main thread's run-queue wait (runnable, no CPU free): the
      wall an otherwise idle machine would show; GIL waits and signal handlers stay in;
    - ``main_cpu``: the main thread's CPU time (thread_time);
    - ``all_cpu``: main's CPU plus the CPU of every other thread of this process and of the
      tool's own process (py-spy), the latter scaled by ready/wall: a sampler's helper
      threads burn CPU per wall second, so on a loaded machine, where the slice's wall
      stretches, they would otherwise look costlier than on an idle one.

    Tool start/stop happen outside the timed region; the order alternates per pair.
    """
    out: dict[str, list[float]] = {"wall": [], "ready": [], "main_cpu": [], "all_cpu": []}
    for i in range(pairs + 1):
        m: dict[bool, dict[str, float]] = {}
        for with_tool in ((True, False) if i % 2 == 0 else (False, True)):
            gc.collect()
            handle = tool.start() if with_tool else None
            x0 = tool.external_cpu(handle) if with_tool else 0.0
            q0 = run_queue_wait()
            t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
            work(units)
            wall, main = time.perf_counter() - t0, time.thread_time() - c0
            proc, q1 = time.process_time() - p0, run_queue_wait()
            ext = tool.external_cpu(handle) - x0 if with_tool else 0.0
            if with_tool:
                tool.stop(handle, wall, main)
            ready = wall - (q1 - q0) if q0 is not None and q1 is not None else None
            scale = ready / wall if ready is not None else 1.0
            m[with_tool] = {"wall": wall, "ready": ready, "main_cpu": main,
                            "all_cpu": main + max(0.0, proc - main + ext) * scale}
        if i:
            for k in out:
                if m[True][k] is not None and m[False][k]:
                    out[k].append(m[True][k] / m[False][k])
    return out


def _task_cpu_ns(tid: int) -> int:
    """CPU time of one thread of this process, ns (/proc schedstat: exact, not tick-based)."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _profiler_tids() -> dict[str, int]:
    """The native engine's own threads: the Python drain thread and the wall-sampling pthread."""
    import threading

    out = {t.name: t.native_id for t in threading.enumerate() if t.name == "ddprof_nb-drain"}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                if fh.read().strip() == "ddprof_nb-wall":
                    out["ddprof_nb-wall"] = int(tid)
        except OSError:
            pass
    return out


def profiler_threads_rows(engine: str, check: str, work, units: int, seconds: float, idle: int) -> list[Row]:
    """One steady-state session of ``seconds`` beside ``idle`` idle threads (a notebook kernel
    has 6-10: half blocked, half waking every 200 ms): the CPU of the profiler's own threads
    as a share of a core and of the workload's CPU, the signal handler's cost per sample,
    and how many records the wall samples took."""
    import threading

    stop = threading.Event()
    idlers = [threading.Thread(target=stop.wait, daemon=True) if i % 2 else
              threading.Thread(target=lambda: [None for _ in iter(lambda: stop.wait(0.2), True)], daemon=True)
              for i in range(idle)]
    for t in idlers:
        t.start()
    sampler = ddprof_nb.Sampler(events=("cpu", "wall"), interval=1 / RATE_HZ, engine=engine).start()
    time.sleep(0.05)
    tids = _profiler_tids()

    def session_stats():
        try:
            return sampler._engine._session.stats()  # noqa: SLF001 - benchmark introspection
        except AttributeError:
            return None

    st0 = session_stats()
    before = {k: _task_cpu_ns(v) for k, v in tids.items()}
    t0, c0 = time.perf_counter(), time.thread_time()
    while time.perf_counter() - t0 < seconds:
        work(units)
    wall, main = time.perf_counter() - t0, time.thread_time() - c0
    used = {k: (_task_cpu_ns(v) - before[k]) / 1e9 for k, v in tids.items()}
    st1 = session_stats()
    stats = None
    if st0 and st1:  # counters over the measured window
        stats = {k: (st1[k] - st0[k]) for k in ("wall_ticks", "handler_ns", "handler_calls", "wall_records",
                                                 "wall_unchanged") if k in st1}
        stats["samples"] = {e: st1["samples"][e] - st0["samples"][e] for e in st1["samples"]}
    t_stop = time.perf_counter()
    prof = sampler.stop()
    stop_s = time.perf_counter() - t_stop
    stop.set()
    tag = f"{check}, {idle} idle threads, {seconds:.0f} s"
    rows = []
    for name in ("ddprof_nb-drain", "ddprof_nb-wall"):
        if name in used:
            rows.append(Row("ddprof_nb", f"{tag}: {name} thread CPU", f"{100 * used[name] / wall:.2f}% of a core",
                            "—", f"{100 * used[name] / main:.2f}% of the workload's CPU", "—", None))
    total = sum(used.values())
    rows.append(Row("ddprof_nb", f"{tag}: profiler threads, total", f"{100 * total / wall:.2f}% of a core", "—",
                    f"{100 * total / main:.2f}% of the workload's CPU", "—", None))
    if stats:
        per_tick = used.get("ddprof_nb-wall", 0) / max(1, stats["wall_ticks"])
        rows.append(Row("ddprof_nb", f"{tag}: wall thread per tick", f"{1e6 * per_tick:.1f} µs CPU", "—",
                        f"{stats['wall_ticks']} ticks", "—", None))
        rows.append(Row("ddprof_nb", f"{tag}: signal handler per CPU sample",
                        f"{stats['handler_ns'] / max(1, stats['handler_calls']) / 1e3:.1f} µs", "—",
                        f"{stats['handler_calls']} samples", "—", None))
        wall_samples = stats["samples"][ddprof_nb.EventType.WALL]
        rows.append(Row("ddprof_nb", f"{tag}: wall samples → records", f"{wall_samples} → {stats.get('wall_records', wall_samples)}",
                        "—", f"{stats.get('wall_unchanged', 0)} reused an idle thread's last stack", "—", None))
        drained = st1.get("agg_out", 0) - st0.get("agg_out", 0)
        rows.append(Row("ddprof_nb", f"{tag}: stop() (converts what the drain left)", f"{1e3 * stop_s:.0f} ms", "—",
                        f"{drained} records drained during the session", "—", None))
    del prof
    return rows




def whole_run_pyspy(kind: str, units: int, runs: int) -> list[float]:
    """Fallback when py-spy cannot attach to this process: child runs with and without
    ``py-spy record --`` alternating (whole-process timing, about ±5% noise here)."""
    exe = pyspy_path()
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        truth = Path(tmp, "run.json")
        for i in range(runs):
            times = {}
            for with_tool in ((True, False) if i % 2 == 0 else (False, True)):
                cmd = [sys.executable, workloads.__file__, kind, "--units", str(units), "--json", str(truth)]
                if with_tool:
                    cmd = [exe, "record", "--rate", str(RATE_HZ), "--format", "raw", "-o", os.devnull, "--"] + cmd
                subprocess.run(cmd, capture_output=True, check=True, timeout=600)
                times[with_tool] = json.loads(truth.read_text())["run_s"]  # the workload, not startup
            ratios.append(times[True] / times[False])
    return ratios


def median_se(values: list[float]) -> float:
    """Standard error of the median, from the IQR (robust to the outliers a shared box
    produces): 1.2533 * sigma / sqrt(n) with sigma = IQR / 1.349."""
    if len(values) < 4:
        return float("inf")
    q = statistics.quantiles(values, n=4)
    return 0.929 * (q[2] - q[0]) / len(values) ** 0.5


def overhead_rows(tool_name: str, check: str, ratios: dict[str, list[float]], goal: float | None,
                  how: str = "") -> list[Row]:
    """One row per measure of ``paired_ratios``, judged against ``goal`` when given (main
    thread CPU is not judged on its own); a verdict whose goal lies within 2 standard
    errors of the median is marked *."""
    rows = []
    for what, label in (("wall", "wall"), ("ready", "wall − run-queue wait"), ("main_cpu", "CPU, main thread"),
                        ("all_cpu", "CPU, all (idle-machine est.)")):
        r = ratios.get(what)
        if not r:
            continue
        med = statistics.median(r)
        q = statistics.quantiles(r, n=4) if len(r) >= 2 else [med, med, med]
        se = median_se(r)
        judged = goal is not None and what != "main_cpu"  # main's CPU is part of the "all" row
        rows.append(Row(tool_name, f"{check}: {label} ({len(r)} pairs{how})", f"{med:.3f}×", "1.000×",
                        f"{100 * (med - 1):+.1f}% ±{100 * se:.1f} (IQR {100 * (q[0] - 1):+.1f}..{100 * (q[2] - 1):+.1f})",
                        f"≤ +{goal * 100:.0f}%" if judged else "—",
                        (med - 1 <= goal) if judged else None,
                        conclusive=not judged or abs(med - 1 - goal) > 2 * se))
    return rows


# -- main --------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="auto", choices=["auto", "native", "python"])
    ap.add_argument("--quick", action="store_true", help="shorter workloads and slices (~3 min instead of ~6-10)")
    ap.add_argument("--sections", default="accuracy,overhead", help="comma list: accuracy, overhead")
    ap.add_argument("--tools", default=",".join(TOOLS), help=f"comma list of: {', '.join(TOOLS)}")
    ap.add_argument("--pairs", type=int, default=None, help="overhead pairs per tool and workload (>= 30)")
    ap.add_argument("--slice", type=float, default=None, help="overhead slice length in seconds")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a ddprof_nb goal is missed")
    args = ap.parse_args(argv)
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        ap.error(f"unknown tools: {', '.join(unknown)}")
    cpu_s = 1.2 if args.quick else 3.0
    unit = 0.4 if args.quick else 1.0
    pairs = args.pairs or (30 if args.quick else 40)
    slice_s = args.slice or (0.1 if args.quick else 0.2)

    try:
        from ddprof_nb.engines.native import NativeEngine

        native = NativeEngine.unavailable_reason() or "available"
    except Exception as exc:  # noqa: BLE001 - report whatever broke the import
        native = f"not importable ({type(exc).__name__}: {exc})"
    print(f"# bench_cpu — Python {platform.python_version()} ({sys.executable}), {platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(f"- ddprof_nb {ddprof_nb.__version__}: --engine {args.engine}; native engine: {native}")
    print(f"- sampling rate {RATE_HZ} Hz for every sampler; {'quick' if args.quick else 'full'} run: "
          f"cpu3 {cpu_s} CPU-s, threads unit {unit} s, overhead {pairs} pairs of {slice_s} s slices")
    sys.stdout.flush()

    all_rows: list[Row] = []
    info: dict = {}
    try:
        smoke = ddprof_nb.Sampler(events=("cpu", "wall"), engine=args.engine).start().stop()
    except ddprof_nb.EngineUnavailableError as exc:
        print(f"\nengine {args.engine!r} unavailable: {exc}")
        return 2
    info["engine"] = smoke.metadata.engine
    print(f"- engine used: {smoke.metadata.engine}")
    sys.stdout.flush()

    if "accuracy" in sections:
        rows: list[Row] = []
        runners = {"ddprof": lambda: acc_cpu3_ddprof(args.engine, cpu_s, info), "cprofile": lambda: acc_cpu3_cprofile(cpu_s),
                   "pyinstrument": lambda: acc_cpu3_pyinstrument(cpu_s), "pyspy": lambda: acc_cpu3_pyspy(cpu_s)}
        for t in tools:
            rows += runners[t]()
        notes = [f"truth: time.thread_time around each call, measured in each tool's own run; {cpu_s} CPU-s in 10 rounds "
                 "of random length, call order shuffled",
                 "cProfile: tottime (its default clock is wall time); pyinstrument: wall seconds of samples whose stack "
                 "holds the function (interval 10 ms); py-spy: non-idle samples (child process, --rate 100)"]
        if "cpu_rate" in info:
            notes.insert(0, f"ddprof_nb engine used: {info['engine']}; achieved CPU sample rate "
                            f"{info['cpu_rate']:.1f} samples per CPU-second (100 expected from per-thread CPU "
                            "timers; the python engine samples on wall ticks instead, so on a busy machine a thread "
                            "with less than a full core gets more samples per CPU-second, each lighter)")
            notes += [f"ddprof_nb note: {n}" for n in info["notes"]]
        print_table("1a. CPU split between three functions (60/30/10)", rows, notes)
        all_rows += rows

        rows_b, rows_c = [], []
        runners = {"ddprof": lambda: acc_threads_ddprof(args.engine, unit, info), "cprofile": lambda: acc_threads_cprofile(unit),
                   "pyinstrument": lambda: acc_threads_pyinstrument(unit), "pyspy": lambda: acc_threads_pyspy(unit)}
        for t in tools:
            b, c = runners[t]()
            rows_b += b
            rows_c += c
        print_table("1b. CPU split between two GIL-releasing threads (sha256 2 : zlib 1) beside a sleeping main", rows_b,
                    ["truth: thread_time inside each thread; shares over the three threads",
                     "cProfile and pyinstrument hook only the thread that started them and time wall clock: "
                     "no CPU split to report", "py-spy: non-idle samples per thread (child process)"])
        print_table("1c. wall time per thread / elapsed (main sleeps+joins; workers alive part of the time)", rows_c,
                    ["truth: perf_counter from a worker's first to last instruction; main = the whole workload",
                     "main is measured over stacks holding threads_workload (the workload function)",
                     "py-spy: --idle samples / 100 Hz"]
                    + ([f"ddprof_nb wall samples per alive second: {', '.join(info['wall_rates'])}"]
                       if "wall_rates" in info else []))
        all_rows += rows_b + rows_c

    if "overhead" in sections:
        numeric = workloads.Numeric()
        works = {"call-heavy (fib)": (workloads.call_heavy, "call_heavy"), "numpy matmul + sha256": (numeric, "numeric")}
        rows = []
        notes = [f"median of with/without ratios over pairs of ~{slice_s} s slices of fixed work in this process; "
                 "tool start/stop outside the timed slice; pair order alternates; IQR = 25th..75th percentile",
                 "wall = perf_counter (what the user waits); wall − run-queue wait = the same minus the time the "
                 "main thread was runnable but had no CPU (/proc schedstat): the wall an otherwise idle machine would "
                 "show, with GIL waits and signal handlers kept",
                 "CPU, main thread = thread_time of the workload's thread (signal handlers, trace hooks); "
                 "CPU, all = that plus every other thread of this process and py-spy's own process, the helpers' "
                 "part scaled by (wall − run-queue wait) / wall, since they burn CPU per wall second",
                 "none (A/A control): both slices without a profiler — the noise floor of this run",
                 "error: median slowdown ± its standard error (0.93 × IQR / √pairs); * = the goal lies within "
                 "2 standard errors of the median: not conclusive at this noise level (more --pairs or a quieter box)"]
        for check, (work, kind) in works.items():
            units = workloads.calibrate(work, slice_s)
            rows += overhead_rows("none (A/A)", check, paired_ratios(NoTool(), work, units, pairs), None)
            for t in tools:
                if t == "ddprof":
                    tool = DdprofTool(args.engine)
                    rows += overhead_rows(tool.name, check, paired_ratios(tool, work, units, pairs), 0.01)
                    notes.append(f"{check}: ddprof_nb rate {tool.rate()}")
                elif t == "cprofile":
                    rows += overhead_rows("cProfile", check, paired_ratios(CProfileTool(), work, units, pairs), None)
                elif t == "pyinstrument":
                    tool = PyinstrumentTool()
                    rows += overhead_rows(tool.name, check, paired_ratios(tool, work, units, pairs), None)
                    notes.append(f"{check}: pyinstrument rate {tool.rate()}")
                elif t == "pyspy":
                    if pyspy_path() is None:
                        rows.append(Row("py-spy", check, "not installed", "", "", "", None))
                        continue
                    tool = PyspyTool()
                    try:
                        ratios = paired_ratios(tool, work, units, pairs)
                    except RuntimeError as exc:
                        notes.append(f"{exc}; py-spy measured by whole child runs instead (±5% noise)")
                        runs = max(5, pairs // 6)
                        rows += overhead_rows("py-spy", check, {"wall": whole_run_pyspy(kind, units * 10, runs)}, None,
                                              ", whole runs")
                    else:
                        rows += overhead_rows("py-spy", check, ratios, None, ", attached")
                        notes.append(f"{check}: py-spy (record --pid, default blocking mode) rate {tool.rate()}")
                    shutil.rmtree(tool.tmp, ignore_errors=True)
        print_table(f"2. overhead at {RATE_HZ} Hz (ddprof_nb: cpu+wall)", rows, notes)
        all_rows += rows
        if "ddprof" in tools and info.get("engine") == "native":
            rows = []
            seconds = 3.0 if args.quick else 6.0
            for check, (work, _kind) in works.items():
                units = workloads.calibrate(work, 0.05)
                for idle in (0, 8):
                    rows += profiler_threads_rows(args.engine, check, work, units, seconds, idle)
            print_table(f"2b. the profiler's own threads, steady state at {RATE_HZ} Hz (load average "
                        f"{os.getloadavg()[0]:.2f})", rows,
                        ["one session per row group, the workload in a loop beside idle threads (half blocked, half "
                         "waking every 200 ms, like a notebook kernel's); CPU from /proc/self/task/*/schedstat",
                         "ddprof_nb-drain: the Python thread converting records (holds the GIL while it does); "
                         "ddprof_nb-wall: the native wall-sampling pthread (no GIL)",
                         "the paired slices above are short sessions whose records are converted at stop(); these "
                         "rows include the drain's work during a long session"])

    mine = [r for r in all_rows if r.tool == "ddprof_nb" and r.ok is not None]
    met = sum(r.ok for r in mine)
    unsure = sum(not r.conclusive for r in mine)
    print(f"\nddprof_nb ({info.get('engine') or args.engine} engine): {met}/{len(mine)} goals met"
          + (f" ({unsure} verdicts not conclusive, marked *)" if unsure else ""))
    return 1 if args.strict and met < len(mine) else 0


if __name__ == "__main__":
    sys.exit(main())
