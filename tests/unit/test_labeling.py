"""ddprof_nb.labeling: interned ids, per-thread published ids, native mirrors, task bits,
and the propagation of labels to threads and thread pools."""

import asyncio
import concurrent.futures
import threading

import pytest

from ddprof_nb import labeling as L
from ddprof_nb.model import EMPTY_LABELS, LabelSet


@pytest.fixture
def clean_thread():
    """Each test starts with the calling thread unlabelled and ends the same way."""
    L._publish(0)
    yield
    L._publish(0)


def published() -> int:
    return L.thread_label_ids.get(threading.get_ident(), 0)


# -- ids ---------------------------------------------------------------------------------
def test_label_ids_are_interned_and_stable():
    # GIVEN two equal label sets built separately
    a = LabelSet.of({"k": "v", "z": 1})
    b = LabelSet.of([("z", "1"), ("k", "v")])
    # THEN they get one id, which resolves back to the set; 0 is the empty set
    assert L.label_id(a) == L.label_id(b) > 0
    assert L.labelset(L.label_id(a)) is a
    assert L.label_id(EMPTY_LABELS) == 0 and L.labelset(0) is EMPTY_LABELS


@pytest.mark.parametrize("bad", [-1, 10**9, "1", 1.0, None])
def test_unknown_ids_raise(bad):
    with pytest.raises(ValueError):
        L.labelset(bad)


def test_task_bits_resolve_to_a_task_label():
    # GIVEN a label set id and a task's bits
    base = L.label_id(LabelSet.of({"req": "r"}))
    bits = L.task_bits("fetcher")
    # THEN the packed id resolves to the set plus task=<name>, cached
    packed = bits | base
    assert packed >> L.TASK_SHIFT and packed & L.LOW_MASK == base
    assert L.labelset(packed).as_dict() == {"req": "r", "task": "fetcher"}
    assert L.labelset(packed) is L.labelset(packed)
    # AND every call takes fresh bits; unknown task bits raise
    assert L.task_bits("fetcher") != bits
    with pytest.raises(ValueError):
        L.labelset((10**8 << L.TASK_SHIFT) | base)


# -- publishing ----------------------------------------------------------------------------
def test_labels_block_publishes_and_restores(clean_thread):
    # GIVEN nested blocks
    with L.labels(a="1") as outer:
        assert published() == L.label_id(outer)
        with L.labels(b="2") as inner:
            # THEN inner blocks add up, and the thread's id follows
            assert inner.as_dict() == {"a": "1", "b": "2"}
            assert L.current() is inner and published() == L.label_id(inner)
        assert published() == L.label_id(outer)
    # AND leaving restores the empty set, even through an exception
    assert published() == 0 and L.current() is EMPTY_LABELS
    with pytest.raises(KeyError):
        with L.labels(c="3"):
            raise KeyError("x")
    assert published() == 0


def test_the_public_api_is_labels_and_current_and_labels_decorates(clean_thread):
    # GIVEN the module's public names, and a function decorated with labels()
    assert sorted(L.__all__) == ["current", "labels"]
    import ddprof_nb

    assert ddprof_nb.labels is L.labels

    @L.labels(stage="parse", run="1")
    def parse():
        return L.current(), published()

    # WHEN it is called twice, once inside a block whose value it overrides
    first = parse()
    with L.labels(run="0", outer="y"):
        inner = parse()
        after_call = L.current().as_dict()
    # THEN each call ran inside the labels (published too), an inner value won, and the
    # labels in force came back after each call
    assert first[0].as_dict() == {"stage": "parse", "run": "1"} and first[1] == L.label_id(first[0])
    assert inner[0].as_dict() == {"stage": "parse", "run": "1", "outer": "y"}
    assert after_call == {"run": "0", "outer": "y"}
    assert L.current() is EMPTY_LABELS and published() == 0


def test_labels_keep_the_threads_task_bits(clean_thread):
    # GIVEN a thread whose published id carries task bits (a task step in progress)
    bits = L.task_bits("t")
    L._publish(bits)
    # WHEN a labels block runs inside it
    with L.labels(x="1") as ls:
        # THEN the task bits stay and the labels are added
        assert published() == bits | L.label_id(ls)
    assert published() == bits


def test_thread_label_ids_is_a_read_only_view(clean_thread):
    me = threading.get_ident()
    with L.labels(v="1") as ls:
        view = L.thread_label_ids
        assert view[me] == L.label_id(ls) and view.get(me) == L.label_id(ls)
        assert (me, L.label_id(ls)) in view.items() and me in list(view)
        assert view.get(-12345, 7) == 7
    with pytest.raises(TypeError):
        L.thread_label_ids[me] = 3  # type: ignore[index]


def test_a_finished_threads_slot_is_dropped():
    # GIVEN a thread that published an id and ended
    seen = {}

    def work():
        L._publish(L.label_id(LabelSet.of({"w": "1"})))
        seen["ident"] = threading.get_ident()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    # THEN its slot is gone: a new thread reusing the ident starts unlabelled
    assert seen["ident"] not in L.thread_label_ids


