"""Fixtures of the coexistence suite; helpers live in coexist_helpers.py, and what
the child interpreters import (workloads, checks, the other tools) in coexist_tools.py."""

import pytest

from ddprof_nb.engines.native import binding as _binding


@pytest.fixture(scope="session", autouse=True)
def _native_available():
    # Every scenario here is about the native engine beside other code: an unavailable engine
    # is a failure on the platforms CI runs, never a skip.
    assert _binding.unavailable_reason() is None, _binding.unavailable_reason()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "lockpark: needs the lock/park GOT hooks; under AddressSanitizer (libasan preloaded) the "
        "profile saying no wait function could be hooked is accepted instead",
    )
