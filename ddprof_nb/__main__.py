"""The command line: ``python -m ddprof_nb record | dump | convert | report``.

``record`` runs a script (or ``-m module``) exactly as ``python script.py`` would — its
folder first on ``sys.path``, ``__name__ == "__main__"``, its own ``sys.argv``, its exit
code (``SystemExit`` codes included) — under the sampler, then writes the profile.  An
exception in the script prints its traceback and exits 1; the profile is still written.
``convert IN OUT`` rewrites a profile in another format; ``report IN`` prints the summary
line and the top tables (``--notes``: every note, warnings first).  ``dump PID`` prints the
Python stack of every thread of another CPython process; ``record --pid PID`` samples one
from outside (ddprof_nb.remote: any CPython 3.11-3.15, with the target's own layout); an
option of the in-process sampler given with ``--pid`` is refused, by name.  ``record`` ends with at most three short lines
on stderr: the summary, the first warning (when there is one), the paths written.  Our own
errors (bad options, unreadable files, unreadable processes) print one
line on stderr and exit 2.  The magics never import this module.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import threading
import time
import traceback
from pathlib import Path

from . import pipeline
from .config import (DEFAULT_ALLOC_RATE, DEFAULT_EVENTS, DEFAULT_INTERVAL_NS, DEFAULT_NATIVE_THREADS,
                     NATIVE_THREADS_MODES, SamplerConfig)
from .errors import ProfilerError
from .events import EventType
from .exporters import save
from .loading import load
from .remote import RemoteError, Target, format_dump
from .remote_record import record
from .render.notes import sorted_notes
from .render.text import notes_text, status_line, top_table
from .sampler import Sampler

__all__ = ["main", "subcommands", "PID_OPTIONS"]

PROG = "python -m ddprof_nb"
_OUTPUT_SUFFIXES = (".pprof", ".pb.gz", ".speedscope.json", ".folded", ".html")
_LINE_MAX = 300  # the longest line record prints at its end
# what sampling a process from outside takes (dests); any other record option given with
# --pid is refused, so a new option cannot be silently ignored there
PID_OPTIONS = frozenset({"help", "pid", "duration", "events", "interval", "label", "output", "folded", "html"})


class CLIError(Exception):
    """A user error: printed as one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise CLIError(f"{self.prog}: {message}")


