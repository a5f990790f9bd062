"""Imported by the coexistence suite's CHILD interpreters only (never by pytest itself).

Workloads, profile checks, "our" session and the other tools (tracemalloc, cProfile, a
sys.monitoring user, faulthandler, a SIGPROF/SIGALRM itimer user, yappi, pyinstrument,
memray, a dlopen/import storm), and ``run_matrix``, which runs one tool beside ddprof_nb in
every start and stop order and reports each cell as a ``RESULT`` line.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import json
import os
import re
import shutil
import signal
import sys
import sysconfig
import tempfile
import threading
import time
import traceback

import ddprof_nb
from ddprof_nb import ProfilerBusyError, ProfilerError
from ddprof_nb.engines.native.session import Session
from ddprof_nb.events import EventType, FrameKind

# libasan interposes sem_wait & co: the lock/park GOT hooks are refused there (by design)
SANITIZED = "libasan" in os.environ.get("LD_PRELOAD", "")

EVENT_SETS = {
    "cpu_wall": ("cpu", "wall"),
    "alloc_live": ("alloc", "live"),
    "lock_park": ("lock", "park"),
    "all": ("cpu", "wall", "alloc", "live", "lock", "park"),
}
# The set that also unwinds native frames (its samples must carry some): every tool meets the
# unwinder and its tables beside every event, at no extra cell
NATIVE_SETS = {"all"}


def emit(**kw):
    print("RESULT " + json.dumps(kw, default=repr), flush=True)


# ---- workloads: each named function must show up in the matching event's samples -------------
def burn(sec):
    """Burn ``sec`` of this thread's CPU."""
    t = time.thread_time()
    while time.thread_time() - t < sec:
        pass


# A WALL sample names cpu_workload only when a wall tick samples the thread while it is in
# there.  On 2 cores at load 10-18 the wall thread's ticks come late and in bursts, and a
# workload of 0.15 s of CPU can end between two of them.  So, in a running session, the
# workload also goes on until the wall thread has finished WALL_TICKS_INSIDE ticks since it
# began: the first may have sampled the thread before it entered, each later one started
# after that and sampled it inside.  A wall thread that finishes fewer within WALL_WAIT_S is
# stalled, and the cell fails saying so (profile_problems).
WALL_TICKS_INSIDE = 3
WALL_WAIT_S = 5.0
MEASURED = {}  # the last cpu_workload's figures, for profile_problems' messages


def session_wall_ticks():
    """The running native session's count of finished wall-thread ticks; None when no
    session runs."""
    st = Session.stats()
    return st["wall_ticks"] if st["start_mono_ns"] and not st["stop_mono_ns"] else None


def cpu_workload(sec=0.15):
    t0, k0 = time.monotonic(), session_wall_ticks()
    burn(sec)
    MEASURED.clear()
    if k0 is None:
        return
    # (polled between short burns: the thread stays on CPU, in this frame, all along)
    while (session_wall_ticks() or k0) - k0 < WALL_TICKS_INSIDE and time.monotonic() - t0 < WALL_WAIT_S:
        burn(0.002)
    MEASURED.update(seconds=round(time.monotonic() - t0, 3), wall_ticks_inside=(session_wall_ticks() or k0) - k0)


KEPT = []  # alloc_workload's kept half: alive at stop, so it is LIVE


def alloc_workload(sec=0.1):
    # ~0.1 s of allocations, big and small; 10-20 MB of bytearrays stay alive (LIVE at stop):
    # at least 160 x 64 kB kept, ~20 sampled blocks expected at the 512 KiB mean, so that
    # none at all (e^-20) means a bug, not a slow machine's short loop
    t0, i = time.perf_counter(), 0
    while time.perf_counter() - t0 < sec or i < 640:
        b = bytearray(64_000)
        b[::4096] = b"x" * 16  # touch the pages: an allocation of real memory
        if i % 4 == 0 and len(KEPT) < 320:
            KEPT.append(b)
        small = [str(j) for j in range(50)]
        i += 1
    return small


def lock_contender(lock, hold, n, waited):
    for _ in range(n):
        t0 = time.perf_counter()
        with lock:
            waited.append(time.perf_counter() - t0)
            time.sleep(hold)


