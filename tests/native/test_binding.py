"""The binding: tables, version checks, errors, safe reads, code resolution, line tables."""

from __future__ import annotations

import platform
import sys

import pytest

from ddprof_nb.engines.native import binding as _binding, codes as _codes, decode as _decode, session as _session
from ddprof_nb.config import SamplerConfig
from ddprof_nb.engines.native import NativeEngine
from ddprof_nb.errors import EngineUnavailableError, NotRunningError, ProfilerBusyError, ProfilerError
from ddprof_nb.events import EventType, FrameKind
from ddprof_nb.engines.native.lockpark import WaitClassifier

from nhelpers import run_script

lib, ffi = _binding.lib, _binding.ffi


def test_compiled_tables_equal_events_h():
    # GIVEN the loaded native module / WHEN its table is compared row by row / THEN it matches
    assert _binding._check_tables(lib, ffi) is None
    for ev in EventType:
        assert ffi.string(lib.ddp_event_name(ev.value)).decode() == ev.label
        assert lib.ddp_event_leaf_kind(ev.value) == ev.leaf_kind.value
        want = [x for vt in ev.value_types for x in vt]
        assert [ffi.string(lib.ddp_event_value_type(ev.value, i)).decode() for i in range(4)] == want
    for fk in FrameKind:
        assert ffi.string(lib.ddp_frame_kind_name(fk.value)).decode() == fk.label
    # out-of-range ids are total: NULL / -1, never garbage
    assert lib.ddp_event_name(len(EventType)) == ffi.NULL
    assert lib.ddp_event_leaf_kind(-1) == -1


def test_module_compiled_for_this_python():
    # GIVEN this interpreter / THEN the module was built against its exact version
    assert _binding._version_hex_tuple(lib.ddp_compiled_python_version()) == tuple(sys.version_info[:3])
    assert NativeEngine.unavailable_reason() is None


def test_version_mismatch_is_refused_with_the_versions_named(monkeypatch):
    # GIVEN a module that claims another CPython's layout
    class FakeLib:
        def __getattr__(self, name):
            return getattr(lib, name)

        @staticmethod
        def ddp_compiled_python_version():
            return 0x030A0CF0  # 3.10.12

    class FakeNative:
        lib = FakeLib()
        ffi = _binding.ffi

    import ddprof_nb

    monkeypatch.setitem(sys.modules, "ddprof_nb._native", FakeNative)
    monkeypatch.setattr(ddprof_nb, "_native", FakeNative, raising=False)
    monkeypatch.setattr(_binding, "_reason", None)
    monkeypatch.setattr(_binding, "lib", None)
    monkeypatch.setattr(_binding, "ffi", _binding.ffi)  # _load() clears both on refusal
    # WHEN the binding loads it
    _binding._load()
    # THEN the engine is refused, naming both versions
    reason = _binding.unavailable_reason()
    assert reason and "3.10.12" in reason and ".".join(map(str, sys.version_info[:3])) in reason
    assert _binding.lib is None
    with pytest.raises(EngineUnavailableError):
        NativeEngine(SamplerConfig.make()).start()


def test_published_offsets_equal_the_compiled_ones_and_any_difference_is_named():
    # GIVEN the running interpreter / WHEN its published offsets are checked / THEN they match
    msg = ffi.new("char[]", 512)
    assert lib.ddp_py_layout_problem(msg, 512) == 0, ffi.string(msg).decode()
    if sys.version_info < (3, 13):  # 3.11/3.12 publish no offsets: nothing to perturb
        assert lib.ddp_py_layout_selftest(0, msg, 512) == -1
        return
    # WHEN each published value the walker relies on is perturbed in turn (0: the cookie)
    names = []
    field = 0
    while (rc := lib.ddp_py_layout_selftest(field, msg, 512)) != -1:
        text = ffi.string(msg).decode()
        # THEN every single difference is refused, naming the field
        assert rc == 1 and text, field
        names.append(text)
        field += 1
    assert field >= 30
    assert any("interpreter_frame.executable" in t for t in names)
    assert any("thread_state.current_frame" in t for t in names)
    assert any("cookie" in t for t in names)