def _parser() -> _Parser:
    p = _Parser(prog=PROG, description="Sampling profiler: record scripts, convert and report profiles.")
    sub = p.add_subparsers(dest="command", metavar="{record,dump,convert,report}", parser_class=_Parser)
    rec = sub.add_parser(
        "record", help="run a script or module under the profiler",
        usage=f"{PROG} record [options] -- script.py [args ...]\n"
              f"       {PROG} record [options] -m module [args ...]\n"
              f"       {PROG} record --pid PID [--duration S] [-e cpu,wall] [-i INTERVAL] [-l KEY=VALUE] "
              "[-o out.pprof] [--folded DIR] [--html FILE]")
    events = ",".join(e.label for e in DEFAULT_EVENTS)  # the defaults, as config.py has them
    interval, alloc_rate = f"{DEFAULT_INTERVAL_NS // 1_000_000}ms", f"{DEFAULT_ALLOC_RATE // 1024}KiB"
    rec.add_argument("-e", "--events", default=events, help=f"event types: cpu,wall,alloc,lock,park (default {events})")
    rec.add_argument("-i", "--interval", default=interval, help=f"sampling interval for cpu and wall (default {interval})")
    rec.add_argument("--alloc-rate", default=alloc_rate, help=f"mean bytes between allocation samples (default {alloc_rate})")
    rec.add_argument("--no-native-alloc", action="store_true",
                     help="alloc/live: Python objects only (no numpy array data or C extensions' malloc)")
    rec.add_argument("--native", action="store_true",
                     help="samples also carry the C/C++/Rust frames between the Python ones (native engine)")
    rec.add_argument("--interpreter-frames", action="store_true",
                     help="with --native: keep the interpreter's eval-loop frames (_PyEval_EvalFrameDefault) "
                          "between the Python frames they run, instead of merging them away")
    rec.add_argument("--native-threads", default=DEFAULT_NATIVE_THREADS, choices=NATIVE_THREADS_MODES,
                     help="CPU and allocations of threads that run no Python (BLAS, OpenMP pools): under the "
                          f"line that asked (attribute), per thread (raw), or left out (off); default {DEFAULT_NATIVE_THREADS}")
    rec.add_argument("--engine", default="auto", help="auto, native or python (default auto)")
    rec.add_argument("--asyncio", default="fold",
                     help="asyncio tasks: fold (default: task stacks, loop frames folded), raw, off")
    rec.add_argument("--max-depth", type=int, default=None, help="frames kept per stack")
    rec.add_argument("--pid", type=int, default=None,
                     help="sample this running CPython process from outside instead (wall with state, and cpu)")
    rec.add_argument("--duration", type=float, default=None, metavar="S",
                     help="with --pid: seconds to sample (default: until Ctrl-C or the process exits)")
    rec.add_argument("--children", action="store_true",  # [children]
                     help="also profile child Python processes (multiprocessing, subprocess); labels pid, process")
    rec.add_argument("-l", "--label", action="append", default=[], metavar="KEY=VALUE",
                     help="label every sample (repeatable)")
    rec.add_argument("-o", "--output", default=None,
                     help="profile file: .pprof/.pb.gz, .speedscope.json, .folded or .html (default <script>.pprof)")
    rec.add_argument("--folded", default=None, metavar="DIR", help="also write <event>.folded files into DIR")
    rec.add_argument("--html", default=None, metavar="FILE", help="also write an HTML report")
    dump = sub.add_parser("dump", help="print the Python stack of every thread of a running CPython process",
                          usage=f"{PROG} dump PID")
    dump.add_argument("pid", type=int, metavar="PID")
    conv = sub.add_parser("convert", help="convert a profile file to another format",
                          usage=f"{PROG} convert IN OUT")
    conv.add_argument("input", metavar="IN")
    conv.add_argument("output", metavar="OUT", help="format from the name (.pprof, .speedscope.json, .folded, .html, or a folder)")
    rep = sub.add_parser("report", help="print the top functions of a profile file",
                         usage=f"{PROG} report IN [--top N] [-e EVENT] [--by function|line] [--notes]")
    rep.add_argument("input", metavar="IN")
    rep.add_argument("--top", type=int, default=20, metavar="N", help="rows per event (default 20)")
    rep.add_argument("-e", "--event", default=None, help="only this event (default: every event)")
    rep.add_argument("--by", choices=("function", "line"), default="function")
    rep.add_argument("--notes", action="store_true",
                     help="print the summary line and every note (warnings first) instead of the tables")
    return p


