"""engines/native/pools.py on a hand-made profile: a pool thread's allocation (ALLOC and its
LIVE row) goes where its CPU would, under the Python thread found inside the same library then,
its type leaf kept; with none inside, under [native threads]; the notes say how much each way."""

from __future__ import annotations

from ddprof_nb.engines.native.pools import attribute_pools
from ddprof_nb.events import EventType, FrameKind
from ddprof_nb.model import Frame, LabelSet, ProfileBuilder

MS = 1_000_000
MiB = 1 << 20
EXT = "/site/_ext.cpython-311-x86_64-linux-gnu.so"
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def _profile():
    b = ProfileBuilder()
    caller = b.frame_id(Frame("caller", "nb.py", 3))
    run = b.frame_id(Frame("alloc_run", EXT, kind=FrameKind.NATIVE))
    join = b.frame_id(Frame("pthread_join", LIBC, kind=FrameKind.NATIVE))
    start = b.frame_id(Frame("start_thread", LIBC, kind=FrameKind.NATIVE))
    grab = b.frame_id(Frame("grab", EXT, kind=FrameKind.NATIVE))
    malloc = b.frame_id(Frame("[malloc]", kind=FrameKind.ALLOC_TYPE))
    main, pool_a, pool_b = b.thread_id(100, "MainThread"), b.thread_id(200, "Thread 200"), b.thread_id(300, "")
    # the caller seen blocked inside the extension (an observation: CPU, count 0) at 1 s
    b.add(EventType.CPU, b.stack_id([caller, run, join]), main, 0, 1000 * MS, 0, 0)
    # a pool thread's 8 MiB block 10 ms later (ALLOC, then LIVE at stop with the same row)
    pool_stack = b.stack_id([start, grab, malloc])
    for ev in (EventType.ALLOC, EventType.LIVE):
        b.add(ev, pool_stack, pool_a, 0, 1010 * MS, 1, 8 * MiB)
    # another's 2 MiB at 5 s, long after the caller left
    for ev in (EventType.ALLOC, EventType.LIVE):
        b.add(ev, pool_stack, pool_b, 0, 5000 * MS, 1, 2 * MiB)
    return b.build(end_ns=6000 * MS)


def _rows(profile, event):
    out = {}
    for i in range(len(profile)):
        if profile.event[i] == event.value:
            names = tuple(f.name for f in profile.stack_frames(int(profile.stack[i])))
            key = (names, profile.threads[int(profile.thread[i])].name)
            out[key] = out.get(key, 0) + int(profile.values[i, 1])
    return out


def test_a_pool_threads_allocation_goes_under_its_caller_or_native_threads():
    r = attribute_pools(_profile(), {200, 300}, {200: "ntalloc", 300: "ntalloc"}, keep_native=False)
    ext = "[_ext.cpython-311-x86_64-linux-gnu.so]"
    for ev in (EventType.ALLOC, EventType.LIVE):
        assert _rows(r.profile, ev) == {
            (("caller", "[pool: ntalloc]", ext, "[malloc]"), "MainThread"): 8 * MiB,
            (("[native threads]", ext, "ntalloc", "[malloc]"), "Thread 300"): 2 * MiB,
        }
    assert _rows(r.profile, EventType.CPU) == {}  # the observation is dropped
    notes = r.notes()
    assert len(notes) == 2, notes
    assert "10.0 MiB allocated on 2 thread(s); 80% under the Python line" in notes[0], notes
    assert "10.0 MiB live at stop on 2 thread(s); 80% under the Python line" in notes[1], notes
    assert all("2.00 MiB under [native threads]" in n for n in notes), notes


def test_native_frames_kept_with_native_true_and_raw_keeps_each_thread():
    kept = attribute_pools(_profile(), {200, 300}, {200: "ntalloc"}, keep_native=True)
    # (the caller's stack is cut above its first frame in the pool's library: the pool's own frames follow)
    assert (("caller", "[pool: ntalloc]", "start_thread", "grab", "[malloc]"), "MainThread") in \
        _rows(kept.profile, EventType.ALLOC)
    raw = attribute_pools(_profile(), {200, 300}, {}, raw=True, keep_native=False)
    ext = "[_ext.cpython-311-x86_64-linux-gnu.so]"
    assert set(_rows(raw.profile, EventType.LIVE)) == {((ext, "[malloc]"), "Thread 200"), ((ext, "[malloc]"), "Thread 300")}


