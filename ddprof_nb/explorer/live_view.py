"""The live view: what a running session sampled so far, redrawn about once a second, then
the usual explorer of the whole profile.

A sink of ``ddprof_nb.live``: ``update(snapshot)`` runs in the refresh thread while the
cell runs.  The kernel's shell channel is busy then, so the view is output only: its
widgets' new values reach the page as comm messages on the IOPub channel, which any
thread may send.  It draws with the static renderers (one SVG flame, an HTML table:
cheap, and nothing to click that could not answer); ``finish(profile)`` puts the
explorer of the whole profile in its place once the session stopped.
"""

from __future__ import annotations

import ipywidgets as W
import numpy as np

from ..events import EventType
from ..live import RECENT_S, LiveSnapshot, shown_event
from ..model import Profile
from ..render import static_html as render_html
from ..render.format import esc, format_count, format_duration
from .threads import KERNEL_THREAD_NAMES, Machinery, hide_machinery, user_first

__all__ = ["LiveView", "MAX_NODES"]

MAX_NODES = 150  # flame nodes drawn per refresh (the final explorer draws the full budget)
_BARS = "▁▂▃▄▅▆▇█"
_MAX_THREADS = 12  # rows of the per-thread table


class LiveView(W.VBox):
    """``shape``: Profile -> Profile applied to each snapshot (the session's stack-shaping
    steps, ``Sampler.shape_live``), so the flame looks like the final one."""

    def __init__(self, shape=None, title: str = "ddprof live"):
        self.shape = shape
        self.title = title
        self.refreshes = 0  # snapshots drawn; also in the header's data-refreshes (the widget state)
        self.final = None  # the explorer (or static view) the view became at the end
        self._skeleton = None  # (raw's size, shaped view, raw row of each view row, machinery): see _view
        self.status = W.HTML(self._header(None))
        self.flame = W.HTML("")
        self.threads = W.HTML("")
        super().__init__(children=(self.status, self.flame, self.threads))
        self.add_class("ddprof-live")

    def _repr_mimebundle_(self, **kwargs):
        """The widget view, and a line saying what it is for frontends without widgets (the
        profile is not known yet when it is displayed)."""
        bundle = {"text/plain": f"{self.title}: the samples so far while it runs, then the explorer of the profile"}
        if self._view_name is not None:
            bundle["application/vnd.jupyter.widget-view+json"] = {
                "version_major": 2, "version_minor": 0, "model_id": self._model_id}
        return bundle

    def _header(self, snap: LiveSnapshot | None, extra: str = "") -> str:
        if snap is None:
            body = "starting&hellip;"
        else:
            counts = " &middot; ".join(f"{esc(e.label)} {format_count(n)} samples" for e, n in sorted(
                snap.samples.items(), key=lambda kv: kv[0].value))
            body = f"{format_duration(snap.elapsed_s * 1e9)} elapsed &middot; {counts or 'no samples yet'}"
        return (f"<div class='ddprof-live-status' data-refreshes='{self.refreshes}' style='font-size:12px'>"
                f"<b>{esc(self.title)}</b> &middot; {body}{extra}</div>")

    def update(self, snap: LiveSnapshot) -> None:
        view, machinery = self._view(snap.profile)
        event = _event(view)
        flame = (render_html.flame_section(view, event, max_nodes=MAX_NODES) if event is not None
                 else "<div class='ddp-flame ddp-empty'>(no samples yet)</div>")
        hidden = set(machinery.threads)
        table = _threads_html(snap, hidden, event)
        self.refreshes += 1
        with self.hold_sync():
            self.flame.value = flame
            self.threads.value = table
            self.status.value = self._header(snap, f" &middot; refreshed every second, {self.refreshes} so far")

    def _view(self, raw: Profile) -> tuple[Profile, Machinery]:
        """``raw`` shaped and without the machinery threads.  Both only map stacks, drop
        rows or pick threads, whatever the values: they run on a skeleton of ``raw`` (each
        row's time is its row number, so no two rows merge) when the running aggregate
        gained keys since the last refresh, and otherwise the skeleton's rows take the new
        values.  The skeleton's tables stay the same objects, so the call tree's shape is
        cached between refreshes too (``render.tree``)."""
        n = len(raw)
        if self._skeleton is None or self._skeleton[0] != (n, len(raw.stacks), len(raw.threads)):
            tick = raw.tick_ns
            rows = np.arange(n, dtype=np.int64)
            skeleton = raw.replace(time_ns=rows * tick, values=np.ones((n, 2), dtype=np.int64))
            shaped = self.shape(skeleton) if self.shape is not None else skeleton
            view, machinery = hide_machinery(shaped)
            self._skeleton = ((n, len(raw.stacks), len(raw.threads)), view, view.time_ns // tick, machinery)
        _, v, rows, machinery = self._skeleton
        view = v.replace(time_ns=np.zeros(len(rows), dtype=np.int64), values=raw.values[rows], metadata=raw.metadata)
        return view, machinery

    def finish(self, profile: Profile | None, error: str | None = None) -> None:
        """Become the explorer of ``profile`` (a static report if the explorer fails); with
        no profile, say why (``error``)."""
        if profile is None:
            self.status.value = self._header(None, f" &middot; stopped: {esc(error or 'no profile')}")
            return
        try:
            from .widget import Explorer

            final = Explorer(profile)
        except Exception as exc:  # noqa: BLE001 - the profile is still shown, statically
            final = W.HTML(render_html.report(profile, full_document=False, top=10, max_nodes=400)
                           + f"<div class='ddprof-msg'>the explorer failed ({esc(type(exc).__name__)}: "
                             f"{esc(exc)}); a static view</div>")
        self.final = final
        self.children = (final,)


def _event(view: Profile) -> EventType | None:
    """The event the live flame shows (``live.shown_event``)."""
    return shown_event(view)


def _threads_html(snap: LiveSnapshot, hidden: set[str], event: EventType | None) -> str:
    """Samples per second of each of the user's threads over the last ``RECENT_S`` seconds."""
    if event is None:
        return ""
    threads = snap.profile.threads
    recent = snap.recent.get(event, {})
    rows = [(threads[i], counts) for i, counts in recent.items()
            if i < len(threads) and threads[i].name not in hidden and not KERNEL_THREAD_NAMES.search(threads[i].name)]
    if not rows:
        return ""
    order = {t: k for k, t in enumerate(user_first([t for t, _ in rows]))}
    rows.sort(key=lambda r: order[r[0]])
    top = max(max(c) for _, c in rows) or 1
    body = []
    for thread, counts in rows[:_MAX_THREADS]:
        bars = "".join(_BARS[min(len(_BARS) - 1, round(c / top * (len(_BARS) - 1)))] if c else " " for c in counts)
        body.append(f"<tr><td>{esc(thread.name)}</td><td style='font-family:monospace'>{bars}</td>"
                    f"<td style='text-align:right'>{format_count(counts[-1])}/s</td></tr>")
    more = (f"<tr><td colspan='3' style='opacity:.7'>{len(rows) - _MAX_THREADS} more thread(s)</td></tr>"
            if len(rows) > _MAX_THREADS else "")
    return (f"<table class='ddprof-live-threads' style='font-size:12px'><tr><th>thread</th>"
            f"<th>{esc(event.label)} samples, last {RECENT_S} s</th><th>last second</th></tr>"
            + "".join(body) + more + "</table>")