def test_layout_mismatch_is_refused_with_the_field_named(monkeypatch):
    # GIVEN a module whose compiled offsets differ from what the interpreter publishes
    class FakeLib:
        def __getattr__(self, name):
            return getattr(lib, name)

        @staticmethod
        def ddp_py_layout_problem(buf, cap):
            text = b"the running interpreter publishes interpreter_frame.owner = 70, the headers say 62"
            ffi.memmove(buf, text + b"\0", len(text) + 1)
            return 1

    class FakeNative:
        lib = FakeLib()
        ffi = _binding.ffi

    import ddprof_nb

    monkeypatch.setitem(sys.modules, "ddprof_nb._native", FakeNative)
    monkeypatch.setattr(ddprof_nb, "_native", FakeNative, raising=False)
    monkeypatch.setattr(_binding, "_reason", None)
    monkeypatch.setattr(_binding, "lib", None)
    monkeypatch.setattr(_binding, "ffi", _binding.ffi)
    # WHEN the binding loads it
    _binding._load()
    # THEN the engine is refused before any read, naming the field and the version
    reason = _binding.unavailable_reason()
    assert reason and "interpreter_frame.owner" in reason and platform.python_version() in reason
    assert _binding.lib is None
    with pytest.raises(EngineUnavailableError):
        NativeEngine(SamplerConfig.make()).start()


def test_free_threaded_and_unknown_versions_are_refused(monkeypatch):
    import sysconfig

    monkeypatch.setattr(_binding, "_reason", None)
    monkeypatch.setattr(_binding, "lib", None)
    monkeypatch.setattr(_binding, "ffi", _binding.ffi)
    real = sysconfig.get_config_var
    monkeypatch.setattr(sysconfig, "get_config_var", lambda k: 1 if k == "Py_GIL_DISABLED" else real(k))
    _binding._load()
    assert "free-threaded" in (_binding.unavailable_reason() or "")
    assert _binding.lib is None
    monkeypatch.setattr(sysconfig, "get_config_var", real)
    monkeypatch.setattr(_binding, "SUPPORTED", ((3, 11),) if sys.version_info[:2] != (3, 11) else ((3, 12),))
    _binding._load()
    reason = _binding.unavailable_reason() or ""
    assert "not " + platform.python_version() in reason and _binding.lib is None


def test_error_codes_become_exceptions():
    # GIVEN each error code / WHEN checked / THEN the matching exception type with the strerror text
    with pytest.raises(ProfilerBusyError, match="already running"):
        _binding.check(lib.DDP_EBUSY, "x")
    with pytest.raises(EngineUnavailableError):
        _binding.check(lib.DDP_EUNSUPPORTED, "x")
    with pytest.raises(NotRunningError):
        _binding.check(lib.DDP_ENOTRUNNING, "x")
    with pytest.raises(ProfilerError, match="SIGPROF already has a handler"):
        _binding.check(lib.DDP_ESIGNAL, "x")
    assert _binding.check(3, "x") == 3


def test_invalid_interval_is_einval():
    # GIVEN an interval below the native minimum / WHEN starting / THEN DDP_EINVAL -> ProfilerError
    session = _session.Session(10, 64, [EventType.CPU])
    with pytest.raises(ProfilerError, match="invalid argument"):
        session.start()
    assert not lib.ddp_running()


def test_stop_without_start_is_not_running():
    with pytest.raises(NotRunningError):
        NativeEngine(SamplerConfig.make()).stop()


def test_guarded_and_syscall_reads_survive_bad_addresses():
    # GIVEN a valid buffer and invalid addresses: a NULL field's, a guard page's (mapped with no
    #   access: a fixed "unmapped" address can be mapped, ASLR placing a mapping there), and, for
    #   the checked read, one past the user address space (the guarded copy is never given one:
    #   such a fault names no address its guard could recognise)
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    guard = libc.mmap(None, mmap.PAGESIZE, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # (0: PROT_NONE)
    assert guard not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    buf = ffi.new("char[64]")
    good = int(ffi.cast("uintptr_t", buf))
    try:
        # WHEN read safely THEN no crash, -1 for the bad ones
        for mode in (lib.DDP_READ_GUARDED, lib.DDP_READ_SYSCALL):
            assert lib.ddp_test_safe_read(good, mode) == 0
            assert lib.ddp_test_safe_read(8, mode) == -1
            assert lib.ddp_test_safe_read(guard, mode) == -1
        assert lib.ddp_test_safe_read(0x800000000000, lib.DDP_READ_SYSCALL) == -1
    finally:
        libc.munmap(guard, mmap.PAGESIZE)


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="3.13+ switch frames with one pointer: no C frame to catch")
def test_a_thread_caught_entering_the_eval_loop_is_a_torn_walk_not_an_empty_stack():
    # GIVEN a thread state whose newest C frame is pushed but has no Python frame yet (the eval
    #   loop's first instructions: a sample from outside, or a signal, can land there)
    # WHEN walked THEN the walk is torn (the sample retried or carried), not an empty stack
    assert lib.ddp_test_walk_entering() == -1


def _resolve(code_obj):
    fp = ffi.new("uint64_t *")
    assert lib.ddp_fingerprint_of(id(code_obj), fp) == 0
    r = _codes.Resolver()
    return r.code(id(code_obj), fp[0]), fp[0], r


