"""Run a demo notebook headless: ``python -m ddprof_nb.demo NOTEBOOK --out DIR``.

Executes every cell with nbclient in a ``python3`` kernel (started from this
interpreter), the way JupyterLab would, with the notebook's folder as the working
directory.  Into ``DIR`` it writes:

* ``<name>.ipynb`` — the executed notebook, outputs and widget state included (also when
  a cell fails, so the traceback can be read there);
* ``<name>.report.html`` — the self-contained HTML report of the last profile the
  notebook took (``ddprof_nb.history.latest``), which opens offline in any browser;

and prints the top functions of that profile.  Exit status: 0 on success, 1 when a cell
raised (the message names the cell and the error) or no profile was taken, 2 when the
notebook cannot be read or the kernel cannot start.

This is what ``bash scripts/demo.sh --headless`` runs, and how the notebook tests
execute the demos.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from .render.format import format_value

__all__ = ["main", "run_notebook", "DemoError", "CellFailed", "RunResult"]

KERNEL = "python3"
DEFAULT_TIMEOUT_S = 600  # per cell
_MARK = "__ddprof_nb_demo_result__"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# Runs in the notebook's kernel after its last cell; never stored in the notebook.
_EPILOGUE = """\
def __ddprof_nb_demo_epilogue(report_path, n):
    import json
    from ddprof_nb import save
    from ddprof_nb.history import history
    out = {"name": history.latest_name, "report": None, "events": [], "top": [], "summary": None}
    profile = history.latest
    if profile is not None:
        save(profile, report_path, format="html")
        out["report"] = report_path
        out["summary"] = repr(profile)
        out["events"] = [e.label for e in profile.events]
        if profile.events:
            event = "cpu" if "cpu" in out["events"] else out["events"][0]
            out["event"] = event
            out["unit"] = "bytes" if event in ("alloc", "live") else "ns"
            out["top"] = [[r.name, r.filename, r.line, r.self, r.total] for r in profile.top(event, n=n)]
            out["total"] = profile.total(event)
    print(%(mark)r + json.dumps(out))
__ddprof_nb_demo_epilogue(%(report)r, %(n)d)
del __ddprof_nb_demo_epilogue
"""


class DemoError(Exception):
    """The notebook could not be run (unreadable, no kernel); the message says why."""


class CellFailed(DemoError):
    """A cell raised; ``index`` is its position among all cells (0-based)."""

    def __init__(self, message: str, index: int, ename: str, evalue: str):
        super().__init__(message)
        self.index, self.ename, self.evalue = index, ename, evalue


class RunResult:
    """What ``run_notebook`` produced: paths, per-cell seconds, the last profile's top table."""

    def __init__(self, notebook, executed_path: Path, report_path: Path | None, cell_seconds: list[float],
                 profile_name: str | None, top: list, event: str | None, unit: str | None, summary: str | None,
                 total: int = 0):
        self.notebook = notebook
        self.executed_path = executed_path
        self.report_path = report_path
        self.cell_seconds = cell_seconds
        self.profile_name = profile_name
        self.top = top
        self.event = event
        self.unit = unit
        self.summary = summary
        self.total = total


def _first_line(source: str) -> str:
    for line in source.splitlines():
        if line.strip():
            return line.strip()[:72]
    return "(empty)"


def _fmt(value: float, unit: str | None) -> str:
    return format_value(value, "bytes" if unit == "bytes" else "nanoseconds")


def top_text(result: RunResult) -> str:
    """The last profile's top functions as a small table."""
    if not result.top:
        return "(the last profile has no samples)"
    total = result.total or max(row[4] for row in result.top) or 1
    lines = [f"top functions by {result.event} (self, total, total as % of the profile):"]
    for name, filename, line, self_v, total_v in result.top:
        where = filename if filename.startswith("Cell In[") else Path(filename).name
        where = f"{where}:{line}" if where and line else where
        lines.append(f"  {_fmt(self_v, result.unit):>9} {_fmt(total_v, result.unit):>9} {100 * total_v / total:5.1f}%  "
                     f"{name}  ({where})")
    return "\n".join(lines)


