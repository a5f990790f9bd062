"""Threads that run no Python (a C extension's pthreads, BLAS and OpenMP pools): their CPU is
sampled on their own CPU clocks and put under the Python line that asked for the work."""

from __future__ import annotations

import pytest

from c_extensions import build
from nhelpers import run_script

# each judges the profile's CPU against the process's within 5 %: seen failing beside other
# tests (5.4 % in CI's two-at-a-time phase; the raw view at load 10)
pytestmark = pytest.mark.alone

POOL_SOURCE = r"""
#include <pthread.h>
#include <signal.h>
#include <time.h>
static double burn_s;
static double cpu_now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void *burn(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "ntpool");
    double t0 = cpu_now();
    volatile double x = 0;
    while (cpu_now() - t0 < burn_s)
        for (int i = 0; i < 100000; i++)
            x += i * 0.5;
    return NULL;
}
/* n pthreads started for this call, each burning `seconds` of CPU; the caller waits */
void pool_run(int n, double seconds)
{
    pthread_t th[64];
    burn_s = seconds;
    for (int i = 0; i < n && i < 64; i++)
        pthread_create(&th[i], NULL, burn, NULL);
    for (int i = 0; i < n && i < 64; i++)
        pthread_join(th[i], NULL);
}
/* the same, but the caller returns at once: the work goes on with no caller inside */
static pthread_t bg[64];
static int nbg;
void pool_start(int n, double seconds)
{
    burn_s = seconds;
    for (nbg = 0; nbg < n && nbg < 64; nbg++)
        pthread_create(&bg[nbg], NULL, burn, NULL);
}
void pool_join(void)
{
    for (int i = 0; i < nbg; i++)
        pthread_join(bg[i], NULL);
}
/* a C library's callback thread: it runs a Python callback (a thread state of its own, made and
 * deleted around the call), then C work of its own; the caller waits */
static PyObject *callback;
static void *call_then_burn(void *arg)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallObject(callback, NULL);
    Py_XDECREF(r);
    PyGILState_Release(g);
    return burn(arg);
}
void pool_callback_then_burn(void *cb, double seconds)
{
    pthread_t th;
    callback = (PyObject *)cb;
    burn_s = seconds;
    pthread_create(&th, NULL, call_then_burn, NULL); /* (cffi calls us without the GIL) */
    pthread_join(th, NULL);
}
/* n idle threads (an idle pool: blocked on a condition variable) until released */
static pthread_t held[512];
static int nheld, release_held;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static void *idle(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    while (!release_held)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return NULL;
}
void pool_hold(int n)
{
    release_held = 0;
    for (nheld = 0; nheld < n && nheld < 512; nheld++)
        pthread_create(&held[nheld], NULL, idle, NULL);
}
void pool_unhold(void)
{
    pthread_mutex_lock(&mu);
    release_held = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < nheld; i++)
        pthread_join(held[i], NULL);
}
/* a pool whose threads block every signal (numexpr's does, so that Ctrl-C reaches the main
 * thread): started once, idle on a condition variable between calls */
static pthread_t mth[8];
static int nm, mdone, mquit;
static unsigned mgo;
static double mseconds;
static pthread_cond_t mgo_cv = PTHREAD_COND_INITIALIZER, mdone_cv = PTHREAD_COND_INITIALIZER;
static void spin(double seconds)
{
    double t0 = cpu_now();
    volatile double x = 0;
    while (cpu_now() - t0 < seconds)
        for (int i = 0; i < 100000; i++)
            x += i * 0.5;
}
static void *masked_worker(void *arg)
{
    unsigned seen = 0;
    (void)arg;
    pthread_setname_np(pthread_self(), "maskpool");
    for (;;) {
        pthread_mutex_lock(&mu);
        while (mgo == seen && !mquit)
            pthread_cond_wait(&mgo_cv, &mu);
        if (mquit) {
            pthread_mutex_unlock(&mu);
            return NULL;
        }
        seen = mgo;
        pthread_mutex_unlock(&mu);
        spin(mseconds);
        pthread_mutex_lock(&mu);
        mdone++;
        pthread_cond_broadcast(&mdone_cv);
        pthread_mutex_unlock(&mu);
    }
}
static void start_masked(pthread_t *th, void *(*fn)(void *))
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_create(th, NULL, fn, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}
void masked_start(int n)
{
    mquit = 0;
    for (nm = 0; nm < n && nm < 8; nm++)
        start_masked(&mth[nm], masked_worker);
}
/* each of the pool's threads burns `seconds` of its CPU; the caller waits */
void masked_run(double seconds)
{
    pthread_mutex_lock(&mu);
    mseconds = seconds, mdone = 0, mgo++;
    pthread_cond_broadcast(&mgo_cv);
    while (mdone < nm)
        pthread_cond_wait(&mdone_cv, &mu);
    pthread_mutex_unlock(&mu);
}
void masked_stop(void)
{
    pthread_mutex_lock(&mu);
    mquit = 1;
    pthread_cond_broadcast(&mgo_cv);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < nm; i++)
        pthread_join(mth[i], NULL);
}
"""