@pytest.mark.parametrize("name", ["plain_ascii", "caf\u00e9_latin1", "\u0444\u0443\u043d\u043a\u0446\u0438\u044f", "\U00020000\U00020001_astral"])
def test_resolution_copies_every_unicode_kind(name):
    # GIVEN a function whose name and file name are ASCII, Latin-1, UCS-2 or UCS-4
    ns = {}
    filename = f"<file-{name}>"
    exec(compile(f"class K:\n    def {name}(self):\n        return 1\n", filename, "exec"), ns)
    code = getattr(ns["K"], name).__code__
    # WHEN resolved through safe reads
    info, _, _ = _resolve(code)
    # THEN the qualified name and file name come back exactly
    assert info is not None
    assert info.qualname == f"K.{name}" and info.filename == filename
    assert info.firstlineno == code.co_firstlineno and info.linetable == code.co_linetable


def test_resolution_refuses_a_wrong_fingerprint_or_address():
    def some_function():
        return 2

    info, fp, r = _resolve(some_function.__code__)
    assert info.qualname.endswith("some_function")
    # a different fingerprint at the same address: another code object, never this name
    assert r.code(id(some_function.__code__), fp ^ 1) is None
    # not a code object / unmapped memory: refused, no crash
    assert r.code(id(object()), fp) is None
    assert r.code(0x7FF000000000, fp) is None


def _lines_reference(code):
    return [pos[0] for pos in code.co_positions()]


def _all_codes(obj, seen=None):
    import types

    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    yield obj
    for c in obj.co_consts:
        if isinstance(c, types.CodeType):
            yield from _all_codes(c, seen)


def test_addr2line_matches_cpython_for_every_instruction():
    # GIVEN real code objects (a stdlib module's, with long/short/no-location entries)
    import json.decoder
    import threading

    src = open(threading.__file__).read() + open(json.decoder.__file__).read()
    top = compile(src, "x.py", "exec")
    checked = 0
    for code in _all_codes(top):
        ref = _lines_reference(code)
        lt = ffi.from_buffer(code.co_linetable) if code.co_linetable else ffi.NULL
        for i, want in enumerate(ref):
            # WHEN the native line table walk answers / THEN it equals co_positions()
            got = lib.ddp_addr2line(lt, len(code.co_linetable), code.co_firstlineno, i)
            assert got == (want if want is not None else code.co_firstlineno), (code.co_qualname, i)
            checked += 1
    assert checked > 10000


def test_second_start_raises_busy_and_first_keeps_working():
    r = run_script(
        """
        from ddprof_nb.errors import ProfilerBusyError
        a = engine()
        a.start()
        busy = False
        try:
            engine().start()
        except ProfilerBusyError as exc:
            busy = "already" in str(exc)
        # also the C level: a raw second session is refused with DDP_EBUSY
        from ddprof_nb.engines.native import binding as _binding, codes as _codes, decode as _decode, session as _session
        s = _session.Session(10_000_000, 64, [EventType.CPU])
        try:
            s.start(); raw = False
        except ProfilerBusyError:
            raw = True
        burn(0.2)
        p = a.stop()
        emit(busy=busy, raw=raw, cpu=p.total("cpu"))
        """
    )
    assert r["busy"] and r["raw"]
    assert r["cpu"] > 0


def test_existing_sigprof_handler_is_detected_and_kept():
    r = run_script(
        """
        import signal
        from ddprof_nb.errors import ProfilerError
        def mine(sig, frame):
            pass
        signal.signal(signal.SIGPROF, mine)
        try:
            engine().start(); msg = ""
        except ProfilerError as exc:
            msg = str(exc)
        # wall-only sampling needs no SIGPROF: allowed
        e = engine(events=("wall",)); e.start(); time.sleep(0.1); p = e.stop()
        emit(msg=msg, kept=signal.getsignal(signal.SIGPROF) is mine, wall=p.total("wall"))
        """
    )
    assert "SIGPROF" in r["msg"]
    assert r["kept"]
    assert r["wall"] > 0


def test_sigprof_disposition_restored_exactly():
    r = run_script(
        """
        import signal
        signal.signal(signal.SIGPROF, signal.SIG_IGN)
        e = engine(interval="1ms"); e.start(); burn(0.2); e.stop()
        ign = signal.getsignal(signal.SIGPROF) is signal.SIG_IGN
        signal.signal(signal.SIGPROF, signal.SIG_DFL)
        e = engine(interval="1ms"); e.start(); burn(0.2); e.stop()
        emit(ign=ign, dfl=signal.getsignal(signal.SIGPROF) is signal.SIG_DFL)
        """
    )
    assert r == {"ign": True, "dfl": True}


