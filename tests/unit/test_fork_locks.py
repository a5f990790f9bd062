"""A fork taken while another thread holds one of ddprof_nb's module-level locks must not
leave that lock held in the child: only the forking thread lives on there, so nobody would
ever release it, and the child's first session (or its stop) would wait forever."""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time

import pytest

import ddprof_nb

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))
# the modules a session's start and stop pass through (the pipeline's steps included)
MODULES = ("ddprof_nb.model.selection", "ddprof_nb.sampler", "ddprof_nb.labeling", "ddprof_nb.model.data",
           "ddprof_nb.pipeline", "ddprof_nb.asyncio_support", "ddprof_nb.children")


def module_locks():
    """(module, owner name or None, attribute) of every lock held by a module or its classes."""
    found = []
    for name in MODULES:
        mod = importlib.import_module(name)
        for attr, value in vars(mod).items():
            if isinstance(value, LOCK_TYPES):
                found.append((name, None, attr))
            elif isinstance(value, type) and value.__module__ == name:
                found += [(name, attr, a) for a, v in vars(value).items() if isinstance(v, LOCK_TYPES)]
    return found


def lock_at(module, owner, attr):
    base = sys.modules[module]
    return getattr(getattr(base, owner) if owner else base, attr)


def test_the_scan_finds_the_locks():
    # (an empty scan would make the test below pass without checking anything)
    names = {(m, o, a) for m, o, a in module_locks()}
    assert ("ddprof_nb.model.selection", None, "_memo_lock") in names, names
    assert ("ddprof_nb.sampler", None, "_active_lock") in names, names


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # (on purpose)
@pytest.mark.parametrize("where", module_locks(), ids=lambda w: ".".join(p for p in w if p))
def test_a_lock_held_at_fork_is_free_in_the_child(where):
    # GIVEN one of our module-level locks held by another thread
    held, release = threading.Event(), threading.Event()

    def holder():
        with lock_at(*where):
            held.set()
            release.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    try:
        # WHEN the process forks
        pid = os.fork()
        if pid == 0:
            # THEN the child can take that lock (the holder is gone with its thread)
            ok = lock_at(*where).acquire(timeout=5)
            os._exit(0 if ok else 1)
    finally:
        release.set()
        t.join()
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        assert time.monotonic() < deadline, "the child did not end"
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0, f"{'.'.join(p for p in where if p)} still held in the fork child"
