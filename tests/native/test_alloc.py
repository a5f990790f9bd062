"""Allocation (ALLOC) and live-heap (LIVE) sampling of the native engine (native/alloc.c).

Every scenario runs in a subprocess (nhelpers.run_script): a fault in an allocator hook
would otherwise take pytest down with it.  Bounds here are loose enough never to flake
(>= 4 standard deviations); benchmarks/bench_alloc.py checks the strict ones.
"""

import textwrap

from nhelpers import run_script

ALLOC_PRELUDE = '''
from ddprof_nb.engines.native import binding as _binding
lib, ffi = _binding.lib, _binding.ffi

def allocators():
    out = []
    for d in range(3):  # RAW, MEM, OBJ
        buf = ffi.new("uint64_t[5]")
        lib.ddp_alloc_test_get_allocator(d, buf)
        out.append(list(buf))
    return out

def leaf_totals(p, event):
    out = collections.Counter()
    for s in p.samples():
        if s.event is event:
            out[py_leaf(s)] += s.values[1]
    return out

def type_totals(p, event):
    out = collections.Counter()
    for s in p.samples():
        if s.event is event and s.stack[-1].kind is FrameKind.ALLOC_TYPE:
            out[s.stack[-1].name] += s.values[1]
    return out
'''


def run(body: str, timeout: float = 60) -> dict:
    return run_script(ALLOC_PRELUDE + textwrap.dedent(body), timeout=timeout)


def test_alloc_split_follows_bytes_allocated():
    # GIVEN two functions allocating bytes objects in a 3:1 ratio (800 MB in all)
    # WHEN they run under the allocation sampler at the default rate (512 KiB)
    # THEN ALLOC bytes split 75/25 within 5 points, and the estimate of the total is close
    res = run(
        '''
        def three():
            for _ in range(30000): x = b"a" * 20000
        def one():
            for _ in range(10000): x = b"a" * 20000
        before = allocators()
        e = engine(events=("alloc",))
        e.start()
        for _ in range(1):
            three(); one()
        p = e.stop()
        t = leaf_totals(p, EventType.ALLOC)
        emit(three=t["three"], one=t["one"], restored=allocators() == before,
             types=dict(type_totals(p, EventType.ALLOC)), notes=list(p.metadata.notes))
        '''
    )
    share = res["three"] / (res["three"] + res["one"])
    assert 0.70 <= share <= 0.80, res
    truth = 40000 * 20033
    assert 0.85 * truth <= res["three"] + res["one"] <= 1.15 * truth, res
    assert res["restored"], res
    assert res["types"].get("[bytes]", 0) >= 0.9 * (res["three"] + res["one"]), res


def test_small_allocations_are_counted_without_bias():
    # GIVEN 2 million allocations of one small size (133-byte bytes objects, 266 MB), far below
    #   the 512 KiB mean gap: each is sampled with p ~ 1/3900, the fast path's countdown decides
    # WHEN sampled at the default rate
    # THEN the estimated bytes and allocation count are near the truth (~500 samples: sd ~4.5 %)
    res = run(
        """
        import itertools
        def small(n=100):  # (a constant b"s" * 100 would be folded at compile time)
            for _ in itertools.repeat(None, 2_000_000): x = bytes(n)
        e = engine(events=("alloc",))
        e.start()
        small()
        p = e.stop()
        count = nbytes = 0
        for s in p.samples():
            if s.event is EventType.ALLOC and py_leaf(s) == "small":
                count += s.values[0]
                nbytes += s.values[1]
        emit(count=count, nbytes=nbytes, size=sys.getsizeof(bytes(100)))
        """
    )
    assert 0.8 * 2_000_000 <= res["count"] <= 1.2 * 2_000_000, res
    truth = 2_000_000 * res["size"]
    assert 0.8 * truth <= res["nbytes"] <= 1.2 * truth, res