def lock_workload():
    # two threads start while this one holds their lock, then take turns on it (10 ms holds):
    # each waits in lock_contender.  Rounds repeat (1 s at most) until a contender measured a
    # wait of 5 ms: on a loaded machine a thread can start too late to meet the other.
    lock, waited = threading.Lock(), []
    deadline = time.perf_counter() + 1.0
    while True:
        lock.acquire()
        ts = [threading.Thread(target=lock_contender, args=(lock, 0.01, 3, waited)) for _ in range(2)]
        for t in ts:
            t.start()
        time.sleep(0.02)
        lock.release()
        for t in ts:
            t.join()
        if max(waited) > 0.005 or time.perf_counter() > deadline:
            return max(waited)


def park_workload():
    for _ in range(3):
        time.sleep(0.02)


def workload(events):
    """What one cell runs while both profilers may be on: the work each event should see."""
    events = set(events)
    if events & {"cpu", "wall"}:
        cpu_workload()
    if "alloc" in events:
        alloc_workload()
    if events & {"lock", "park"}:
        lock_workload()
        park_workload()


EXPECT = {"cpu": "cpu_workload", "wall": "cpu_workload", "alloc": "alloc_workload", "live": "alloc_workload",
          "lock": "lock_contender", "park": "park_workload"}


# ---- reading profiles ------------------------------------------------------------------------
def functions(p, event):
    """Names of the frames on the stacks of ``event``'s samples."""
    ev = EventType.parse(event)
    out = set()
    for s in p.samples():
        if s.event is ev:
            out.update(f.name for f in s.stack)
    return out


def lockpark_degraded(p):
    """The profile says wait functions could not be hooked (what AddressSanitizer's
    interceptors of sem_wait and friends lead to)."""
    return any("no wait function could be hooked" in n or ("lock/park: degraded" in n and "could not be hooked" in n)
               for n in p.metadata.notes)


def degraded_by(p, event, words):
    """A note of ``p`` says ``event`` was degraded by the other tool (one of ``words``): e.g.
    CPU samples stop while another tool's SIGPROF handler is installed over ours."""
    return any("degraded" in n and re.search(rf"\b{event}\b", n) and any(w.lower() in n.lower() for w in words)
               for n in p.metadata.notes)


def without_native_frames(p, event):
    """``event``'s samples in the workload's function, none of which carries a native frame."""
    ev = EventType.parse(event)
    mine = [s for s in p.samples() if s.event is ev and any(f.name == EXPECT[event] for f in s.stack)]
    return bool(mine) and not any(f.kind is FrameKind.NATIVE for s in mine for f in s.stack)


def profile_problems(p, events, words=(), native=False):
    """What is missing from ``p`` for ``events`` after ``workload(events)`` ran in it.  An
    event may be missing when a note says the other tool (``words``) degraded it.  With
    ``native``, the samples of every event but WALL (taken from outside the thread) must
    carry native frames too."""
    problems = []
    for ev in events:
        if ev in ("lock", "park") and SANITIZED and lockpark_degraded(p):
            continue  # a clear degradation under ASan is the expected outcome
        if words and degraded_by(p, ev, words):
            continue
        seen = functions(p, ev)
        if EXPECT[ev] not in seen:
            problems.append(f"{ev}: {EXPECT[ev]} not in the samples (frames: {sorted(seen)[:12]}; "
                            f"cpu_workload measured: {MEASURED}; notes: {list(p.metadata.notes)})")
        elif native and ev != "wall" and without_native_frames(p, ev):
            problems.append(f"{ev}: no sample in {EXPECT[ev]} carries a native frame although native=True "
                            f"(notes: {list(p.metadata.notes)})")
    if "wall" in events and MEASURED and MEASURED["wall_ticks_inside"] < WALL_TICKS_INSIDE:
        problems.append(f"wall: the wall thread finished {MEASURED['wall_ticks_inside']} tick(s) in the "
                        f"{MEASURED['seconds']} s cpu_workload ran (a stalled wall thread)")
    return problems