# a script prefix (indented as the bodies it goes before): ``wakes`` lists each return of the drain thread's wait, as (time, mask)
RECORD_WAKES = """
        from ddprof_nb.engines.native import binding as _binding, codes as _codes, decode as _decode, session as _session
        wakes = []
        _wait = _session.Session.wait
        def _recording_wait(self, timeout):
            mask = _wait(self, timeout)
            wakes.append((time.monotonic(), mask))
            return mask
        _session.Session.wait = _recording_wait
    """


# alone: it bounds how soon the drain wakes, which other work on the CPUs delays
@pytest.mark.alone
def test_the_drain_comes_soon_for_new_code_and_once_a_second_for_known_code():
    # GIVEN a session that burns CPU in one function for 1.6 s, then runs code made on the spot
    r = run_script(
        RECORD_WAKES + """
        e = engine()
        e.start()
        t0 = time.monotonic()
        burn(1.6)
        t_new = time.monotonic()
        ns = {}
        exec(compile("def fresh(burn):\\n    burn(0.5)\\n", "<fresh>", "exec"), ns)
        ns["fresh"](burn)
        p = e.stop()
        emit(wakes=[(t - t0, m) for t, m in wakes], t_new=t_new - t0, fresh=sum(1 for f in p.frames if f.name == "fresh"))
        """
    )
    new_code = 4  # DDP_WAKE_CODE
    steady = [w for w in r["wakes"] if 0.5 < w[0] < r["t_new"]]
    later = [w for w in r["wakes"] if w[0] > r["t_new"] and w[1] > 0 and w[1] & new_code]
    # WHEN the drain's wakes are counted / THEN known code waits for the 1 s interval: at
    # most one wake per second of the window (it came every 0.1 s before: 11 wakes in
    # 1.1 s), however long a loaded machine stretches the burn; and new code wakes it
    # with the new-code reason (~0.1 s later: printed, a figure rather than a gate)
    assert len(steady) <= (r["t_new"] - 0.5) + 1, r["wakes"]
    assert later, r
    print(f"\nnew code woke the drain {later[0][0] - r['t_new']:.3f} s after it first ran")
    assert r["fresh"] == 1, r


# alone: it bounds how soon the drain wakes, which other work on the CPUs delays
@pytest.mark.alone
def test_code_resolved_in_one_session_does_not_bring_the_next_sessions_drain_early():
    # GIVEN a session that burned CPU in one function, then a second session running it again
    #       (a notebook's next cell), with a new function at the end of the second
    r = run_script(
        RECORD_WAKES + """
        e = engine(); e.start(); burn(0.5); known = {f.name for f in e.stop().frames}
        wakes.clear()
        e = engine(); e.start()
        t0 = time.monotonic()
        burn(0.8)
        t_new = time.monotonic()
        ns = {}
        exec(compile("def fresh2(burn):\\n    burn(0.5)\\n", "<fresh2>", "exec"), ns)
        ns["fresh2"](burn)
        p = e.stop()
        emit(wakes=[(t - t0, m) for t, m in wakes], t_new=t_new - t0,
             fresh=sum(1 for f in p.frames if f.name == "fresh2"), burn=sum(1 for f in p.frames if f.name == "burn"),
             known_burn="burn" in known, unknown=sorted({f.name for f in p.frames} - known - {"fresh2"}))
        """
    )
    new_code = 4  # DDP_WAKE_CODE
    early = [w for w in r["wakes"] if w[0] < r["t_new"] and w[1] > 0 and w[1] & new_code]
    later = [w for w in r["wakes"] if w[0] > r["t_new"] and w[1] > 0 and w[1] & new_code]
    # WHEN the second session's drain wakes are listed / THEN the known function brought
    # none early (the filter outlives the session, as the code cache does), the new one did.
    # (An early wake is only explained by a function the first session never sampled: the
    # tail of the second start() itself, caught by a sample under a sanitizer's slowdown.)
    assert r["known_burn"], r
    assert early == [] or r["unknown"], r
    assert later and later[0][0] - r["t_new"] < 0.45, r
    assert r["fresh"] == 1 and r["burn"] >= 1, r


