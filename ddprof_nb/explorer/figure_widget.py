"""A plotly FigureWidget that sends plotly's JavaScript to the page once, not per figure.

plotly's FigureWidget is an anywidget whose ``_esm`` trait is plotly's whole widget
bundle (about 5 MB).  Every figure sends and stores its own copy, and the page imports
each copy as a separate module: an Explorer (two figures) cost about 10 MB of comm
traffic, ~100 ms of kernel CPU and a fresh 5 MB module evaluation per cell.

Here the bundle travels once per kernel session, as the binary ``bundle`` trait of one
hidden ``_PlotlyBundle`` widget that is never displayed (anywidget initialises a model
when its comm opens, displayed or not).  Its tiny ESM imports the bundle and publishes
the module under a page-global key; every figure's tiny ESM awaits that key and then
runs plotly's own widget code unchanged.  Models may arrive in any order (page reload
restores them from the kernel in parallel), so whichever runs first creates the
shared promise.  The key carries plotly's version: a kernel restarted on another
plotly never picks up the old page's module.
"""

from __future__ import annotations

import json

__all__ = ["figure_widget_class"]

# Both ESMs start with this: the page-global slot the bundle module is published in.
_SHARED_JS = """
const KEY = Symbol.for(%s);
function shared() {
  let s = globalThis[KEY];
  if (!s) {
    let resolve;
    const promise = new Promise((r) => { resolve = r; });
    s = globalThis[KEY] = { promise, resolve, loading: false };
  }
  return s;
}
"""

_CARRIER_ESM = _SHARED_JS + """
export default {
  initialize({ model }) {
    const s = shared();
    if (s.loading) return;  // another carrier (an older kernel, a restored model) won
    s.loading = true;
    const blob = new Blob([model.get("bundle")], { type: "text/javascript" });
    s.resolve(import(URL.createObjectURL(blob)));
  },
};
"""

_FIGURE_ESM = _SHARED_JS + """
export default () => {
  let inner;
  return {
    async initialize(ctx) {
      const mod = await shared().promise;
      // anywidget's contract: a default export that is the widget or makes it
      inner = typeof mod.default === "function" ? await mod.default() : mod.default;
      return inner.initialize(ctx);
    },
    render(ctx) { return inner.render(ctx); },
  };
};
"""

_classes: dict = {}
_carrier = None


def _bundle_key() -> str:
    import plotly

    return json.dumps(f"ddprof_nb.plotly-widget-bundle@{plotly.__version__}")


def _ensure_carrier() -> None:
    """Open the bundle carrier's comm unless one is open (closed widgets have no comm)."""
    global _carrier
    if _carrier is None or getattr(_carrier, "comm", None) is None:
        _carrier = _classes["carrier"](bundle=_classes["bundle"])


def figure_widget_class():
    """The FigureWidget subclass (built on first use: plotly and anywidget import lazily)."""
    cls = _classes.get("figure")
    if cls is not None:
        return cls
    import anywidget
    import plotly.graph_objects as go
    import traitlets

    key = _bundle_key()
    bundle = str(go.FigureWidget._esm)  # anywidget turned the bundle's path into its text

    class _PlotlyBundle(anywidget.AnyWidget):
        _esm = _CARRIER_ESM % key
        bundle = traitlets.Bytes().tag(sync=True)

    class FigureWidget(go.FigureWidget):
        """plotly's FigureWidget with the shared bundle, whose comm opens only once its
        traces and layout are set: plotly opens it inside ``__init__`` and sends the data
        in a second message, and a page rendering in between drew an empty chart that
        never redrew (Chromium throttled 6x: one load in three)."""

        _esm = _FIGURE_ESM % key

        def open(self):
            if self.__dict__.get("_ddprof_ready"):
                super().open()

        def __init__(self, *a, **k):
            _ensure_carrier()  # its comm_open precedes ours
            super().__init__(*a, **k)
            self._ddprof_ready = True
            self.open()

    _classes.update(carrier=_PlotlyBundle, bundle=bundle.encode("utf-8"), figure=FigureWidget)
    return FigureWidget
