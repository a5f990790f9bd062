"""Shared pytest configuration.

``pytest --update`` rewrites golden files under tests/data/ instead of comparing
against them (memray and pprof do the same); review the diff before committing.
"""

import pytest


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