def subcommands(parser: argparse.ArgumentParser | None = None) -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser, by name (what walks every option: the --pid check, the tests)."""
    parser = parser or _parser()
    return next(dict(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _split_record(argv: list[str]) -> tuple[list[str], str | None, str | None, list[str]]:
    """record's argv -> (its options, script, module, target args).

    Options end at ``--``, at ``-m MODULE`` or at the first word that is not an option;
    everything after the target belongs to the target, dashes included."""
    # the options that take a value, from the parser itself (a list kept by hand missed one)
    takes_value = {s for a in subcommands()["record"]._actions if a.nargs != 0 for s in a.option_strings}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            rest = argv[i + 1:]
            if not rest:
                raise CLIError(f"{PROG} record: no script after --")
            if rest[0] == "-m":
                return argv[:i], None, _module_name(rest[1:]), rest[2:]
            return argv[:i], rest[0], None, rest[1:]
        if a == "-m":
            return argv[:i], None, _module_name(argv[i + 1:]), argv[i + 2:]
        if a.startswith("-m") and len(a) > 2 and not a.startswith("--"):
            return argv[:i], None, a[2:], argv[i + 1:]
        if a.startswith("-") and a != "-":
            if a in takes_value:
                i += 1
            i += 1
            continue
        return argv[:i], a, None, argv[i + 1:]
    return argv, None, None, []


def _module_name(rest: list[str]) -> str:
    if not rest:
        raise CLIError(f"{PROG} record: -m needs a module name")
    return rest[0]


def _check_output(path: str, what: str) -> None:
    p = Path(path)
    if not p.name.lower().endswith(_OUTPUT_SUFFIXES) and not p.is_dir():
        raise CLIError(f"{PROG} record: {what} {path!r}: unknown format; use one of {', '.join(_OUTPUT_SUFFIXES)}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise CLIError(f"{PROG} record: {what} {path!r}: folder {str(parent)!r} does not exist")


def _target_file(script: str | None, module: str | None) -> str | None:
    """The file the target's code is compiled from (its frames are the stacks' root)."""
    if script is not None:
        return os.path.abspath(script)
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(module + ".__main__")
    except (ImportError, ValueError) as exc:
        raise CLIError(f"{PROG} record: cannot find module {module!r}: {exc}") from None
    if spec is None:
        raise CLIError(f"{PROG} record: no module named {module!r}")
    return spec.origin


def _print_traceback(exc: BaseException) -> None:
    """The traceback as Python prints it for a script: our and runpy's frames left out."""
    tb = exc.__traceback__
    ours = os.path.abspath(__file__)
    while tb is not None and (
        tb.tb_frame.f_globals.get("__name__") == "runpy"
        or os.path.abspath(tb.tb_frame.f_code.co_filename) == ours
    ):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): Python prints it and exits 1
    return 1


def _labels(args) -> dict[str, str]:
    labels = {}
    for item in args.label:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise CLIError(f"{PROG} record: invalid label {item!r}: use KEY=VALUE")
        labels[k] = v
    return labels


def _native_mode(args) -> bool | str:
    if args.interpreter_frames and not args.native:
        raise CLIError(f"{PROG} record: --interpreter-frames needs --native")
    return "interpreter" if args.interpreter_frames else args.native


def _record_config(args) -> SamplerConfig:
    labels = _labels(args)
    try:
        config_options = dict(events=args.events, interval=args.interval, alloc_rate=args.alloc_rate,
                              native_alloc=not args.no_native_alloc, engine=args.engine, labels=labels,
                              asyncio=args.asyncio, native=_native_mode(args),
                              native_threads=args.native_threads)
        if args.max_depth is not None:
            config_options["max_depth"] = args.max_depth
        return SamplerConfig.make(**config_options)
    except ValueError as exc:
        raise CLIError(f"{PROG} record: {exc}") from None


def _record_output(args, script: str | None, module: str | None) -> str:
    """The -o file (the default ``<stem>.pprof`` unless only --folded/--html are asked for);
    every output is checked before the target runs."""
    stem = Path(script).stem if script is not None else module.rsplit(".", 1)[-1]
    output = args.output if args.output is not None or args.folded or args.html else f"{stem}.pprof"
    if output:
        _check_output(output, "-o")
    if args.html:
        if not args.html.lower().endswith(".html"):
            raise CLIError(f"{PROG} record: --html {args.html!r}: the name must end in .html")
        _check_output(args.html, "--html")
    if args.folded:
        try:
            Path(args.folded).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CLIError(f"{PROG} record: --folded {args.folded!r}: {exc.strerror or exc}") from None
    return output


def _run_target(script: str | None, module: str | None) -> int:
    """Run the script or module as ``python`` would; its exit code."""
    try:
        if script is not None:
            runpy.run_path(os.path.abspath(script), run_name="__main__")
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        # like the interpreter at exit: wait for the script's non-daemon threads
        me = threading.current_thread()
        for t in threading.enumerate():
            if t is not me and not t.daemon:
                t.join()
    except SystemExit as exc:
        return _exit_code(exc)
    except KeyboardInterrupt as exc:
        _print_traceback(exc)
        return 130
    except BaseException as exc:  # noqa: BLE001 - the script's error: traceback, exit 1
        _print_traceback(exc)
        return 1
    return 0