OMP_SOURCE = r"""
#include <time.h>
static double cpu_now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
/* every thread of an OpenMP team of n burns `seconds` of its own CPU */
double omp_burn(int n, double seconds)
{
    double total = 0;
    #pragma omp parallel num_threads(n) reduction(+:total)
    {
        double t0 = cpu_now();
        volatile double x = 0;
        while (cpu_now() - t0 < seconds)
            for (int i = 0; i < 100000; i++)
                x += i * 0.5;
        total += x;
    }
    return total;
}
"""


@pytest.fixture(scope="module")
def ext_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("ntpool")
    build(out, "_ddp_ntpool", "void pool_run(int n, double seconds); void pool_start(int n, double seconds);"
           " void pool_join(void); void pool_hold(int n); void pool_unhold(void);"
           " void pool_callback_then_burn(void *cb, double seconds);"
           " void masked_start(int n); void masked_run(double seconds); void masked_stop(void);",
           POOL_SOURCE, libraries=["pthread"])
    build(out, "_ddp_ntomp", "double omp_burn(int n, double seconds);", OMP_SOURCE,
           extra_compile_args=["-fopenmp"], extra_link_args=["-fopenmp"])
    return str(out)


def _session(ext_dir: str, setup: str, work: str, native_threads="attribute", native=False, env=None,
             after: str = "") -> dict:
    """A CPU session around ``work()`` (defined by ``setup``): the process's CPU over the
    session (less its profiler threads' and its drain thread's, ``own``: coverage_notes' rule), the profile's CPU, the CPU under the Python function ``caller`` and under the
    root ``[native threads]``, each stack's frame names, the notes."""
    return run_script(f"""
        sys.path.insert(0, {ext_dir!r})
        {setup}
        def caller():
            {work}
        # a first session builds the unwind tables of the objects loaded (its start-up cost)
        e = NativeEngine(SamplerConfig.make(events=("cpu",), native_threads={native_threads!r})); e.start(); e.stop()
        e = NativeEngine(SamplerConfig.make(events=("cpu",), interval="10ms", native_threads={native_threads!r},
                                            native={native!r}))
        e.start()
        def own_cpu():  # the profiler's own threads and its drain thread (overhead: in no profile)
            ns = 0
            for t in os.listdir("/proc/self/task"):
                try:
                    if (int(t) == e._drain_tid
                            or open(f"/proc/self/task/{{t}}/comm").read().startswith("ddprof_nb-")):
                        ns += int(open(f"/proc/self/task/{{t}}/schedstat").read().split()[0])
                except OSError:
                    pass
            return ns
        o0, c0 = own_cpu(), time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)
        caller()
        {after}
        c1, o1 = time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID), own_cpu()
        p = e.stop()
        stacks = collections.Counter()
        under_caller = under_root = profile = 0
        for s in p.samples():
            if s.event is not EventType.CPU:
                continue
            names = [f.name for f in s.stack]
            profile += s.values[1]
            under_caller += s.values[1] * ("caller" in names)
            under_root += s.values[1] * (names[:1] == ["[native threads]"])
            stacks[" ; ".join(names)] += s.values[1]
        emit(process=c1 - c0 - (o1 - o0), own=o1 - o0, profile=profile, caller=under_caller, root=under_root,
             stacks=[[k, v] for k, v in stacks.most_common(20)], notes=list(p.metadata.notes),
             timers_left=timers_of_ours(),
             threads={{t.tid: t.name for t in p.threads}})
        """, timeout=120, env=env)


