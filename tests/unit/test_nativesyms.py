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


def test_a_whole_file_mmap_of_a_library_is_not_taken_for_its_load():
    # GIVEN libc's load bias, and a map where a reader's whole-file mmap of libc (read-only,
    #   offset 0) lies below the loader's mappings, as a symbol reader's mmap does
    from ddprof_nb import elfsyms
    libc_path = Symbolizer().resolve(_addr(ctypes.CDLL(None).getpid)).library
    with open(libc_path, "rb") as f:
        data = f.read()
    maps = elfsyms.mappings(os.getpid())
    real = elfsyms.load_base(data, maps, libc_path)
    decoy = elfsyms.Mapping(0x10000, 0x10000 + len(data), "r--s", 0, libc_path)
    # WHEN its load bias is computed from that map
    # THEN it is the loader's, not the decoy's
    assert real is not None
    assert elfsyms.load_base(data, [decoy, *maps], libc_path) == real
    assert elfsyms.load_base(data, [decoy], libc_path) is None


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
    assert sum("+0x" not in f.name for f in frames) > len(frames) // 5


@pytest.mark.parametrize("mangled, readable", [
    ("_ZNSt6vectorIiSaIiEE9push_backERKi", "std::vector<int, std::allocator<int> >::push_back(int const&)"),
    ("_ZN2at6native12_GLOBAL__N_18cpu_gemmEv", "at::native::(anonymous namespace)::cpu_gemm()"),
    ("_ZN4core3fmt5write17h0123456789abcdefE", "core::fmt::write"),
    ("_ZN66_$LT$alloc..vec..Vec$LT$T$GT$$u20$as$u20$core..ops..drop..Drop$GT$4drop17h5d3f6c3a0b7a4c1eE",
     "<alloc::vec::Vec<T> as core::ops::drop::Drop>::drop"),
    ("_ZN5arrow7compute6detail13ExecBatchIter4NextEPNS0_9ExecBatchE.cold",
     "arrow::compute::detail::ExecBatchIter::Next(arrow::compute::ExecBatch*) [cold]"),
    # Rust v0 (rpds-py's own symbols; expected as GNU c++filt -s rust prints them, crate hashes dropped)
    ("_RINvMNtCsevLNFiNqfJP_4core3stre18trim_start_matchesReECsbqKBVLtWDau_14rustc_demangle",
     "<str>::trim_start_matches::<&str>"),
    ("_RINvMNtNtCsgHYyB3hU8Ec_3std4sync9once_lockINtB3_8OnceLockNtNtB7_2fs4FileE10initializeNCNvNtNtNtB7_3sys6"
     "random5linux9getrandom0NtNtNtCsevLNFiNqfJP_4core2io5error5ErrorEB7_",
     "<std::sync::once_lock::OnceLock<std::fs::File>>::initialize::<std::sys::random::linux::getrandom::{closure#0}, "
     "core::io::error::Error>"),
    ("_RINvNtCsevLNFiNqfJP_4core3ptr9drop_glueAINtNtCskbEd6xbsJ5x_4pyo38instance5BoundNtNtNtBH_5types3any5PyAnyEj2_E"
     "CsfEKrbt0A2Rl_4rpds.llvm.7764731264739577181",
     "core::ptr::drop_glue::<[pyo3::instance::Bound<pyo3::types::any::PyAny>; 2]>"),
    ("_RINvMs1_NtCskbEd6xbsJ5x_4pyo34syncINtB6_11GILOnceCellNtNtNtB8_7pyclass18create_type_object17PyClassTypeObjectE"
     "4initNCNCNvMs0_NtNtNtB8_5impl_7pyclass16lazy_type_objectNtB1Z_19LazyTypeObjectInner15get_or_try_init00NtNtB8_3err"
     "5PyErrEB8_",
     "<pyo3::sync::GILOnceCell<pyo3::pyclass::create_type_object::PyClassTypeObject>>::init::<<pyo3::impl_::pyclass::"
     "lazy_type_object::LazyTypeObjectInner>::get_or_try_init::{closure#0}::{closure#0}, pyo3::err::PyErr>"),
    ("_RNvXs_NtCs1234_7mycrate3fooNtB4_3BarNtNtCs5678_4core3fmt7Display3fmt",
     "<mycrate::foo::Bar as core::fmt::Display>::fmt"),
    ("_RNvNtCs1234_7mycrate3foo", None),  # truncated: no identifier after the path
    ("dgemm_kernel_HASWELL", "dgemm_kernel_HASWELL"),
    ("_Zgarbage", "_Zgarbage"),
])
def test_demangle(mangled, readable):
    assert demangle(mangled) == (mangled if readable is None else readable)


def test_rust_v0_against_cxxfilt_on_a_real_library():
    # GIVEN every v0 symbol of rpds-py's library (Rust, ~1,500 functions), and GNU c++filt
    # THEN each demangles as c++filt prints it, crate hashes and const types aside
    import re
    import shutil
    import subprocess

    rpds = pytest.importorskip("rpds")
    if not shutil.which("c++filt") or not shutil.which("nm"):
        pytest.skip("binutils (nm, c++filt) not installed: the hard-coded cases above still ran")
    out = subprocess.run(["nm", "--defined-only", rpds.rpds.__file__], capture_output=True, text=True).stdout
    names = [ln.split()[-1] for ln in out.splitlines()
             if len(ln.split()) == 3 and ln.split()[1] in "tT" and ln.split()[-1].startswith("_R")]
    assert len(names) > 500
    ref = subprocess.run(["c++filt", "-s", "rust"], input="\n".join(names), capture_output=True,
                         text=True).stdout.splitlines()
    if ref == names:
        pytest.skip("this c++filt does not know Rust v0")
    for name, want in zip(names, ref):
        want = re.sub(r"(\d): [a-z0-9]+", r"\1", re.sub(r"\[[0-9a-f]+\]", "", want))
        assert demangle(name) == want, name