def test_live_heap_goes_to_the_keeper():
    # GIVEN one function keeping 50 MB in a list, one allocating and freeing 50 MB
    # WHEN profiling stops with the kept memory still alive
    # THEN the keeper holds >= 90% of LIVE, ~50 MB, typed as bytes
    res = run(
        '''
        kept = []
        def keeper():
            for _ in range(500): kept.append(bytes(100_000))
        def churner():
            for _ in range(500): x = bytes(100_000)
        e = engine(events=("alloc",))
        e.start()
        keeper(); churner()
        p = e.stop()
        live = leaf_totals(p, EventType.LIVE)
        alloc = leaf_totals(p, EventType.ALLOC)
        emit(live=dict(live), alloc=dict(alloc), live_types=dict(type_totals(p, EventType.LIVE)))
        '''
    )
    live = res["live"]
    assert live.get("keeper", 0) >= 0.9 * sum(live.values()), res
    # ~90 of the 500 blocks are sampled: the estimate's relative sd is ~10%; bounds are 5 sd
    assert 25e6 <= live["keeper"] <= 75e6, res
    assert res["alloc"].get("churner", 0) >= 25e6, res  # allocated, but not live
    assert res["live_types"].get("[bytes]", 0) >= 0.9 * live["keeper"], res


def test_allocations_from_many_threads():
    # GIVEN 8 threads, thread i allocating (i + 1) * 50 MB
    # WHEN sampled together
    # THEN each thread's ALLOC total is near its truth, and the drain thread never shows up
    res = run(
        '''
        tids = {}
        def work(i):
            tids[threading.get_native_id()] = f"w{i}"  # short-lived: may end before a drain names it
            for _ in range((i + 1) * 2500): x = b"b" * 20000
        e = engine(events=("alloc",))
        e.start()
        drain_tid = e._drain_tid
        ts = [threading.Thread(target=work, args=(i,), name=f"w{i}") for i in range(8)]
        for t in ts: t.start()
        for t in ts: t.join()
        p = e.stop()
        by_thread = collections.Counter()
        for s in p.samples():
            if s.event is EventType.ALLOC:
                name = "drain" if s.thread.tid == drain_tid else tids.get(s.thread.tid, s.thread.name)
                by_thread[name] += s.values[1]
        emit(by_thread=dict(by_thread))
        '''
    )
    got = res["by_thread"]
    assert "drain" not in got, got
    for i in range(8):
        truth = (i + 1) * 2500 * 20033  # >= ~95 samples: relative sd <= 10%
        assert 0.6 * truth <= got.get(f"w{i}", 0) <= 1.4 * truth, (i, got)


def test_realloc_chains():
    # GIVEN bytearrays grown by repeated appends (realloc chains: the block moves and grows)
    # WHEN one 40 MB bytearray is kept and another is grown then dropped
    # THEN LIVE holds the kept one (~40 MB, one block) and nothing of the dropped one;
    #      ALLOC counts every realloc's new size
    res = run(
        '''
        kept = []
        def grow_keep():
            b = bytearray()
            chunk = b"z" * 4096
            for _ in range(40_000_000 // 4096): b += chunk
            kept.append(b)
        def grow_drop():
            b = bytearray()
            chunk = b"z" * 4096
            for _ in range(40_000_000 // 4096): b += chunk
            del b
        e = engine(events=("alloc",))
        e.start()
        grow_keep(); grow_drop()
        p = e.stop()
        emit(live=dict(leaf_totals(p, EventType.LIVE)), alloc=dict(leaf_totals(p, EventType.ALLOC)),
             n=len(kept[0]))
        '''
    )
    live = res["live"]
    assert 30e6 <= live.get("grow_keep", 0) <= 50e6, res
    assert live.get("grow_drop", 0) <= 2e6, res
    assert res["alloc"].get("grow_keep", 0) >= 40e6, res  # every resize counts its new size


def test_many_start_stop_cycles_leak_nothing_and_restore_the_allocator():
    # GIVEN the allocators in place before profiling
    # WHEN 1000 alloc sessions start, allocate, keep some memory across stop, and stop
    # THEN RSS stays flat, the allocators are exactly the ones from before, and memory
    #      allocated while profiling is freed after stop without trouble
    res = run(
        '''
        from ddprof_nb.engines.native.decode import RecordConverter
        from ddprof_nb.engines.native.session import Session
        from ddprof_nb.model import ProfileBuilder
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        before = allocators()
        carry = []
        def cycle(i):
            s = Session(10_000_000, 64, ("alloc",), alloc_rate=64 * 1024, ring_records=256)
            s.start()
            tmp = [bytes(1000) for _ in range(300)]
            carry.append(tmp)          # allocated while profiling...
            if len(carry) > 3:
                carry.pop(0)           # ...freed during a later session or after stop
            s.stop()
            conv = RecordConverter(ProfileBuilder(), 0)
            s.drain(conv)
            s.release()
        for i in range(100): cycle(i)
        r0 = rss()
        for i in range(900): cycle(i)
        r1 = rss()
        carry.clear()
        emit(growth=r1 - r0, restored=allocators() == before)
        ''',
        timeout=120,
    )
    assert res["restored"], res
    assert res["growth"] < 8 << 20, res


