"""Shared pytest configuration.

``pytest --update`` rewrites golden files under tests/data/ instead of comparing
against them (memray and pprof do the same); review the diff before committing.

Two markers are given here by place, so that a new test gets them without asking:

- ``quick`` (the contributor's lane, ``scripts/test.sh --quick``): every test of the
  folders in QUICK_FOLDERS not marked ``slow``; elsewhere the tests marked ``quick`` by hand.
- ``internals`` (run on every CPython version the native engine claims; the whole suite
  runs on 3.11 only): every test of INTERNALS_FOLDERS and INTERNALS_MODULES — the code that
  reads interpreter internals (frames, code objects, thread states, asyncio's tasks, another
  process's memory) or version-dependent interpreter APIs (the python engine, the engine
  choice).  A test elsewhere that does so is marked ``internals`` by hand, or goes in one of
  these places.  See docs/testing.md.
"""

from pathlib import Path

import pytest

_TESTS = Path(__file__).parent
# whole folders, so that a new test there is in the quick lane unless it is marked slow
QUICK_FOLDERS = ("unit", "native")
INTERNALS_FOLDERS = ("native",)
INTERNALS_MODULES = (
    "integration/test_api_python_engine.py",
    "integration/test_asyncio.py",
    "integration/test_engine_choice.py",
    "integration/test_imports_named.py",
    "integration/test_python_engine.py",
    "integration/test_python_engine_threads.py",
    "integration/test_remote_dump.py",
    "integration/test_remote_record.py",
    "coexist/test_coexist_fork.py",
)


def pytest_addoption(parser):
    parser.addoption(
        "--update",
        action="store_true",
        default=False,
        help="rewrite golden files in tests/data/ from the current output instead of comparing",
    )


@pytest.fixture
def update_golden(request) -> bool:
    """True when the run was started with ``--update``."""
    return bool(request.config.getoption("--update"))


def pytest_collection_modifyitems(config, items):
    quick_roots = [_TESTS / name for name in QUICK_FOLDERS]
    internals_roots = [_TESTS / name for name in INTERNALS_FOLDERS]
    internals_files = {_TESTS / name for name in INTERNALS_MODULES}
    for item in items:
        path = Path(item.path)
        if any(root in path.parents for root in quick_roots) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.quick)
        if path in internals_files or any(root in path.parents for root in internals_roots):
            item.add_marker(pytest.mark.internals)
