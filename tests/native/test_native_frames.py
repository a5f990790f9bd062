"""Native frames in profiles (native=True): merged between the Python frames, named.

Acceptance of native frames: a C extension's two burners (70/30 under one Python call, built
with and without frame pointers) split within 3 points under the right Python frame with
exact names; numpy's matmul on one BLAS thread runs >= 60 % of its caller's CPU through a
*gemm* frame whose file is the BLAS library.  Each scenario runs in a subprocess.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from c_extensions import build
from nhelpers import PRELUDE, run_script
from test_native_unwind import EXT_CDEF, EXT_SOURCE, FLAVOURS


@pytest.fixture(scope="module")
def ext_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("frames_ext")
    for flavour in ("fp", "nofp"):
        build(out, f"_ddpx_{flavour}", EXT_CDEF, EXT_SOURCE, extra_compile_args=FLAVOURS[flavour])
    return str(out)


HELPERS = '''
def native_engine(native=True, events=("cpu",)):
    return NativeEngine(SamplerConfig.make(events=events, interval="5ms", native=native))

def under(p, fn, value_index=1):
    """CPU samples whose stack holds the Python function fn: (stack root first, their CPU
    (value_index 1) or their number of timer signals (0))"""
    out = []
    for s in p.samples():
        if s.event is EventType.CPU and any(f.kind is FrameKind.PYTHON and f.name == fn for f in s.stack):
            out.append((s.stack, s.values[value_index]))
    return out

def interpreter_file():
    import ctypes
    from ddprof_nb.nativesyms import Symbolizer
    at = ctypes.cast(ctypes.pythonapi.Py_IsInitialized, ctypes.c_void_p).value
    return Symbolizer().resolve(at).library

def has_symtab(path):
    """the file keeps its full symbol table (a stripped one names exported functions only)"""
    from ddprof_nb import elfsyms
    with open(path, "rb") as f:
        data = f.read()
    h = elfsyms._header(data)
    return any(elfsyms._SHDR.unpack_from(data, h[6] + i * h[11])[1] == 2 for i in range(h[12]))

def below(stack, fn):
    """the frames below (leafward of) the last frame of Python function fn"""
    i = max(i for i, f in enumerate(stack) if f.kind is FrameKind.PYTHON and f.name == fn)
    return stack[i + 1:]
'''


def run(body: str, ext: str = "", timeout: float = 120, env_blas: bool = False) -> dict:
    path = f"sys.path.insert(0, {ext!r})\n" if ext else ""
    return run_script(path + HELPERS + textwrap.dedent(body), timeout=timeout,
                      env={"OPENBLAS_NUM_THREADS": "1"} if env_blas else None)


@pytest.mark.alone  # a CPU share within 3 points: a 3.5-point miss was seen at load 10
@pytest.mark.parametrize("flavour", ["fp", pytest.param("nofp", marks=pytest.mark.c_variant)])
def test_extension_split_70_30_under_the_calling_python_function(ext_dir, flavour):
    # GIVEN the extension built `flavour`, its burners run 7:3 under ddpx_burn, called by
    #   the Python function burn_it
    # WHEN profiled with native=True
    # THEN under burn_it come exactly _cffi_f_ddpx_burn, ddpx_burn, ddpx_mid, then a burner,
    #   each with the extension as its file; the burners split 70/30 within 3 points of the
    #   CPU timer's signals (where the walk placed each tick; the CPU weights a tick carries
    #   are the CPU accounting's, checked by the accuracy tests)
    res = run(f'''
        import importlib
        m = importlib.import_module("_ddpx_{flavour}")
        def burn_it():
            m.lib.ddpx_burn(60, 2_500_000)
        m.lib.ddpx_share_a()
        e = native_engine(); e.start(); burn_it(); p = e.stop()
        truth = m.lib.ddpx_share_a()
        got, ticks = collections.Counter(), collections.Counter()
        shapes = collections.Counter()
        def burner(stack):
            tail = below(stack, "burn_it")
            names = [f.name for f in tail if f.kind is FrameKind.NATIVE and f.filename == m.__file__]
            if [f.kind for f in tail[-4:]] == [FrameKind.NATIVE] * 4 and names[-4:-1] == ["_cffi_f_ddpx_burn", "ddpx_burn", "ddpx_mid"]:
                return names[-1]
        for stack, w in under(p, "burn_it"):
            shapes[" > ".join(f.name for f in below(stack, "burn_it")[-5:])] += w
            if burner(stack):
                got[burner(stack)] += w
        for stack, n in under(p, "burn_it", 0):
            if burner(stack):
                ticks[burner(stack)] += n
        emit(got=got, ticks=ticks, truth=truth, total=sum(w for _, w in under(p, "burn_it")), shapes=shapes.most_common(10))
    ''', ext_dir)
    total = res["total"]
    assert total > 1e9 * 1.2, res  # CPU weights are ns: about 2.2 s of burning
    got = res["got"]
    assert set(got) == {"ddpx_hot_a", "ddpx_hot_b"}, res
    assert sum(got.values()) >= 0.97 * total, (res["shapes"], res)
    ticks, truth = res["ticks"], res["truth"]
    assert sum(ticks.values()) >= 100 and abs(truth - 0.7) <= 0.1, res  # (the burners do run about 7:3)
    # the split within 3 points of the burners' own CPU clock readings
    assert abs(ticks["ddpx_hot_a"] / sum(ticks.values()) - truth) <= 0.03, res


def test_without_native_no_native_frames(ext_dir):
    # GIVEN the same burn profiled with native=False
    # THEN no stack holds a native frame: the Python call is the leaf, as before
    res = run('''
        import importlib
        m = importlib.import_module("_ddpx_nofp")
        def burn_it():
            m.lib.ddpx_burn(10, 2_500_000)
        e = native_engine(native=False); e.start(); burn_it(); p = e.stop()
        kinds = collections.Counter(f.kind.name for s in p.samples() for f in s.stack)
        emit(kinds=kinds, leaves=collections.Counter(stack[-1].name for stack, _ in under(p, "burn_it")))
    ''', ext_dir)
    assert "NATIVE" not in res["kinds"], res
    assert set(res["leaves"]) == {"burn_it"}, res


@pytest.mark.parametrize("flavour", ["fp", pytest.param("nofp", marks=pytest.mark.c_variant)])
def test_wall_samples_of_a_blocked_thread_carry_the_native_frames_it_waits_in(ext_dir, flavour):
    # GIVEN the extension's ddpx_wait -> ddpx_wait_inner -> nanosleep, blocked 0.6 s under the
    #   Python function waits (the GIL released), while the main thread burns Python
    # WHEN profiled for wall with native=True (and once with native=False)
    # THEN nearly all of waits' blocked wall time (state off-cpu: its start ran Python) is in
    #   samples whose frames below it run through ddpx_wait_inner with libc's sleep at the
    #   leaf; native=False keeps Python frames only
    res = run(f'''
        import importlib
        m = importlib.import_module("_ddpx_{flavour}")
        def waits():
            m.lib.ddpx_wait(0.6)
        def profile(native):
            e = NativeEngine(SamplerConfig.make(events=("wall",), interval="10ms", native=native))
            e.start()
            t = threading.Thread(target=waits); t.start(); burn(0.3); t.join()
            total = through = 0
            kinds = collections.Counter()
            for s in e.stop().samples():
                names = [f.name for f in s.stack]
                if s.event is EventType.WALL and "waits" in names and s.labels.get("state") == "off-cpu":
                    total += s.values[1]
                    tail = below(s.stack, "waits")
                    kinds.update(f.kind.name for f in tail)
                    through += s.values[1] * ("ddpx_wait_inner" in [f.name for f in tail]
                                              and os.path.basename(tail[-1].filename).startswith("libc"))
            return total, through, kinds
        e = native_engine(); e.start(); e.stop()  # (the first session builds the unwind tables)
        emit(on=profile(True), off=profile(False))
    ''', ext_dir)
    total, through, _ = res["on"]
    assert total >= 0.5e9 and through >= 0.9 * total, res
    assert "NATIVE" not in res["off"][2] and res["off"][0] >= 0.5e9, res


def test_numpy_matmul_runs_through_gemm_in_the_blas_library():
    # GIVEN numpy's matmul on one BLAS thread, called by the Python function crunch
    # WHEN profiled with native=True
    # THEN >= 60 % of the CPU under crunch has a *gemm* frame whose file is the BLAS library,
    #   below crunch (no Python frame between)
    res = run('''
        import numpy as np
        a = np.random.rand(500, 500)
        def crunch():
            for _ in range(80):
                a @ a
        e = native_engine(); e.start(); crunch(); p = e.stop()
        total = gemm = 0
        files = collections.Counter()
        for stack, w in under(p, "crunch"):
            total += w
            tail = below(stack, "crunch")
            hits = [f for f in tail if f.kind is FrameKind.NATIVE and "gemm" in f.name.lower()
                    and "blas" in os.path.basename(f.filename).lower()]
            if hits and all(f.kind is not FrameKind.PYTHON for f in tail):
                gemm += w
                files[os.path.basename(hits[0].filename)] += 1
        emit(total=total, gemm=gemm, files=files)
    ''', env_blas=True)
    assert res["total"] > 0.1e9, res
    assert res["gemm"] >= 0.6 * res["total"], res


def test_native_frames_survive_pprof_speedscope_and_folded(ext_dir, tmp_path):
    # GIVEN a native=True profile of the extension
    # WHEN saved as pprof, speedscope and folded, and loaded back
    # THEN pprof and speedscope keep each native frame's name, library (file) and kind; folded
    #   (names only) keeps them as native frames
    res = run(f'''
        import importlib
        from ddprof_nb import load, save
        m = importlib.import_module("_ddpx_nofp")
        def burn_it():
            m.lib.ddpx_burn(6, 2_500_000)
        e = native_engine(); e.start(); burn_it(); p = e.stop()
        def natives(q):
            return sorted({{(f.name, f.filename, f.kind.name) for s in q.samples() for f in s.stack
                            if f.kind is FrameKind.NATIVE and "ddpx" in f.name}})
        out = {{"orig": natives(p)}}
        for ext in ("pprof", "speedscope.json"):
            path = os.path.join({str(tmp_path)!r}, "p." + ext)
            save(p, path)
            out[ext] = natives(load(path))
        path = os.path.join({str(tmp_path)!r}, "cpu.folded")
        save(p, path)
        out["folded"] = sorted({{(f.name, f.kind.name) for s in load(path).samples() for f in s.stack if "ddpx" in f.name}})
        emit(**out)
    ''', ext_dir)
    orig = res["orig"]
    assert {n for n, _, _ in orig} >= {"ddpx_burn", "ddpx_mid", "ddpx_hot_a", "ddpx_hot_b"}, res
    assert all(f.endswith(".so") for _, f, _ in orig), res
    assert res["pprof"] == orig, res
    assert res["speedscope.json"] == orig, res
    # (folded writes a frame that is not Python's as its bracketed name, read back as native)
    assert {(n, k) for n, k in res["folded"]} == {(f"[{n}]", "NATIVE") for n, _, _ in orig}, res


def test_alloc_and_park_samples_carry_native_frames():
    # GIVEN numpy arrays allocated by make, and a time.sleep in nap
    # WHEN profiled for alloc and park with native=True
    # THEN the [numpy] allocations under make pass through numpy's C allocator
    #   (PyDataMem_UserNEW) below make, and the sleep's park sample through time_sleep below nap
    res = run('''
        import numpy as np
        def make():
            for _ in range(2000):
                a = np.ones(20000)
        def nap():
            time.sleep(0.3)
        e = NativeEngine(SamplerConfig.make(events=("alloc", "park"), native=True))
        e.start(); make(); nap(); p = e.stop()
        alloc_total = alloc_hit = park_total = park_hit = 0
        for s in p.samples():
            names = [f.name for f in s.stack]
            if s.event is EventType.ALLOC and "make" in names:
                alloc_total += s.values[1]
                tail = names[names.index("make") + 1:]
                alloc_hit += s.values[1] * ("PyDataMem_UserNEW" in tail and tail[-1] == "[numpy]")
            if s.event is EventType.PARK and "nap" in names:
                park_total += s.values[1]
                park_hit += s.values[1] * ("time_sleep" in names[names.index("nap") + 1:])
        emit(alloc_total=alloc_total, alloc_hit=alloc_hit, park_total=park_total, park_hit=park_hit,
             interp_named=has_symtab(interpreter_file()))
    ''')
    assert res["alloc_total"] > 0 and res["alloc_hit"] >= 0.9 * res["alloc_total"], res
    assert res["park_total"] > 0, res
    if res["interp_named"]:  # (time_sleep is a static function: named only from a .symtab)
        assert res["park_hit"] == res["park_total"], res


def test_rust_and_cpp_extensions_from_pypi_show_demangled_namespaced_names():
    # GIVEN rpds-py (Rust, v0 mangling) inserting into a persistent map, and numpy's stable
    #   sort (timsort, a C++ template over npy:: tag types), each under its own Python function
    # WHEN profiled with native=True
    # THEN frames in rpds's library and in numpy's C++ sort have namespaced names ("::"),
    #   and no native frame anywhere is a mangled name (_Z..., _R...)
    res = run('''
        import numpy as np
        import rpds
        def rust():
            for _ in range(4):
                m = rpds.HashTrieMap()
                for i in range(60000):
                    m = m.insert(i, i)
        x = np.random.rand(1_000_000)
        def cpp():
            for _ in range(4):
                np.sort(x, kind="stable")
        e = native_engine(); e.start(); rust(); cpp(); p = e.stop()
        names = collections.Counter()
        mangled = set()
        for fn in ("rust", "cpp"):
            for stack, w in under(p, fn):
                for f in below(stack, fn):
                    if f.kind is FrameKind.NATIVE:
                        if f.name.startswith(("_Z", "_R", "__Z", "__R")):
                            mangled.add(f.name)
                        lib_ = os.path.basename(f.filename)
                        if fn == "rust" and lib_.startswith("rpds") or fn == "cpp" and lib_.startswith("_multiarray_umath"):
                            names[(fn, f.name, lib_)] += w
        top = [[*k, v] for fn in ("rust", "cpp") for k, v in collections.Counter(
            {k: v for k, v in names.items() if k[0] == fn}).most_common(8)]
        emit(names=top, mangled=sorted(mangled), numpy_named=has_symtab(np._core._multiarray_umath.__file__))
    ''')
    assert not res["mangled"], res
    rust = [n for fn, n, _, _ in res["names"] if fn == "rust"]
    cpp = [n for fn, n, _, _ in res["names"] if fn == "cpp"]
    assert any("rpds::" in n for n in rust), res
    if res["numpy_named"]:  # (a stripped numpy names its exported functions only)
        # a C++ signature: "int timsort_<npy::double_tag>(void*, long)" here with numpy 2.x
        assert any("::" in n and "<" in n and "(" in n for n in cpp), res


@pytest.mark.alone  # names come from drains while each copy is loaded: none came in time beside another test once
def test_libraries_loaded_and_unloaded_during_the_session(ext_dir, tmp_path):
    # GIVEN 30 copies of the extension's library, each loaded (ctypes), burned in for ~40 ms
    #   of CPU and unloaded (dlclose) during one native=True session at 1 ms
    # WHEN profiled
    # THEN nothing crashes, and most samples in a copy's burners walk up through ddpx_mid and
    #   ddpx_burn to the Python caller: each copy's tables were built after it was loaded
    #   (which copy a frame names is not checked: they are unloaded before the drain names
    #   them, the README's limit)
    import glob
    import shutil

    src = glob.glob(os.path.join(ext_dir, "_ddpx_nofp*.so"))[0]
    for i in range(30):
        shutil.copy(src, tmp_path / f"copy{i}.so")
    res = run(f'''
        import ctypes, _ctypes
        def load_burn_unload():
            for i in range(30):
                lib_ = ctypes.CDLL(os.path.join({str(tmp_path)!r}, f"copy{{i}}.so"))
                lib_.ddpx_burn.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
                t = time.thread_time()
                while time.thread_time() - t < 0.04:
                    lib_.ddpx_burn(1, 200_000)
                _ctypes.dlclose(lib_._handle)
                del lib_
        e = NativeEngine(SamplerConfig.make(events=("cpu",), interval="1ms", native=True))
        e.start(); load_burn_unload(); p = e.stop()
        total = whole = 0
        files = set()
        for s in p.samples():
            names = [f.name for f in s.stack]
            if s.stack[-1].name in ("ddpx_hot_a", "ddpx_hot_b"):
                total += 1
                if names[-3:-1] == ["ddpx_burn", "ddpx_mid"] and "load_burn_unload" in names:
                    whole += 1
                    files.add(os.path.basename(s.stack[-1].filename))
        emit(total=total, whole=whole, files=len(files))
    ''', ext_dir)
    assert res["total"] >= 100, res
    assert res["whole"] >= 0.6 * res["total"], res
