"""Fixtures of the native-sampler tests; helpers live in nhelpers.py."""

import pytest

from ddprof_nb.engines.native import binding as _binding


@pytest.fixture(scope="session", autouse=True)
def _native_available():
    # The native tests are the native engine's spec: an unavailable engine is a failure
    # on the platforms CI runs (Linux, CPython 3.11-3.15), never a skip.
    assert _binding.unavailable_reason() is None, _binding.unavailable_reason()
