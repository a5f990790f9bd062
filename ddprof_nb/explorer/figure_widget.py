"""A plotly FigureWidget that sends plotly's JavaScript to the page once, not per figure;
``figure_widget`` makes one from unvalidated trace properties and ``send_update`` changes
its traces and layout in one message.

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

The page gets plotly's widget code with a plotly.js of the icicle and bar traces only
(``plotly_partial``: 1.4 MB instead of 5 MB).  Importing it is one main-thread task (0.3-0.7 s
of Chromium CPU on a loaded 2-core box; the whole plotly.js took 2-3.5 s), during which the
page draws nothing.  That task is the module's evaluation: compiling it ahead (a
``<link rel="modulepreload">`` of the blob URL as the bundle arrives) leaves the import's
main-thread CPU as it was.  The explorer's static flame graph, shown while plotly loads
(``static_view``), must not wait behind that task.  It starts when a figure's view is first
rendered (after a paint: the static output is displayed before the widget), or
``start_after_ms`` after the carrier arrives (-1: never).  The magic sends the bundle when a
recording starts and lets the page evaluate it at once, while the cell runs and the kernel
builds the explorer (at least ~1 s before the static chart can arrive); the cell's end holds
a set-up not yet started (``hold_bundle``).  A figure's model does not wait for plotly in
``initialize`` (anywidget fails a model not initialized within 2 s); its view's render does.
"""

from __future__ import annotations

import json
import threading

from .icicle_patch import lighter_icicle
from .plotly_partial import with_partial_plotly

__all__ = ["figure_widget_class", "figure_widget", "send_update", "remember_state", "send_bundle", "hold_bundle"]

# Both ESMs start with this: the page-global slot the bundle module is published in.
_SHARED_JS = """
const KEY = Symbol.for(%s);
function shared() {
  let s = globalThis[KEY];
  if (!s) {
    let resolve;
    const promise = new Promise((r) => { resolve = r; });
    s = globalThis[KEY] = { promise, resolve, loading: false, start: null, wanted: false };
  }
  return s;
}
"""

_CARRIER_ESM = _SHARED_JS + """
export default {
  initialize({ model }) {
    const s = shared();
    if (s.start) return;  // another carrier (an older kernel, a restored model) came first
    s.start = () => {
      if (s.loading) return;
      s.loading = true;
      clearTimeout(s.timer);
      clearTimeout(s.late);
      const blob = new Blob([model.get("bundle")], { type: "text/javascript" });
      s.resolve(import(URL.createObjectURL(blob)));
    };
    const schedule = () => {
      clearTimeout(s.timer);
      clearTimeout(s.late);
      const after = model.get("start_after_ms");
      if (after < 0 || s.loading) return;
      // after a paint: the static chart displayed just before this message shows first;
      // a hidden tab runs no animation frames, hence the later timeout
      s.timer = setTimeout(() => requestAnimationFrame(() => setTimeout(s.start, 0)), after);
      s.late = setTimeout(s.start, after + 500);
    };
    model.on("change:start_after_ms", schedule);
    if (s.wanted) s.start();
    else schedule();
  },
};
"""