def test_records_taken_by_a_wake_are_never_lost_nor_overwritten():
    # GIVEN a session whose drain wake took records into the buffer (wait) but never fed
    #       them (the engine's drain skips a wake that races stop), then waited again
    r = run_script(
        """
        from ddprof_nb.engines.native.decode import RecordConverter
        from ddprof_nb.engines.native.session import Session
        from ddprof_nb.model import ProfileBuilder
        # one record per sample (merge_wall=False): a late tick and the next one in the same
        # 1 ms bucket would make one record of two samples (CI's chroot saw 47 records of 48)
        s = Session(2_000_000, 64, ("wall",), merge_wall=False)
        s.start()
        time.sleep(0.05)
        first = s.wait(0)           # takes what is ready
        held = s._taken
        time.sleep(0.05)
        second = s.wait(0)          # takes more, after those
        s.stop()
        after_stop = s.wait(0)      # stopped: takes nothing, keeps what it holds
        conv = RecordConverter(ProfileBuilder(), 0)
        fed = s.drain(conv, final=True)
        stats = s.stats()
        s.release()
        emit(first=first, held=held, second=second, after_stop=after_stop, fed=fed,
             made=stats["samples"][EventType.WALL], dropped=stats["dropped_full"][EventType.WALL])
        """
    )
    # WHEN the final drain runs / THEN it feeds every record the sampler made, in order
    assert r["first"] >= 0 and r["second"] >= 0 and r["after_stop"] == -1, r
    assert r["held"] > 0, r
    assert r["dropped"] == 0 and r["fed"] == r["made"] > r["held"], r


def test_a_drain_from_another_thread_never_waits_for_the_drain_threads_wake():
    # GIVEN an engine whose drain thread waits for a wake an hour away, and a CPU burner
    r = run_script(
        """
        import threading
        e = NativeEngine(SamplerConfig.make(events=("cpu", "wall")), drain_interval=3600,
                         drain_early=False, drain_new_code=False)
        e.start()
        burn(0.3)
        took = []
        def drain_now():
            t = time.monotonic()
            e._drain_once()
            took.append(time.monotonic() - t)
        for _ in range(3):  # WHEN another thread drains, three times
            d = threading.Thread(target=drain_now)
            d.start()
            d.join(10)
            burn(0.05)
        p = e.stop()
        emit(took=took, cpu=p.total(EventType.CPU))
        """
    )
    # THEN each drain returned (before the fix it waited on the waiting thread's lock for
    # the whole hour: its join(10) gave up and it never appended), and the records it and
    # the final drain fed add up
    print(f"\ndrains from another thread took {', '.join(f'{t * 1e3:.1f} ms' for t in r['took'])}")
    assert len(r["took"]) == 3, r
    assert r["cpu"] > 0.25e9, r


def test_wall_merge_buckets_are_the_profiles_own_ticks():
    # GIVEN the Profile's tick rule (model.tick_for) and the sampler's merge bucket rule
    import random

    from ddprof_nb.model import MAX_TICKS, MIN_TICK_NS, tick_for

    rng = random.Random(7)
    points = [rng.randrange(0, 4 * 3600 * 10**9) for _ in range(3000)]
    points += [MIN_TICK_NS * MAX_TICKS * 2**k + d for k in range(12) for d in (-1, 0, 1)]
    for e in points:
        # WHEN a sample taken e ns after start gets its bucket / THEN it is the tick tick_for(e) puts it in
        t = tick_for(e)
        assert lib.ddp_merge_bucket(e, MIN_TICK_NS, MAX_TICKS) == e // t * t, e
    # AND two samples whose buckets are equal share one tick of every longer profile
    for _ in range(3000):
        e1 = rng.randrange(0, 600 * 10**9)
        e2 = e1 + rng.randrange(0, 2 * 10**9)
        b1, b2 = (lib.ddp_merge_bucket(e, MIN_TICK_NS, MAX_TICKS) for e in (e1, e2))
        if b1 == b2:
            for d in (e2, e2 + 1, 2 * e2 + 7, 10 * e2 + 3):
                t = tick_for(d)
                assert e1 // t == e2 // t, (e1, e2, d)
    assert lib.ddp_merge_bucket(123, 0, MAX_TICKS) == -1  # merging off


def _records(specs, record_size, start=0):
    """A record buffer from (stack_hash, [code objects]) specs: WALL records, one sample each."""
    import numpy as np

    dt = _decode._record_dtype(record_size)
    buf = np.zeros(len(specs), dtype=dt)
    raw = buf.view(np.uint8).reshape(len(specs), record_size)
    hsize = ffi.sizeof("ddp_record")
    fp = ffi.new("uint64_t *")
    for i, (h, codes) in enumerate(specs):
        buf[i]["event"], buf[i]["state"], buf[i]["depth"] = EventType.WALL.value, 2, len(codes)
        buf[i]["tid"], buf[i]["ts_ns"], buf[i]["count"], buf[i]["value"] = 1, start + i, 1, 10
        buf[i]["stack_hash"] = h
        frames = np.zeros(len(codes), dtype=[("code", "<u8"), ("fp", "<u8"), ("lasti", "<i4"), ("fl", "<i4")])
        for j, c in enumerate(codes):
            assert lib.ddp_fingerprint_of(id(c), fp) == 0
            frames[j] = (id(c), fp[0], 0, c.co_firstlineno)
        raw[i, hsize : hsize + frames.nbytes] = frames.view(np.uint8)
    return buf


