"""Where a live session (``%%ddprof --live``, ``profile(live=True)``) is shown.

- In a notebook (an IPython kernel; the magics' display mode "widget"): the live view
  widget (``explorer.live_view``), displayed when the session starts and turned into the
  explorer of the whole profile at the end.
- Elsewhere, when stderr is a terminal: one progress line on stderr (elapsed time,
  samples per event, the hottest function so far), rewritten in place each second and
  erased at the end.
- Elsewhere (stderr a file or a pipe: a log wants no line a second): nothing; the
  profile is the same.
"""

from __future__ import annotations

import sys

from .live import shown_event
from .render.format import format_count, format_duration

__all__ = ["widget_sink", "line_sink", "sink_for", "StderrLine"]


class StderrLine:
    """A live sink writing one progress line to a terminal's stderr."""

    def __init__(self, stream=None, width: int = 100):
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.refreshes = 0

    def update(self, snap) -> None:
        self.refreshes += 1
        self.stream.write("\r" + progress_line(snap)[: self.width] + "\x1b[K")
        self.stream.flush()

    def finish(self, profile=None, error=None) -> None:
        if self.refreshes:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def progress_line(snap) -> str:
    """``ddprof live: 12.0 s · cpu 1,180 · wall 9,640 samples · hottest (cpu): busy 97%``."""
    counts = " · ".join(f"{e.label} {format_count(n)}" for e, n in sorted(snap.samples.items(),
                                                                         key=lambda kv: kv[0].value) if n)
    line = f"ddprof live: {format_duration(snap.elapsed_s * 1e9)} · {counts or 'no'} samples"
    event = shown_event(snap.profile)
    if event is not None:
        rows = snap.profile.top(event, n=1)
        total = snap.profile.total(event)
        if rows and total:
            line += f" · hottest ({event.label}): {rows[0].name} {100 * rows[0].self / total:.0f}%"
    return line


def line_sink(stream=None):
    """A progress line when ``stream`` (stderr) is a terminal, else None (show nothing)."""
    stream = stream if stream is not None else sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return StderrLine(stream) if tty else None


def widget_sink(shape=None, title: str = "ddprof live"):
    """The live view widget, displayed now; None when ipywidgets cannot load."""
    try:
        from IPython.display import display

        from .explorer.live_view import LiveView
    except Exception:  # noqa: BLE001 - no widgets: the caller falls back to the line
        return None
    view = LiveView(shape=shape, title=title)
    display(view)
    return view


def sink_for(shape=None, title: str = "ddprof live"):
    """The sink for code running here: the widget inside an IPython kernel, else the line
    on a terminal, else None."""
    shell = None
    if "IPython" in sys.modules:
        from IPython import get_ipython

        shell = get_ipython()
    if shell is not None and getattr(shell, "kernel", None) is not None:
        sink = widget_sink(shape, title)
        if sink is not None:
            return sink
    return line_sink()