_FIGURE_ESM = _SHARED_JS + """
export default () => {
  let inner, model, ready, listening = null;
  // plotly's view subscribes to the model's "change:_py2js_*" events with handlers it
  // never removes, and purges its plot when removed: a view removed while its model
  // lives on (a Box's children replaced, an output cleared) threw on every later update
  // ("Error setting state: Cannot read properties of undefined (reading 'length')").
  // The model plotly sees records what each render subscribes; the view's cleanup
  // unsubscribes it.
  function on(name, callback, context) {
    if (listening) listening.push([name, callback, context]);
    return model.on(name, callback, context);
  }
  return {
    // anywidget fails a model whose initialize takes over 2 s: plotly's waits in the
    // background, and render awaits it
    initialize(ctx) {
      const s = shared();
      model = ctx.model;
      const proxy = new Proxy(model, {
        get(target, prop) {
          if (prop === "on") return on;
          const value = Reflect.get(target, prop, target);
          return typeof value === "function" ? value.bind(target) : value;
        },
      });
      ready = s.promise.then(async (mod) => {
        // anywidget's contract: a default export that is the widget or makes it
        inner = typeof mod.default === "function" ? await mod.default() : mod.default;
        return inner.initialize({ ...ctx, model: proxy });
      });
      return () => ready.then((cleanup) => { if (typeof cleanup === "function") cleanup(); });
    },
    // plotly.js re-measures on a window resize only ("responsive"); the output area
    // also changes width when a side panel opens or the pane is dragged: watch it.
    async render(ctx) {
      // a view is wanted: plotly's set-up may start, after a paint (the static chart
      // displayed before this view shows first); a hidden tab runs no animation frames
      const s = shared();
      const start = () => { s.wanted = true; if (s.start) s.start(); };
      requestAnimationFrame(() => setTimeout(start, 0));
      setTimeout(start, 500);
      await ready;
      const subscribed = listening = [];
      let cleanup;
      try {
        cleanup = await inner.render(ctx);
      } finally {
        listening = null;
      }
      let observer = null;
      if (typeof ResizeObserver === "function") {
        let width = 0;
        observer = new ResizeObserver(() => {
          const gd = ctx.el.classList.contains("js-plotly-plot") ? ctx.el : ctx.el.querySelector(".js-plotly-plot");
          const w = ctx.el.clientWidth;
          if (gd && w && w !== width && gd._responsiveChartHandler) {
            width = w;
            gd._responsiveChartHandler();
          }
        });
        observer.observe(ctx.el);
      }
      return () => {
        for (const [name, callback, context] of subscribed) model.off(name, callback, context);
        if (observer) observer.disconnect();
        if (typeof cleanup === "function") cleanup();
      };
    },
  };
};
"""

_classes: dict = {}
_carrier = None


def _bundle_key(partial: bool) -> str:
    import plotly

    which = "+icicle-bar" if partial else ""
    return json.dumps(f"ddprof_nb.plotly-widget-bundle@{plotly.__version__}{which}")


# A recording's bundle starts evaluating this long after it reaches the page.  With the
# whole plotly.js (seconds of set-up) it was 1 s, so that a short cell's static chart came
# first; the partial plotly.js's set-up ends before the cell's static chart can arrive.
START_AFTER_S = 0.0


def _carrier_open() -> bool:
    return _carrier is not None and getattr(_carrier, "comm", None) is not None  # closed: no comm


def _ensure_carrier(start_after_s: float | None = None) -> None:
    """Open the bundle carrier's comm unless one is open."""
    global _carrier
    if not _carrier_open():
        after = -1 if start_after_s is None else round(start_after_s * 1000)
        _carrier = _classes["carrier"](bundle=_classes["bundle"], start_after_ms=after)


def send_bundle(start_after_s: float | None = START_AFTER_S) -> None:
    """Send plotly's bundle to the page now (once per kernel), before any figure exists;
    the page evaluates it ``start_after_s`` later (unless ``hold_bundle`` comes first) or
    when a figure is first shown (``None``: only then).

    The magic calls it when a recording starts, so the page evaluates the module
    while the cell runs; an Explorer calls it with ``None`` when it is made, so the
    bundle's transfer overlaps the kernel's first view and its evaluation waits for the
    static chart to be on screen."""
    figure_widget_class()
    _ensure_carrier(start_after_s)


def hold_bundle() -> None:
    """The recording ended: the page leaves the bundle unevaluated until a figure is shown
    (a no-op once it started), so the static chart comes first."""
    if _carrier_open():
        _carrier.start_after_ms = -1


_class_lock = threading.Lock()  # one build, whichever thread asks first


def figure_widget_class():
    """The FigureWidget subclass (built on first use: plotly and anywidget import lazily)."""
    cls = _classes.get("figure")
    if cls is not None:
        return cls
    with _class_lock:
        if "figure" not in _classes:
            _build_classes()
    return _classes["figure"]


