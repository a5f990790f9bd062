"""record's command line split into its options, the target and the target's arguments: every
option that takes a value (read from the parser) keeps it, whatever follows."""

from __future__ import annotations

import pytest

from ddprof_nb.__main__ import _split_record, subcommands


def _value_options():
    return sorted({a.option_strings[-1] for a in subcommands()["record"]._actions if a.option_strings and a.nargs != 0})


@pytest.mark.parametrize("option", _value_options())
def test_every_value_option_keeps_its_value_before_a_bare_script(option):
    options, script, module, rest = _split_record([option, "v", "script.py", "--native"])
    assert (options, script, module, rest) == ([option, "v"], "script.py", None, ["--native"])


def test_flags_take_no_value():
    assert _split_record(["--native", "--interpreter-frames", "s.py"]) == (["--native", "--interpreter-frames"],
                                                                          "s.py", None, [])
    assert "--native-threads" in _value_options()
