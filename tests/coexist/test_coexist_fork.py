"""fork() after a hooked library was unloaded during a session.

The wait and C-allocation hooks write into other objects' GOT slots, and a fork child puts
every slot back at once.  A library loaded during a session (an event-loop or networking
library through ctypes), hooked at a tick, then unloaded (its only reference) leaves patch
records whose memory is gone: the child must skip them, never write there.  multiprocessing,
subprocess-heavy code and Dask all fork this way.  Each scenario runs in its own interpreter.
"""

from __future__ import annotations

import glob
import os

import pytest

from c_extensions import build
from coexist_helpers import SANITIZED, run_snippet

# imports a wait of every kind the hooks group (poll, recv, nanosleep) and the C allocator
HOOKED_SOURCE = r"""
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
int hooked_poll(int ms) { return poll(0, 0, ms); }
long hooked_recv(int fd) { char b[4]; return recv(fd, b, 4, MSG_DONTWAIT); }
int hooked_sleep(long ns) { struct timespec t = {0, ns}; return nanosleep(&t, 0); }
void *hooked_malloc(size_t n) { return malloc(n); }
void hooked_free(void *p) { free(p); }
"""


@pytest.fixture(scope="module")
def hooked_library(tmp_path_factory):
    out = build(tmp_path_factory.mktemp("hooked"), "_ddp_hooked",
                "int hooked_poll(int); long hooked_recv(int); int hooked_sleep(long); void *hooked_malloc(size_t);"
                "void hooked_free(void *);", HOOKED_SOURCE)
    return glob.glob(os.path.join(out, "_ddp_hooked*.so"))[0]


SNIPPET = """
import ctypes, _ctypes
from ddprof_nb.engines.native import binding as _b
lib, ffi = _b.lib, _b.ffi

def hooked_slots(lister, wrapper_of, lo, hi):
    n = lister(ffi.NULL, ffi.NULL, ffi.NULL, 0) + 64
    a, v, k = ffi.new("uint64_t[]", n), ffi.new("uint64_t[]", n), ffi.new("int32_t[]", n)
    n = min(n, lister(a, v, k, n))
    return sum(1 for i in range(n) if lo <= a[i] < hi and v[i] == wrapper_of(k[i]))

def mapped(path):
    lo = hi = None
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith(path):
            a, b = (int(x, 16) for x in line.split()[0].split("-"))
            lo, hi = min(lo or a, a), max(hi or b, b)
    return (lo, hi) if lo is not None else None

path = {path!r}
with ddprof_nb.profile(events={events!r}, interval="10ms") as h:
    handle = ctypes.CDLL(path)
    where = mapped(path)
    t0, waits, allocs = time.monotonic(), 0, 0
    while time.monotonic() - t0 < 10:  # hooked at the sampler's next tick
        waits = hooked_slots(lib.ddp_wait_slots, lib.ddp_wait_wrapper, *where)
        allocs = hooked_slots(lib.ddp_nalloc_slots, lib.ddp_nalloc_wrapper, *where)
        if (waits or not {want_waits}) and (allocs or not {want_allocs}):
            break
        time.sleep(0.01)
    emit(waits_hooked=waits, allocs_hooked=allocs)
    # its only reference goes: the loader unmaps it
    _ctypes.dlclose(handle._handle)
    del handle
    emit(unmapped=mapped(path) is None)
    statuses = []
    for _ in range(5):
        pid = os.fork()
        if pid == 0:  # the child runs on the original functions: a sleep, an allocation, exit
            time.sleep(0.001)
            bytearray(1 << 16)
            os._exit(0)
        statuses.append(os.waitpid(pid, 0)[1])
    emit(statuses=statuses)
    # the parent's session goes on and still records
    park_workload()
emit(done=True, park_seen="park_workload" in functions(h.profile, "park") if "park" in {events!r} else True)
"""


@pytest.mark.lockpark
@pytest.mark.parametrize("events", [("lock", "park"), ("alloc",), ("cpu", "wall", "alloc", "live", "lock", "park")],
                         ids=["lock-park", "alloc", "all"])
def test_child_forked_after_a_hooked_library_was_unloaded_lives(hooked_library, events):
    want_waits = "park" in events and not SANITIZED  # (libasan owns the wait slots: nothing hooked)
    want_allocs = "alloc" in events and not SANITIZED
    # GIVEN a session that hooked a library loaded during it, and that library unloaded since
    # WHEN the process forks five times
    run = run_snippet(SNIPPET.format(path=hooked_library, events=events, want_waits=want_waits,
                                     want_allocs=want_allocs), timeout=60)
    r = run.ok()
    # (the scenario happened: the library's slots were ours, then its memory went away)
    assert not want_waits or r["waits_hooked"] > 0, r
    assert not want_allocs or r["allocs_hooked"] > 0, r
    assert r["unmapped"], r
    # THEN every child lived and exited 0, and the parent's session still recorded after it
    assert r["statuses"] == [0] * 5, run.report()
    assert r["done"] and r["park_seen"], r