def test_stop_never_clobbers_an_allocator_installed_over_ours():
    # GIVEN a session, and another library installing its allocator over ours meanwhile
    # WHEN the session stops while theirs is on top
    # THEN theirs stays on top (ours passes through), and once they uninstall and a new
    #      session starts and stops, the original allocators are back exactly
    res = run(
        '''
        before = allocators()
        e = engine(events=("alloc",))
        e.start()
        assert lib.ddp_alloc_test_foreign(1) == 0
        x = [bytes(1000) for _ in range(1000)]
        p1 = e.stop()
        theirs_on_top = allocators() != before
        left = any("pass-through" in n for n in p1.metadata.notes)
        x = [bytes(1000) for _ in range(1000)]  # through theirs, then ours (inactive)
        assert lib.ddp_alloc_test_foreign(0) == 0
        e = engine(events=("alloc",))
        e.start()
        y = [bytes(100_000) for _ in range(200)]  # 20 MB: ~40 samples expected
        p2 = e.stop()
        del x, y
        emit(theirs_on_top=theirs_on_top, left=left, restored=allocators() == before,
             alloc2=p2.total(EventType.ALLOC))
        '''
    )
    assert res["theirs_on_top"] and res["left"], res
    assert res["restored"], res
    assert res["alloc2"] > 0, res


def test_alloc_with_cpu_and_wall():
    # GIVEN a CPU burner and an allocator in one process
    # WHEN alloc, cpu and wall are sampled together
    # THEN each event attributes to its own function
    res = run(
        '''
        def allocs():
            for _ in range(10000): x = b"c" * 20000
        e = engine(events=("cpu", "wall", "alloc"))
        e.start()
        burn(0.3); allocs()
        p = e.stop()
        emit(cpu=dict(totals(p, EventType.CPU, py_leaf)), alloc=dict(leaf_totals(p, EventType.ALLOC)),
             wall=sum(totals(p, EventType.WALL, py_leaf).values()), events=[ev.label for ev in p.events])
        '''
    )
    assert res["cpu"].get("burn", 0) >= 0.5 * sum(res["cpu"].values()), res
    assert res["alloc"].get("allocs", 0) >= 0.9 * sum(res["alloc"].values()), res
    assert res["wall"] > 0, res
    assert {"cpu", "wall", "alloc", "live"} <= set(res["events"]) or {"cpu", "wall", "alloc"} <= set(res["events"]), res


def test_object_types_as_leaf_frames():
    # GIVEN instances of a user class (GC type with a managed dict: pre-header on 3.11-3.13)
    # WHEN they are allocated under the sampler and kept
    # THEN their samples end in a [Foo] ALLOC_TYPE frame
    res = run(
        '''
        class Foo:
            def __init__(self): self.a = 1
        def make():
            return [Foo() for _ in range(300_000)]
        e = engine(events=("alloc",), )
        e.start()
        keep = make()
        p = e.stop()
        emit(alloc=dict(type_totals(p, EventType.ALLOC)), live=dict(type_totals(p, EventType.LIVE)))
        '''
    )
    assert res["alloc"].get("[Foo]", 0) > 0 and res["live"].get("[Foo]", 0) > 0, res


def test_alloc_rate_reaches_the_native_sampler():
    # GIVEN alloc_rate="64KiB" (8x the default's sample count)
    # WHEN the same workload runs
    # THEN about 8x more samples are taken, with the same estimated total
    res = run(
        '''
        from ddprof_nb.engines.native.alloc import AllocTracker
        def work():
            for _ in range(5000): x = b"d" * 20000
        out = {}
        for rate in ("64KiB", "512KiB"):
            e = NativeEngine(SamplerConfig.make(events=("alloc",), alloc_rate=rate))
            e.start(); work(); p = e.stop()
            out[rate] = (AllocTracker.stats()["sampled"], leaf_totals(p, EventType.ALLOC)["work"])
        emit(**out)
        '''
    )
    n64, b64 = res["64KiB"]
    n512, b512 = res["512KiB"]
    assert n64 >= 4 * n512, res
    assert 0.85 <= b64 / 100e6 <= 1.15 and 0.7 <= b512 / 100e6 <= 1.3, res


