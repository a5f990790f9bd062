"""The native-stack walk on its own (native/unwind.c, ehframe.c), from a signal handler.

A tiny C extension is built three ways: -O2 with frame pointers, -O2 without them (the
walk must follow each function's .eh_frame rule), and with frame pointers but no unwind
tables at all (the walk falls back to rbp).  Its two burners share one loop body and run
7:3 under one Python call.  Every scenario runs in a subprocess: a crash is a failure
with its output, not a dead pytest.
"""

from __future__ import annotations

import textwrap

import pytest

from c_extensions import build
from nhelpers import run_script

EXT_SOURCE = r"""
#include <stdint.h>
#include <signal.h>
#include <time.h>
/* One loop body, two callers run 7:3: about a 70/30 CPU split (their speed per iteration
 * can differ a little, so ddpx_mid measures the truth with the thread's CPU clock).  Their
 * local arrays differ, so their frames (CFA offsets) differ. */
#define DDPX_SPIN(n, buf, m) \
    uint64_t a = 1, b = 2, c = 3, d = 4; \
    for (uint64_t i = 0; i < (n); i++) { \
        a = a * 6364136223846793005ULL + b; b ^= a >> 7; c += b * 3; d ^= c << 1; \
        buf[i & 7] = d; \
    } \
    return a ^ b ^ c ^ d ^ buf[(n) & 7];
__attribute__((noinline)) uint64_t ddpx_hot_a(uint64_t n) { volatile uint64_t buf[24]; DDPX_SPIN(n, buf, 24) }
__attribute__((noinline)) uint64_t ddpx_hot_b(uint64_t n) { volatile uint64_t buf[8]; DDPX_SPIN(n, buf, 8) }
static uint64_t cpu_a, cpu_b; /* ns each burner ran, by the thread's CPU clock */
static uint64_t cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}
__attribute__((noinline)) uint64_t ddpx_mid(uint64_t n)
{
    uint64_t t0 = cpu_now();
    uint64_t x = ddpx_hot_a(n * 7);
    uint64_t t1 = cpu_now();
    x += ddpx_hot_b(n * 3) * 3;
    cpu_a += t1 - t0;
    cpu_b += cpu_now() - t1;
    return x;
}
/* The share of ddpx_hot_a in the burners' CPU since the last call (and start again). */
double ddpx_share_a(void)
{
    double s = cpu_a + cpu_b ? (double)cpu_a / (double)(cpu_a + cpu_b) : 0.0;
    cpu_a = cpu_b = 0;
    return s;
}
uint64_t ddpx_burn(uint64_t rounds, uint64_t n)
{
    uint64_t s = 0;
    for (uint64_t r = 0; r < rounds; r++)
        s += ddpx_mid(n);
    return s;
}
/* Blocked in the kernel two calls below the entry point (the GIL released by cffi). */
__attribute__((noinline)) void ddpx_wait_inner(double seconds)
{
    struct timespec t = { (time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9) };
    while (nanosleep(&t, &t) != 0)
        ;
    __asm__ __volatile__("" ::: "memory"); /* (not a tail call: this frame stays on the stack) */
}
void ddpx_wait(double seconds) { ddpx_wait_inner(seconds); __asm__ __volatile__("" ::: "memory"); }
static volatile uint64_t handler_sink;
static uint64_t handler_n;
__attribute__((noinline)) static void ddpx_on_usr1(int sig) { (void)sig; handler_sink += ddpx_hot_b(handler_n); }
/* A burner inside a signal handler: its stacks pass through the kernel's signal frame. */
uint64_t ddpx_burn_in_handler(uint64_t n)
{
    struct sigaction sa = {0};
    sa.sa_handler = ddpx_on_usr1;
    sigaction(SIGUSR1, &sa, 0);
    handler_n = n;
    raise(SIGUSR1);
    return handler_sink;
}
"""
EXT_CDEF = ("uint64_t ddpx_burn(uint64_t rounds, uint64_t n); uint64_t ddpx_burn_in_handler(uint64_t n);"
            "double ddpx_share_a(void); void ddpx_wait(double seconds);")
