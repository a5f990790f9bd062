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
    # GIVEN an alloc session sampling about every byte.  PyMem_Calloc/PyObject_Calloc refuse
    #       an overflowing nelem x elsize before any allocator runs; a direct caller of the
    #       domain's allocator does not, and (2**63 + 1) x 2 wraps to 2 (pymalloc, unchecked
    #       there, then hands out 2 bytes).  So: the hook called directly, 2,000 times with
    #       the wrapped size and 2,000 times with a true 1 x 2, from two functions
    # WHEN the ALLOC counts under each function are compared
    # THEN the public API refuses the size, and the wrapped calls count ~2,000 fewer
    #      allocations than the true ones (the hook took the wrapped 2 bytes as an allocation)
    r = run_script(
        """
        import ctypes
        class Allocator(ctypes.Structure):
            _fields_ = [("ctx", ctypes.c_void_p), ("malloc", ctypes.c_void_p), ("calloc", ctypes.c_void_p),
                        ("realloc", ctypes.c_void_p), ("free", ctypes.c_void_p)]
        api = ctypes.pythonapi
        api.PyMem_Calloc.restype, api.PyMem_Calloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_size_t]
        e = NativeEngine(SamplerConfig.make(events=("alloc",), interval="10ms", alloc_rate=1))
        e.start()
        a = Allocator()
        api.PyMem_GetAllocator(ctypes.c_int(1), ctypes.byref(a))  # PYMEM_DOMAIN_MEM: ours on top
        calloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)(a.calloc)
        free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(a.free)
        def calls(nelem):
            for _ in range(2000):
                free(a.ctx, calloc(a.ctx, nelem, 2))
        def wrapped():
            calls(2**63 + 1)
        def true_size():
            calls(1)
        public = api.PyMem_Calloc(2**63 + 1, 2)
        wrapped(); true_size()
        p = e.stop()
        count = collections.Counter()
        for x in p.samples():
            if x.event is EventType.ALLOC:
                for f in x.stack:
                    if f.name in ("wrapped", "true_size"):
                        count[f.name] += x.values[0]
        emit(public=public, count=dict(count))
        """,
    )
    assert r["public"] is None, r
    assert r["count"].get("wrapped", 0) < r["count"]["true_size"] - 1000, r
