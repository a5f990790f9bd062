"""The top table as a widget: an HTML table whose header sorts and whose rows select.

A tiny anywidget: Python sends the columns and the rows' cells (already sorted and
formatted); a click on a sortable header sets ``sort``, a click on a row sets
``selected`` (its index), and Python answers by sending new rows.  The table never
cuts a name: the cells do not wrap and the table scrolls sideways.
"""

from __future__ import annotations

import anywidget
import traitlets

__all__ = ["TopTable"]

_ESM = """
function render({ model, el }) {
  const wrap = document.createElement("div");
  wrap.className = "ddprof-top-wrap";
  el.appendChild(wrap);
  function draw() {
    const cols = model.get("columns"), rows = model.get("rows"), sort = model.get("sort");
    const sel = model.get("selected"), titles = model.get("titles");
    const table = document.createElement("table");
    table.className = "ddprof-top";
    const head = table.createTHead().insertRow();
    cols.forEach((c) => {
      const th = document.createElement("th");
      th.textContent = c.label + (c.key && c.key === sort ? (c.key === "name" ? " \\u25B2" : " \\u25BC") : "");
      th.className = (c.numeric ? "num" : "txt") + (c.key ? " sortable" : "");
      if (c.key) {
        th.title = "sort by " + c.label;
        th.onclick = () => { model.set("sort", c.key); model.save_changes(); };
      }
      head.appendChild(th);
    });
    const body = table.createTBody();
    rows.forEach((cells, i) => {
      const tr = body.insertRow();
      if (i === sel) tr.className = "selected";
      tr.title = titles[i] || "";
      cells.forEach((text, j) => {
        const td = tr.insertCell();
        td.textContent = text;
        td.className = cols[j] && cols[j].numeric ? "num" : "txt";
      });
      tr.onclick = () => { model.set("selected", i); model.save_changes(); };
    });
    if (!rows.length) {
      const td = body.insertRow().insertCell();
      td.colSpan = cols.length;
      td.textContent = "(no samples)";
    }
    wrap.replaceChildren(table);
  }
  // one message from Python changes up to five of these: build the table once, after all
  // of them (each build replaced every row, and laid the table out again)
  let pending = false;
  const later = () => {
    if (pending) return;
    pending = true;
    queueMicrotask(() => { pending = false; draw(); });
  };
  for (const name of ["columns", "rows", "sort", "selected", "titles"]) model.on("change:" + name, later);
  draw();
}
export default { render };
"""

_CSS = """
.ddprof-top-wrap { overflow: auto; max-height: 420px; }
.ddprof-top { border-collapse: collapse; font: 12px var(--jp-code-font-family, monospace); }
.ddprof-top th, .ddprof-top td { padding: 1px 8px; white-space: nowrap; }
.ddprof-top th { position: sticky; top: 0; background: var(--jp-layout-color1, #fff); text-align: left;
  border-bottom: 1px solid var(--jp-border-color1, #ccc); }
.ddprof-top th.sortable { cursor: pointer; text-decoration: underline dotted; }
.ddprof-top .num { text-align: right; font-variant-numeric: tabular-nums; }
.ddprof-top tbody tr { cursor: pointer; }
.ddprof-top tbody tr:hover { background: var(--jp-layout-color2, #eee); }
.ddprof-top tbody tr.selected { background: var(--jp-brand-color3, #cde); }
"""


class TopTable(anywidget.AnyWidget):
    """``columns``: [{key, label, numeric}] (``key`` "" for an unsortable column);
    ``rows``: each row's cells as text; ``titles``: a tooltip per row; ``sort``: the
    key the rows are sorted by; ``selected``: the clicked row (-1: none)."""

    _esm = _ESM
    _css = _CSS
    columns = traitlets.List(traitlets.Dict()).tag(sync=True)
    rows = traitlets.List(traitlets.List(traitlets.Unicode())).tag(sync=True)
    titles = traitlets.List(traitlets.Unicode()).tag(sync=True)
    sort = traitlets.Unicode("self").tag(sync=True)
    selected = traitlets.Int(-1).tag(sync=True)
