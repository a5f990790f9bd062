"""Records merged as the drain takes them, under the time tick of the latest one (agg.c:
ddp_agg_coarsen): the Profile stays the one of one record per sample."""

from __future__ import annotations

from nhelpers import run_script


def test_records_coarsened_by_late_drains_give_the_same_profile_as_one_record_per_sample():
    # GIVEN idle threads (blocked, or napping now and then) beside a main thread that burns
    # CPU then sleeps, sampled at 2 ms, drained twice: after 0.7 s (the tick has grown from
    # 1 to 4 ms) and after stop (8 ms), each drain merging what it takes under its own tick
    r = run_script(
        """
        import numpy as np
        from ddprof_nb.engines.native import binding as _binding, decode as _decode, session as _session
        from ddprof_nb.model import Metadata, ProfileBuilder
        stop = threading.Event()
        def idle(): stop.wait()
        def napper():
            while not stop.is_set(): time.sleep(0.03)
        ths = [threading.Thread(target=idle, name=f"idle{i}") for i in range(4)]
        ths.append(threading.Thread(target=napper, name="napper"))
        for t in ths: t.start()
        cap = 1 << 15
        s = _session.Session(2_000_000, 16, ("wall",), ring_records=cap, merge_shadow=True)
        s.start()
        bufs, counts = [], []
        def drain():
            buf = _binding.ffi.new("char[]", s.record_size * cap)
            bufs.append(buf)
            counts.append(_binding.lib.ddp_drain(buf, cap))
        burn(0.5); time.sleep(0.2)
        drain()
        coarsened_mid = s.stats()["agg_coarsened"]
        burn(0.3); time.sleep(0.4)
        s.stop()
        stop.set()
        drain()
        st = s.stats()
        s.release()
        raw = np.concatenate([np.frombuffer(_binding.ffi.buffer(b, n * s.record_size), dtype=np.uint8)
                              for b, n in zip(bufs, counts)]).reshape(-1, s.record_size)
        hdr = np.frombuffer(raw.tobytes(), dtype=_decode._record_dtype(s.record_size))
        duration = st["stop_mono_ns"] - st["start_mono_ns"]
        rows, records = {}, {}
        for which, name in ((0, "merged"), (1, "per_sample")):
            sel = np.ascontiguousarray(raw[hdr["aux"] == which])
            records[name] = len(sel)
            conv = _decode.RecordConverter(ProfileBuilder(), st["start_mono_ns"])
            conv.feed(_binding.ffi.from_buffer(sel), len(sel), s.record_size)
            conv.builder.metadata = Metadata(start_ns=0, end_ns=duration, interval_ns=2_000_000)
            p = conv.builder.build(end_ns=duration)
            rows[name] = sorted([s.thread.name, [f.name for f in s.stack], [list(kv) for kv in s.labels.items], s.time_ns,
                                 list(s.values)] for s in p.samples())
        emit(rows=rows, records=records, samples=st["samples"][EventType.WALL], counts=counts,
             merged_count=int(hdr["count"][hdr["aux"] == 0].sum()), coarsened=st["agg_coarsened"],
             coarsened_mid=coarsened_mid)
        """
    )
    # THEN both ways give exactly the same Profile rows (stack, thread, labels, tick, values)
    assert r["rows"]["merged"] == r["rows"]["per_sample"]
    # AND both drains merged records under their coarser tick, every sample counted once
    assert 0 < r["coarsened_mid"] < r["coarsened"], r
    assert all(n > 0 for n in r["counts"]), r
    assert r["merged_count"] == r["samples"] == r["records"]["per_sample"]
    # AND the idle threads' stacks came out once per final tick or so, not once per sample
    assert r["records"]["merged"] < 0.5 * r["records"]["per_sample"], r["records"]