def _assert_accounted(r, under="caller", share=0.90):
    # the profile holds the process's CPU over the session within 5 % ...
    assert abs(r["profile"] - r["process"]) <= 0.05 * r["process"], (r["profile"], r["process"], r["own"], r["stacks"])
    # ... and at least 90 % of it is under the Python line that asked for the work
    assert r[under] >= share * r["process"], (r[under], r["process"], r["stacks"])


def test_a_callback_threads_python_then_c_work_is_counted_once(ext_dir):
    # GIVEN a pthread born in the session that runs a Python callback burning 0.3 s (its own
    #   thread state, made and deleted around the call), then burns 0.3 s in C, while the caller waits
    r = _session(ext_dir, "from _ddp_ntpool import lib as pool, ffi; py_part = lambda: burn(0.3)",
                 "pool.pool_callback_then_burn(ffi.cast('void *', id(py_part)), 0.3)")
    # THEN the profile holds the process's CPU within 5 % (the Python part counted once: on the
    #   thread as Python, not again as a pool thread's CPU since its birth), its Python part under
    #   the callback
    _assert_accounted(r, share=0.4)
    assert sum(v for k, v in r["stacks"] if "<lambda>" in k) >= 0.8 * 0.3e9, r["stacks"]


def test_a_c_extensions_pthreads_are_under_the_calling_line(ext_dir):
    # GIVEN a C extension that starts 2 pthreads per call, each burning 0.4 s of CPU, while
    # the calling Python thread waits in pthread_join (the GIL released), three calls
    r = _session(ext_dir, "from _ddp_ntpool import lib as pool", "for _ in range(3): pool.pool_run(2, 0.4)")
    # THEN their CPU is in the profile and under the caller (threads that start and end per call included)
    _assert_accounted(r)
    # AND beneath a [pool: <OS thread name>] frame, then the library's one frame (native=False)
    pool = [k for k, _ in r["stacks"] if "[pool: ntpool]" in k]
    assert pool and all(k.endswith("[pool: ntpool] ; [_ddp_ntpool" + k.split("[_ddp_ntpool", 1)[1]) for k in pool), r
    assert all(k.rsplit(" ; ", 1)[-1].startswith("[_ddp_ntpool") for k in pool), pool
    # AND the coverage note (CPU outside the profile) stays quiet, and no timer is left armed
    assert not [n for n in r["notes"] if n.startswith("cpu: the profile holds")], r["notes"]
    assert r["timers_left"] == 0


def test_without_the_option_the_pool_is_outside_the_profile(ext_dir):
    # GIVEN the same work with native threads off (the old behaviour)
    r = _session(ext_dir, "from _ddp_ntpool import lib as pool", "pool.pool_run(2, 0.4)", native_threads="off")
    # THEN the profile misses most of the process's CPU, and the note says so
    assert r["profile"] < 0.6 * r["process"], r
    assert [n for n in r["notes"] if n.startswith("cpu: the profile holds")], r["notes"]


def test_native_frames_of_the_pool_thread_follow_the_pool_frame(ext_dir):
    # GIVEN native=True
    r = _session(ext_dir, "from _ddp_ntpool import lib as pool", "pool.pool_run(2, 0.4)", native=True)
    _assert_accounted(r)
    # THEN the pool's samples go on below [pool: ntpool] with the thread's own frames: its
    # start routine `burn` (the extension's), named from its symbols
    pool = [(k, v) for k, v in r["stacks"] if "[pool: ntpool]" in k]
    assert sum(v for k, v in pool if " ; burn" in k.split("[pool: ntpool]", 1)[1]) >= 0.9 * sum(v for _, v in pool), pool