@pytest.fixture(params=["numpy", "record-by-record"])
def batch_path(request, monkeypatch):
    """Run a converter test through both of RecordConverter.feed's paths."""
    monkeypatch.setattr(_decode, "SMALL_BATCH", 0 if request.param == "numpy" else 10**6)
    return request.param


def test_a_stack_hash_collision_never_merges_two_stacks(batch_path):
    # GIVEN records of two different stacks that carry the same stack_hash, across two batches
    from ddprof_nb.model import ProfileBuilder

    def alpha():
        pass

    def beta():
        pass

    size = ffi.sizeof("ddp_record") + 4 * _binding.FRAME_SIZE
    conv = _decode.RecordConverter(ProfileBuilder(), 0)
    batches = [_records([(42, [alpha.__code__]), (42, [beta.__code__]), (42, [alpha.__code__])], size),
               _records([(42, [beta.__code__]), (7, [beta.__code__]), (42, [alpha.__code__])], size, start=3)]
    for b in batches:
        # WHEN they are converted
        assert conv.feed(ffi.from_buffer(b), len(b), size) == len(b)
    prof = conv.builder.build()
    # THEN every record keeps its own stack: 3 alpha and 3 beta samples
    names = {}
    for s in prof.samples():
        names[s.stack[-1].name] = names.get(s.stack[-1].name, 0) + s.values[0]
    assert {k.rsplit(".", 1)[-1]: v for k, v in names.items()} == {"alpha": 3, "beta": 3}, names


def test_both_batch_paths_build_the_same_profile(monkeypatch):
    # GIVEN a batch of CPU, WALL, LOCK and PARK records: stacks repeated and colliding on their
    # hash, several threads, label sets, states and subinterpreters, torn records and an excluded thread
    import random

    import numpy as np

    from ddprof_nb import labeling
    from ddprof_nb.model import LabelSet, ProfileBuilder

    def f1():
        pass

    def f2():
        pass

    def f3():
        pass

    rng = random.Random(3)
    size = ffi.sizeof("ddp_record") + 4 * _binding.FRAME_SIZE
    stacks = [[f1.__code__], [f2.__code__, f1.__code__], [f3.__code__, f2.__code__, f1.__code__], [f3.__code__]]
    specs = [(rng.choice([5, 6, 7]), stacks[rng.randrange(4)]) for _ in range(300)]  # 3 hashes for 4 stacks
    buf = _records(specs, size)
    ids = [labeling.label_id(LabelSet.of({"k": v})) for v in ("a", "b")] + [0]
    for r in buf:
        r["event"] = rng.choice([EventType.CPU.value, EventType.WALL.value, EventType.LOCK.value, EventType.PARK.value])
        r["aux"] = rng.choice([1, 4, 17])  # lock/park: sem_wait, clock_nanosleep, the GIL's cond wait
        r["state"] = rng.choice([1, 2, 3])
        r["tid"] = rng.choice([11, 12, 13])
        r["label_id"] = rng.choice(ids)
        r["interp"] = rng.choice([0, 0, 0, 1, 3])  # a subinterpreter's CPU samples: its id + 1
        r["count"], r["value"] = 1, rng.randrange(1, 10**7)
        if rng.random() < 0.05:
            r["flags"] |= lib.DDP_REC_INVALID

    def convert(small: int):
        monkeypatch.setattr(_decode, "SMALL_BATCH", small)
        conv = _decode.RecordConverter(ProfileBuilder(), 0, exclude_tids=(13,), thread_names={11: "a", 12: "b"})
        conv.waits = WaitClassifier(conv.builder)
        for lo in range(0, len(buf), 100):
            part = np.ascontiguousarray(buf[lo:lo + 100])
            conv.feed(ffi.from_buffer(part), len(part), size)
        return conv, sorted((s.event.label, tuple(f.name for f in s.stack), s.thread, s.labels.items,
                             s.time_ns, s.values) for s in conv.builder.build().samples())

    (c_np, numpy_rows), (c_py, python_rows) = convert(0), convert(10**6)
    # THEN the two paths agree row for row, and so do their counts of torn records
    assert numpy_rows == python_rows
    assert c_np.skipped_invalid == c_py.skipped_invalid > 0
    assert {r[2].name for r in python_rows} == {"a", "b"}  # tid 13 excluded
    assert len({r[1] for r in python_rows if r[0] in ("cpu", "wall")}) == 4
    assert {dict(r[3]).get("interp") for r in python_rows if r[0] == "cpu"} == {None, "0", "2"}
    # AND lock/park records went through the classifier on both paths (leaf pseudo-frames)
    leaves = {r[1][-1] for r in python_rows if r[0] in (EventType.LOCK.label, EventType.PARK.label)}
    assert {"[sleep]", "[GIL]"} <= leaves, leaves


