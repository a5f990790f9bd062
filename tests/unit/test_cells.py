"""ddprof_nb.cells: IPython cell file names -> ``Cell In[N]``, and stacks rooted at a cell.

Profiles are built from mock records shaped like the engines' (IPython machinery at the
root of the main thread, the cell's module code, user functions below)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ddprof_nb import cells
from ddprof_nb.events import EventType, FrameKind
from ddprof_nb.model import Frame, Metadata, ProfileBuilder

KERNEL_CELL = "/tmp/ipykernel_4242/1234567.py"
TERMINAL_CELL = "<ipython-input-7-0123456789ab>"
SHELL = SimpleNamespace(compile=SimpleNamespace(_filename_map={KERNEL_CELL: 12, TERMINAL_CELL: 7}))

MACHINERY = [Frame("<module>", "/venv/ipykernel_launcher.py", 18, 1),
             Frame("InteractiveShell.run_cell", "/venv/IPython/core/interactiveshell.py", 3246, 3202),
             Frame("InteractiveShell.run_code", "/venv/IPython/core/interactiveshell.py", 3823, 3786)]
CELL = Frame("<module>", KERNEL_CELL, 3, 1)
BUSY = Frame("busy", KERNEL_CELL, 6, 5)
LIB = Frame("dot", "/venv/numpy/core.py", 40, 30)
OWN = Frame("_CellHooks.end", "/site/ddprof_nb/magics.py", 300, 290)


def build(rows):
    """rows: (thread tid, [frames], cpu ns)."""
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10**9, engine="mock"))
    for tid, frames, ns in rows:
        b.add(EventType.CPU, b.stack_of(frames), b.thread_id(tid, f"t{tid}"), 0, 0, 1, ns)
    return b.build()


def test_cell_number_reads_ipythons_map_and_terminal_names():
    assert cells.cell_number(KERNEL_CELL, SHELL) == 12
    assert cells.cell_number(TERMINAL_CELL, SHELL) == 7
    # terminal names carry their number even without a shell
    assert cells.cell_number("<ipython-input-31-deadbeef0123>", fmap={}) == 31
    assert cells.cell_number("/src/mod.py", SHELL) is None
    assert cells.cell_number("", SHELL) is None
    assert cells.cell_label(12) == "Cell In[12]"
    assert cells.is_cell_file("Cell In[3]", fmap={}) and not cells.is_cell_file("/src/mod.py", fmap={})


def test_name_cells_renames_cell_frames_and_keeps_line_numbers():
    # GIVEN a stack through a kernel cell and a terminal cell
    profile = build([(1, MACHINERY + [CELL, BUSY, Frame("<module>", TERMINAL_CELL, 2, 1)], 30)])
    # WHEN naming cells
    named = cells.name_cells(profile, SHELL)
    frames = named.stack_frames(int(named.stack[0]))
    # THEN cell files read Cell In[N], module code is named after its cell, lines kept
    assert frames[:3] == tuple(MACHINERY)
    assert frames[3] == Frame("Cell In[12]", "Cell In[12]", 3, 1)
    assert frames[4] == Frame("busy", "Cell In[12]", 6, 5)
    assert frames[5] == Frame("Cell In[7]", "Cell In[7]", 2, 1)
    assert named.total("cpu") == profile.total("cpu")
    # AND a profile without cells is returned as is
    plain = build([(1, [LIB], 5)])
    assert cells.name_cells(plain, SHELL) is plain


def test_reroot_makes_the_cell_the_root_of_its_threads_stacks():
    # GIVEN the main thread's samples: in the cell (two stacks), in IPython only, and in
    # the profiler's own hook; and a worker thread's sample
    profile = build([
        (1, MACHINERY + [CELL, BUSY], 70),
        (1, MACHINERY + [CELL, BUSY, LIB], 20),
        (1, MACHINERY, 5),
        (1, MACHINERY + [CELL, OWN], 3),
        (2, [Frame("Thread.run", "/py/threading.py", 1, 1), LIB], 11),
    ])
    # WHEN rooting thread 1 at the cell file, dropping our own frames, naming cells
    rooted = cells.reroot(profile, 1, lambda f: f.filename == KERNEL_CELL,
                          drop=lambda f: f.filename.endswith("ddprof_nb/magics.py"), rename=SHELL)
    # THEN thread 1's stacks start at the cell; the others of thread 1 are left out
    t1 = [i for i, t in enumerate(rooted.threads) if t.tid == 1]
    rows1 = np.isin(rooted.thread, t1)
    stacks1 = {rooted.stack_frames(s) for s in rooted.stack[rows1].tolist()}
    cell = Frame("Cell In[12]", "Cell In[12]", 3, 1)
    named_busy = Frame("busy", "Cell In[12]", 6, 5)
    assert stacks1 == {(cell, named_busy), (cell, named_busy, LIB)}
    assert int(rooted.values[rows1, 1].sum()) == 90
    # AND the worker thread keeps its whole stack
    rows2 = ~rows1
    assert {rooted.stack_frames(s)[0].name for s in rooted.stack[rows2].tolist()} == {"Thread.run"}
    assert int(rooted.values[rows2, 1].sum()) == 11
    assert rooted.metadata == profile.metadata


def test_reroot_can_charge_samples_outside_the_cell_to_a_given_stack():
    # GIVEN an async cell: while it awaits, the thread is in the event loop
    loop = MACHINERY + [Frame("BaseEventLoop._run_once", "/py/asyncio/base_events.py", 1900, 1850)]
    profile = build([(1, MACHINERY + [CELL, BUSY], 10), (1, loop, 40)])
    outside = (Frame("<module>", KERNEL_CELL, 0, 1), Frame("[await]"))
    # WHEN rooting with an "outside" stack
    rooted = cells.reroot(profile, 1, lambda f: f.filename == KERNEL_CELL, outside=outside)
    # THEN the waiting time is charged to [await] under the cell; nothing is lost
    assert rooted.total("cpu") == 50
    top = {r.name: r.self for r in rooted.top("cpu", n=None)}
    assert top["[await]"] == 40 and top["busy"] == 10
    assert {rooted.stack_frames(s)[0].filename for s in rooted.stack.tolist()} == {KERNEL_CELL}


def test_reroot_of_a_thread_without_samples_changes_nothing_but_tables():
    profile = build([(2, [LIB], 7)])
    rooted = cells.reroot(profile, 1, lambda f: True)
    assert rooted.total("cpu") == 7
    assert rooted.stack_frames(int(rooted.stack[0])) == (LIB,)
    assert rooted.frames[0].kind is FrameKind.PYTHON


def test_reroot_of_an_empty_profile():
    empty = ProfileBuilder(Metadata(start_ns=0, end_ns=1)).build()
    rooted = cells.reroot(empty, 1, lambda f: True)
    assert len(rooted) == 0
