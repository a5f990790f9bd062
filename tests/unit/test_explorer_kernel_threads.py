"""In a kernel the explorer shows the user's threads: the kernel's own threads and the
profiler's work are hidden in every view by default, one toggle shows them, the banner
says what was hidden or lost, and MainThread leads the thread list and the timeline."""

from __future__ import annotations

import pytest

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")

from ddprof_nb.events import EventType  # noqa: E402
from ddprof_nb.explorer.threads import find_machinery, hide_machinery, user_first  # noqa: E402
from ddprof_nb.explorer.widget import Explorer  # noqa: E402
from ddprof_nb.events import FrameKind  # noqa: E402
from ddprof_nb.model import Frame, Metadata, ProfileBuilder, Thread  # noqa: E402

MS = 1_000_000
CELL = Frame("Cell In[3]", "/tmp/ipykernel_1/123.py", 1, 1)
WORK = Frame("work", "/tmp/ipykernel_1/123.py", 2, 2)
ZMQ = Frame("poll", "/venv/lib/python3.11/site-packages/zmq/sugar/poll.py", 99, 90)
SELECT = Frame("select", "/usr/lib/python3.11/selectors.py", 468, 451)
USER_IN_WATCHER = Frame("flush", "/home/user/app.py", 7, 5)  # a user-looking frame in a kernel thread
LOOP = Frame("[asyncio loop]", kind=FrameKind.THREAD)
SAMPLER = Frame("[ddprof_nb asyncio sampler]", kind=FrameKind.THREAD)


def kernel_profile(dropped=None):
    """Wall: MainThread runs the cell (40), a user thread 'loader' works (20); IOPub and
    Heartbeat wait in zmq/selectors (300 each), 'Thread-3 (_watch_pipe_fd)' once ran a
    user-looking frame (50), an idle loop thread (200); the asyncio sampler's ticks (5)
    sit on MainThread."""
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=400 * MS, engine="native", dropped=dropped or {}))
    rows = [
        ([CELL, WORK], (1, "MainThread"), 40),
        ([SAMPLER], (1, "MainThread"), 5),
        ([CELL, WORK], (7, "loader"), 20),
        ([ZMQ], (2, "IOPub"), 300),
        ([SELECT], (3, "Heartbeat"), 300),
        ([USER_IN_WATCHER], (4, "Thread-3 (_watch_pipe_fd)"), 50),
        ([LOOP], (5, "Thread-4"), 200),
    ]
    for stack, (tid, name), n in rows:
        b.add(EventType.WALL, b.stack_of(stack), b.thread_id(tid, name), 0, 10 * MS, n, n * MS)
    return b.build()


def total(ex) -> int:
    return ex.flame_data.total


def test_kernel_threads_and_own_work_are_found():
    p = kernel_profile()
    names = sorted(p.threads[i].name for i in find_machinery(p))
    assert names == ["Heartbeat", "IOPub", "Thread-3 (_watch_pipe_fd)", "Thread-4"]
    view, hidden = hide_machinery(p)
    assert view.total("wall", 0) == 60 and hidden.own_samples == 5
    assert hidden.describe() == "hid 4 kernel/profiler threads and 5 samples of the profiler's own work"


def test_user_threads_come_first_mainthread_at_the_head():
    threads = [Thread(2, "IOPub"), Thread(9, "a-worker"), Thread(3, "Control"), Thread(1, "MainThread")]
    assert [t.name for t in user_first(threads)] == ["MainThread", "a-worker", "Control", "IOPub"]


def test_every_view_hides_the_machinery_until_the_toggle_shows_it():
    ex = Explorer(kernel_profile(), event="wall", top_n=100)
    # GIVEN the default view: the user's 60 samples only, in the flame, table and timeline
    ex.value_tb.value = 0
    assert total(ex) == 60
    assert {r[0] for r in ex.drawing.top_rows} == {"Cell In[3]", "work"}
    assert "[ddprof_nb asyncio sampler]" not in ex.flame_data.labels
    assert set(ex.views.timeline(ex.state).lanes) == {"MainThread (1)", "loader (7)"}
    assert [label for label, _ in ex.threads_sel.options] == ["MainThread (1)", "loader (7)"]
    # the toggle says how many it hides
    assert ex.machinery_tb.description == "show 4 kernel threads" and ex.machinery_tb.layout.display != "none"
    # WHEN it is pressed THEN every view has everything, MainThread still first
    ex.machinery_tb.value = True
    assert total(ex) == 60 + 5 + 300 + 300 + 50 + 200
    assert "[ddprof_nb asyncio sampler]" in ex.flame_data.labels
    assert "IOPub (2)" in ex.views.timeline(ex.state).lanes
    opts = [label for label, _ in ex.threads_sel.options]
    assert opts[:2] == ["MainThread (1)", "loader (7)"] and len(opts) == 6
    # a thread picked while shown stays picked; hiding again drops it from the list
    ex.threads_sel.value = (2,)
    assert total(ex) == 300
    ex.machinery_tb.value = False
    assert ex.threads_sel.value == () and total(ex) == 60