def test_blocks_freed_by_another_thread_are_never_read():
    # GIVEN big objects (mmap'ed blocks) allocated on one thread and freed on another,
    #       sampled at a high rate, while the allocating thread keeps allocating
    # WHEN their type would be read at the allocating thread's next allocation
    # THEN nothing faults (a freed block is recognised through the live table) and the
    #      freed blocks are not live
    res = run(
        '''
        import queue
        q = queue.Queue(maxsize=4)
        def producer():
            for i in range(3000):
                q.put(bytes(300_000))  # > mmap threshold: unmapped when freed
                x = (i, str(i))        # more allocations on this thread after the hand-off
            q.put(None)
        def consumer():
            while q.get() is not None:
                pass
        e = NativeEngine(SamplerConfig.make(events=("alloc",), alloc_rate="4KiB"))
        e.start()
        ts = [threading.Thread(target=producer), threading.Thread(target=consumer)]
        for t in ts: t.start()
        for t in ts: t.join()
        p = e.stop()
        emit(alloc=p.total(EventType.ALLOC), live=dict(leaf_totals(p, EventType.LIVE)))
        ''',
        timeout=120,
    )
    assert res["alloc"] > 0.5 * 3000 * 300_000, res
    assert res["live"].get("producer", 0) <= 4 * 300_000 * 2, res


def test_a_layer_left_under_a_foreign_allocator_never_counts_twice():
    # GIVEN our hook left as a pass-through under a foreign allocator (stop while theirs
    #       is on top), and a new session installing its hook over theirs
    # WHEN 100 MB are allocated through both layers of ours
    # THEN the estimate is the truth, not twice it; and once the foreign one is gone a
    #      later session reuses the old layer and puts the original allocators back
    res = run(
        '''
        before = allocators()
        e = engine(events=("alloc",))
        e.start()
        assert lib.ddp_alloc_test_foreign(1) == 0
        e.stop()
        def work():
            for _ in range(5000): x = b"s" * 20000
        e = engine(events=("alloc",))
        e.start()
        work()
        p = e.stop()
        assert lib.ddp_alloc_test_foreign(0) == 0
        e = engine(events=("alloc",))
        e.start()
        e.stop()
        from ddprof_nb.engines.native.alloc import AllocTracker
        emit(work=leaf_totals(p, EventType.ALLOC)["work"], restored=allocators() == before,
             layers=AllocTracker.stats()["layers_in_use"])
        '''
    )
    truth = 5000 * 20033  # ~190 samples: relative sd ~7%
    assert 0.7 * truth <= res["work"] <= 1.3 * truth, res
    assert res["restored"] and res["layers"] == 0, res


def test_a_layer_hidden_by_an_allocator_serving_small_blocks_itself_is_not_reinstalled():
    # GIVEN our hook left as a pass-through under a foreign allocator that serves blocks up to
    #       512 bytes without calling down (as pymalloc does) and passes larger ones down
    #       through ours: a 1-byte probe never reaches our layer, which took it as unlinked,
    #       and the next session reinstalled that very layer on top, over the foreign one
    # WHEN a new session starts and 20 KB blocks are allocated
    # THEN they are counted once (no endless round between the two layers: the run ends), and
    #      the old layer is still in use (it is linked)
    res = run(
        """
        e = engine(events=("alloc",))
        e.start()
        assert lib.ddp_alloc_test_foreign(2) == 0
        e.stop()
        def work():
            for _ in range(5000): x = b"s" * 20000
        e = engine(events=("alloc",))
        e.start()
        work()
        p = e.stop()
        from ddprof_nb.engines.native.alloc import AllocTracker
        layers = AllocTracker.stats()["layers_in_use"]
        assert lib.ddp_alloc_test_foreign(0) == 0
        emit(work=leaf_totals(p, EventType.ALLOC)["work"], layers=layers)
        """,
        timeout=30,
    )
    truth = 5000 * 20033
    assert 0.7 * truth <= res["work"] <= 1.3 * truth, res
    assert res["layers"] == 2, res  # the old layer (2 domains), still linked; the new one left at stop