def test_a_python_threads_own_rows_and_its_interpreter_frames_are_never_a_pools():
    # GIVEN a short Python thread that a tick saw running no Python (as it ended: its tid is among
    #   the native threads'), with a labelled CPU row of its Python code and a native-only row in
    #   the interpreter's library, while another Python thread ran inside that library too
    b = ProfileBuilder()
    work = b.frame_id(Frame("work", "nb.py", 3))
    eval_loop = b.frame_id(Frame("_PyEval_EvalFrameDefault", "/usr/lib/libpython3.11.so.1.0", kind=FrameKind.NATIVE))
    teardown = b.frame_id(Frame("PyThreadState_Clear", "/usr/lib/libpython3.11.so.1.0", kind=FrameKind.NATIVE))
    start = b.frame_id(Frame("start_thread", LIBC, kind=FrameKind.NATIVE))
    other, short = b.thread_id(100, "w1"), b.thread_id(200, "short61")
    labelled = b.labels_id(LabelSet.of({"w": "short61"}))
    b.add(EventType.CPU, b.stack_id([work, eval_loop]), other, 0, 1000 * MS, 1, 10 * MS)
    b.add(EventType.CPU, b.stack_id([work, eval_loop]), short, labelled, 1001 * MS, 1, 2 * MS)
    b.add(EventType.CPU, b.stack_id([start, teardown]), short, 0, 1002 * MS, 1, 1 * MS)
    # WHEN pool threads are attributed
    r = attribute_pools(b.build(end_ns=2000 * MS), {200}, {200: "python"}, keep_native=False)
    rows = _rows(r.profile, EventType.CPU)
    # THEN its Python row stays its own, with its labels; its interpreter-only row goes under
    #   [native threads] (no pool's), never to the other thread
    assert rows[(("work",), "short61")] == 2 * MS, rows
    assert rows[(("work",), "w1")] == 10 * MS, rows
    assert [k for k in rows if k[1] == "w1"] == [(("work",), "w1")], rows
    assert sum(v for (stack, _), v in rows.items() if stack[0] == "[native threads]") == 1 * MS, rows
    p = r.profile
    own = [i for i in range(len(p)) if p.threads[int(p.thread[i])].name == "short61"
           and p.stack_frames(int(p.stack[i]))[0].name == "work"]
    assert [dict(p.labelsets[int(p.labels[i])]) for i in own] == [{"w": "short61"}]


def test_a_masked_threads_cpu_keeps_its_entry_point_without_the_wait_it_was_walked_in():
    # GIVEN a thread that blocks SIGPROF: its CPU rows hold the entry point's frames from a walk
    #   taken while it waited (start_thread ; worker ; pthread_cond_wait), then the masked frame;
    #   its first row came before it was first caught waiting (a cut frame only); and a running
    #   WALL row with the same walk
    from ddprof_nb.engines.native.pools import MASKED
    b = ProfileBuilder()
    caller = b.frame_id(Frame("caller", "nb.py", 3))
    run = b.frame_id(Frame("ext_run", EXT, kind=FrameKind.NATIVE))
    wait = b.frame_id(Frame("pthread_cond_wait", LIBC, kind=FrameKind.NATIVE))
    start = b.frame_id(Frame("start_thread", LIBC, kind=FrameKind.NATIVE))
    worker = b.frame_id(Frame("worker", EXT, kind=FrameKind.NATIVE))
    cut = b.frame_id(Frame("[truncated]", kind=FrameKind.TRUNCATED))
    masked = b.frame_id(MASKED)
    main, pool = b.thread_id(100, "MainThread"), b.thread_id(200, "")
    b.add(EventType.CPU, b.stack_id([caller, run, wait]), main, 0, 1000 * MS, 0, 0)  # the caller, blocked inside
    b.add(EventType.CPU, b.stack_id([cut, masked]), pool, 0, 1000 * MS, 1, 10 * MS)
    b.add(EventType.CPU, b.stack_id([start, worker, wait, masked]), pool, 0, 1020 * MS, 1, 30 * MS)
    running = b.labels_id(LabelSet.of({"state": "cpu"}))
    b.add(EventType.WALL, b.stack_id([start, worker, wait]), pool, running, 1020 * MS, 1, 40 * MS)
    p = b.build(end_ns=2000 * MS)
    # WHEN its rows are attributed, with native frames kept
    r = attribute_pools(p, {200}, {200: "maskpool"}, keep_native=True)
    # THEN all 40 ms of CPU are under the caller, the entry point ending in worker and the
    #   masked frame (the wait the walk caught is gone, the first row took the thread's entry)
    assert _rows(r.profile, EventType.CPU) == {
        (("caller", "[pool: maskpool]", "start_thread", "worker", "[profiling signal blocked]"), "MainThread"): 40 * MS}
    # AND the running WALL row also ends at worker, on its own thread
    assert _rows(r.profile, EventType.WALL) == {
        (("caller", "[pool: maskpool]", "start_thread", "worker"), "Thread 200"): 40 * MS}