MINI_SRC = r"""
static __attribute__((noinline)) int hidden_worker(int n) { int s = 0; for (int i = 0; i < n; i++) s += i * 7; return s; }
void *where_is_hidden_worker(void) { return (void *)hidden_worker; }
int visible(int n) { return hidden_worker(n); }
"""


def _minidebuginfo_library(d, with_debugdata: bool) -> str:
    """A shared library stripped of .symtab, its local function's name kept (or not) in an
    xz-compressed .gnu_debugdata, as distributions that ship MiniDebugInfo build them."""
    import lzma
    import subprocess

    src, lib = d / "mini.c", d / f"libmini{int(with_debugdata)}.so"
    src.write_text(MINI_SRC)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    if with_debugdata:
        debug = d / "mini.debug"
        subprocess.run(["objcopy", "--only-keep-debug", str(lib), str(debug)], check=True)
        (d / "mini.xz").write_bytes(lzma.compress(debug.read_bytes()))
    subprocess.run(["strip", "--strip-all", str(lib)], check=True)
    if with_debugdata:
        subprocess.run(["objcopy", "--add-section", f".gnu_debugdata={d / 'mini.xz'}", str(lib)], check=True)
    return str(lib)


@pytest.mark.parametrize("with_debugdata", [True, False], ids=["minidebuginfo", "stripped"])
def test_a_stripped_librarys_local_function_is_named_from_its_gnu_debugdata(tmp_path, with_debugdata):
    # GIVEN a library stripped of .symtab whose static function hidden_worker is named only in
    #   its .gnu_debugdata (or nowhere: the same library without it)
    lib = ctypes.CDLL(_minidebuginfo_library(tmp_path, with_debugdata))
    lib.where_is_hidden_worker.restype = ctypes.c_void_p
    # WHEN the function's address (and one inside it) is resolved
    sym = Symbolizer()
    at = lib.where_is_hidden_worker()
    names = {sym.resolve(at).name, sym.resolve(at + 2).name}
    # THEN its name comes from .gnu_debugdata; without it, library+offset as for any stripped code
    if with_debugdata:
        assert names == {"hidden_worker"}, names
    else:
        assert all(n.startswith("libmini0.so+0x") for n in names), names
    # AND the exported function keeps its .dynsym name either way
    assert sym.resolve(_addr(lib.visible)).name == "visible"


def test_symbolizers_share_a_librarys_symbols_and_a_replaced_file_is_read_again(tmp_path):
    # GIVEN two symbolizers of this process (two sessions), and a copy of libc in a file
    from ddprof_nb import elfsyms, nativesyms
    libc = ctypes.CDLL(None)
    first, second = Symbolizer(), Symbolizer()
    # WHEN both resolve libc's getpid
    a, b = first.resolve(_addr(libc.getpid)), second.resolve(_addr(libc.getpid))
    # THEN the name is the same and the symbol tables were read once (shared), each with its bias
    assert a == b and a.name == "getpid"
    one, two = first._libs[a.library], second._libs[a.library]
    assert one.starts is two.starts and one.bias == two.bias != 0
    # AND a file replaced at the same path is read again, not taken from the last read
    copy = tmp_path / "libcopy.so"
    copy.write_bytes(open(a.library, "rb").read())
    maps = elfsyms.mappings(os.getpid())
    old = nativesyms._Library.load(str(copy), maps)
    copy.unlink()
    copy.write_bytes(open(a.library, "rb").read()[:-4096])  # (another inode and size)
    new = nativesyms._Library.load(str(copy), maps)
    assert old is not None and new is not None and new.starts is not old.starts


def test_symbolizers_read_the_memory_map_again_only_when_the_loader_moved(monkeypatch):
    # GIVEN a loader generation that stays, then moves, and a count of memory-map reads
    from ddprof_nb import elfsyms, nativesyms
    reads = []
    real = elfsyms.mappings
    monkeypatch.setattr(elfsyms, "mappings", lambda pid, **kw: reads.append(pid) or real(pid, **kw))
    monkeypatch.setattr(nativesyms, "_maps_seen", (None, None, None))
    gen = [1]
    getpid = _addr(ctypes.CDLL(None).getpid)
    # WHEN three symbolizers (sessions) resolve an address, the loader moving before the third
    for i in range(3):
        if i == 2:
            gen[0] += 1
        assert Symbolizer(loader_generation=lambda: gen[0]).resolve(getpid).name == "getpid"
    # THEN the map was read by the first and the third only
    assert len(reads) == 2
    # AND an address in no known mapping still reads the map again (a JIT page is no dlopen)
    page = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                     prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    at = ctypes.addressof(ctypes.c_char.from_buffer(page)) + 8
    sym = Symbolizer(loader_generation=lambda: gen[0])
    assert sym.resolve(getpid).name == "getpid" and len(reads) == 2
    assert sym.resolve(at).name.startswith(("[anon]+", "[unknown]+")) and len(reads) == 3