def test_a_new_session_restarts_the_countdown_of_threads_alive_before():
    # GIVEN a worker thread and the main thread, both allocating under a session whose mean
    #       gap is 1 TiB (their countdowns are ~1e12 bytes when it stops)
    # WHEN a session at 64 KiB follows, with both threads still alive
    # THEN both threads' allocations are sampled at the new rate from its start
    res = run(
        '''
        go, done, job = threading.Event(), threading.Event(), {}
        def worker():
            while True:
                go.wait(); go.clear()
                if job["n"] < 0: return
                for _ in range(job["n"]): x = b"w" * 20000
                done.set()
        def on_worker(n):
            job["n"] = n; done.clear(); go.set(); done.wait()
        def main_work(n):
            for _ in range(n): x = b"m" * 20000
        t = threading.Thread(target=worker); t.start()
        e = NativeEngine(SamplerConfig.make(events=("alloc",), alloc_rate=str(1 << 40)))
        e.start(); on_worker(500); main_work(500); e.stop()
        e = NativeEngine(SamplerConfig.make(events=("alloc",), alloc_rate="64KiB"))
        e.start(); on_worker(1000); main_work(1000); p = e.stop()
        tid = t.native_id
        job["n"] = -1; go.set(); t.join()
        by = collections.Counter()
        for s in p.samples():
            if s.event is EventType.ALLOC:
                by["worker" if s.thread.tid == tid else "main"] += s.values[1]
        emit(by=dict(by))
        '''
    )
    truth = 1000 * 20033  # ~300 samples each at 64 KiB: relative sd ~6%
    for who in ("worker", "main"):
        assert 0.7 * truth <= res["by"].get(who, 0) <= 1.3 * truth, res


def test_a_fork_child_forgets_the_parents_threads():
    # GIVEN 4 threads of the parent that allocated under a session (so the hook knows them)
    #       and are still alive when the parent forks
    # WHEN the child (where they do not exist: glibc unmaps their 64 MiB stacks, too big for
    #      its 40 MiB stack cache, once a thread of the child ends) starts and stops its own
    #      allocation session
    # THEN the child samples its allocations and exits cleanly
    res = run(
        '''
        import warnings
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        ready, release = threading.Barrier(5), threading.Event()
        def w():
            for _ in range(200): x = b"a" * 20000
            ready.wait(); release.wait()
        e = engine(events=("alloc",))
        e.start()
        threading.stack_size(64 << 20)
        ts = [threading.Thread(target=w) for _ in range(4)]
        for t in ts: t.start()
        threading.stack_size(0)
        ready.wait()
        e.stop()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                t = threading.Thread(target=lambda: [bytes(1000) for _ in range(1000)])
                t.start(); t.join()
                e2 = engine(events=("alloc",))
                e2.start()
                x = [b"c" * 20000 for _ in range(3000)]
                p2 = e2.stop()
                code = 0 if p2.total(EventType.ALLOC) > 0 else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        release.set()
        for t in ts: t.join()
        emit(status=status)
        '''
    )
    assert res["status"] == 0, res


def test_a_stack_seen_again_is_decoded_once():
    # GIVEN one line allocating ~1,500 sampled blocks, drained in two batches
    # WHEN the drain converts the ALLOC records
    # THEN each distinct stack is decoded from its frames once (later records find it by their
    #      stack's bytes), and every sample is still in the profile
    res = run(
        '''
        from ddprof_nb.engines.native import decode
        calls = collections.Counter()
        real = decode.RecordConverter._stack_id
        def counted(self, flags, raw):
            calls[(flags, bytes(raw))] += 1
            return real(self, flags, raw)
        decode.RecordConverter._stack_id = counted
        def churn():
            for _ in range(20000): x = b"a" * 20000
        e = engine(events=("alloc",), drain_interval=1e6)
        e.start()
        churn()
        e._drain_once()
        churn()
        p = e.stop()
        total = sum(s.values[1] for s in p.samples() if s.event is EventType.ALLOC and py_leaf(s) == "churn")
        emit(max_calls=max(calls.values()), stacks=len(calls), total=total)
        '''
    )
    assert res["max_calls"] == 1, res
    assert abs(res["total"] / (2 * 20000 * 20000) - 1) <= 0.12, res  # ~1,500 samples: 4 SD ~ 10 %