def test_nothing_to_hide_means_no_toggle():
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=MS))
    b.add(EventType.CPU, b.stack_of([WORK]), b.thread_id(1, "MainThread"), 0, 0, 3, 3 * MS)
    ex = Explorer(b.build())
    assert ex.machinery_tb.layout.display == "none" and "hid" not in ex.banner.value


def test_a_profile_of_only_machinery_hides_nothing():
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=MS))
    b.add(EventType.WALL, b.stack_of([SELECT]), b.thread_id(3, "Heartbeat"), 0, 0, 3, 3 * MS)
    ex = Explorer(b.build())
    assert total(ex) == 3 * MS and ex.machinery_tb.layout.display == "none"


def test_banner_is_one_line_with_details_one_click_away():
    p = kernel_profile(dropped={EventType.WALL: 44})
    p = p.with_metadata(notes=("hid 1 idle kernel thread(s) (Control); --all-threads keeps them",))
    ex = Explorer(p)
    html = ex.banner.value
    line, details = html.split("<details", 1)
    assert line.count("<div") == 1 and "<br" not in line
    assert ("native engine · 400 ms · wall 915 ms / 915 samples · 1 warning · hid 4 kernel/profiler threads and "
            "5 samples of the profiler&#x27;s own work</div>") in line
    summary = details.split("<summary")[1].split("</summary>")[0]
    assert summary.endswith(">1 warning, 4 notes")
    # the warning comes first, then the notes and what is hidden
    items = details.split("<li")[1:]
    assert "warning: samples dropped while recording (wall 44)" in items[0]
    assert "hid 1 idle kernel thread(s) (Control)" in items[1]
    assert "Heartbeat, IOPub, Thread-3 (_watch_pipe_fd), Thread-4" in details
    assert "dropped" not in ex.status.value


def test_idle_wall_time_of_threads_that_run_no_python_is_hidden_until_shown():
    # GIVEN wall samples: the cell (40, running), a BLAS pool thread working for it under its
    #   line (30), the same thread waiting for work under [native threads] (500, off-cpu) and
    #   spinning there (10, running), and a C allocation of it under [native threads] (no state)
    native_root = Frame("[native threads]", kind=FrameKind.THREAD)
    lib = Frame("[libopenblas.so]", "/venv/libopenblas.so", kind=FrameKind.NATIVE)
    name = Frame("blas-1", kind=FrameKind.THREAD)
    pool = Frame("[pool: blas-1]", kind=FrameKind.THREAD)
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=600 * MS, engine="native"))
    cpu, off = b.labels_id({"state": "cpu"}), b.labels_id({"state": "off-cpu"})
    main, blas = b.thread_id(1, "MainThread"), b.thread_id(9, "blas-1")
    b.add(EventType.WALL, b.stack_of([CELL, WORK]), main, cpu, 0, 40, 40 * MS)
    b.add(EventType.WALL, b.stack_of([CELL, WORK, pool, lib]), blas, cpu, 0, 30, 30 * MS)
    b.add(EventType.WALL, b.stack_of([native_root, lib, name]), blas, off, 0, 500, 500 * MS)
    b.add(EventType.WALL, b.stack_of([native_root, lib, name]), blas, cpu, 0, 10, 10 * MS)
    b.add(EventType.ALLOC, b.stack_of([native_root, lib, name]), blas, 0, 0, 7, 7 << 20)
    p = b.build()
    # WHEN the machinery is hidden THEN the idle 500 go, the rest stays, and the banner says so
    view, hidden = hide_machinery(p)
    assert view.total("wall", 0) == 80 and view.total("alloc", 0) == 7, view
    assert hidden.idle_pool_samples == 500 and not hidden.threads
    assert "500 idle wall samples of threads that run no Python" in hidden.describe()
    # AND the explorer's toggle offers them, and shown, everything is there
    ex = Explorer(p, event="wall")
    assert ex.machinery_tb.layout.display != "none" and ex.machinery_tb.description == "show idle native threads"
    assert total(ex) == 80 * MS
    ex.machinery_tb.value = True
    assert total(ex) == 580 * MS