def test_drain_wait_sleeps_without_the_gil_and_wakes_for_new_threads_and_stop():
    r = run_script(
        """
        from ddprof_nb.engines.native import binding as _binding, codes as _codes, decode as _decode, session as _session
        s = _session.Session(10_000_000, 32, ("cpu", "wall"), drain_new_code=False)  # (nothing drains here)
        out, go = {}, threading.Event()
        def waiter():
            go.wait()
            t = time.monotonic()
            out["timeout"] = (s.wait(0.3), time.monotonic() - t)
            t = time.monotonic()
            out["thread"] = (s.wait(5.0), time.monotonic() - t)
            t = time.monotonic()
            out["stop"] = (s.wait(5.0), time.monotonic() - t)
        w = threading.Thread(target=waiter); w.start()  # before start: not a new thread
        s.start()
        go.set()
        time.sleep(0.05)
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < 0.3:  # the GIL stays free while the waiter sleeps in C
            n += 1
        time.sleep(0.3)
        th = threading.Thread(target=time.sleep, args=(0.5,)); th.start()
        time.sleep(0.5)
        s.stop()
        w.join(); th.join()
        s.release()
        emit(out=out, spins=n, after=s.wait(0.1))
        """
    )
    out = r["out"]
    # THEN a wait with nothing to do times out (0), a new thread wakes it (DDP_WAKE_THREAD)
    # within a few wall ticks, stop ends it (-1), and a wait after stop returns at once
    assert out["timeout"][0] == 0 and out["timeout"][1] >= 0.29, out
    assert out["thread"][0] & 2 and out["thread"][1] < 1.5, out
    assert out["stop"][0] == -1 and out["stop"][1] < 1.5, out
    assert r["after"] == -1
    assert r["spins"] > 10000


def test_a_thread_first_seen_unnamed_gets_its_name_when_learnt():
    # GIVEN records of tid 1 converted before its name is known (a drain woken by the new
    # thread can run before threading has its native id)
    from ddprof_nb.model import ProfileBuilder

    def work():
        pass

    size = ffi.sizeof("ddp_record") + 4 * _binding.FRAME_SIZE
    names: dict[int, str] = {}
    conv = _decode.RecordConverter(ProfileBuilder(), 0, thread_names=names)
    first = _records([(1, [work.__code__])] * 3, size)
    conv.feed(ffi.from_buffer(first), len(first), size)
    # WHEN the name is learnt, more records come, and the engine names the threads at stop
    names[1] = "worker-7"
    more = _records([(1, [work.__code__])] * 2, size, start=10)
    conv.feed(ffi.from_buffer(more), len(more), size)
    conv.name_threads()
    # THEN all five samples belong to one thread, under its real name
    prof = conv.builder.build()
    assert [t.name for t in prof.threads] == ["worker-7"]
    assert int(prof.values[:, 0].sum()) == 5


def test_alloc_records_convert_alike_on_both_batch_paths(monkeypatch):
    # GIVEN ALLOC records mixed with WALL ones (stacks, threads, labels, times, weights, ids varied)
    import random

    import numpy as np

    from ddprof_nb.engines.native.alloc import AllocTracker
    from ddprof_nb.model import ProfileBuilder

    def g1():
        pass

    def g2():
        pass

    rng = random.Random(5)
    size = ffi.sizeof("ddp_record") + 4 * _binding.FRAME_SIZE
    stacks = [[g1.__code__], [g2.__code__, g1.__code__]]
    buf = _records([(rng.choice([1, 2]), stacks[rng.randrange(2)]) for _ in range(200)], size, start=1000)
    for i, r in enumerate(buf):
        if rng.random() < 0.7:
            r["event"], r["aux"] = EventType.ALLOC.value, i + 1
            r["count"], r["value"] = rng.randrange(1, 9), rng.randrange(1, 10**7)
        r["tid"], r["label_id"] = rng.choice([21, 22]), 0
        if rng.random() < 0.03:
            r["flags"] |= lib.DDP_REC_INVALID

    def convert(small: int):
        # WHEN the batch goes through one of feed's paths (numpy: small = 0; record by record)
        monkeypatch.setattr(_decode, "SMALL_BATCH", small)
        conv = _decode.RecordConverter(ProfileBuilder(), 500)
        conv.alloc = AllocTracker(conv.builder)
        conv.feed(ffi.from_buffer(np.ascontiguousarray(buf)), len(buf), size)
        frames = list(conv.builder._frames)
        names = lambda sid: tuple(frames[f].name for f in conv.alloc._stack_ids_of(sid))  # noqa: E731
        return [(aid, names(sid), th, lb, t, c, v) for aid, sid, th, lb, t, c, v in conv.alloc._held]

    numpy_rows, python_rows = convert(0), convert(10**6)
    # THEN both hold the same ALLOC rows, in record order, valid ones only, times from the start
    assert numpy_rows == python_rows
    want = [(int(r["aux"]), int(r["ts_ns"]) - 500, int(r["count"]), int(r["value"])) for r in buf
            if r["event"] == EventType.ALLOC.value and not r["flags"] & lib.DDP_REC_INVALID]
    assert [(a, t, c, v) for a, _, _, _, t, c, v in python_rows] == want
    assert {len(r[1]) for r in python_rows} == {1, 2}


