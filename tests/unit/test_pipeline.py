"""pipeline: the stop steps, each a Profile -> Profile function, and the lists entry points pick."""

from __future__ import annotations

from ddprof_nb import pipeline
from ddprof_nb.events import EventType
from ddprof_nb.model import Frame, Metadata, ProfileBuilder

MS = 1_000_000
outer = Frame("runner", "/usr/lib/python3.11/runpy.py", 80, 70)
cell = Frame("<module>", "/app/script.py", 1, 1)
work = Frame("work", "/app/script.py", 12, 10)
wait = Frame("wait", "/usr/lib/python3.11/threading.py", 320, 300)


def profile():
    """tid 10 ran outer -> cell -> work; tid 20 (a helper thread) only waited in threading.py."""
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=100 * MS))
    main, helper = b.thread_id(10, "MainThread"), b.thread_id(20, "helper")
    b.add(EventType.CPU, b.stack_of([outer, cell, work]), main, 0, 0, 3, 30 * MS)
    b.add(EventType.CPU, b.stack_of([outer, cell]), main, 0, 0, 1, 10 * MS)
    b.add(EventType.WALL, b.stack_of([wait]), helper, 0, 0, 5, 50 * MS)
    return b.build()


def stacks_of(p, tid):
    rows = [i for i in range(len(p)) if p.threads[int(p.thread[i])].tid == tid]
    return {tuple(f.name for f in p.stack_frames(int(p.stack[i]))) for i in rows}


def test_the_lists_differ_only_where_their_entry_points_must():
    assert pipeline.COLLECT == (pipeline.merge_tasks, pipeline.add_labels, pipeline.trim_caller,
                                pipeline.drop_sampler_frames, pipeline.note_fallback, pipeline.merge_remote,
                                pipeline.fold_asyncio)
    assert pipeline.PYTHON_API == pipeline.COLLECT + (pipeline.name_cells,)
    assert pipeline.MAGIC == pipeline.COLLECT + (pipeline.reroot, pipeline.hide_threads)
    assert pipeline.CLI == pipeline.COLLECT + (pipeline.reroot,)


def test_collect_with_nothing_to_do_keeps_the_samples():
    p = profile()
    q = pipeline.run(p, pipeline.COLLECT, pipeline.StopContext(tid=10))
    assert stacks_of(q, 10) == stacks_of(p, 10) and stacks_of(q, 20) == stacks_of(p, 20)
    assert q.total(EventType.CPU) == p.total(EventType.CPU) and q.metadata.notes == ()


def test_the_magic_list_roots_at_the_cell_hides_idle_threads_and_says_so():
    ctx = pipeline.StopContext(tid=10, labels={"run": "1"}, note="fell back", is_root=lambda f: f.name == "<module>",
                               hide=r"[/\\]threading\.py$", hide_reason="--all-threads keeps them")
    q = pipeline.run(profile(), pipeline.MAGIC, ctx)
    assert stacks_of(q, 10) == {("<module>", "work"), ("<module>",)}
    assert stacks_of(q, 20) == set()
    assert q.total(EventType.CPU) == 40 * MS
    assert q.metadata.notes == ("fell back", "hid 1 idle kernel thread(s) (helper); --all-threads keeps them")
    assert {ls.get("run") for ls in q.labelsets if len(ls.items)} == {"1"}


def test_the_cli_list_roots_at_the_script_and_keeps_every_thread():
    ctx = pipeline.StopContext(tid=10, is_root=lambda f: f.filename == "/app/script.py")
    q = pipeline.run(profile(), pipeline.CLI, ctx)
    assert stacks_of(q, 10) == {("<module>", "work"), ("<module>",)}
    assert stacks_of(q, 20) == {("wait",)}


def test_trim_caller_cuts_the_frames_above_the_start_call():
    prefix = ((outer.name, outer.filename, outer.first_line), (cell.name, cell.filename, cell.first_line))
    keep_last = pipeline.run(profile(), (pipeline.trim_caller,), pipeline.StopContext(tid=10, prefix=prefix))
    assert stacks_of(keep_last, 10) == {("<module>", "work"), ("<module>",)}
    below = pipeline.run(profile(), (pipeline.trim_caller,),
                         pipeline.StopContext(tid=10, prefix=prefix, keep_last=False))
    # (a stack no longer than the prefix is left whole)
    assert stacks_of(below, 10) == {("work",), ("runner", "<module>")}
    assert stacks_of(below, 20) == {("wait",)}  # other threads keep their stacks
