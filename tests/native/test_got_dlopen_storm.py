"""The lock/park GOT hooks beside threads that load and unload libraries nonstop (native/gotpatch.c).

A patch pass must hook the loaded objects even when another thread's dlopen lands inside
every pass (a loader storm on a loaded machine deferred every pass of whole sessions: the
interpreter's sleeps went unseen), and a library unloaded and loaded again at the same
address must be hooked again.  Each scenario runs in a subprocess: a bad patch would crash
the interpreter.  Two small libraries are built for it: a storm driver whose C threads run
dlopen/dlclose without the GIL, and the library they load (it imports poll, a hooked wait).
"""

from __future__ import annotations

import glob
import os
import shutil
import textwrap

import pytest

from c_extensions import build
from nhelpers import run_script

SANITIZED = "libasan" in os.environ.get("LD_PRELOAD", "")

STORM_SOURCE = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
static volatile int stop_flag;
static long loads;
static pthread_t threads[8];
static int nthreads;
static char paths[8][4096];
/* thread i loads and unloads its own copy: every dlopen is a real load */
static void *loop(void *arg)
{
    const char *path = paths[(intptr_t)arg];
    while (!stop_flag) {
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (h) {
            __atomic_add_fetch(&loads, 1, __ATOMIC_RELAXED);
            dlclose(h);
        }
    }
    return NULL;
}
int storm_start(const char *dir, int n)
{
    stop_flag = 0;
    nthreads = 0;
    for (int i = 0; i < n && i < 8; i++) {
        snprintf(paths[nthreads], sizeof paths[0], "%s/copy%d.so", dir, i);
        if (pthread_create(&threads[nthreads], NULL, loop, (void *)(intptr_t)nthreads) == 0)
            nthreads++;
    }
    return nthreads;
}
long storm_loads(void) { return __atomic_load_n(&loads, __ATOMIC_RELAXED); }
long storm_stop(void)
{
    stop_flag = 1;
    for (int i = 0; i < nthreads; i++)
        pthread_join(threads[i], NULL);
    nthreads = 0;
    return storm_loads();
}
"""
STORM_CDEF = "int storm_start(const char *p, int n); long storm_loads(void); long storm_stop(void);"
LOADED_SOURCE = r"""
#include <dlfcn.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
int loaded_poll(int ms) { return poll(0, 0, ms); }
/* The loader holds its main lock while a constructor runs.  This one sleeps (a raw syscall:
 * no hooked import) and loads another library, eight times: a load under way nearly always
 * has another object still to add, as a busy loader on a loaded machine has. */