# ---- our profiler, started and stopped from anywhere (not a with block) ---------------------
class Ours:
    def __init__(self, events, interval="5ms", native=False):
        self.events = events
        self.interval = interval
        self.native = native
        self.sampler = None
        self.refused = None  # "ErrorClass: message" when start raised a ProfilerError
        self.profile = None

    def start(self):
        sampler = ddprof_nb.Sampler(events=self.events, interval=self.interval, native=self.native)
        try:
            sampler.start(trim="none")
        except ProfilerError as exc:
            self.refused = f"{type(exc).__name__}: {exc}"
            return
        self.sampler = sampler

    def stop(self):
        if self.sampler is not None:
            sampler, self.sampler = self.sampler, None
            self.profile = sampler.stop()


def refusal_problems(refused, words):
    """A refusal is acceptable only as a ProfilerError naming the other tool or resource."""
    if refused.startswith(ProfilerBusyError.__name__):
        return [f"refused as busy although no other ddprof_nb session runs (locked out): {refused}"]
    if not any(w.lower() in refused.lower() for w in words):
        return [f"refused without naming the other tool/resource ({' / '.join(words)}): {refused}"]
    return []


# ---- raw sigaction: save and restore a disposition exactly, as C-level tools (vmprof) do -------
_libc = ctypes.CDLL(None, use_errno=True)


def raw_sigaction(sig, new=None):
    """The current struct sigaction of ``sig`` (raw bytes), after installing ``new`` if given."""
    old = ctypes.create_string_buffer(256)  # struct sigaction is 152 bytes on x86-64 glibc
    if _libc.sigaction(sig, new, old) != 0:
        raise OSError(ctypes.get_errno(), "sigaction")
    return old