def test_listeners_hear_every_change_on_the_calling_thread(clean_thread):
    # GIVEN a listener
    mirrored = L._mirrored  # a native engine run earlier in this process keeps its provider
    heard = []
    L.add_listener(heard.append)
    try:
        with L.labels(a="1") as ls:
            pass
    finally:
        L.remove_listener(heard.append)
    # THEN it heard the block's id, then the restore
    assert heard == [L.label_id(ls), 0]
    assert L._mirrored == mirrored


def test_slot_providers_are_written_directly(clean_thread):
    # GIVEN a provider handing out a one-item view per thread (a native slot's stand-in)
    cells = {}
    mirrored = L._mirrored

    def provider():
        cells[threading.get_ident()] = view = memoryview(bytearray(8)).cast("Q")
        return view

    L.add_slot_provider(provider)
    try:
        with L.labels(p="1") as ls:
            mine = cells[threading.get_ident()]
            # THEN the view holds the thread's id while the block runs, 0 after
            assert mine[0] == L.label_id(ls)
        assert mine[0] == 0
        # AND another thread gets its own view
        t = threading.Thread(target=lambda: L._publish(5))
        t.start()
        t.join()
        assert cells[t.ident][0] == 5 and cells[t.ident] is not mine
    finally:
        L.remove_slot_provider(provider)
    assert L._mirrored == mirrored


# -- propagation ---------------------------------------------------------------------------
def _seen_in_thread(start):
    """Run ``start(fn)`` which must run fn on another thread; what fn saw."""
    out = {}

    def fn():
        out["labels"] = L.current()
        out["id"] = published()
        out["ident"] = threading.get_ident()
        return 42

    result = start(fn)
    return out, result


def _thread_start(fn):
    t = threading.Thread(target=fn)
    t.start()
    t.join()


class _Sub(threading.Thread):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def run(self):
        self.fn()


def _subclass_start(fn):
    t = _Sub(fn)
    t.start()
    t.join()


def _pool_submit(fn):
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as ex:
        return ex.submit(fn).result()


def _run_in_executor(fn):
    async def main():
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    return asyncio.run(main())


def _to_thread(fn):
    async def main():
        return await asyncio.to_thread(fn)

    return asyncio.run(main())


@pytest.mark.parametrize("start", [_thread_start, _subclass_start, _pool_submit, _run_in_executor, _to_thread],
                         ids=["Thread", "Thread subclass", "ThreadPoolExecutor.submit", "run_in_executor",
                              "to_thread"])
def test_threads_started_in_a_labelled_context_inherit_the_labels(clean_thread, start):
    # GIVEN labels in force
    with L.labels(req="r7") as ls:
        # WHEN work runs on another thread
        out, _ = _seen_in_thread(start)
    # THEN it ran under the labels, published on its own thread
    assert out["ident"] != threading.get_ident()
    assert out["labels"] is ls and out["id"] == L.label_id(ls)


@pytest.mark.parametrize("start", [_thread_start, _pool_submit, _run_in_executor])
def test_without_labels_nothing_changes(clean_thread, start):
    # GIVEN propagation installed but no labels in force
    L.install_propagation()
    out, result = _seen_in_thread(start)
    # THEN the work runs unlabelled, results unchanged
    assert out["labels"] is EMPTY_LABELS and out["id"] == 0
    assert result in (None, 42)


def test_pool_workers_do_not_keep_the_labels_of_the_submit_that_started_them(clean_thread):
    # GIVEN a pool whose worker thread is started by a labelled submit
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as ex:
        with L.labels(first="1"):
            ex.submit(lambda: None).result()
        # WHEN later work is submitted without labels
        out = ex.submit(lambda: (L.current(), published())).result()
    # THEN that work is unlabelled
    assert out == (EMPTY_LABELS, 0)


def test_the_pool_thread_is_restored_after_labelled_work(clean_thread):
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as ex:
        with L.labels(a="1"):
            ex.submit(lambda: None).result()
        with L.labels(b="2") as ls:
            assert ex.submit(lambda: published()).result() == L.label_id(ls)
        assert ex.submit(lambda: published()).result() == 0


def test_submit_passes_arguments_and_exceptions_through(clean_thread):
    def f(a, b=0):
        if a < 0:
            raise ValueError("neg")
        return a + b

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as ex, L.labels(x="1"):
        assert ex.submit(f, 1, b=2).result() == 3
        with pytest.raises(ValueError, match="neg"):
            ex.submit(f, -1).result()


def test_a_thread_started_twice_still_raises_and_keeps_its_run(clean_thread):
    t = threading.Thread(target=lambda: None)
    with L.labels(x="1"):
        t.start()
        t.join()
        with pytest.raises(RuntimeError):
            t.start()
    assert "run" not in t.__dict__


def test_propagation_is_installed_by_the_first_labels_block_and_can_be_undone(clean_thread):
    L.uninstall_propagation()
    assert threading.Thread.start.__name__ == "start" and not hasattr(threading.Thread.start, "__wrapped__")
    with L.labels(a="1"):
        assert L.propagation_installed()
        assert threading.Thread.start.__wrapped__ is not None
    L.uninstall_propagation()
    assert not L.propagation_installed()
    assert not hasattr(concurrent.futures.ThreadPoolExecutor.submit, "__wrapped__")
    L.install_propagation()
    L.install_propagation()  # idempotent
    assert threading.Thread.start.__wrapped__.__name__ == "start"