@pytest.mark.parametrize("native", [False, True])
def test_a_pool_that_blocks_every_signal_is_under_the_calling_line(ext_dir, native):
    # GIVEN a pool started before the session whose 2 threads block every signal (SIGPROF too:
    #   their CPU timers' signals never come), idle between calls; the caller waits in 4 calls,
    #   each thread burning 0.2 s per call
    r = _session(ext_dir, "from _ddp_ntpool import lib as pool; pool.masked_start(2)",
                 "for _ in range(4): pool.masked_run(0.2)", native=native, after="pool.masked_stop()")
    # THEN their CPU is in the profile and under the caller (before: 0 samples, all of it under
    #   [native threads] -> [unknown] -> [cpu not sampled])
    _assert_accounted(r)
    pool = [(k, v) for k, v in r["stacks"] if "[pool: maskpool]" in k]
    assert sum(v for _, v in pool) >= 0.9 * 1.6e9, r["stacks"]
    # AND below the pool frame, the thread's entry point, then the frame that says why no deeper
    tails = {k.split("[pool: maskpool] ; ", 1)[1] for k, _ in pool}
    if native:  # (its start routine, under the C runtime's thread start: unnamed in a stripped libc)
        assert all(t.endswith(" ; masked_worker ; [profiling signal blocked]") for t in tails), tails
    else:
        assert all(t.startswith("[_ddp_ntpool") and t.endswith("] ; [profiling signal blocked]") for t in tails), tails
    assert [n for n in r["notes"] if "2 thread(s) block the profiling signal" in n], r["notes"]


def test_work_with_no_caller_inside_goes_under_native_threads(ext_dir):
    # GIVEN pool threads that burn 2 x 0.5 s after their caller returned, while Python sleeps
    # (joined only after they are done: a join would be a caller inside the library)
    r = _session(ext_dir, "from _ddp_ntpool import lib as pool", "pool.pool_start(2, 0.5)",
                 after="time.sleep(2.5); pool.pool_join()")
    # THEN their CPU is under [native threads] -> [library] -> the thread's name (but for what
    # they burnt right after the call, near their caller's last record in the library: its
    # work, by the rule; 0.12 s of 0.4 s seen at load 7)
    assert r["root"] >= 0.6 * 1.0e9, r["stacks"]
    roots = [k for k, _ in r["stacks"] if k.startswith("[native threads]")]
    assert all(k.split(" ; ")[2] == "ntpool" and k.split(" ; ")[1].startswith("[_ddp_ntpool") for k in roots), roots
    assert any("no Python thread was inside" in n for n in r["notes"]), r["notes"]


def test_raw_view_keeps_each_pool_thread_apart(ext_dir):
    r = _session(ext_dir, "from _ddp_ntpool import lib as pool", "pool.pool_run(2, 0.4)", native_threads="raw")
    # THEN nothing is under the caller but its own CPU; the pool threads are threads of the profile
    assert r["caller"] < 0.2 * r["process"], r["stacks"]
    assert abs(r["profile"] - r["process"]) <= 0.05 * r["process"], r
    assert list(r["threads"].values()).count("ntpool") >= 2, r["threads"]


def test_numpy_matmul_on_two_blas_threads(ext_dir):
    pytest.importorskip("numpy")
    # GIVEN numpy's BLAS with 2 threads (the caller and a pool thread) multiplying matrices
    r = _session(ext_dir, "import numpy as np; a = np.random.rand(1200, 1200); a @ a",
                 "for _ in range(6): a @ a", env={"OPENBLAS_NUM_THREADS": "2"})
    _assert_accounted(r)
    # (the pool thread's work is there: the caller alone would be ~half)
    assert sum(v for k, v in r["stacks"] if "[pool: " in k) >= 0.3 * r["process"], r["stacks"]