def wait_child(pid, timeout):
    """The wait status of child ``pid``, or None (and the child killed) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.005)
    print_native_stacks(pid)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def print_native_stacks(pid):
    """Every thread's C stack of hung process ``pid`` to stderr (gdb, when installed): a hang
    seen once in dozens of runs must say where it waited."""
    gdb = shutil.which("gdb")
    if gdb is None:
        print(f"process {pid} hung (no gdb here to show its stacks)", file=sys.stderr)
        return
    import subprocess

    try:
        got = subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt"],
                             capture_output=True, text=True, timeout=60)
        out = got.stdout
    except (OSError, subprocess.SubprocessError) as exc:
        got, out = None, f"gdb failed: {exc!r}"
    keep = [ln for ln in out.splitlines() if ln.startswith(("#", "Thread"))]
    if not keep:  # (no stack: say why, from what gdb printed, and what the kernel says of each thread)
        keep = (out + (got.stderr if got else "")).splitlines()[-12:] + kernel_view(pid)
    print(f"process {pid} hung; its threads' stacks:\n" + "\n".join(keep), file=sys.stderr, flush=True)


def kernel_view(pid) -> list[str]:
    """Each thread's state, wait channel, syscall line and kernel stack from /proc: what is left
    to see when gdb cannot attach (a thread stuck in the kernel keeps ptrace from stopping it;
    seen once, a yappi cell's dlopen under ASan, when gdb timed out after 60 s)."""
    out = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError as exc:
        return [f"/proc/{pid}/task: {exc}"]
    for tid in tids:
        def read(name):
            try:
                with open(f"/proc/{pid}/task/{tid}/{name}") as f:
                    return f.read().strip()
            except OSError as exc:
                return f"({exc.strerror})"
        stat = read("stat")
        state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
        out.append(f"thread {tid} {read('comm')!r} state {state} wchan {read('wchan')!r} syscall {read('syscall')!r}")
        out += ["    " + line for line in read("stack").splitlines()[:12]]
    return out


# ---- the other tools ---------------------------------------------------------------------------
class Tool:
    """Another user of the interpreter's hooks.  ``run(fn)`` starts it, calls fn, stops it."""

    name = "?"
    words: tuple = ()  # what a refusal of ours must name to be acceptable

    def start(self):
        pass

    def stop(self):
        pass

    def run(self, fn):
        self.start()
        try:
            fn()
        finally:
            self.stop()

    def progress(self):
        """A counter that grows while the tool works (None: not observable)."""
        return None

    def problems(self):
        """What is wrong with the tool's own results, checked after the cell."""
        return []


class Nothing(Tool):
    name = "nothing"


class Tracemalloc(Tool):
    name = "tracemalloc"
    words = ("tracemalloc", "allocator")

    def start(self):
        import tracemalloc

        self.probe = None
        tracemalloc.start()

    def stop(self):
        import tracemalloc

        self.probe = [bytearray(1000) for _ in range(200)]  # traced (by us or them) just before stop
        self.snapshot = tracemalloc.take_snapshot()
        tracemalloc.stop()

    def problems(self):
        here = [t for t in self.snapshot.traces if t.traceback[0].filename == __file__]
        if len(here) < 100:
            return [f"tracemalloc snapshot: {len(here)} traces from {__file__} (of {len(self.snapshot.traces)}), "
                    "expected >= 100"]
        return []


class _NamesTool(Tool):
    """A tool whose results name the functions it saw: ``workload`` must be among them."""

    def names(self):
        raise NotImplementedError

    def problems(self):
        names = self.names()
        if "workload" not in names:
            return [f"{self.name}: workload not in its results ({len(names)} functions)"]
        return []


class CProfile(_NamesTool):
    name = "cProfile"
    words = ("cProfile", "setprofile", "monitoring")

    def start(self):
        import cProfile

        self.pr = cProfile.Profile()
        self.pr.enable()

    def stop(self):
        self.pr.disable()

    def names(self):
        import pstats

        return {k[2] for k in pstats.Stats(self.pr).stats}


class PyProfile(_NamesTool):
    name = "profile"
    words = ("setprofile", "profile module")

    def run(self, fn):
        import profile

        # (runcall: the pure-Python profiler asserts on returns from frames it never saw entered)
        self.pr = profile.Profile()
        self.pr.runcall(fn)

    def names(self):
        self.pr.create_stats()
        return {k[2] for k in self.pr.stats}


class SysMonitoring(_NamesTool):
    """A bare sys.monitoring tool id (3.12+) counting PY_START events."""

    name = "sys.monitoring"
    words = ("monitoring",)

    def start(self):
        mon = sys.monitoring
        self.seen, self.calls = set(), 0
        self.tool = next(i for i in (3, 4) if mon.get_tool(i) is None)
        mon.use_tool_id(self.tool, "coexist-test")
        mon.register_callback(self.tool, mon.events.PY_START, self._on_start)
        mon.set_events(self.tool, mon.events.PY_START)

    def _on_start(self, code, offset):
        self.calls += 1
        self.seen.add(code.co_name)

    def stop(self):
        mon = sys.monitoring
        mon.set_events(self.tool, 0)
        mon.register_callback(self.tool, mon.events.PY_START, None)
        mon.free_tool_id(self.tool)

    def progress(self):
        return self.calls

    def names(self):
        return self.seen


class Coverage(Tool):
    """coverage.py with the core COVERAGE_CORE names (the test sets it: ctrace or sysmon)."""

    name = "coverage"
    words = ("coverage", "settrace", "monitoring")

    def start(self):
        import coverage

        self.cov = coverage.Coverage(data_file=None, config_file=False)
        self.cov.start()

    def stop(self):
        self.cov.stop()

    def problems(self):
        out = []
        core = dict(self.cov.sys_info()).get("core")
        want = {"sysmon": "SysMonitor", "ctrace": "CTracer"}.get(os.environ.get("COVERAGE_CORE", ""), core)
        if core != want:
            out.append(f"coverage ran with core {core}, not {want}")
        lines = self.cov.get_data().lines(os.path.abspath(__file__)) or []
        body = workload.__code__.co_firstlineno + 2  # `events = set(events)`
        if body not in lines:
            out.append(f"coverage: line {body} of workload not measured ({len(lines)} lines measured)")
        return out


# How long a forked child that segfaults on purpose may take to die.  Under ASan it dies only
# after ASan's symbolized report of the re-raised SIGSEGV: 2.4-3.6 s each at load 15 on 2 cores.
CRASH_WAIT_S = 15 if SANITIZED else 5


class Faulthandler(Tool):
    """faulthandler.enable() plus dump_traceback_later with a 20 ms repeat."""

    name = "faulthandler"
    words = ("faulthandler", "SIGSEGV", "SIGBUS")

    def start(self):
        import faulthandler

        # a named crash file when the harness gives one: it reads it after a SIGSEGV (see
        # test_coexist_matrix.run_cells on faulthandler's own watchdog crashes)
        where = os.environ.get("COEXIST_CRASH_FILE")
        self.crash = open(where, "w+") if where else tempfile.TemporaryFile("w+")
        self.dumps = tempfile.TemporaryFile("w+")
        faulthandler.enable(file=self.crash, all_threads=True)
        faulthandler.dump_traceback_later(0.02, repeat=True, file=self.dumps)

    def stop(self):
        import faulthandler

        # on a loaded machine the watchdog thread may run late: give it up to 3 s for the
        # second dump problems() asks for (one that never comes still fails there)
        deadline = time.monotonic() + 3
        while self.dump_count() < 2 and time.monotonic() < deadline:
            burn(0.02)
        faulthandler.cancel_dump_traceback_later()

    def dump_count(self):
        fd = self.dumps.fileno()  # pread: faulthandler writes at the file's offset
        return os.pread(fd, os.fstat(fd).st_size, 0).count(b"Timeout (")

    def progress(self):
        return os.fstat(self.dumps.fileno()).st_size  # faulthandler writes to the fd directly

    def problems(self):
        import faulthandler

        out = []
        self.dumps.seek(0)
        text = self.dumps.read()
        if text.count("Timeout (") < 2 or "workload" not in text:
            out.append(f"faulthandler: {text.count('Timeout (')} periodic dumps, workload "
                       f"{'' if 'workload' in text else 'not '}in them")
        if not faulthandler.is_enabled():
            out.append("faulthandler is no longer enabled")
        # its fatal-signal handler still catches a crash: a forked child segfaults on purpose
        pid = os.fork()
        if pid == 0:
            import resource  # a crash on purpose: no core file in the tester's directory
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            ctypes.string_at(0)
            os._exit(99)
        status = wait_child(pid, CRASH_WAIT_S)
        self.crash.seek(0)
        report = self.crash.read()
        if status is None:
            out.append(f"a segfaulting (forked) child never died: stuck in a SIGSEGV handler for "
                       f"{CRASH_WAIT_S} s")
        elif not (os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGSEGV, signal.SIGABRT)):
            out.append(f"the crashing child ended with status {status}")
        elif "Segmentation fault" not in report and not SANITIZED:
            out.append("faulthandler's SIGSEGV handler is gone: a segfaulting child printed no traceback "
                       f"(report: {report[:200]!r})")
        # the child's report read, the file is empty again: a later crash's report is its own
        self.crash.seek(0)
        self.crash.truncate()
        faulthandler.disable()
        return out


