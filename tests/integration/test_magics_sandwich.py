"""``%ddprof sandwich FUNCTION [NAME]``: a function's callers and callees as the text
tables of ``%ddprof top``, driven through a real InteractiveShell (fixture in test_magics.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("IPython")

from ddprof_nb.render import text as summary  # noqa: E402
from ddprof_nb.history import history  # noqa: E402
from ddprof_nb.model import Frame, Metadata, Profile, ProfileBuilder  # noqa: E402
from test_magics import run, shell  # noqa: E402,F401 - the shared fixture

FIRST = {"main": 1, "a": 20, "b": 30, "c": 40, "x": 50, "helper": 60, "leaf": 70}


def hand_profile(rows, event="cpu") -> Profile:
    """rows: (";"-joined names, value); each frame one line into its function."""
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=10**9))
    t = b.thread_id(1, "main")
    for names, value in rows:
        frames = [Frame(n, "nb.py", FIRST[n] + 1, FIRST[n]) for n in names.split(";")]
        b.add(event, b.stack_of(frames), t, 0, 0, 1, value)
    return b.build()


@pytest.mark.pure_python  # (a hand-built profile through the magic: no sampling)
def test_sandwich_prints_callers_and_callees_tables(shell, capsys):
    # GIVEN a helper called from three places, stored in the history
    history.add(hand_profile([("main;a;helper;leaf", 10_000_000), ("main;b;helper", 20_000_000),
                              ("main;c;x;helper", 30_000_000), ("main;c", 4_000_000), ("main;a", 6_000_000)]),
                "hand")
    capsys.readouterr()
    # WHEN its sandwich is asked for
    res, _ = run(shell, "%ddprof sandwich helper hand")
    out = capsys.readouterr().out
    assert res.success, res.error_in_exec
    # THEN the callers table is the top table of the call chains to helper (self: direct
    # calls from a, b, x; total: reached through each), computed here by hand
    callers = hand_profile([("main;a", 10_000_000), ("main;b", 20_000_000), ("main;c;x", 30_000_000)])
    callees = hand_profile([("helper;leaf", 10_000_000), ("helper", 20_000_000), ("helper", 30_000_000)])
    expected_callers = summary.top_table(callers, "cpu", n=10)
    expected_callees = summary.top_table(callees, "cpu", n=10)
    assert out.startswith("ddprof [hand] sandwich of helper (nb.py:60)\n")
    assert "callers of helper (nb.py:60)" in out and "callees of helper (nb.py:60)" in out
    assert expected_callers in out and expected_callees in out
    assert out.index(expected_callers) < out.index(expected_callees)
    rows = [ln.split() for ln in expected_callers.splitlines()[2:]]
    assert [r[-2] for r in rows] == ["x", "b", "a", "main", "c"]  # by self (direct calls), then total


@pytest.mark.quick
def test_sandwich_of_the_latest_real_profile(shell, capsys):
    # GIVEN a profiled cell
    res, _ = run(shell, "%%ddprof --no-show -e cpu -o real\nbusy(0.2)\n")
    assert res.success
    capsys.readouterr()
    # WHEN the sandwich of busy is asked for (the latest profile by default)
    res, _ = run(shell, "%ddprof sandwich busy")
    out = capsys.readouterr().out
    assert res.success, res.error_in_exec
    # THEN both tables are there, busy at the top of its callees, over all its CPU time
    assert out.startswith("ddprof [real] sandwich of busy (")
    callees = out.split("callees of busy", 1)[1].splitlines()
    assert " busy " in callees[3]  # its first row (after the note, the table's title and header)
    assert history["real"].sandwich("busy")[1].total("cpu") >= 0.1e9


@pytest.mark.pure_python  # (a hand-built profile through the magic: no sampling)
def test_sandwich_errors_are_one_line(shell, capsys):
    history.add(hand_profile([("main;a;helper", 5)]), "hand")
    capsys.readouterr()
    for line, message in [
        ("%ddprof sandwich helpr hand", "UsageError: %ddprof sandwich: no function named 'helpr' in this profile; "
                                        "did you mean 'helper'?"),
        ("%ddprof sandwich", "UsageError: the following arguments are required: function"),
        ("%ddprof sandwich helper hand -n 0", "UsageError: %ddprof sandwich: -n must be at least 1, not 0"),
        ("%ddprof sandwich helper hand -e nope", "UsageError: %ddprof sandwich: unknown EventType 'nope'"),
    ]:
        res, _ = run(shell, line)
        err = capsys.readouterr().err
        assert not res.success and err.strip().startswith(message), (line, err)
    res, _ = run(shell, "%ddprof sandwich helper hand -e wall")
    assert res.success and capsys.readouterr().out.strip() == "ddprof [hand]: helper (nb.py:60) has no samples of wall"