def test_a_task_records_labels_are_its_threads_the_sessions_its_state_and_its_name():
    # GIVEN a label set published by a thread, and an asyncio task's id (its bits on top)
    from ddprof_nb import labeling
    from ddprof_nb.model import LabelSet, ProfileBuilder

    low = labeling.label_id(LabelSet.of({"user": "ann"}))
    task = labeling.task_bits("Task-7") | low
    conv = _decode.RecordConverter(ProfileBuilder(), 0, base_labels={"run": "r1"})
    wall = EventType.WALL.value
    # WHEN records carrying them are converted / THEN each gets every label, once
    assert conv._labelset(task, 2).as_dict() == {"user": "ann", "run": "r1", "state": "off-cpu", "task": "Task-7"}
    assert conv._labelset(low, 0).as_dict() == {"user": "ann", "run": "r1"}
    assert conv._labels_id(task, 2, wall) == conv._labels_id(task, 2, wall) != conv._labels_id(task, 1, wall)
    # a CPU record keeps no state: its key is the set alone
    cpu = EventType.CPU.value
    assert conv._labels_id(task, 1, cpu) == conv._labels_id(task, 0, cpu) != conv._labels_id(task, 1, wall)
    # an unknown thread set keeps the task's name; session labels win over a task's
    unknown = (labeling.LOW_MASK - 5) | (task & ~labeling.LOW_MASK)
    assert conv._labelset(unknown, 0).as_dict() == {"run": "r1", "task": "Task-7"}
    own = _decode.RecordConverter(ProfileBuilder(), 0, base_labels={"task": "mine"})
    assert own._labelset(task, 0).as_dict() == {"user": "ann", "task": "mine"}


def test_the_cpu_the_timers_accounted_is_checked_against_the_threads_clocks():
    # GIVEN a CPU session in which the main thread burns 0.2 s of CPU
    r = run_script(
        """
        from ddprof_nb.engines.native import binding as _binding, codes as _codes, decode as _decode, session as _session
        got = {}
        _stats = _session.Session.stats
        def stats():
            out = _stats()
            got.update(out)
            return out
        _session.Session.stats = staticmethod(stats)
        e = engine(interval="5ms", events=("cpu",))
        e.start()
        burn(0.2)
        p = e.stop()
        emit(used=got["cpu_used_ns"], sampled=got["cpu_sampled_ns"], total=p.total(EventType.CPU))
        """
    )
    # WHEN stop compares the thread's CPU clock with its samples' weight / THEN the clock
    # counts the burn, the samples' weight is at most a period or two off it, and the
    # profile's CPU total is the clock's (the samples only split it between stacks)
    assert 0.2e9 <= r["used"] < 0.5e9, r
    assert r["sampled"] <= r["used"] + 2 * 5e6, r
    assert abs(r["total"] - r["used"]) <= 1000, r


def test_a_note_says_when_the_cpu_timers_signals_came_late():
    from ddprof_nb.engines.native.session_notes import late_signals_note as _late_signals_note

    ms = 1_000_000
    # (seen beside CPU hogs on 2 vCPUs: no signal at all for 0.1 s of CPU)
    note = _late_signals_note(100 * ms, 0, 5 * ms)
    assert note and "accounted 0 ns of the 100 ms of CPU" in note
    assert _late_signals_note(100 * ms, 50 * ms, 5 * ms)
    # a session's last partial period is never sampled: a quarter off is within reason,
    # and a short session says nothing
    assert _late_signals_note(100 * ms, 80 * ms, 5 * ms) is None
    assert _late_signals_note(50 * ms, 0, 5 * ms) is None