class Itimer(Tool):
    """A signal-based sampler: a Python handler for ``sig`` driven by setitimer(``which``).
    The previous disposition is saved and restored raw (sigaction), as C-level tools do, so
    whatever handler it displaced (ours, possibly) is put back exactly."""

    sig, which = signal.SIGPROF, signal.ITIMER_PROF
    name = "itimer_prof"
    words = ("SIGPROF",)

    def __init__(self):
        self.calls = 0

    def _handler(self, signum, frame):
        self.calls += 1

    def start(self):
        self.saved = raw_sigaction(self.sig)
        signal.signal(self.sig, self._handler)
        signal.setitimer(self.which, 0.005, 0.005)

    def stop(self):
        # a short cell on a loaded machine may see no timer expiry yet: wait for the first
        # one (at most 0.3 s of CPU), so "never called" means the handler is really cut off
        t0 = time.thread_time()
        while self.calls == 0 and time.thread_time() - t0 < 0.3:
            burn(0.01)
        signal.setitimer(self.which, 0)
        raw_sigaction(self.sig, self.saved)

    def progress(self):
        return self.calls

    def problems(self):
        return [] if self.calls else [f"{self.name}: the {self.sig.name} handler was never called"]


class ItimerReal(Itimer):
    sig, which = signal.SIGALRM, signal.ITIMER_REAL
    name = "itimer_real"
    words = ("SIGALRM",)