__attribute__((constructor)) static void slow_init(void)
{
    const char *leaf = getenv("DDP_TEST_LEAF");
    for (int i = 0; i < 8; i++) {
        struct timespec t = {0, 100000};
        syscall(SYS_nanosleep, &t, NULL);
        void *h = leaf ? dlopen(leaf, RTLD_NOW | RTLD_LOCAL) : NULL;
        if (h)
            dlclose(h);
    }
}
"""
LOADED_CDEF = "int loaded_poll(int ms);"


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """(directory of the storm driver module, path of the library it loads)."""
    out = tmp_path_factory.mktemp("storm")
    for name, cdef, src in (("_ddp_storm", STORM_CDEF, STORM_SOURCE), ("_ddp_loaded", LOADED_CDEF, LOADED_SOURCE),
                            ("_ddp_leaf", "int leaf(void);", "int leaf(void) { return 1; }")):
        build(out, name, cdef, src)
    loaded = glob.glob(os.path.join(out, "_ddp_loaded*.so"))[0]
    for i in range(2):
        shutil.copy(loaded, os.path.join(out, f"copy{i}.so"))
    os.environ["DDP_TEST_LEAF"] = glob.glob(os.path.join(out, "_ddp_leaf*.so"))[0]  # (the children inherit it)
    return str(out), loaded


HELPERS = '''
from ddprof_nb.engines.native import binding as _binding, session as _session
lib, ffi = _binding.lib, _binding.ffi
WRAP = {k: lib.ddp_wait_wrapper(k) for k in (lib.DDP_WAIT_CLOCK_NANOSLEEP, lib.DDP_WAIT_NANOSLEEP, lib.DDP_WAIT_POLL)}

def slots():
    n = lib.ddp_wait_slots(ffi.NULL, ffi.NULL, ffi.NULL, 0) + 64  # (objects come and go meanwhile)
    a, v, k = ffi.new("uint64_t[]", n), ffi.new("uint64_t[]", n), ffi.new("int32_t[]", n)
    n = min(n, lib.ddp_wait_slots(a, v, k, n))
    return [(int(a[i]), int(v[i]), int(k[i])) for i in range(n)]

def mapped(path):
    """The address range of the mappings of `path` now, or None."""
    lo = hi = None
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith(path):
            a, b = (int(x, 16) for x in line.split()[0].split("-"))
            lo, hi = min(lo or a, a), max(hi or b, b)
    return (lo, hi) if lo is not None else None
'''


def test_sleep_hooked_at_every_start_while_c_threads_load_and_unload_nonstop(libs):
    storm_dir, loaded = libs
    # GIVEN two C threads that dlopen/dlclose a library each nonstop, without the GIL (the
    # loader's lock is nearly always held, and a load lands inside nearly every patch pass)
    r = run_script(
        f"sys.path.insert(0, {storm_dir!r})\nfrom _ddp_storm import lib as storm\n" + HELPERS + textwrap.dedent(f"""
        storm.storm_start({storm_dir!r}.encode(), 2)
        while storm.storm_loads() < 50:
            time.sleep(0.001)
        cycles, hooked, parked = 40, 0, 0
        for _ in range(cycles):
            # WHEN a park session starts
            e = engine(events=("park",))
            e.start()
            # (the interpreter's sleep slot: the start's own pass must have hooked it)
            if any(k == lib.DDP_WAIT_CLOCK_NANOSLEEP and v == WRAP[k] for (a, v, k) in slots()):
                hooked += 1
            for _ in range(3):
                time.sleep(0.005)
            p = e.stop()
            if sum(1 for s in p.samples() if s.event is EventType.PARK and s.stack[-1].name == "[sleep]"):
                parked += 1
        emit(cycles=cycles, hooked=hooked, parked=parked, loads=storm.storm_stop(), stats=_session.wait_stats())
        """),
        timeout=120,
    )
    # THEN the storm ran throughout, and the process survived every start and stop beside it
    assert r["loads"] > 100, r
    if SANITIZED:
        return  # libasan's interceptors own the wait slots: nothing is hooked (by design)
    # AND every session's start hooked the sleep, and every session recorded the sleeps as PARK
    assert r["hooked"] == r["cycles"], r
    assert r["parked"] == r["cycles"], r


def test_library_loaded_again_at_the_same_address_is_hooked_again(libs):
    _, loaded = libs
    # GIVEN a park session, and a library importing poll loaded during it (hooked at a tick)
    r = run_script(
        HELPERS + textwrap.dedent(f"""
        import ctypes
        libc = ctypes.CDLL(None)
        libc.dlopen.restype, libc.dlopen.argtypes = ctypes.c_void_p, (ctypes.c_char_p, ctypes.c_int)
        libc.dlclose.argtypes = (ctypes.c_void_p,)
        path = {loaded!r}
        def hooked_in_lib():
            where = mapped(path)
            return where, sum(1 for (a, v, k) in slots() if where and where[0] <= a < where[1] and v == WRAP[k])
        def wait_hooked(deadline_s=10):
            t0 = time.monotonic()
            while time.monotonic() - t0 < deadline_s:
                where, n = hooked_in_lib()
                if n:
                    return where, n
                time.sleep(0.005)
            return hooked_in_lib()
        e = engine(events=("park",))
        e.start()
        h = libc.dlopen(path.encode(), 2)
        first = wait_hooked()
        # WHEN it is unloaded and loaded again (at the same address, as the loader reuses the hole)
        libc.dlclose(h)
        assert mapped(path) is None
        h = libc.dlopen(path.encode(), 2)
        again = wait_hooked()
        p = e.stop()
        after = hooked_in_lib()
        libc.dlclose(h)
        emit(first=first, again=again, after=after, stats=_session.wait_stats())
        """),
        timeout=60,
    )
    if SANITIZED:
        return  # libasan's poll interceptor owns the slot: nothing is hooked (by design)
    assert r["first"][1] == 1, r
    if r["again"][0] != r["first"][0]:
        pytest.skip(f"the library came back at another address this time: {r}")
    # THEN the new copy's slot is hooked again (the loader's fresh value was noticed), and
    # the stop put it back (no slot of ours left behind)
    assert r["again"][1] == 1, r
    assert r["stats"]["slots_rebound"] >= 1, r
    assert r["after"][1] == 0 and r["stats"]["active_patches"] == 0, r