def _record(options: list[str], script: str | None, module: str | None, target_args: list[str]) -> int:
    args = _parser().parse_args(["record", *options])
    if args.pid is not None:
        if script is not None or module is not None:
            raise CLIError(f"{PROG} record: --pid samples a running process; give it no script or module")
        return _record_pid(args)
    if args.duration is not None:
        raise CLIError(f"{PROG} record: --duration goes with --pid")
    if script is None and module is None:
        raise CLIError(f"{PROG} record: nothing to run; give -- script.py [args] or -m module [args]")
    if script is not None and not os.path.isfile(script):
        raise CLIError(f"{PROG} record: cannot open script {script!r}: no such file")
    config = _record_config(args)
    output = _record_output(args, script, module)
    root_file = _target_file(script, module)

    sampler = Sampler(config, children=args.children)  # [children]
    saved_argv, saved_path0 = list(sys.argv), sys.path[0] if sys.path else None
    sys.argv = [script if script is not None else (root_file or module), *target_args]
    if script is not None:
        # `python script.py` puts the script's folder first on sys.path (not the cwd)
        script_dir = os.path.dirname(os.path.abspath(script))
        if sys.path:
            sys.path[0] = script_dir
        else:
            sys.path.insert(0, script_dir)
    try:
        sampler.start(trim="none")
    except (ProfilerError, ValueError, OSError) as exc:
        raise CLIError(f"{PROG} record: cannot start profiling: {exc}") from None
    started = time.perf_counter()
    try:
        code = _run_target(script, module)
    finally:
        root = os.path.abspath(root_file) if root_file is not None else None
        is_root = (lambda f: f.filename == root or f.filename == root_file) if root is not None else None
        profile = sampler.stop(pipeline.CLI, is_root=is_root)
        elapsed = time.perf_counter() - started
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0
    _write_outputs(profile, output, args, elapsed)
    return code


def _write_outputs(profile, output: str | None, args, wall_s: float | None = None) -> None:
    """Write every output asked for, then at most three short lines: the summary, the
    first warning (and where every note is), the paths written."""
    written = []
    try:
        for path, shown, format in ((output, output, None), (args.folded, f"{args.folded}{os.sep}", None),
                                    (args.html, args.html, "html")):
            if path:
                save(profile, path, format=format)
                written.append(shown)
    except (OSError, ValueError, ImportError) as exc:
        raise CLIError(f"{PROG} record: could not write the profile: {exc}") from None
    lines = [status_line(profile, wall_s=wall_s).replace("ddprof: ", "ddprof_nb: ", 1)]
    warnings = sorted_notes(profile)[0]
    if warnings:
        more = f" (+{len(warnings) - 1} more)" if len(warnings) > 1 else ""
        notes_of = next((w for w in written if not w.endswith((".html", os.sep))), None)
        where = f"; every note: {PROG} report --notes {notes_of}" if notes_of else ""
        lines.append(f"ddprof_nb: warning: {_clip(warnings[0], _LINE_MAX - 30 - len(more) - len(where))}{more}{where}")
    for line in lines:
        print(_clip(line, _LINE_MAX), file=sys.stderr)
    print(f"ddprof_nb: wrote {', '.join(written)}", file=sys.stderr)  # paths are never clipped


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def _refuse_in_process_options(args) -> None:
    """--pid samples from outside: an in-process option given with it is refused, by name."""
    actions = subcommands()["record"]._actions
    given = [a for a in actions if a.dest not in PID_OPTIONS and getattr(args, a.dest) != a.default]
    if given:
        names = ", ".join(a.option_strings[-1] for a in given)
        takes = ", ".join(a.option_strings[-1] for a in actions if a.dest in PID_OPTIONS - {"help", "pid"})
        raise CLIError(f"{PROG} record --pid: {names} {'applies' if len(given) == 1 else 'apply'} to the in-process "
                       f"sampler only (a script, or %%ddprof in the kernel); sampling from outside takes {takes}")


