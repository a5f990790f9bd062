"""Native addresses to names (ddprof_nb.nativesyms) and demangling (ddprof_nb.demangle)."""

from __future__ import annotations

import ctypes
import mmap
import os

import pytest

from ddprof_nb.demangle import demangle
from ddprof_nb.nativesyms import Symbolizer


def _addr(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


def test_a_libc_function_by_name_with_its_library():
    # GIVEN the addresses of libc's getpid and of a byte inside qsort
    # WHEN resolved
    # THEN each is named with libc as its library
    libc = ctypes.CDLL(None)
    sym = Symbolizer()
    f = sym.resolve(_addr(libc.getpid))
    assert f.name == "getpid" and os.path.basename(f.library).startswith("libc"), f
    g = sym.resolve(_addr(libc.qsort) + 3)
    assert g.name == "qsort" and g.library == f.library, g


def test_addresses_without_a_symbol_are_library_plus_offset():
    # GIVEN an address inside an anonymous executable page, and one inside libc past every
    #   exported function's end (a stripped static function)
    # WHEN resolved
    # THEN neither is "??": the page is [anon]+0x.., libc's is libc.so.6+0x<file offset>
    page = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                     prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    at = ctypes.addressof(ctypes.c_char.from_buffer(page)) + 100
    sym = Symbolizer()
    f = sym.resolve(at)
    assert f.name == "[anon]+0x64" or f.name.startswith("[unknown]+0x"), f
    libc_path = sym.resolve(_addr(ctypes.CDLL(None).getpid)).library
    lib = sym._libs[libc_path]
    gaps = [(e, s) for e, s in zip(lib.ends, lib.starts[1:]) if s - e > 64 and sym._mapping(e + 16 + lib.bias)]
    assert gaps, "libc has no gap between symbols"
    off = gaps[0][0] + 16
    g = sym.resolve(off + lib.bias)
    assert g.name == f"{os.path.basename(libc_path)}+{off:#x}" and g.offset == off, g


def test_symbolizing_10000_distinct_addresses_is_quick():
    # GIVEN 10,000 distinct addresses spread over every executable mapping with a file
    # WHEN a new Symbolizer resolves them (every library read for the first time)
    # THEN none is "??" (the speed goal, <= 0.5 s, is benchmarks/bench_native_frames.py's)
    import random

    from ddprof_nb import elfsyms

    maps = [m for m in elfsyms.mappings(os.getpid()) if "x" in m.perms and m.path.startswith("/")]
    rng = random.Random(7)
    addrs = {rng.randrange(m.start, m.end) for m in rng.choices(maps, k=12000)}
    sym = Symbolizer()
    frames = [sym.resolve(a) for a in list(addrs)[:10000]]
    assert all(f.name and "??" not in f.name for f in frames)
    assert sum("+0x" not in f.name for f in frames) > len(frames) // 3


@pytest.mark.parametrize("mangled, readable", [
    ("_ZNSt6vectorIiSaIiEE9push_backERKi", "std::vector<int, std::allocator<int> >::push_back(int const&)"),
    ("_ZN2at6native12_GLOBAL__N_18cpu_gemmEv", "at::native::(anonymous namespace)::cpu_gemm()"),
    ("_ZN4core3fmt5write17h0123456789abcdefE", "core::fmt::write"),
    ("_ZN66_$LT$alloc..vec..Vec$LT$T$GT$$u20$as$u20$core..ops..drop..Drop$GT$4drop17h5d3f6c3a0b7a4c1eE",
     "<alloc::vec::Vec<T> as core::ops::drop::Drop>::drop"),
    ("_ZN5arrow7compute6detail13ExecBatchIter4NextEPNS0_9ExecBatchE.cold",
     "arrow::compute::detail::ExecBatchIter::Next(arrow::compute::ExecBatch*) [cold]"),
    ("dgemm_kernel_HASWELL", "dgemm_kernel_HASWELL"),
    ("_Zgarbage", "_Zgarbage"),
])
def test_demangle(mangled, readable):
    assert demangle(mangled) == readable
