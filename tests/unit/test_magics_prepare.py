"""The magic sends plotly's bundle to the page when a session starts, only where the
explorer will show the profile, and never fails the cell for it."""

import pytest

from ddprof_nb.explorer import figure_widget
from ddprof_nb.magics import display


@pytest.fixture
def sent(monkeypatch):
    calls = []
    monkeypatch.setattr(figure_widget, "send_bundle", lambda: calls.append(1))
    return calls


def test_bundle_sent_when_the_explorer_will_show(monkeypatch, sent):
    monkeypatch.setattr(display, "mode_for", lambda shell, mode: "widget")
    display.prepare(object(), "auto")
    assert sent == [1]


@pytest.mark.parametrize("mode", ["text", "static"])
def test_nothing_sent_where_no_widget_shows(monkeypatch, sent, mode):
    monkeypatch.setattr(display, "mode_for", lambda shell, m: mode)
    display.prepare(object(), "auto")
    assert sent == []


def test_a_failing_send_does_not_fail_the_cell(monkeypatch):
    def boom():
        raise RuntimeError("no comm")
    monkeypatch.setattr(display, "mode_for", lambda shell, mode: "widget")
    monkeypatch.setattr(figure_widget, "send_bundle", boom)
    display.prepare(object(), "auto")  # returns quietly
