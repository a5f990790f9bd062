"""Edges of the process the sampler lives in: thread states freed and reused, more threads
than the slot table over a session's life, a SIGSEGV disposition of SIG_IGN, malformed line
tables.  Each risky scenario runs in its own interpreter (a crash or hang = a failure)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from nhelpers import run_script

from ddprof_nb.engines.native.binding import ffi, lib


def test_thread_states_made_and_freed_by_c_threads_never_lend_one_thread_another_ones_stack():
    # GIVEN C threads (pthread_create through ctypes) that run qsort with a Python comparison:
    # every comparison enters Python through PyGILState_Ensure on a thread with no thread
    # state, so each makes one and frees it, hundreds of times a millisecond, while the
    # sampler holds the thread-state pointer it last saw; each thread has its own comparison
    # function, and the main thread burns CPU in a function of its own
    r = run_script(
        """
        import ctypes
        libc = ctypes.CDLL(None)
        CMP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
        THR = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
        N, LEN = 8, 3000
        ran = collections.defaultdict(set)  # tid -> the comparison functions it ran
        src = '''
        def cmp_{i}(a, b):
            ran[threading.get_native_id()].add({i})
            x = sum(range(200))
            va, vb = ctypes.cast(a, P)[0], ctypes.cast(b, P)[0]
            return (va > vb) - (va < vb)
        '''
        cmps = []
        for i in range(N):
            ns = {"ran": ran, "threading": threading, "ctypes": ctypes, "P": ctypes.POINTER(ctypes.c_int)}
            exec(textwrap.dedent(src.format(i=i)), ns)
            cmps.append(CMP(ns[f"cmp_{i}"]))
        arrays = [(ctypes.c_int * LEN)(*[(k * 7919 + i) % 3001 for k in range(LEN)]) for i in range(N)]
        def body_of(i):
            return THR(lambda arg: libc.qsort(arrays[i], LEN, 4, cmps[i]) and None)
        bodies = [body_of(i) for i in range(N)]
        def main_burn(sec):
            burn(sec)
        e = engine(interval="1ms")
        e.start()
        end = time.time() + 3
        while time.time() < end:
            handles = []
            for i in range(N):
                h = ctypes.c_ulong()
                assert libc.pthread_create(ctypes.byref(h), None, bodies[i], None) == 0
                handles.append(h)
            main_burn(0.02)
            for h in handles:
                libc.pthread_join(h, None)
        p = e.stop()
        main = threading.main_thread().native_id
        bad, checked = [], 0
        for s in p.samples():
            names = [f.name for f in s.stack]
            ran_here = {int(n.split("_")[1]) for n in names if n.startswith("cmp_")}
            if s.thread.tid == main:
                checked += s.values[0]
                if ran_here:
                    bad.append(names)
            elif ran_here:
                checked += s.values[0]
                # (a tid the kernel handed to several C threads ran each of their functions)
                if not ran_here <= ran[s.thread.tid] or "main_burn" in names:
                    bad.append(names)
        emit(bad=bad[:5], nbad=len(bad), checked=checked)
        """.replace("import ctypes", "import ctypes, textwrap"),
        timeout=120,
    )
    # THEN every sample of a thread shows only code that thread ran
    assert r["checked"] > 500, r
    assert r["nbad"] == 0, r


def test_a_session_outlives_more_short_threads_than_its_slot_table_holds():
    # GIVEN 4,600 threads, one after another, each allocating enough to be sampled at once
    # (the slot table has 4,096 entries; a thread's slot serves a new one after it exits)
    r = run_script(
        """
        from ddprof_nb.engines.native import NativeEngine
        from ddprof_nb.config import SamplerConfig
        N = 4600
        def work():
            x = [bytearray(4096) for _ in range(64)]  # 256 KiB at a 64 KiB mean gap: ~4 samples
        e = NativeEngine(SamplerConfig.make(events=("alloc",), interval="10ms", alloc_rate="64KiB"))
        e.start()
        for i in range(N):
            t = threading.Thread(target=work)
            t.start()
            t.join()
        p = e.stop()
        main = threading.main_thread().native_id
        got = sum(s.values[1] for s in p.samples() if s.event is EventType.ALLOC and s.thread.tid != main)
        emit(ratio=got / (N * 64 * 4096), notes=p.metadata.notes)
        """,
        timeout=150,
    )
    # THEN the threads' bytes are all there (an unbiased estimate over ~18,000 samples; the
    # 4,096 threads a table without reuse holds would be 89 % of them), and no thread was
    # left out for want of a slot
    assert not any("beyond the" in n for n in r["notes"]), r["notes"]
    assert 0.95 < r["ratio"] < 1.15, r["ratio"]


def test_an_ignored_sigsegv_still_ends_a_real_fault_instead_of_spinning():
    # GIVEN SIGSEGV ignored before a session installed its fault handler (which chains to the
    # previous disposition for faults that are not its own reads)
    code = textwrap.dedent(
        """
        import ctypes, signal, ddprof_nb
        signal.signal(signal.SIGSEGV, signal.SIG_IGN)
        with ddprof_nb.profile(events=("cpu", "wall")):
            ctypes.string_at(16)  # a real fault, outside any guarded read
        print("survived?")
        """
    )
    # WHEN the program faults
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    # THEN it dies of SIGSEGV, as it would without us (returning from the handler would
    # re-run the faulting load forever)
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stderr[-2000:])


def test_an_over_long_line_table_varint_is_malformed_not_undefined():
    # GIVEN a long-form entry whose line delta is a varint of 12 six-bit chunks (72 bits)
    firstlineno = 10
    table = bytes([0x80 | (14 << 3) | 0]) + bytes([0x7F] * 11 + [0x01]) + bytes([0, 0, 0])
    buf = ffi.from_buffer(table)
    # WHEN an instruction inside it is looked up / THEN the table is treated as malformed
    assert lib.ddp_addr2line(buf, len(table), firstlineno, 0) == firstlineno