def _build_classes() -> None:
    import anywidget
    import traitlets

    go = _plotly_without_nbformat()

    whole = str(go.FigureWidget._esm)  # anywidget turned the path into its text
    bundle = with_partial_plotly(whole)
    key = _bundle_key(bundle is not whole)
    bundle = lighter_icicle(bundle)

    class _PlotlyBundle(anywidget.AnyWidget):
        _esm = _CARRIER_ESM % key
        bundle = traitlets.Bytes().tag(sync=True)
        start_after_ms = traitlets.Int(-1).tag(sync=True)  # -1: when a figure is shown

    class FigureWidget(go.FigureWidget):
        """plotly's FigureWidget with the shared bundle, whose comm opens only once its
        traces and layout are set: plotly opens it inside ``__init__`` and sends the data
        in a second message, and a page rendering in between drew an empty chart that
        never redrew (Chromium throttled 6x: one load in three)."""

        _esm = _FIGURE_ESM % key

        def open(self):
            if self.__dict__.get("_ddprof_ready"):
                super().open()

        def _should_send_property(self, key, value):
            if key in ("_widget_data", "_widget_layout") and self.__dict__.get("_ddprof_quiet"):
                return False  # see remember_state
            return super()._should_send_property(key, value)

        def __init__(self, *a, **k):
            _ensure_carrier()  # its comm_open precedes ours
            super().__init__(*a, **k)
            self._ddprof_ready = True
            self.open()

    _classes.update(carrier=_PlotlyBundle, bundle=bundle.encode("utf-8"), figure=FigureWidget)


class _ImportedOnUse:
    """Stands for a module until it is used; then imports it (None-like if it cannot)."""

    def __init__(self, name: str):
        self._name = name

    def _module(self):
        import importlib

        try:
            return importlib.import_module(self._name)
        except Exception:  # noqa: BLE001 - as plotly's optional import: absent
            return None

    def __bool__(self) -> bool:
        return self._module() is not None

    def __getattr__(self, attr):
        module = self._module()
        if module is None:
            raise AttributeError(attr)
        return getattr(module, attr)


def _plotly_without_nbformat():
    """``plotly.graph_objects`` with its FigureWidget, nbformat left unimported.

    plotly.io._renderers imports nbformat when it is imported, only to check its version
    when plotly renders a figure as a MIME bundle.  nbformat imports jsonschema, which
    (with rfc3987-syntax, installed beside JupyterLab) compiles a grammar on import: 1.5
    to 5 s of a new kernel's first explorer, for nothing a FigureWidget uses.  While that
    module is imported, plotly's optional-import helper is told nbformat is absent; the
    module's ``nbformat`` then becomes a stand-in that imports it on first use, so
    plotly's own rendering works as before.  Any surprise: the plain import."""
    import importlib.util
    import sys

    if "nbformat" not in sys.modules and "plotly.io._renderers" not in sys.modules:
        try:
            from _plotly_utils import optional_imports

            absent = optional_imports._not_importable
            if importlib.util.find_spec("nbformat") is not None and "nbformat" not in absent:
                absent.add("nbformat")
                try:
                    import plotly.io._renderers as renderers
                finally:
                    absent.discard("nbformat")
                if getattr(renderers, "nbformat", 0) is None:
                    renderers.nbformat = _ImportedOnUse("nbformat")
        except Exception:  # noqa: BLE001 - another plotly: its import as it is
            pass
    import plotly.graph_objects as go

    go.FigureWidget  # noqa: B018 - the lazy attribute imports the widget machinery
    return go


def _flatten(d: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}: plotly's restyle/relayout paths (lists stay whole)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


_MISSING = object()


def _current(props: dict, path: str):
    """The value at a dotted ``path`` of a figure's raw props, or ``_MISSING``."""
    for part in path.split("."):
        if not isinstance(props, dict) or part not in props:
            return _MISSING
        props = props[part]
    return props


def _same(a, b) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - e.g. arrays: compare as different, send
        return False


