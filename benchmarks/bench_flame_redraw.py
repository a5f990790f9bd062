"""Chromium's share of an explorer interaction: plotly redrawing the flame chart.

    python benchmarks/bench_flame_redraw.py [--samples 1000000] [--stacks 50000] [--pairs 15]

Needs the ``browser`` extra (Playwright) and ``/usr/bin/chromium``.

In a blank headless-Chromium page (no JupyterLab, no kernel: nothing else on its main
thread) it evaluates the plotly bundle the explorer's figures use (``figure_widget``,
with ``icicle_patch``'s changes), draws the flame chart of bench_explorer.py's synthetic
profile and times ``Plotly.update`` (what plotly's widget runs for the explorer's
one-message updates) from one view to another and back, until the second animation frame
after it (the chart painted).  Views: the default CPU flame, a focus regex, a dropped
function (a transform), a time range, the wall event.  Each transition runs ``--pairs``
times there and back with the explorer's node budget at the default min %
(``pipeline.DRAW_NODES``), alternating with the same transition at ``render``'s cap
(``DEFAULT_MAX_NODES``, what the explorer draws below the default min %): the ratio of
the two is measured in one page, so the machine's load cancels out.  Prints a table of
medians (ms) and the boxes drawn.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
WIDTH = 1370  # the explorer's flame in a 1400 px JupyterLab notebook

_PAGE_JS = """async ({bundle, width, first}) => {
  const url = URL.createObjectURL(new Blob([bundle], {type: "text/javascript"}));
  await import(url);
  const gd = document.createElement("div");
  gd.style.width = width + "px";
  document.body.appendChild(gd);
  window._gd = gd;
  await window.Plotly.newPlot(gd, first.data, first.layout, {responsive: true});
  return typeof window.Plotly.update;
}"""

_UPDATE_JS = """async ({style, layout}) => {
  const frame = () => new Promise((r) => requestAnimationFrame(() => r()));
  const t0 = performance.now();
  await window.Plotly.update(window._gd, style, layout, [0]);
  await frame(); await frame();
  return performance.now() - t0;
}"""


def _views(samples: int, stacks: int) -> dict:
    """name -> (profile view, event): views of one stacks table, as the explorer makes them."""
    sys.path.insert(0, str(HERE))
    from bench_explorer import synthetic_profile

    from ddprof_nb.model import selection, calltree

    p = synthetic_profile(samples, stacks)
    span = p.metadata.end_ns - p.metadata.start_ns
    return {
        "CPU (default)": (p, "cpu"),
        "focus regex": (selection.filter(p, focus="func_1[0-9]$"), "cpu"),
        "drop function": (calltree.drop_function(p, "^func_1[0-9]$"), "cpu"),
        "time range": (selection.filter(p, time_range=(span // 3, span // 2)), "cpu"),
        "wall event": (p, "wall"),
    }


def _update(view, event, budget: int) -> tuple[dict, dict, int]:
    """plotly_update's (style, layout) for the flame of ``view`` and its node count."""
    from ddprof_nb import render as F
    from ddprof_nb.explorer.figure_widget import _flatten

    fd = F.flame_data(F.call_tree(view, event), max_nodes=budget)
    props = F.flame_trace_props(fd)
    style = {k: [v] for k, v in _flatten(props).items()}
    return style, _flatten(F.flame_layout(fd)), len(fd.ids)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--stacks", type=int, default=50_000)
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--chromium", default=CHROMIUM)
    args = ap.parse_args(argv)
    if not os.path.exists(args.chromium):
        raise SystemExit(f"{args.chromium} is missing (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    from ddprof_nb import render as F
    from ddprof_nb.explorer.figure_widget import _classes, figure_widget_class
    from ddprof_nb.explorer.view_state import DRAW_NODES

    figure_widget_class()
    bundle = _classes["bundle"].decode("utf-8")
    views = _views(args.samples, args.stacks)
    base_view, base_event = views.pop("CPU (default)")
    budgets = (DRAW_NODES, F.DEFAULT_MAX_NODES)
    updates = {(name, b): _update(v, e, b) for name, (v, e) in views.items() for b in budgets}
    base = {b: _update(base_view, base_event, b) for b in budgets}
    fd0 = F.flame_data(F.call_tree(base_view, base_event), max_nodes=DRAW_NODES)
    first = {"data": [dict(F.flame_trace_props(fd0), type="icicle")], "layout": F.flame_layout(fd0)}

    rows = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, args=ARGS, headless=True)
        page = browser.new_page(viewport={"width": WIDTH + 30, "height": 1100})
        page.set_content("<!doctype html><html><body style='margin:0'></body></html>")
        page.evaluate(_PAGE_JS, {"bundle": bundle, "width": WIDTH, "first": json.loads(json.dumps(first))})

        def timed(style, layout) -> float:
            return page.evaluate(_UPDATE_JS, {"style": style, "layout": layout})

        for _ in range(2):  # warm-up: compile plotly's drawing code
            for (name, b), (style, layout, _n) in updates.items():
                timed(style, layout)
                timed(*base[b][:2])
        small, large = budgets
        for name in views:
            runs: dict[int, list[tuple[float, float]]] = {small: [], large: []}
            for i in range(args.pairs):
                for b in (budgets if i % 2 == 0 else budgets[::-1]):
                    style, layout, _n = updates[(name, b)]
                    there = timed(style, layout)
                    back = timed(*base[b][:2])
                    runs[b].append((there, back))
            med = {b: (statistics.median(r[0] for r in runs[b]), statistics.median(r[1] for r in runs[b]))
                   for b in runs}
            ratio = statistics.median(x[0] / y[0] for x, y in zip(runs[small], runs[large]))
            rows.append((name, [(updates[(name, b)][2], base[b][2]) for b in budgets], *med[small], *med[large], ratio))
        browser.close()

    print(f"\n{args.samples:,} samples, {args.stacks:,} stacks; {args.pairs} pairs per transition; Chromium "
          f"{args.chromium}, flame {WIDTH} px wide; load average {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)\n")
    small, large = budgets
    print(f"| transition | boxes there / back at {small} | there | back | boxes at {large} | there | back "
          f"| {small} / {large} (there) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, counts, a, b, c, d, ratio in rows:
        (n1, m1), (n2, m2) = counts
        print(f"| CPU flame -> {name} | {n1} / {m1} | {a:.0f} | {b:.0f} | {n2} / {m2} | {c:.0f} | {d:.0f} | {ratio:.2f} |")
    print("\nms: Plotly.update to the second animation frame after it (the chart painted), median of the pairs;"
          f"\nbudgets: {small} boxes (the explorer at the default min %), {large} (below it); the last column is"
          "\nthe median of the paired ratios.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