FLAVOURS = {
    "fp": ["-O2", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer"],
    "nofp": ["-O2", "-fomit-frame-pointer"],
    "nocfi": ["-O2", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer",
              "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"],
}


@pytest.fixture(scope="module")
def ext_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("unwind_ext")
    for flavour, args in FLAVOURS.items():
        build(out, f"_ddpx_{flavour}", EXT_CDEF, EXT_SOURCE, extra_compile_args=args)
    return str(out)


PRELUDE = '''
import collections, importlib, json, os, signal, sys, threading, time
from ddprof_nb import _native
from ddprof_nb.nativesyms import Symbolizer
lib, ffi = _native.lib, _native.ffi
MAX = 128

def emit(**r):
    print("RESULT " + json.dumps(r))

def take(n):
    """the walks of the last run: [(frames [(name, library)], truncated)]"""
    sym = Symbolizer()
    pcs, fl, ns = ffi.new("uint64_t[]", MAX), ffi.new("int32_t*"), ffi.new("int64_t*")
    out = []
    for i in range(n):
        d = lib.ddp_test_unwind_get(i, pcs, MAX, fl, ns)
        frames = [sym.resolve(pcs[j]) for j in range(d)]
        out.append(([(f.name, os.path.basename(f.library)) for f in frames], bool(fl[0] & 1)))
    lib.ddp_test_unwind_free()
    return out

def addr(mod, name):
    return int(ffi.cast("uintptr_t", mod.ffi.addressof(mod.lib, name)))

import ctypes
# the interpreter's object (libpython, or the executable when it is linked in): a walk that
# reaches it went past the extension (a stripped one names no eval loop: Debian's 3.14)
INTERP = os.path.basename(Symbolizer().resolve(ctypes.cast(ctypes.pythonapi.Py_IsInitialized, ctypes.c_void_p).value).library)
'''


def run(body: str, ext: str, timeout: float = 120) -> dict:
    return run_script(f"sys.path.insert(0, {ext!r})\n" + PRELUDE + textwrap.dedent(body), timeout=timeout)


@pytest.mark.alone  # a CPU share within 3 points
@pytest.mark.parametrize("flavour", ["fp", *(pytest.param(f, marks=pytest.mark.c_variant) for f in ("nocfi", "nofp"))])
def test_two_burners_split_70_30_in_call_order(ext_dir, flavour):
    # GIVEN the extension built `flavour`, two burners run 7:3 under ddpx_mid under ddpx_burn
    # WHEN a CPU timer's handler walks the thread's native stack every tick
    # THEN every walk that ends in ddpx_hot_a or ddpx_hot_b (all but the odd tick that lands
    #   in cffi's call glue around ddpx_burn: at most 1 %) goes on through ddpx_mid, ddpx_burn,
    #   in the extension's library, then up into the interpreter, none truncated, and the
    #   leaves split 70/30 within 3 points
    res = run(f'''
        m = importlib.import_module("_ddpx_{flavour}")
        m.lib.ddpx_share_a()
        assert lib.ddp_test_unwind_start(signal.SIGPROF, 1_000_000, MAX) == 0
        m.lib.ddpx_burn(40, 2_500_000)
        truth = m.lib.ddpx_share_a()
        walks = take(lib.ddp_test_unwind_stop())
        leaves = collections.Counter(w[0][0][0] for w in walks)
        burns = [(frames, trunc) for frames, trunc in walks if frames and frames[0][0] in ("ddpx_hot_a", "ddpx_hot_b")]
        good = sum(1 for frames, trunc in burns
                   if [n for n, _ in frames[1:3]] == ["ddpx_mid", "ddpx_burn"]
                   and {{lib_ for _, lib_ in frames[:3]}} == {{m.__file__.rsplit("/", 1)[1]}}
                   and any(lib_ == INTERP for _, lib_ in frames[3:]) and not trunc)
        emit(n=len(walks), burns=len(burns), leaves=leaves, good=good, truth=truth, sample=walks[0][0][:8] if walks else None)
    ''', ext_dir)
    n, burns = res["n"], res["burns"]
    assert n >= 150 and burns >= 0.99 * n, res
    assert res["good"] == burns, res
    share = res["leaves"]["ddpx_hot_a"] / burns
    assert abs(res["truth"] - 0.7) <= 0.1, res  # (the burners do run about 7:3)
    assert abs(share - res["truth"]) <= 0.03, res


def test_rows_follow_each_functions_cfi_or_are_absent(ext_dir):
    # GIVEN the extension without frame pointers, and the one without unwind tables
    # WHEN the unwind tables are asked for the row at a burner's entry point
    # THEN without frame pointers it is the entry rule (CFA = rsp + 8, rbp not saved);
    #   without unwind tables there is no row (the walk's rbp fallback is what found its callers)
    res = run('''
        nofp, nocfi = importlib.import_module("_ddpx_nofp"), importlib.import_module("_ddpx_nocfi")
        lib.ddp_unwind_refresh()
        reg, off, fpo, fl = (ffi.new("int32_t*") for _ in range(4))
        rows = {}
        for name, mod in (("nofp", nofp), ("nocfi", nocfi)):
            rc = lib.ddp_unwind_row(addr(mod, "ddpx_burn"), reg, off, fpo, fl)
            rows[name] = None if rc else (reg[0], off[0], fpo[0])
        emit(rows=rows)
    ''', ext_dir)
    assert res["rows"]["nofp"] == [1, 8, -32768], res  # UW_CFA_RSP, +8, UW_FP_SAME
    assert res["rows"]["nocfi"] is None or res["rows"]["nocfi"][0] == 0, res


def test_a_thread_blocked_in_a_system_call(ext_dir):
    # GIVEN a Python thread in time.sleep (blocked in the kernel)
    # WHEN it is signalled and its handler walks its stack
    # THEN the walk starts in libc, goes through the interpreter and ends at the thread's start
    res = run('''
        t = threading.Thread(target=time.sleep, args=(3,), daemon=True)
        t.start(); time.sleep(0.3)
        assert lib.ddp_test_unwind_start(signal.SIGURG, 0, MAX) == 0
        for _ in range(5):
            lib.ddp_test_unwind_signal(t.native_id); time.sleep(0.05)
        walks = take(lib.ddp_test_unwind_stop())
        emit(walks=[[f for f in frames] for frames, _ in walks], trunc=[tr for _, tr in walks], interp=INTERP)
    ''', ext_dir)
    assert len(res["walks"]) == 5, res
    for frames, trunc in zip(res["walks"], res["trunc"]):
        assert frames[0][1].startswith("libc"), frames
        assert res["interp"] in [lib_ for _, lib_ in frames[1:]], frames
        assert not trunc, frames
        assert frames[-1][1].startswith("libc"), frames  # the thread's start (clone), where the walk ends


def test_through_a_signal_frame(ext_dir):
    # GIVEN a burner running inside a SIGUSR1 handler raised from the extension
    # WHEN the CPU timer's handler walks that stack
    # THEN it goes hot_b <- the handler <- (the kernel's signal frame) <- the code that raised
    #   it <- ddpx_burn_in_handler <- the interpreter
    res = run('''
        m = importlib.import_module("_ddpx_nofp")
        assert lib.ddp_test_unwind_start(signal.SIGPROF, 1_000_000, MAX) == 0
        m.lib.ddpx_burn_in_handler(400_000_000)
        walks = take(lib.ddp_test_unwind_stop())
        emit(walks=[[n for n, _ in frames] for frames, _ in walks], trunc=[tr for _, tr in walks],
             libs=[[lib_ for _, lib_ in frames] for frames, _ in walks], interp=INTERP)
    ''', ext_dir)
    walks = res["walks"]
    assert len(walks) >= 30, res
    through = [(w, libs) for w, libs in zip(walks, res["libs"]) if w[:2] == ["ddpx_hot_b", "ddpx_on_usr1"]]
    assert len(through) >= 0.9 * len(walks), walks[:3]
    for w, libs in through:
        at = w.index("ddpx_burn_in_handler")  # (ValueError: the walk stopped at the signal frame)
        assert at > 2 and res["interp"] in libs[at + 1:], w


def test_bad_registers_keep_the_walked_part_and_mark_the_rest(ext_dir):
    # GIVEN walks started from registers no thread has: a null stack, an unmapped stack, a
    #   stack of random words, a stack ending at a guard page, and a JIT-like page (no unwind info) whose rbp points at a
    #   made-up frame returning into ddpx_mid
    # WHEN walked
    # THEN none crashes; each keeps its first pc, stops, and says it is truncated; the JIT
    #   page's walk follows rbp to ddpx_mid
    res = run('''
        import ctypes, mmap, struct
        m = importlib.import_module("_ddpx_nofp")
        lib.ddp_unwind_refresh()
        pcs, fl = ffi.new("uint64_t[]", MAX), ffi.new("int32_t*")
        hot = addr(m, "ddpx_burn")
        out = {}
        def walk(name, pc, sp, fp):
            d = lib.ddp_test_unwind_regs(pc, sp, fp, pcs, MAX, fl)
            out[name] = (d, fl[0], [pcs[i] for i in range(d)])
        walk("null", hot, 0, 0)
        walk("unmapped", hot + 1, 0x7ff000000000 - 0x10000, 0x7ff000000000)
        junk = ctypes.create_string_buffer(os.urandom(1 << 16))
        junk_at = ctypes.addressof(junk) + 4096
        for i in range(20):
            walk(f"junk{i}", hot + 1, junk_at + 8 * i, junk_at + 64 * i)
        jit = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        jit_pc = ctypes.addressof(ctypes.c_char.from_buffer(jit)) + 16
        mid_ra = addr(m, "ddpx_burn") + 9
        frame = ctypes.create_string_buffer(struct.pack("<QQ", 0, mid_ra) + bytes(64))
        fa = ctypes.addressof(frame)
        walk("jit", jit_pc, fa - 64, fa)
        # a stack's end at its guard page: sp on the last words below a PROT_NONE page, rbp in it
        two = mmap.mmap(-1, 8192, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(two))
        ctypes.memset(base, 0xff, 8192)
        assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(base + 4096), ctypes.c_size_t(4096), 0) == 0
        walk("guard", hot + 1, base + 4096 - 8, base + 4096 + 64)
        walk("guard_fp", jit_pc, base + 4096 - 16, base + 4096 + 64)
        # a rule that reads a return address into data (no object's code): at ddpx_share_a's
        # entry (CFA = rsp + 8) the stack's first word points into a bytes buffer, and a real
        # return address (just after a call in ddpx_burn) lies two words above
        burn_at = addr(m, "ddpx_burn")
        code = ctypes.string_at(burn_at, 96)
        real_ra = burn_at + code.index(bytes([0xE8])) + 5
        data = ctypes.create_string_buffer(256)
        stack = ctypes.create_string_buffer(struct.pack("<QQQ", ctypes.addressof(data) + 64, 0, real_ra) + bytes(512))
        walk("ra_in_data", addr(m, "ddpx_share_a"), ctypes.addressof(stack), 0)
        emit(out=out, jit_pc=jit_pc, mid_ra=mid_ra, real_ra=real_ra, data_at=ctypes.addressof(data))
    ''', ext_dir)
    out = res["out"]
    # the return address into data is no frame: the walk goes on at the real one above it
    ra_depth, _, ra_pcs = out.pop("ra_in_data")
    assert ra_depth >= 2 and ra_pcs[1] == res["real_ra"] - 1, (ra_pcs, res)
    assert not any(res["data_at"] <= pc < res["data_at"] + 256 for pc in ra_pcs), ra_pcs
    for name, (depth, flags, pcs) in out.items():
        assert depth >= 1 and flags & 1, (name, out[name])
    assert out["null"][0] == 1 and out["unmapped"][0] == 1, out
    assert out["guard_fp"][0] == 1, out  # (its first read is in the guard page)
    jit_depth, _, jit_pcs = out["jit"]
    assert jit_pcs[:2] == [res["jit_pc"], res["mid_ra"] - 1], out["jit"]