def test_an_openmp_loop(ext_dir):
    # GIVEN an OpenMP team of 3 (the caller and 2 pool threads) burning 0.15 s each, 5 times
    r = _session(ext_dir, "from _ddp_ntomp import lib as omp; omp.omp_burn(3, 0.01)",
                 "for _ in range(5): omp.omp_burn(3, 0.15)")
    _assert_accounted(r)
    assert any("[pool: " in k and "[libgomp" in k for k, _ in r["stacks"]), r["stacks"]


def test_threads_beyond_the_bound_are_counted_and_no_timer_outlives_the_session(ext_dir):
    # GIVEN 300 idle native threads alive through a session (the bound is 256 at once), and a
    # pool started per call beside them once they have been idle a while (the table is full)
    r = _session(ext_dir, "from _ddp_ntpool import lib as pool; pool.pool_hold(300)",
                 "time.sleep(1.0); pool.pool_run(2, 0.2)", after="time.sleep(0.1)")
    # THEN the note says threads were beyond the bound, and every timer is gone at stop
    assert any("beyond the 256 sampled at once" in n for n in r["notes"]), r["notes"]
    assert r["timers_left"] == 0
    # AND the pool's threads took the places of idle ones: its CPU is under its caller
    assert r["caller"] >= 0.8 * 0.4e9, r["stacks"]


def test_wall_of_pool_threads_working_goes_under_the_caller_and_idle_time_is_hidden(ext_dir):
    # GIVEN 2 idle pool threads held through a CPU+wall session, and a call that runs 2 pthreads
    #   burning 0.3 s of CPU each while the Python caller waits
    r = run_script(f"""
        sys.path.insert(0, {ext_dir!r})
        from _ddp_ntpool import lib as pool
        from ddprof_nb.explorer.threads import idle_pool_rows
        pool.pool_hold(2)
        def caller():
            pool.pool_run(2, 0.3)
        cfg = dict(events=("cpu", "wall"), interval="10ms", native_threads="attribute")
        e = NativeEngine(SamplerConfig.make(**cfg)); e.start(); e.stop()  # (unwind tables built)
        e = NativeEngine(SamplerConfig.make(**cfg))
        e.start(); t0 = time.monotonic(); caller(); time.sleep(0.2); took = time.monotonic() - t0; p = e.stop()
        pool.pool_unhold()
        me = threading.get_native_id()
        working = other_pool = 0
        idle_stacks = collections.Counter()
        for s in p.samples():
            if s.event is not EventType.WALL or s.thread.tid == me:
                continue
            names = [f.name for f in s.stack]
            if "caller" in names and any(n.startswith("[pool: ") for n in names):
                working += s.values[1]
            elif names[:1] == ["[native threads]"] and s.labels.get("state") == "off-cpu":
                idle_stacks[names[1]] += s.values[1]  # (numpy's BLAS pool idles there too)
            else:
                other_pool += s.values[1]
        rows = idle_pool_rows(p)
        hidden = int(p.values[rows, 1].sum())
        emit(working=working, idle=sum(v for k, v in idle_stacks.items() if k.startswith("[_ddp_ntpool")),
             other=other_pool, hidden=hidden, took=took, idle_all=sum(idle_stacks.values()), main_wall=sum(s.values[1] for s in p.samples()
                                                          if s.event is EventType.WALL and s.thread.tid == me))
        """, timeout=120)
    # THEN the working threads' wall (~0.6 s in all) is under the caller's line, on their own
    #   threads (the caller's wall is its own: ~the session)
    #   (their wall runs from the scan that first saw them to the last: within a tick of each end)
    assert 0.9 * 0.6e9 <= r["working"] <= 2 * r["took"] * 1e9, r
    assert r["main_wall"] <= 1.1 * r["took"] * 1e9 + 0.1e9, r
    # AND the 2 held threads' wall (~2 x the session) is idle time under [native threads] ->
    #   their library, which the explorer hides by default
    assert r["idle"] >= 0.8 * 2 * r["took"] * 1e9, r
    assert r["hidden"] == r["idle_all"], r
