"""How the magics show a profile: the explorer widget inside a kernel (its mimebundle
carries text/plain and text/html fallbacks); without the explorer, or outside a kernel, a
bundle of a text summary and a static HTML flame graph; in terminal IPython just the text.
The mode is picked by the caller (``ddprof_nb.magics.display_mode``, the user's setting)."""

from __future__ import annotations

import sys
import threading

from ..model import Profile
from ..render import static_html as render_html, notes as render_notes, text as render_text
from ..render.format import esc


def mode_for(shell, display_mode: str) -> str:
    """"auto" -> widget inside a kernel, text in terminal IPython, static elsewhere."""
    if display_mode != "auto":
        return display_mode
    if getattr(shell, "kernel", None) is not None:
        return "widget"
    if type(shell).__name__ == "TerminalInteractiveShell":
        return "text"
    return "static"


def fallback_bundle(profile: Profile, name: str | None = None, other: Profile | None = None,
                    html: bool = True) -> dict:
    """The mimebundle shown where no widget renders: a text summary and a static HTML
    flame graph (a diff shows both profiles' summaries and the biggest changes)."""
    if other is None:
        text = render_text.text_summary(profile, n=10, name=name)
    else:
        text = "\n\n".join([render_text.status_line(profile, "A"), render_text.status_line(other, "B"),
                            render_text.diff_table(profile, other)])
    bundle = {"text/plain": text}
    if html:
        title = f"ddprof [{name}]" if name else None
        # a cell output stays small: fewer, wider nodes than the saved report
        small = dict(full_document=False, top=10, max_nodes=400, min_fraction=0.005)
        if other is None:
            bundle["text/html"] = render_html.report(profile, title=title, **small)
        else:
            bundle["text/html"] = (
                "<div>" + render_html.report(profile, title="A", **small)
                + render_html.report(other, title="B", **small)
                + "<pre>" + esc(text) + "</pre></div>"
            )
    return bundle


def prepare(shell, display_mode: str) -> None:
    """Before a session that will be shown as the explorer: send plotly's bundle to the page
    now, so the browser evaluates it (seconds, once per kernel) while the cell runs instead
    of after it ends (from a second in: see ``figure_widget.send_bundle``).  Outside a
    kernel, or without the explorer, nothing happens."""
    if mode_for(shell, display_mode) != "widget":
        return
    try:
        from ..explorer.figure_widget import send_bundle
        send_bundle()
    except Exception:  # noqa: BLE001 - the explorer is optional; its own error shows at display
        pass


def preload(shell, display_mode: str):
    """Where sessions will be shown as the explorer: import what it needs (plotly,
    ipywidgets, anywidget: about 0.3 s of a new kernel) in a background thread, while
    the user writes the next cell.  A cell that needs them sooner waits on the imports'
    locks, doing nothing twice.  The thread's name marks it as the profiler's (hidden
    in the explorer's views).  Returns the thread, or None."""
    if mode_for(shell, display_mode) != "widget":
        return None

    def run():
        try:
            from ..explorer.figure_widget import figure_widget_class
            from ..explorer import widget  # noqa: F401 - the explorer's own modules

            figure_widget_class()
        except Exception:  # noqa: BLE001 - the explorer reports its own failure when it is made
            pass

    thread = threading.Thread(target=run, name="ddprof_nb-preload", daemon=True)
    thread.start()
    return thread


def _explorer(profile: Profile, other: Profile | None = None):
    """The explorer widget, or None when it is missing or fails (we fall back)."""
    try:
        from ..explorer.figure_widget import hold_bundle
        from ..explorer.widget import Explorer
    except Exception:  # noqa: BLE001 - explorer not installed or broken: static fallback
        return None
    try:
        hold_bundle()  # the static chart is drawn before plotly's set-up blocks the page
    except Exception:  # noqa: BLE001 - a closed comm: the chart comes after plotly's set-up
        pass
    try:
        return Explorer(profile, other) if other is not None else Explorer(profile)
    except Exception as exc:  # noqa: BLE001
        print(f"ddprof: the explorer failed ({type(exc).__name__}: {exc}); showing a static view",
              file=sys.stderr)
        return None


def show_as(mode: str, profile: Profile, name: str | None = None, other: Profile | None = None) -> None:
    """Display ``profile`` (or the diff ``profile`` -> ``other``) in ``mode``."""
    from IPython.display import display

    if mode == "text":
        # the status line was printed already; a terminal gets the tables
        if other is None:
            print("\n\n".join(render_text.top_table(profile, e, n=10) for e in profile.events) or "(no samples)")
            warnings = render_notes.sorted_notes(profile)[0]  # the status line counted them
            if warnings:
                print("\n" + "\n".join(f"warning: {w}" for w in warnings))
        else:
            print(fallback_bundle(profile, name, other, html=False)["text/plain"])
        return
    if mode == "widget":
        widget = _explorer(profile, other)
        if widget is not None:
            display(widget)
            return
    display(fallback_bundle(profile, name, other), raw=True)