# A library whose constructor holds the loader's main lock (as a slow dlopen does) until it is
# told to go on, and a driver that loads it from a C thread (no GIL held meanwhile).
SLOW_SOURCE = r"""
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
int slow_poll(int ms) { return poll(0, 0, ms); }  /* an import the wait hooks resolve with dlvsym */
__attribute__((constructor)) static void slow_init(void)
{
    const char *dir = getenv("DDP_TEST_SLOW_DIR");
    char path[4096];
    if (!dir)
        return;
    strcpy(path, dir); strcat(path, "/in_ctor");
    close(open(path, O_CREAT | O_WRONLY, 0600));
    strcpy(path, dir); strcat(path, "/release");
    for (int i = 0; i < 500 && access(path, F_OK) != 0; i++) {  /* at most 5 s */
        struct timespec t = {0, 10000000};
        syscall(SYS_nanosleep, &t, NULL);  /* (a raw syscall: no hooked import) */
    }
}
"""
DRIVER_SOURCE = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
static char slow_path[4096];
static pthread_t loader;
static void *load(void *arg) { (void)arg; dlopen(slow_path, RTLD_NOW | RTLD_LOCAL); return NULL; }
int start_load(const char *p) { strncpy(slow_path, p, sizeof slow_path - 1); return pthread_create(&loader, NULL, load, NULL); }
void join_load(void) { pthread_join(loader, NULL); }
"""


@pytest.fixture(scope="module")
def slow_library(tmp_path_factory):
    out = tmp_path_factory.mktemp("slowload")
    for name, cdef, src in (("_ddp_slowlib", "int slow_poll(int);", SLOW_SOURCE),
                            ("_ddp_slowdrv", "int start_load(const char *); void join_load(void);", DRIVER_SOURCE)):
        build(out, name, cdef, src)
    return str(out), glob.glob(os.path.join(out, "_ddp_slowlib*.so"))[0]


@pytest.mark.lockpark
def test_fork_never_waits_for_a_patch_pass_stuck_in_the_loader(slow_library, tmp_path):
    # A patch pass resolves the imports it found with dlvsym, which waits for the loader's main
    # lock; a dlopen'ed constructor holds that lock (and may call pthread_atfork, which glibc
    # before 2.36 makes wait for a fork's prepare handlers).  Fork must not wait for that pass.
    drv_dir, slow = slow_library
    run = run_snippet(f"""
        sys.path.insert(0, {drv_dir!r})
        from _ddp_slowdrv import lib as drv
        d = {str(tmp_path)!r}
        with ddprof_nb.profile(events=("lock", "park"), interval="10ms") as h:
            time.sleep(0.05)
            # GIVEN a C thread inside dlopen, its constructor holding the loader's lock
            drv.start_load({slow!r}.encode())
            t0 = time.monotonic()
            while not os.path.exists(d + "/in_ctor") and time.monotonic() - t0 < 10:
                time.sleep(0.005)
            time.sleep(0.2)  # the sampler's tick sees the new object and its pass waits in dlvsym
            # WHEN the process forks
            t0 = time.monotonic()
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            fork_s = time.monotonic() - t0
            open(d + "/release", "w").close()
            status = os.waitpid(pid, 0)[1]
            drv.join_load()
        emit(fork_s=fork_s, status=status, in_ctor=os.path.exists(d + "/in_ctor"))
        """, timeout=60, env={"DDP_TEST_SLOW_DIR": str(tmp_path)})
    r = run.ok()
    assert r["in_ctor"], r
    # THEN fork returns at once (it waited for the constructor's 5 s before) and the child lives
    assert r["fork_s"] < 2.0, r
    assert r["status"] == 0, r


# A C signal handler that waits (poll through a hooked GOT slot), and a per-thread timer that
# fires it every few microseconds at the thread that armed it.
SIGPOLL_SOURCE = r"""
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static volatile long handled;
static void on_signal(int sig) { (void)sig; poll(0, 0, 0); handled++; }
int install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    return sigaction(SIGURG, &sa, 0);
}
static __thread timer_t me;
int arm(long period_ns)
{
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = SIGURG;
    ev._sigev_un._tid = (int)syscall(SYS_gettid);
    if (timer_create(CLOCK_MONOTONIC, &ev, &me) != 0)
        return -1;
    struct itimerspec it = {{0, period_ns}, {0, period_ns}};
    return timer_settime(me, 0, &it, 0);
}
void disarm(void) { timer_delete(me); }
long handled_count(void) { return handled; }
"""


@pytest.fixture(scope="module")
def sigpoll_library(tmp_path_factory):
    return build(tmp_path_factory.mktemp("sigpoll"), "_ddp_sigpoll",
                 "int install(void); int arm(long); void disarm(void); long handled_count(void);",
                 SIGPOLL_SOURCE, libraries=["rt"])


@pytest.mark.lockpark
def test_a_signal_handler_that_waits_inside_a_threads_first_wait_never_deadlocks(sigpoll_library):
    # A thread's first recorded wait claims its in-flight entry; a C signal handler that waits
    # (poll) interrupting that claim claims again on the same thread: with a mutex there it hung.
    run = run_snippet(f"""
        sys.path.insert(0, {sigpoll_library!r})
        from _ddp_sigpoll import lib as sp
        sp.install()
        def first_wait(arm):
            if arm:
                sp.arm(20000)  # every 20 us at this thread
            time.sleep(0)      # its first hooked wait: the claim
            if arm:
                sp.disarm()
        with ddprof_nb.profile(events=("lock", "park"), interval="10ms") as h:
            time.sleep(0.05)  # (the handler's library is hooked at a tick)
            # GIVEN thousands of entries claimed (each claim scans them: a wider window)
            for _ in range(30):
                ts = [threading.Thread(target=first_wait, args=(False,)) for _ in range(100)]
                [t.start() for t in ts]; [t.join() for t in ts]
            # WHEN new threads make their first wait under a storm of waiting signal handlers
            t0 = time.monotonic()
            for _ in range(300):
                t = threading.Thread(target=first_wait, args=(True,))
                t.start(); t.join(10)
                if t.is_alive():
                    emit(hung=True)
                    os._exit(3)
            emit(storm_s=time.monotonic() - t0, handled=sp.handled_count())
        emit(done=True)
        """, timeout=120)
    # THEN every thread finished (no deadlock) and the handlers really ran meanwhile
    r = run.ok()
    assert r["done"] and r["handled"] > 300, r
