"""How long a new kernel takes to show the explorer after a short ``%%ddprof`` cell.

    python benchmarks/bench_new_kernel.py [--kernels 10] [--cell 0.2] [--pause 1] [--against DIR] [--breakdown]

Each run starts a fresh kernel (nbclient), runs ``%load_ext ddprof_nb``, waits ``--pause``
seconds (a user writing the next cell; the kernel idles), and then runs a cell
that burns ``--cell`` seconds of CPU, either plain (the baseline) or under ``%%ddprof``;
the two alternate, one kernel each.  For a profiled cell the clock runs from the cell's
``execute_request`` to the ``display_data`` carrying the explorer's widget view (every
figure's comm message is on the wire before it); for the baseline, to the cell's reply.
The table gives medians over the kernels: each case's time less the cell's own work,
``%%ddprof``'s added time (profiled minus plain, paired), and the kernel's CPU time.
``--against DIR`` adds a third case in the same rotation: the profiled cell with the
``ddprof_nb`` package of another checkout first on the kernel's ``PYTHONPATH`` (e.g. a
``git archive`` of main with this build's ``_native*.so`` copied in), and the ratio of
the two profiled cases' added times (paired).
What follows in the browser (plotly's bundle evaluated, the chart drawn) is
``bench_explorer_browser.py``'s new-kernel row.

``--breakdown`` also runs the profiled cell under cProfile in one more new kernel and
prints where its time went (imports, the explorer's first view, the figures, sending).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import nbformat
from nbclient import NotebookClient

WORK = ("import time, os\n"
        "def work(seconds):\n"
        "    t0 = time.process_time()\n"
        "    while time.process_time() - t0 < seconds:\n"
        "        sorted(str(i) for i in range(2000))\n")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class TimedClient(NotebookClient):
    """Notes when the watched cell's request goes out and when its widget view arrives."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.sent = self.shown = None
        self.watch = None

    async def async_execute_cell(self, cell, cell_index, *a, **k):
        if cell_index == self.watch:
            self.sent = time.perf_counter()
        out = await super().async_execute_cell(cell, cell_index, *a, **k)
        if cell_index == self.watch and self.shown is None:
            self.shown = time.perf_counter()  # no widget view: the reply (the baseline)
        return out

    def process_message(self, msg, cell, cell_index):
        if (cell_index == self.watch and self.shown is None and msg["msg_type"] == "display_data"
                and WIDGET_VIEW in msg["content"].get("data", {})):
            self.shown = time.perf_counter()
        return super().process_message(msg, cell, cell_index)


def _kernel_cpu_cell() -> str:
    return "print('KCPU', sum(os.times()[:2]))"


def run_once(profiled: bool, cell_s: float, pause_s: float, pythonpath: str | None = None) -> dict:
    body = f"work({cell_s})"
    cells = ["%load_ext ddprof_nb\n" + WORK + f"time.sleep({pause_s})\n" + _kernel_cpu_cell(),
             ("%%ddprof\n" if profiled else "") + body,
             _kernel_cpu_cell()]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = TimedClient(nb, timeout=300, kernel_name="python3", allow_errors=False)
    client.watch = 1
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    client.execute(env=env)
    kcpu = [float(o["text"].split()[1]) for c in (nb.cells[0], nb.cells[2]) for o in c.outputs
            if o.get("name") == "stdout" and o["text"].startswith("KCPU")]
    return {"wall": client.shown - client.sent - cell_s, "cpu": kcpu[1] - kcpu[0] - cell_s, "nb": nb}


def breakdown(cell_s: float) -> None:
    """The profiled cell under cProfile (all of it: the magic's start, the cell, the display)."""
    pre = "import cProfile as _cp\n_pr = _cp.Profile()\n_pr.enable()\n"
    nb_cells = ["%load_ext ddprof_nb\n" + WORK + pre,
                f"%%ddprof\nwork({cell_s})",
                "_pr.disable()\nimport pstats, io\n_s = io.StringIO()\n"
                "pstats.Stats(_pr, stream=_s).sort_stats('cumulative').print_stats(45)\n"
                "print(_s.getvalue())"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in nb_cells])
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    for o in nb.cells[2].outputs:
        if o.get("name") == "stdout":
            print("```\n" + o["text"] + "```")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", type=int, default=10, help="new kernels per case (the cases rotate)")
    ap.add_argument("--cell", type=float, default=0.2, help="CPU seconds the cell burns")
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between %%load_ext and the cell")
    ap.add_argument("--against", metavar="DIR", help="also the profiled cell with DIR's ddprof_nb (a baseline)")
    ap.add_argument("--breakdown", action="store_true", help="also a cProfile of one profiled cell")
    args = ap.parse_args()
    print(f"Python {sys.version.split()[0]} · {os.cpu_count()} CPUs · load {os.getloadavg()[0]:.1f} · "
          f"{args.kernels} new kernels per case, cell of {args.cell} s "
          f"run {args.pause} s after %load_ext\n")
    cases = {"plain": (False, None), "ddprof": (True, None)}
    if args.against:
        cases["against"] = (True, os.path.abspath(args.against))
    runs: dict[str, list[dict]] = {k: [] for k in cases}
    names = list(cases)
    for i in range(args.kernels):
        for name in names[i % len(names):] + names[:i % len(names)]:  # rotate: no case always first
            runs[name].append(run_once(cases[name][0], args.cell, args.pause, cases[name][1]))
        print(f"  round {i + 1}/{args.kernels}: " + ", ".join(f"{k} {v[-1]['wall']:.2f} s" for k, v in runs.items()),
              file=sys.stderr)
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    added = [b["wall"] - a["wall"] for a, b in zip(runs["plain"], runs["ddprof"])]
    rows = [("plain cell (baseline): to its reply", f"{med(runs['plain'], 'wall'):.3f}",
             f"{med(runs['plain'], 'cpu'):.3f}"),
            ("`%%ddprof` cell: to the explorer's widget view", f"{med(runs['ddprof'], 'wall'):.3f}",
             f"{med(runs['ddprof'], 'cpu'):.3f}"),
            ("added by `%%ddprof` (paired with plain)", f"{statistics.median(added):.3f}", ""),
            ("worst `%%ddprof` kernel", f"{max(r['wall'] for r in runs['ddprof']):.3f}", "")]
    if args.against:
        old = runs["against"]
        rows.insert(2, (f"`%%ddprof` cell, {args.against}'s ddprof_nb", f"{med(old, 'wall'):.3f}",
                        f"{med(old, 'cpu'):.3f}"))
        ratio = statistics.median((b["wall"] - a["wall"]) / max(c["wall"] - a["wall"], 1e-3)
                                  for a, b, c in zip(runs["plain"], runs["ddprof"], old))
        rows.append(("added time, this / against (median of paired ratios)", f"{ratio:.2f}", ""))
    print(f"load at the end {os.getloadavg()[0]:.1f}; times less the cell's own {args.cell} s; goal: "
          "the chart <= 2 s after the cell (the page's plotly set-up comes on top: bench_explorer_browser.py)\n")
    print("| case | wall s (median) | kernel CPU s (median) |\n|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    if args.breakdown:
        print()
        breakdown(args.cell)


if __name__ == "__main__":
    main()