def _record_pid(args) -> int:
    _refuse_in_process_options(args)
    if args.duration is not None and not args.duration > 0:
        raise CLIError(f"{PROG} record: --duration must be a positive number of seconds")
    try:
        config = SamplerConfig.make(interval=args.interval, events=args.events)
    except ValueError as exc:
        raise CLIError(f"{PROG} record: {exc}") from None
    other = [e.label for e in config.events if e not in (EventType.CPU, EventType.WALL)]
    if other:
        raise CLIError(f"{PROG} record --pid: samples cpu and wall only; {', '.join(other)} need the in-process "
                       "sampler (record a script, or %%ddprof in the kernel)")
    labels = _labels(args)
    output = _record_output(args, f"pid{args.pid}", None)
    target = _remote_target(args.pid)
    print(f"ddprof_nb: sampling process {args.pid} (CPython {target.version_text})"
          f"{'' if args.duration is None else f' for {args.duration:g} s'}; Ctrl-C stops", file=sys.stderr)
    try:
        with target:
            profile = record(target, args.duration, config.interval_ns, events=config.events, labels=labels)
    except RemoteError as exc:
        raise CLIError(f"{PROG} record: {exc}") from None
    _write_outputs(profile, output, args)
    return 0


def _load(path: str):
    try:
        return load(path)
    except OSError as exc:
        raise CLIError(f"{PROG}: cannot read {path!r}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CLIError(f"{PROG}: {exc}") from None


def _convert(args) -> int:
    profile = _load(args.input)
    try:
        save(profile, args.output)
    except (OSError, ValueError) as exc:
        raise CLIError(f"{PROG} convert: cannot write {args.output!r}: {getattr(exc, 'strerror', None) or exc}") from None
    print(f"ddprof_nb: wrote {args.output}", file=sys.stderr)
    return 0


def _report(args) -> int:
    if args.top < 1:
        raise CLIError(f"{PROG} report: --top must be at least 1")
    profile = _load(args.input)
    if args.notes:
        print(status_line(profile, Path(args.input).name))
        print(notes_text(profile))
        return 0
    try:
        events = [args.event] if args.event else list(profile.events)
        tables = [top_table(profile, e, n=args.top, by=args.by) for e in events]
    except ValueError as exc:
        raise CLIError(f"{PROG} report: {exc}") from None
    print(status_line(profile, Path(args.input).name))
    print()
    print("\n\n".join(tables) if tables else "(no samples)")
    warnings, others = sorted_notes(profile)
    if warnings or others:
        print(f"\n{len(warnings)} warning(s), {len(others)} note(s): {PROG} report --notes {args.input}")
    return 0


def _remote_target(pid: int):
    """Open ``pid`` for reading, or a one-line error naming why it cannot be read."""
    try:
        return Target(pid)
    except RemoteError as exc:
        raise CLIError(f"{PROG}: {exc}") from None


def _dump(args) -> int:

    target = _remote_target(args.pid)
    try:
        with target:
            text = format_dump(target, target.dump())
    except RemoteError as exc:
        raise CLIError(f"{PROG} dump: {exc}") from None
    sys.stdout.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "record":
            if any(a in ("-h", "--help") for a in _split_record(argv[1:])[0]):
                _parser().parse_args(["record", "-h"])
            options, script, module, target_args = _split_record(argv[1:])
            return _record(options, script, module, target_args)
        args = _parser().parse_args(argv)
        if args.command == "dump":
            return _dump(args)
        if args.command == "convert":
            return _convert(args)
        if args.command == "report":
            return _report(args)
        _parser().print_help(sys.stderr)
        return 2
    except CLIError as exc:
        print(exc, file=sys.stderr)
        return 2
    except BrokenPipeError:  # `report ... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