def run_notebook(path, out_dir, *, timeout: int = DEFAULT_TIMEOUT_S, top_n: int = 10,
                 progress=None, kernel_name: str = KERNEL) -> RunResult:
    """Execute the notebook at ``path``; write the executed copy and the report into ``out_dir``.

    ``progress(index, total, first_line, seconds)`` is called after each code cell.
    Raises ``CellFailed`` (after writing the executed notebook) when a cell raises, and
    ``DemoError`` when the notebook cannot be read or the kernel cannot start.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = Path(path)
    out_dir = Path(out_dir)
    nb = _read_notebook(path)
    out_dir.mkdir(parents=True, exist_ok=True)
    executed_path = out_dir / path.name
    report_path = (out_dir / f"{path.stem}.report.html").resolve()
    client = NotebookClient(nb, kernel_name=kernel_name, timeout=timeout, store_widget_state=True,
                            resources={"metadata": {"path": str(path.resolve().parent)}})
    cell_seconds: list[float] = []
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    result_msg = None

    def save():
        client.set_widgets_metadata()
        nbformat.write(nb, executed_path)

    try:
        with client.setup_kernel():
            info = client.wait_for_reply(client.kc.kernel_info())
            if info is not None and "language_info" in info["content"]:
                nb.metadata["language_info"] = info["content"]["language_info"]
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                start = time.perf_counter()
                try:
                    client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
                except CellExecutionError as exc:
                    save()
                    raise _cell_failed(exc, path, cell, index, code_cells, executed_path) from None
                cell_seconds.append(time.perf_counter() - start)
                if progress is not None:
                    progress(code_cells.index(index) + 1, len(code_cells), _first_line(cell.source),
                             cell_seconds[-1])
            # the epilogue runs in the same kernel but is not part of the notebook (nbclient
            # stores each executed cell back at its index, so it sits at the end meanwhile)
            epilogue = nbformat.v4.new_code_cell(_EPILOGUE % {"mark": _MARK, "report": str(report_path), "n": top_n})
            nb.cells.append(epilogue)
            try:
                client.execute_cell(epilogue, len(nb.cells) - 1, store_history=False)
            except CellExecutionError as exc:
                nb.cells.pop()
                save()
                raise DemoError(f"{path.name}: writing the report of the last profile failed: "
                                f"{exc.ename}: {_ANSI.sub('', exc.evalue)}") from None
            nb.cells.pop()
            result_msg = _result_message(epilogue.outputs)
    except DemoError:
        raise
    except Exception as exc:  # noqa: BLE001 - kernel start/death: one clear line
        raise DemoError(f"{path.name}: could not run the notebook in a {kernel_name!r} kernel: "
                        f"{type(exc).__name__}: {exc}") from None
    save()
    if result_msg is None:
        raise DemoError(f"{path.name}: the report step printed nothing")
    return RunResult(nb, executed_path, Path(result_msg["report"]) if result_msg["report"] else None,
                     cell_seconds, result_msg["name"], result_msg["top"], result_msg.get("event"),
                     result_msg.get("unit"), result_msg.get("summary"), result_msg.get("total", 0))


def _read_notebook(path: Path):
    import nbformat

    try:
        return nbformat.read(path, as_version=4)
    except FileNotFoundError:
        raise DemoError(f"{path}: no such notebook") from None
    except Exception as exc:  # noqa: BLE001 - nbformat raises many types for bad files
        raise DemoError(f"{path}: not a readable notebook ({type(exc).__name__}: {exc})") from None


def _cell_failed(exc, path: Path, cell, index: int, code_cells: list[int], executed_path: Path) -> CellFailed:
    """The one-paragraph account of a cell that raised: which cell, what it raised, where the
    full traceback is, and the traceback's last lines."""
    n = code_cells.index(index) + 1
    trace = _ANSI.sub("", "\n".join(exc.traceback.splitlines()[-6:])) if exc.traceback else ""
    return CellFailed(
        f"{path.name}: code cell {n} of {len(code_cells)} (In[{cell.get('execution_count')}]) "
        f"raised {exc.ename}: {_ANSI.sub('', exc.evalue)}\n"
        f"  cell starts: {_first_line(cell.source)}\n"
        f"  the executed notebook with the full traceback: {executed_path}\n{trace}",
        index, exc.ename, exc.evalue)


def _result_message(outputs) -> dict | None:
    """The epilogue's result: the JSON after the marker on its printed output (None: none)."""
    result_msg = None
    for output in outputs:
        text = output.get("text", "") if output.get("output_type") == "stream" else ""
        for line in text.splitlines():
            if line.startswith(_MARK):
                result_msg = json.loads(line[len(_MARK):])
    return result_msg


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ddprof_nb.demo",
        description="Run a demo notebook headless; write the executed notebook and an HTML report "
                    "of its last profile into --out, and print the top functions.")
    ap.add_argument("notebook", help="the .ipynb to run, e.g. notebooks/01-quickstart.ipynb")
    ap.add_argument("--out", required=True, metavar="DIR", help="folder for the executed notebook and the report")
    ap.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, help="seconds per cell (default %(default)s)")
    ap.add_argument("-n", "--top", type=int, default=10, help="how many top functions to print (default %(default)s)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no per-cell progress")
    args = ap.parse_args(argv)

    def progress(i, n, first, seconds):
        print(f"  [{i:2d}/{n}] {seconds:6.1f} s  {first}", flush=True)

    print(f"running {args.notebook} (kernel {KERNEL}) ...", flush=True)
    start = time.perf_counter()
    try:
        result = run_notebook(args.notebook, args.out, timeout=args.timeout, top_n=args.top,
                              progress=None if args.quiet else progress)
    except CellFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except DemoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"ran {len(result.cell_seconds)} code cells in {time.perf_counter() - start:.1f} s")
    print(f"executed notebook: {result.executed_path}")
    if result.report_path is None:
        print("error: the notebook took no profile (ddprof_nb.history is empty), so there is no report",
              file=sys.stderr)
        return 1
    print(f"HTML report of the last profile ({result.profile_name!r}): {result.report_path}")
    print(result.summary)
    print(top_text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