def send_update(fig, traces: list[dict], layout: dict) -> None:
    """Update ``fig``'s traces (one props dict each, same count) and layout in one
    message, with only the properties whose value differs from the figure's (plotly's
    Python side follows the browser's own changes): most of a chart's layout and style
    is the same at every update, and plotly checks each path it is given (~20 ms a
    chart).  ``plotly_update`` skips the per-value validation that ``trace.update``
    does (~50 ms for a 600-node icicle); our props are validated by the unit tests."""
    restyle: dict[str, list] = {}
    changed: set[str] = set()
    for i, props in enumerate(traces):
        now = fig._data[i] if i < len(fig._data) else {}
        for k, v in _flatten(props).items():
            restyle.setdefault(k, [None] * len(traces))[i] = v
            if v is None or not _same(_current(now, k), v):
                changed.add(k)
    restyle = {k: v for k, v in restyle.items() if k in changed}
    relayout = {k: v for k, v in _flatten(layout).items()
                if v is None or not _same(_current(fig._layout_obj._props, k), v)}
    if restyle or relayout:
        fig.plotly_update(restyle_data=restyle, relayout_data=relayout, trace_indexes=list(range(len(traces))))


def remember_state(fig, data: bool = True) -> None:
    """Make the figure's stored state its current data and layout, without sending them.

    plotly changes a drawn figure with one-off messages and keeps its creation-time
    data in the ``_widget_data``/``_widget_layout`` state; a page reloaded with the
    kernel alive draws from that state, so it showed the first view (contradicting the
    controls) and the next message addressed traces it did not have ("indices must be
    valid indices for gd.data").  The browser already has the data: the state is
    written quietly (``FigureWidget._should_send_property``), for the next view to be
    restored to read.  ``data=False``: only the layout changed (a time range on the
    timeline, whose traces are the larger part: a 1 M-sample profile's took ~50 ms to copy)."""
    from copy import deepcopy

    fig._ddprof_quiet = True
    try:
        if data:
            fig._widget_data = deepcopy(fig._data)
        fig._widget_layout = deepcopy(fig._layout_obj._props)
    finally:
        fig._ddprof_quiet = False


_TEMPLATES: dict = {}


def _template(trace_types: tuple[str, ...]) -> dict:
    """The default plotly template cut to what our figures use (layout basics and our
    trace types), cached per default template: plotly would validate and deep-copy the
    whole template (~10 ms) for every figure, and send it all to the browser."""
    import plotly.io as pio

    default = pio.templates.default
    key = (default if isinstance(default, str) else id(default), trace_types)
    hit = _TEMPLATES.get(key)
    if hit is None:
        if default is None:
            hit = {}
        else:
            full = (pio.templates[default] if isinstance(default, str) else default).to_plotly_json()
            lay = full.get("layout", {})
            data = full.get("data", {})
            hit = {
                "layout": {k: lay[k] for k in _TEMPLATE_LAYOUT if k in lay},
                "data": {t: data[t] for t in trace_types if t in data},
            }
        _TEMPLATES[key] = hit
    return hit


_TEMPLATE_LAYOUT = ("autotypenumbers", "colorway", "font", "hovermode", "hoverlabel", "paper_bgcolor",
                    "plot_bgcolor", "xaxis", "yaxis", "title", "legend", "margin")

def figure_widget(traces, layout: dict, trace_type: str):
    """A FigureWidget of ``traces`` (props dicts: unvalidated, see ``_send_update``)."""
    if isinstance(traces, dict):
        traces = [traces]
    data = [dict(t, type=trace_type) for t in traces]
    layout = dict(layout, template=_template((trace_type,)))
    fig = figure_widget_class()(data=data, layout=layout, _validate=False)
    fig._config = dict(fig._config, responsive=True)  # resize with the window (and see render())
    # Only the bulk data skips validation.  With validation off, plotly's object API
    # (``fig.layout.autosize = True``, ``xaxis.update(range=...)``) would change the
    # Python copy and send nothing to the browser: turn it back on for those edits.
    fig._validate = True
    fig._layout_obj._validate = True
    for tr in fig.data:
        tr._validate = True
    return fig
