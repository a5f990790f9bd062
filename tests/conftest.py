"""Shared pytest configuration.

``pytest --update`` rewrites golden files under tests/data/ instead of comparing
against them (memray and pprof do the same); review the diff before committing.

The quick lane (``scripts/test.sh --quick``, ``pytest -m quick``) is every test of the
folders below that is not marked ``slow``, and elsewhere the tests marked ``quick``.
"""

from pathlib import Path

import pytest

# the unit tests and the native core: whole folders, so that a new test there is in the
# quick lane unless it is marked slow
QUICK_FOLDERS = ("unit", "native")
_TESTS = Path(__file__).parent


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
    for item in items:
        path = Path(item.path)
        if any(root in path.parents for root in quick_roots) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.quick)