class Yappi(_NamesTool):
    name = "yappi"
    words = ("yappi", "setprofile", "monitoring")

    def start(self):
        import yappi

        yappi.set_clock_type("cpu")
        yappi.start()

    def stop(self):
        import yappi

        yappi.stop()
        self._names = {f.name for f in yappi.get_func_stats()}
        yappi.clear_stats()

    def names(self):
        return self._names


class Pyinstrument(_NamesTool):
    name = "pyinstrument"
    words = ("pyinstrument", "setprofile", "monitoring")

    def start(self):
        import pyinstrument

        self.pr = pyinstrument.Profiler(interval=0.002)
        self.pr.start()

    def stop(self):
        self.pr.stop()

    def names(self):
        out, todo = set(), [self.pr.last_session.root_frame()]
        while todo:
            fr = todo.pop()
            if fr is not None:
                out.add(fr.function)
                todo.extend(fr.children)
        return out


class Memray(Tool):
    name = "memray"
    words = ("memray", "allocator", "malloc")

    def __init__(self):
        self.path = os.path.join(tempfile.mkdtemp(prefix="coexist_memray_"), "capture.bin")

    def run(self, fn):
        import memray

        with memray.Tracker(destination=memray.FileDestination(self.path, overwrite=True)):
            fn()
            # a 3 MB malloc it must see (a CPU-only cell may malloc nothing memray would record)
            probe = bytearray(3_000_000)
            del probe

    def problems(self):
        import memray

        try:
            sizes = [r.size for r in memray.FileReader(self.path).get_allocation_records()]
        finally:
            shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)
        return [] if any(n >= 3_000_000 for n in sizes) else [
            f"memray did not record the 3 MB probe ({len(sizes)} allocations recorded)"]


def storm_libraries(limit=6):
    """Shared objects that dlopen/dlclose really load and unload: stdlib extension modules
    not imported in this process, plus libz/libbz2.  Each is tried once here."""
    import ctypes.util
    import _ctypes

    cands = []
    for path in sorted(glob.glob(os.path.join(sysconfig.get_config_var("DESTSHARED") or "", "*.so")),
                       key=os.path.getsize):
        mod = os.path.basename(path).split(".")[0]
        if mod not in sys.modules and not mod.startswith(("_test", "_xx", "xx", "_tkinter", "_ctypes")):
            cands.append(path)
    cands += [p for p in (ctypes.util.find_library("z"), ctypes.util.find_library("bz2")) if p]
    out = []
    for path in cands:
        try:
            _ctypes.dlclose(ctypes.CDLL(path)._handle)
        except OSError:
            continue
        out.append(path)
        if len(out) >= limit:
            break
    return out


def fresh_extension_specs():
    """Specs of stdlib extension modules that can be imported again and again (multi-phase
    init: each import runs dlopen and the module's init, as a first import does).  Not
    _zoneinfo: on 3.11 each instance freed after the first releases None three times more
    than it took (its static "no ttinfo" is shared), so a storm kills the interpreter
    ("deallocating None") after ~1,300 of them, profiler or not."""
    specs = []
    for name in ("_bisect", "_random", "_heapq", "_statistics", "_struct", "_json", "_csv", "_contextvars",
                 "_queue", "_opcode", "_lsprof", "math", "cmath", "array", "select"):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin in (None, "built-in") or not spec.origin.endswith(".so"):
            continue
        try:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        except Exception:  # noqa: BLE001 - single-phase modules refuse a second instance: skip them
            continue
        specs.append(spec)
    return specs


