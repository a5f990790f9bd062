"""The Explorer's output without a widget frontend: a static flame graph (HTML/SVG, no
JavaScript) and a text top table for terminals, nbconvert and notebook viewers, and
the self-contained HTML report.  A mixin of ``Explorer``."""

from __future__ import annotations

import html
from pathlib import Path

from ..model import top as _top
from .. import render as F
from ..exporters.files import write_atomic
from ..render.figures import report as interactive_report

__all__ = ["StaticMixin"]


class StaticMixin:
    """``_repr_mimebundle_``, ``_ipython_display_``, ``static_html``, ``top_text``, ``to_html``."""

    @property
    def flame_data(self) -> F.FlameData:
        """The flame chart's current data (ids, labels, values, colours, hover)."""
        return self._fd

    def _top_now(self, n: int) -> tuple[list, int]:
        """The top ``n`` functions of the current view (by self) and the view's total."""
        e, vi = self.event, self.value_index
        return _top.top(self._view, e, n=n, sort=_top.SELF[vi]), self._view.total(e, vi)

    def top_text(self, n: int = 20, rows=None) -> str:
        """The current view's top table as fixed-width text (the table ``%ddprof top`` prints)."""
        return F.top_table(self._view, self.event, n=n, value_index=self.value_index, rows=rows)

    def static_html(self, max_nodes: int = 300, rows=None) -> str:
        """A flame graph in plain HTML/SVG (no JavaScript) and the top table."""
        fd = F.flame_data(self._tree, min_pct=max(self.min_pct_sl.value, 0.5), max_nodes=max_nodes,
                          orientation=self.chart_tb.value, normalize=bool(self.diff_norm_tb.value))
        rows, total = (rows, self._view.total(self.event, self.value_index)) if rows else self._top_now(15)
        return (
            "<div class='ddprof-static'>"
            + F.static_flame_html(fd)
            + "<details><summary>top functions</summary>"
            + F.top_table_html(rows[:15], self.event, self.value_index, total)
            + "</details></div>"
        )

    def _repr_mimebundle_(self, **kwargs):
        """The widget view plus text/plain (top table) and text/html (static flame graph)
        for frontends without widgets (terminal, nbconvert, GitHub's viewer)."""
        # ipywidgets' own bundle starts with repr(self), which walks every child
        # (figures included) only to be cut to 110 characters: build it here instead
        bundle = {}
        if self._view_name is not None:
            bundle["application/vnd.jupyter.widget-view+json"] = {
                "version_major": 2, "version_minor": 0, "model_id": self._model_id}
        rows, _ = self._top_now(20)  # one top for both fallbacks
        bundle["text/plain"] = self.top_text(rows=rows)
        bundle["text/html"] = self.static_html(rows=rows)
        return bundle

    def _ipython_display_(self) -> None:
        """Two outputs: the static flame graph, then the widget.  A notebook saved with
        them and reopened without its kernel (or on GitHub, nbviewer) shows the static
        chart where the widget cannot be drawn, and a new page shows it while plotly's
        bundle loads; once the explorer's flame chart is drawn, the static output's own
        style sheet (``_FALLBACK_CSS``) hides it and shows the explorer in its place."""
        from IPython.display import display

        bundle = self._repr_mimebundle_()
        static = bundle.pop("text/html")
        display({"text/html": f"{_FALLBACK_CSS}<div class='ddprof-static-fallback'>{static}</div>"}, raw=True)
        display(bundle, raw=True)

    def to_html(self, path) -> Path:
        """Write a self-contained HTML report (plotly.js inlined: opens offline) with the
        flame chart, timeline and top table of the current view (atomically, mode 0600).
        Returns the path."""
        path = Path(path)
        status = html.unescape(self.status.value)
        write_atomic(path, interactive_report(self._view, self.event, self.value_index, fd=self._fd, status=status))
        return path


# The static flame graph output stands in for the widget output right after it until that
# holds an explorer whose flame chart plotly has drawn.  Before that the widget output shows
# ipywidgets' "Error displaying widget: model not found" (no kernel) or "Loading widget...":
# hidden outright; or an explorer waiting for plotly's bundle, which the browser evaluates
# once per page (seconds of CPU the first time in a new kernel): kept in the layout at its
# full width but with no height and unseen, so plotly draws it at the right size and the
# swap costs no second drawing.
_DRAWN = ".ddprof-explorer .ddprof-flame .main-svg"
_FALLBACK_CSS = f"""<style>
.jp-OutputArea-child:has(.ddprof-static-fallback) + .jp-OutputArea-child:not(:has(.ddprof-explorer)),
.output_area:has(.ddprof-static-fallback) + .output_area:not(:has(.ddprof-explorer)) {{ display: none; }}
.jp-OutputArea-child:has(.ddprof-static-fallback) + .jp-OutputArea-child:has(.ddprof-explorer):not(:has({_DRAWN})),
.output_area:has(.ddprof-static-fallback) + .output_area:has(.ddprof-explorer):not(:has({_DRAWN})) {{
  height: 0; min-height: 0; overflow: hidden; visibility: hidden; }}
.jp-OutputArea:has({_DRAWN}) .jp-OutputArea-child:has(.ddprof-static-fallback),
.output:has({_DRAWN}) .output_area:has(.ddprof-static-fallback) {{ display: none; }}
</style>"""
