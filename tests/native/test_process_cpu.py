"""The CPU the profile does not hold is named: threads that run no Python (a library's own
pthreads, as BLAS and OpenMP pools are), measured from their run time, in a note."""

from __future__ import annotations

import re

import pytest

from ddprof_nb.render.notes import is_warning

from c_extensions import build
from nhelpers import run_script

POOL_SOURCE = r"""
#include <pthread.h>
#include <string.h>
#include <time.h>
static double burn_s;
static void *burn(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "testpool");
    struct timespec t0, t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    volatile double x = 0;
    do {
        for (int i = 0; i < 100000; i++)
            x += i * 0.5;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9 < burn_s);
    return NULL;
}
/* n pthreads each burning `seconds` of CPU; the caller waits for them (the GIL released) */
void pool_run(int n, double seconds)
{
    pthread_t th[16];
    burn_s = seconds;
    for (int i = 0; i < n && i < 16; i++)
        pthread_create(&th[i], NULL, burn, NULL);
    for (int i = 0; i < n && i < 16; i++)
        pthread_join(th[i], NULL);
}
/* a pool that stays (as BLAS and OpenMP pools do): its threads burn, then idle until released */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int burned, released;
static pthread_t kept[16];
static int nkept;
static void *burn_and_stay(void *arg)
{
    burn(arg);
    pthread_mutex_lock(&mu);
    burned++;
    pthread_cond_broadcast(&cv);
    while (!released)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return NULL;
}
void pool_burn_and_stay(int n, double seconds)
{
    burn_s = seconds;
    burned = released = 0;
    for (nkept = 0; nkept < n && nkept < 16; nkept++)
        pthread_create(&kept[nkept], NULL, burn_and_stay, NULL);
    pthread_mutex_lock(&mu);
    while (burned < nkept)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}
void pool_release(void)
{
    pthread_mutex_lock(&mu);
    released = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < nkept; i++)
        pthread_join(kept[i], NULL);
}
"""


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory):
    return build(tmp_path_factory.mktemp("pool"), "_ddp_pool",
                 "void pool_run(int n, double seconds); void pool_burn_and_stay(int n, double seconds); void pool_release(void);",
                 POOL_SOURCE, libraries=["pthread"])


def _seconds(text: str) -> float:
    value, unit = re.match(r"([\d.]+) *(ns|µs|us|ms|s)\b", text).groups()
    return float(value) * {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def _coverage_notes(pool_dir: str, work: str, after: str = "", native_threads: str = "off") -> list[str]:
    """The coverage notes of a CPU session around ``work`` (Python lines; ``pool`` is the C
    pool library), ``after`` run once the session stopped."""
    r = run_script(f"""
        sys.path.insert(0, {pool_dir!r})
        from _ddp_pool import lib as pool
        e = NativeEngine(SamplerConfig.make(events=("cpu",), native_threads={native_threads!r}))
        e.start()
        {work}
        p = e.stop()
        {after}
        emit(notes=[n for n in p.metadata.notes if n.startswith("cpu: the profile holds")])
        """)
    return r["notes"]


def test_cpu_of_threads_that_run_no_python_is_named_in_a_note(pool_dir):
    # GIVEN a library's own pool (its threads outlive the call) burning 2 x 0.4 s of CPU
    # while the Python caller waits
    notes = _coverage_notes(pool_dir, "burn(0.2); pool.pool_burn_and_stay(2, 0.4)", after="pool.pool_release()")
    # THEN one note says how much of the process's CPU the profile holds, and names the pool
    (note,) = notes
    m = re.search(r"; ([\d.]+ *\S+) ran on threads that run no Python, not in this profile \(testpool ×2 ([\d.]+ *\S+)", note)
    assert m, note
    # AND its CPU is what the pool burned (0.8 s), within 10 %
    assert abs(_seconds(m.group(2)) - 0.8) <= 0.08, note
    # AND the summary counts it as a warning (the profile is less than what ran)
    assert is_warning(note), note


def test_no_note_when_the_profile_holds_the_process_cpu(pool_dir):
    # GIVEN only Python threads burning CPU
    notes = _coverage_notes(pool_dir, "ts = [threading.Thread(target=burn, args=(0.3,)) for _ in range(2)]; "
                            "[t.start() for t in ts]; burn(0.3); [t.join() for t in ts]")
    # THEN the profile holds it all and says nothing about other threads
    assert notes == [], notes


def test_cpu_of_native_threads_that_ended_during_the_session_is_counted(pool_dir):
    # GIVEN a library that starts its threads per call (2 x 0.4 s of CPU) and joins them
    (note,) = _coverage_notes(pool_dir, "burn(0.2); pool.pool_run(2, 0.4)")
    # THEN the note says that much went to threads that ended outside the profile
    m = re.search(r"; ([\d.]+ *\S+) went to threads that ended before stop outside the profile", note)
    assert m and abs(_seconds(m.group(1)) - 0.8) <= 0.08, note


@pytest.mark.parametrize("work,after", [
    ("burn(0.2); pool.pool_burn_and_stay(2, 0.4)", "pool.pool_release()"),  # a pool that stays
    ("burn(0.2); pool.pool_run(2, 0.4)", ""),  # threads started and ended per call
])
def test_no_note_when_threads_that_run_no_python_are_sampled(pool_dir, work, after):
    # GIVEN the same pools, with native_threads on: their CPU is in the profile
    notes = _coverage_notes(pool_dir, work, after=after, native_threads="attribute")
    # THEN nothing is said about CPU outside the profile
    assert notes == [], notes


def test_the_profilers_threads_are_named_as_ours_though_gone_before_the_notes():
    # GIVEN a session (its wall thread, which builds the unwind tables of libraries loaded meanwhile,
    #   is joined at stop, before the notes are written)
    r = run_script("""
        e = NativeEngine(SamplerConfig.make(events=("cpu",)))
        e.start()
        burn(0.05)
        e.stop()
        emit(names=sorted(name for name, _ in e._cpu_at[1].threads.values()))
        """)
    # THEN the stop's snapshot has its name: its CPU is the profiler's own in the coverage note,
    #   not a "thread <tid>" that ran no Python (before: unnamed, and read as such once gone)
    assert "ddprof_nb-wall" in r["names"], r["names"]
