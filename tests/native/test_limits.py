"""Settings and sizes at their limits: refused or passed through, never a hang or a wrong count."""

from __future__ import annotations

from nhelpers import run_script


def test_an_aggregate_too_large_to_index_is_refused_at_start():
    # GIVEN aggregates of 2**31 - 1 keys (the index's size doubled in uint32 wrapped to 0 and
    #       the doubling never ended: the start hung)
    # WHEN a session starts with them, and then one with the default
    # THEN the first start fails at once with an error, and the next session runs
    r = run_script(
        """
        from ddprof_nb.errors import ProfilerError
        t0 = time.monotonic()
        try:
            NativeEngine(SamplerConfig.make(events=("cpu",), interval="10ms"), agg_keys=2**31 - 1).start()
            refused = None
        except ProfilerError as exc:
            refused = str(exc)
        took = time.monotonic() - t0
        e = engine(events=("cpu",))
        e.start(); burn(0.05); p = e.stop()
        emit(refused=refused, took=took, cpu=p.total(EventType.CPU))
        """,
        timeout=30,
    )
    assert r["refused"] and "invalid" in r["refused"], r
    assert r["took"] < 5, r
    assert r["cpu"] > 0, r


def test_a_calloc_whose_size_overflows_is_never_counted():
    # GIVEN an alloc session sampling every ~256 bytes.  PyMem_Calloc/PyObject_Calloc refuse
    #       an overflowing nelem x elsize before any allocator runs; a direct caller of the
    #       domain's allocator does not, and (2**63 + 250) x 2 wraps to 500 (pymalloc,
    #       unchecked there, then hands out 500 bytes).  So: the hook called directly (with
    #       the GIL), 2,000 times with the wrapped size and 2,000 times with a true 250 x 2
    # WHEN the ALLOC bytes under each caller are compared
    # THEN the public API refuses the size, and the wrapped calls count ~1 MB less than the
    #      true ones (the hook took the wrapped 500 bytes as an allocation: about equal)
    r = run_script(
        """
        import ctypes
        class Allocator(ctypes.Structure):
            _fields_ = [("ctx", ctypes.c_void_p), ("malloc", ctypes.c_void_p), ("calloc", ctypes.c_void_p),
                        ("realloc", ctypes.c_void_p), ("free", ctypes.c_void_p)]
        api = ctypes.pythonapi
        api.PyMem_Calloc.restype, api.PyMem_Calloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_size_t]
        e = NativeEngine(SamplerConfig.make(events=("alloc",), interval="10ms", alloc_rate=256), ring_records=1 << 16)
        e.start()
        a = Allocator()
        api.PyMem_GetAllocator(ctypes.c_int(1), ctypes.byref(a))  # PYMEM_DOMAIN_MEM: ours on top
        # (PYFUNCTYPE: called with the GIL, as the allocator API needs)
        calloc = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)(a.calloc)
        free = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(a.free)
        ctx = a.ctx
        def calls(nelem):
            for _ in range(1000):
                free(ctx, calloc(ctx, nelem, 2))
        def wrapped():
            calls(2**63 + 250)
        def true_size():
            calls(250)
        public = api.PyMem_Calloc(2**63 + 250, 2)
        true_size(); wrapped(); true_size(); wrapped()
        p = e.stop()
        got = collections.Counter()
        for x in p.samples():
            if x.event is EventType.ALLOC:
                for f in x.stack:
                    if f.name in ("wrapped", "true_size"):
                        got[f.name] += x.values[1]
        from ddprof_nb.engines.native.alloc import AllocTracker
        emit(public=public, bytes=dict(got), emit_failed=AllocTracker.stats()["emit_failed"])
        """,
    )
    assert r["public"] is None, r
    assert r["emit_failed"] == 0, r
    assert r["bytes"].get("wrapped", 0) < r["bytes"]["true_size"] - 600_000, r