class LoaderStorm(Tool):
    """Another thread importing extension modules and dlopen/dlclose-ing libraries nonstop."""

    name = "loader_storm"
    words = ("dlopen", "loader", "dl_iterate_phdr")

    def __init__(self):
        self.paths = storm_libraries()
        self.specs = fresh_extension_specs()
        self.count = 0
        self.error = None

    def _loop(self):
        import _ctypes

        i = 0
        try:
            while not self._stop.is_set():
                for path in self.paths:
                    _ctypes.dlclose(ctypes.CDLL(path)._handle)
                if self.specs:
                    spec = self.specs[i % len(self.specs)]
                    spec.loader.exec_module(importlib.util.module_from_spec(spec))
                i += 1
                self.count = i
        except BaseException as exc:  # noqa: BLE001 - reported by problems()
            self.error = f"{type(exc).__name__}: {exc}"

    def start(self):
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="loader-storm", daemon=True)
        self.thread.start()
        t0 = time.monotonic()
        while self.count < 2 and self.error is None and time.monotonic() - t0 < 5:
            time.sleep(0.001)  # the storm is under way before anything else happens

    def stop(self):
        self._stop.set()
        self.thread.join(10)

    def progress(self):
        return self.count

    def problems(self):
        out = []
        if self.thread.is_alive():
            out.append("the loader storm thread is stuck (still alive 10 s after it was told to stop)")
        if self.error:
            out.append(f"the loader storm failed: {self.error}")
        if self.count < 2:
            out.append(f"the loader storm ran {self.count} rounds")
        return out


TOOLS = {cls.name: cls for cls in (Tracemalloc, CProfile, PyProfile, SysMonitoring, Coverage, Faulthandler, Itimer,
                                   ItimerReal, Yappi, Pyinstrument, Memray, LoaderStorm)}


# ---- the matrix ------------------------------------------------------------------------------
ORDERS = [  # (ours starts first, ours stops first)
    (True, True),    # interleaved: ours, theirs, stop ours, stop theirs
    (True, False),   # ours around theirs
    (False, True),   # theirs around ours
    (False, False),  # interleaved: theirs, ours, stop theirs, stop ours
]


def order_label(ours_start_first, ours_stop_first):
    return (f"start:{'ours' if ours_start_first else 'theirs'}-first/"
            f"stop:{'ours' if ours_stop_first else 'theirs'}-first")


def run_cell(tool, events, ours_start_first, ours_stop_first, native=False):
    """One cell: both profilers around ``workload(events)`` in the given orders; the list of
    problems (empty: the cell passes) and whether ours was refused."""
    KEPT.clear()
    ours = Ours(events, native=native)
    tail = {}

    def middle():
        if not ours_start_first:
            ours.start()
        workload(events)
        if ours_stop_first:
            ours.stop()
            before = tool.progress()
            if before is not None:
                # the other tool goes on working after our stop (signals, dumps, loads)
                burn(0.06)
                tail["grew"] = tool.progress() - before

    try:
        if ours_start_first:
            ours.start()
        tool.run(middle)
    finally:
        ours.stop()  # (no-op when it already stopped inside)

    problems = []
    if ours.refused:
        problems += refusal_problems(ours.refused, tool.words)
    else:
        problems += profile_problems(ours.profile, events, tool.words, native)
    if tail.get("grew") == 0:
        problems.append(f"{tool.name} stopped working after our session stopped")
    problems += tool.problems()
    return {"problems": problems, "refused": ours.refused}


def run_matrix(tool_name, set_name, cells=(0, 1, 2, 3)):
    """The cells ``cells`` (indexes into ORDERS) of ``tool_name`` beside ddprof_nb for one
    event set, then a fresh session of ours alone.  Each outcome is emitted as soon as it is
    known; the first failing cell ends the run (after the fresh session), so that the cells
    after it can be run again in a clean interpreter instead of inheriting its mess."""
    events = EVENT_SETS[set_name]
    native = set_name in NATIVE_SETS
    for index in cells:
        label = order_label(*ORDERS[index])
        print(f"CELL {label} ...", flush=True)
        t0 = time.monotonic()
        try:
            res = run_cell(TOOLS[tool_name](), events, *ORDERS[index], native=native)
        except Exception:  # noqa: BLE001 - a cell's exception is its failure
            res = {"problems": ["exception: " + traceback.format_exc(limit=6)], "refused": None}
        res["seconds"] = round(time.monotonic() - t0, 2)
        emit(**{label: res})
        if res["problems"]:
            break
    print("CELL fresh session ...", flush=True)
    try:
        res = run_cell(Nothing(), events, True, False, native=native)
    except Exception:  # noqa: BLE001
        res = {"problems": ["exception: " + traceback.format_exc(limit=6)], "refused": None}
    if res["refused"]:
        res["problems"].append(f"a fresh session alone was refused: {res['refused']}")
    emit(fresh=res)
