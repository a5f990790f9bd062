"""IPython magics: ``%%ddprof`` (profile a cell) and ``%ddprof`` (start/stop/show/...).

How a ``%%ddprof`` cell runs.  A cell magic normally receives its body as a string and
runs it again through ``shell.run_cell`` (``%%capture``) — which names the body after
the *next* execution count, lets an exception be shown but not fail the cell, and
cannot ``await`` inside a kernel whose event loop is already running.  Instead, like
pyinstrument's magic, we let the cell run as an ordinary cell and wrap its code:

1. an input transformer (``input_transformers_cleanup``, before IPython turns
   ``%%name`` into ``run_cell_magic``) replaces the ``%%ddprof ARGS`` line by a marker
   statement ``get_ipython().run_line_magic('ddprof', '__cell__ ARGS')`` — same line
   count, so the body keeps the cell's own line numbers;
2. an AST transformer turns a module starting with that marker into::

       try:
           get_ipython()._ddprof_cell.begin('ARGS')       # line 1: parse, start sampling
           <the cell's statements>
           get_ipython()._ddprof_cell.keep(<last expression>)
       finally:
           get_ipython()._ddprof_cell.end()               # stop, store, show
       get_ipython()._ddprof_cell.result()                # the last value, shown as Out[N]

So the cell is compiled and run by IPython itself (its namespace, display hook,
``Out``/``_``, top-level ``await``, tracebacks naming ``Cell In[N]``); an exception
propagates after ``end()`` stored and showed the profile, and KeyboardInterrupt keeps
the partial profile.  Sampling starts inside the cell; the stop pipeline (``pipeline.MAGIC``)
then roots the cell thread's stacks at the cell's code and leaves out the profiler's own
frames.  The rewriting itself is in ``cell_rewrite.py``.  A
direct ``shell.run_cell_magic('ddprof', ...)`` call (no transformer involved) re-runs
the text as a cell, which goes through the same path.

Only one profile runs per process (the Sampler enforces it); a second ``%%ddprof`` or
``%ddprof start`` gets a one-line error.  Display: inside a kernel the explorer widget
(its mimebundle carries text/plain and text/html fallbacks); without the explorer, or
outside a kernel, a bundle of a text summary and a static HTML flame graph; in
terminal IPython just the text.

(Over 600 lines: one Magics class with ten subcommands, the option parser they share,
the session they run and how its result is shown; the cell rewriting is apart.)
"""

from __future__ import annotations

import argparse
import ast
import inspect
import os
import re
import shlex
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import MagicArgumentParser
from IPython.utils.process import arg_split

from . import cells, pipeline, transforms
from .render import html as render_html, text as render_text
from .render.format import esc, format_bytes, format_duration
from .config import (ASYNCIO_MODES, DEFAULT_ALLOC_RATE, DEFAULT_EVENTS, DEFAULT_INTERVAL_NS, ENGINES, SamplerConfig,
                     parse_duration_ns)
from .errors import ProfilerBusyError, ProfilerError
from .cell_rewrite import HOOKS_ATTR as _HOOKS_ATTR, MARKER as _MARKER
from .cell_rewrite import CellWrapper as _CellWrapper, cell_transform as _cell_transform
from .explorer.threads import KERNEL_FRAMES
from .history import history
from .live_display import line_sink, widget_sink
from .kernels import ALLOW_ATTACH_HELP, allow_attach, find_kernel, list_kernels, runtime_dir
from .remote import RemoteError, Target, VersionMismatch, dump_text
from .remote_record import record
from .loading import load
from .model import Frame, Profile
from .sampler import Sampler

__all__ = ["DDProfMagics", "load_ipython_extension", "unload_ipython_extension", "display_mode"]

# "auto": widget inside a kernel, text in terminal IPython, static (text + HTML) elsewhere;
# or force one of "widget", "static", "text".
display_mode = "auto"

_OWN_FILES = frozenset({__file__, os.path.realpath(__file__)})
_SUBCOMMANDS = ("start", "stop", "show", "list", "save", "load", "diff", "top", "sandwich", "status", "help",
                "kernels", "dump", "attach", "allow-attach")
_CO_COROUTINE = inspect.CO_COROUTINE

USAGE = """\
%%ddprof [-e EVENTS] [-i INTERVAL] [--alloc-rate SIZE] [--no-native-alloc] [-l KEY=VALUE ...]
         [-o NAME] [--save PATH] [--no-show] [--live] [--engine auto|native|python]
         [--asyncio fold|raw|off] [--children] [--dask CLIENT]     profile this cell
%ddprof [options] STATEMENT     profile one statement
%ddprof start [options]         profile across cells until %ddprof stop (--live: watch it meanwhile)
%ddprof stop                    stop, store and show that profile
%ddprof show [NAME]             show a stored profile (default: the latest)
%ddprof list                    list the stored profiles (ddprof_nb.history)
%ddprof top [N] [NAME] [-e EVENT] [--by function|line]   text table of the top functions
%ddprof sandwich FUNCTION [NAME] [-e EVENT] [-n N]   its callers and callees, over all call sites
%ddprof save NAME PATH          write a profile (.pprof, .pb.gz, .speedscope.json, .folded, .html)
%ddprof load PATH [-o NAME] [-e EVENT] [-i INTERVAL]   read a profile file (ours or another tool's)
%ddprof diff A B                compare two stored profiles
%ddprof status                  is a profile running? what does the history hold?
%ddprof kernels                 this user's running Jupyter kernels: id, PID, busy/idle, notebook
%ddprof dump KERNEL             every thread's Python stack in another kernel (PID or kernel id prefix)
%ddprof attach KERNEL [-d S] [-i INTERVAL] [-o NAME]   sample another kernel from outside, then show it
%ddprof allow-attach [off]      let processes of your user read this kernel (%ddprof allow-attach -h)"""


# ----------------------------------------------------------------------------------
# option parsing


class _Parser(MagicArgumentParser):
    """argparse that raises UsageError: the usage text for unknown options, a one-line
    message naming the option for bad values."""

    def __init__(self, prog: str, **kwargs):
        kwargs.setdefault("formatter_class", argparse.HelpFormatter)
        super().__init__(prog=prog, add_help=False, **kwargs)

    def error(self, message):
        raise UsageError(f"{message}\n{self.format_usage().rstrip()}")

    def parse_argstring(self, argstring, *, partial=False):
        # POSIX quoting, so `--save "my file.pprof"` is a path without quotes (IPython's
        # default keeps them); on Windows backslashes in paths must survive
        try:
            argv = arg_split(argstring, posix=os.name != "nt", strict=True)
        except ValueError as exc:
            raise UsageError(f"{self.prog}: {exc} in {argstring!r}") from None
        return self.parse_known_args(argv) if partial else self.parse_args(argv)


def _sampler_options(p: "_Parser", statement: bool = False) -> None:
    p.add_argument("-e", "--events", action="append", default=None, metavar="EVENTS",
                   help="event types, comma separated: cpu,wall,alloc,lock,park "
                        f"(default {','.join(e.label for e in DEFAULT_EVENTS)})")
    p.add_argument("-i", "--interval", default=None, metavar="INTERVAL",
                   help=f"sampling interval for cpu and wall, e.g. 10ms (default {DEFAULT_INTERVAL_NS // 1_000_000}ms)")
    p.add_argument("--alloc-rate", default=None, metavar="SIZE",
                   help=f"mean bytes between allocation samples, e.g. 512KiB (default {DEFAULT_ALLOC_RATE // 1024}KiB)")
    p.add_argument("--no-native-alloc", action="store_true",
                   help="alloc/live: Python objects only (no numpy array data or C extensions' malloc)")
    p.add_argument("-l", "--label", action="append" if statement else "extend", nargs=None if statement else "+",
                   default=[], metavar="KEY=VALUE", help="label every sample with KEY=VALUE")
    p.add_argument("-o", "--name", default=None, help="name of the profile in ddprof_nb.history")
    p.add_argument("--save", default=None, metavar="PATH", help="also write the profile to PATH")
    p.add_argument("--no-show", action="store_true", help="store the profile without showing it")
    p.add_argument("--all-threads", action="store_true",
                   help="keep the kernel's own idle threads (IOPub, heartbeat, ...) in the profile")
    p.add_argument("--engine", default="auto", metavar="|".join(ENGINES), help=f"sampling engine: {'|'.join(ENGINES)}")
    p.add_argument("--asyncio", default="fold", metavar="|".join(ASYNCIO_MODES),
                   help="asyncio tasks: fold the loop's frames (default), raw: keep them, off: no task sampling")
    # [children/dask] beyond one process
    p.add_argument("--children", action="store_true",
                   help="also profile child Python processes started meanwhile (labels pid, process)")
    p.add_argument("--dask", default=None, metavar="CLIENT",
                   help="also profile every worker of this dask.distributed Client (a name in the namespace)")
    if not statement:
        p.add_argument("--live", action="store_true",
                       help="show the samples so far while it runs (refreshed about once a second), "
                            "then the explorer of the whole profile")
    p.add_argument("-h", "--help", action="store_true", help="show this help")


def _make_parser(prog: str, statement: bool = False) -> _Parser:
    p = _Parser(prog)
    _sampler_options(p, statement)
    return p


_CELL_PARSER = _make_parser("%%ddprof")
_START_PARSER = _make_parser("%ddprof start")
_STMT_PARSER = _make_parser("%ddprof", statement=True)
_ATTACH_PARSER = _Parser("%ddprof attach")
_ATTACH_PARSER.add_argument("kernel", metavar="KERNEL", help="a PID or a kernel id prefix (see %%ddprof kernels)")
_ATTACH_PARSER.add_argument("-d", "--duration", type=float, default=10.0, metavar="S", help="seconds to sample (default 10)")
_ATTACH_PARSER.add_argument("-i", "--interval", default=f"{DEFAULT_INTERVAL_NS // 1_000_000}ms", metavar="INTERVAL",
                            help=f"sampling interval (default {DEFAULT_INTERVAL_NS // 1_000_000}ms)")
_ATTACH_PARSER.add_argument("-o", "--name", default=None, help="name of the profile in ddprof_nb.history (default pidPID)")
_ATTACH_PARSER.add_argument("-h", "--help", action="store_true", help="show this help")


def _labels(items) -> dict[str, str]:
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"invalid label {item!r}: use -l key=value")
        out[key.strip()] = value
    return out


def _config(args) -> SamplerConfig:
    options = {"engine": args.engine, "labels": _labels(args.label), "asyncio": args.asyncio}
    if args.events:
        options["events"] = ",".join(args.events)
    if args.interval is not None:
        options["interval"] = args.interval
    if args.alloc_rate is not None:
        options["alloc_rate"] = args.alloc_rate
    if args.no_native_alloc:
        options["native_alloc"] = False
    try:
        return SamplerConfig.make(**options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _help(parser: _Parser) -> str:
    return parser.format_help().rstrip()


# ----------------------------------------------------------------------------------
# the running profile


@dataclass
class _Session:
    """The profile being taken (one per process)."""

    sampler: object
    kind: str  # "cell" | "line" | "span" (start/stop)
    tid: int
    name: str | None
    save: str | None
    show: bool
    count: int | None  # execution count of the cell that started it
    root_files: frozenset[str] | None = None  # the cell's file (None: any cell)
    frame: object = None  # the cell's frame (a cell's begin/end must match)
    is_async: bool = False
    all_threads: bool = False
    started: float = field(default_factory=time.perf_counter)
    live: object = None  # the live view's sink (live_display), when --live


_session: _Session | None = None
_session_lock = threading.Lock()


def _busy_message(what: str) -> str:
    s = _session
    if s is None:
        return f"{what}: a profile is already running in this process; stop it first"
    where = f" in In[{s.count}]" if s.count is not None else ""
    started = {"cell": "%%ddprof", "line": "%ddprof", "span": "%ddprof start"}[s.kind]
    hint = "; run %ddprof stop first" if s.kind == "span" else ""
    return f"{what}: a profile is already running (started by {started}{where}){hint}"


def _start(shell, args, kind: str, count: int | None, *, root_files=None, frame=None,
           is_async: bool = False, what: str = "%%ddprof") -> _Session:
    """Parse-checked options -> a running session, or UsageError with one line."""
    global _session
    config = _config(args)
    if args.name is not None and not args.name.strip():
        raise UsageError(f"{what}: invalid name {args.name!r} for -o: give a non-empty name")
    live = getattr(args, "live", False)
    if live and args.no_show:
        raise UsageError(f"{what}: --live shows the profile while it runs; it cannot go with --no-show")
    with _session_lock:
        if _session is not None:
            raise UsageError(_busy_message(what))
        sampler = Sampler(config, children=getattr(args, "children", False),  # [children/dask]
                          dask=_dask_client(shell, args, what))
        session = _Session(sampler, kind, threading.get_native_id(), args.name, args.save,
                           not args.no_show, count, root_files, frame, is_async,
                           getattr(args, "all_threads", False))
        if live:
            session.live = _live_sink(shell, session)
        try:
            sampler.start(trim="none", live=session.live)
        except ProfilerBusyError:
            _end_live(session, None, "a profile is already running")
            raise UsageError(_busy_message(what)) from None
        except (ProfilerError, ValueError, OSError) as exc:
            _end_live(session, None, str(exc))
            raise UsageError(f"{what}: cannot start profiling: {exc}") from None
        _session = session
        return _session


def _live_sink(shell, session: _Session):
    """--live: the live view widget in a notebook, else a progress line on a terminal's
    stderr, else None (``live_display``); its snapshots are shaped as the final profile."""
    def shape(profile: Profile) -> Profile:
        return session.sampler.shape_live(profile, pipeline.MAGIC, **_stop_facts(shell, session))

    where = f"In[{session.count}]" if session.count is not None else ""
    sink = widget_sink(shape, f"ddprof live {where}".rstrip()) if _mode(shell) == "widget" else None
    return sink if sink is not None else line_sink()


def _end_live(session: _Session, profile: Profile | None, error: str | None = None) -> None:
    """The live view becomes the explorer of ``profile`` (or says why there is none)."""
    sink, session.live = session.live, None
    if sink is None:
        return
    try:
        sink.finish(profile, error)
    except Exception as exc:  # noqa: BLE001 - the profile is stored; only its live view failed
        print(f"ddprof: the live view could not finish: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    if getattr(sink, "final", None) is not None:
        session.show = False  # the live view became the explorer: not shown twice


def _dask_client(shell, args, what: str):
    """[children/dask] ``--dask NAME``: the Client bound to NAME in the user namespace."""
    name = getattr(args, "dask", None)
    if not name:
        return None
    ns = getattr(shell, "user_ns", None) or {}
    try:
        client = eval(name, ns) if name.replace(".", "").isidentifier() else None  # noqa: S307 - names only
    except Exception:  # noqa: BLE001
        client = None
    if client is None:
        raise UsageError(f"{what}: --dask {name!r}: no such name in the namespace (give the variable holding a Client)")
    if not hasattr(client, "run") or not hasattr(client, "scheduler_info"):
        raise UsageError(f"{what}: --dask {name!r} is a {type(client).__name__}, not a dask.distributed Client")
    return client


def _stop_facts(shell, session: _Session) -> dict:
    """What ``pipeline.MAGIC`` needs to know of the session: its root frames (the cell),
    the frames it drops, where an async cell's waits go, which threads it hides."""
    if session.root_files is not None:
        root_files = session.root_files

        def is_root(f: Frame) -> bool:
            return f.filename in root_files
    else:
        fmap = cells.filename_map(shell)

        def is_root(f: Frame) -> bool:
            return cells.is_cell_file(f.filename, fmap=fmap)

    outside = None
    if session.is_async and session.root_files:
        # an async cell waiting in the event loop has no frame on the thread's stack:
        # its waits are charged to the cell, under an [await] frame
        cell_file = next(iter(session.root_files))
        cell = Frame("<module>", cell_file, 0, 1)
        n = cells.cell_number(cell_file, shell)
        outside = (cells.cell_frame(cell, n) if n is not None else cell, Frame("[await]"))
    return dict(is_root=is_root, drop=lambda f: f.filename in _OWN_FILES, outside=outside,
                rename=shell if shell is not None else True,
                hide=None if session.all_threads else KERNEL_FRAMES, hide_reason="--all-threads keeps them")


def _finish(shell, session: _Session) -> tuple[str, Profile]:
    """Stop ``session``; root and name its stacks; store it in the history; a live view
    becomes the explorer of the result."""
    global _session
    with _session_lock:
        if _session is session:
            _session = None
    elapsed = time.perf_counter() - session.started
    try:
        profile = session.sampler.stop(pipeline.MAGIC, **_stop_facts(shell, session))
    except BaseException as exc:
        _end_live(session, None, f"{type(exc).__name__}: {exc}")
        raise
    name = session.name
    if name is None:
        if session.kind == "span":
            end = _current_count(shell)
            name = f"{session.count}-{end}" if session.count is not None and end is not None else None
        else:
            name = str(session.count) if session.count is not None else None
    extra = dict(profile.metadata.extra)
    if session.count is not None:
        extra.setdefault("cell", f"In[{session.count}]")
    profile = profile.with_metadata(extra=extra)
    name = history.add(profile, name)
    print(render_text.status_line(profile, name, wall_s=elapsed))
    if session.save:
        _save(profile, session.save)
    _end_live(session, profile)
    return name, profile


def _save(profile: Profile, path: str) -> bool:
    try:
        profile.save(os.path.expanduser(path))
    except Exception as exc:  # noqa: BLE001 - one clear line, never a traceback from us
        print(f"ddprof: could not save to {path}: {exc}", file=sys.stderr)
        return False
    print(f"ddprof: saved to {path}")
    return True


def _current_count(shell) -> int | None:
    """Execution count of the cell running now (IPython increments before running)."""
    if shell is None:
        return None
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    n = getattr(result, "execution_count", None)
    if isinstance(n, int):
        return n
    n = getattr(shell, "execution_count", None)
    return n - 1 if isinstance(n, int) and n > 0 else None


# ----------------------------------------------------------------------------------
# showing profiles


def _mode(shell) -> str:
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


def _explorer(profile: Profile, other: Profile | None = None):
    """The explorer widget, or None when it is missing or fails (we fall back)."""
    try:
        from .explorer.widget import Explorer
    except Exception:  # noqa: BLE001 - explorer not installed or broken: static fallback
        return None
    try:
        return Explorer(profile, other) if other is not None else Explorer(profile)
    except Exception as exc:  # noqa: BLE001
        print(f"ddprof: the explorer failed ({type(exc).__name__}: {exc}); showing a static view",
              file=sys.stderr)
        return None


def show(profile: Profile, name: str | None = None, other: Profile | None = None, shell=None) -> None:
    """Display ``profile`` (or the diff ``profile`` -> ``other``) the best way the
    frontend allows (see the module docstring)."""
    from IPython.display import display

    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    mode = _mode(shell)
    if mode == "text":
        # the status line was printed already; a terminal gets the tables
        if other is None:
            print("\n\n".join(render_text.top_table(profile, e, n=10) for e in profile.events) or "(no samples)")
        else:
            print(fallback_bundle(profile, name, other, html=False)["text/plain"])
        return
    if mode == "widget":
        widget = _explorer(profile, other)
        if widget is not None:
            display(widget)
            return
    display(fallback_bundle(profile, name, other), raw=True)


# ----------------------------------------------------------------------------------
# the cell hooks the rewritten cell calls


class _CellHooks:
    """``get_ipython()._ddprof_cell``: what a rewritten ``%%ddprof`` cell calls."""

    def __init__(self, shell):
        self.shell = shell
        self._value = None

    def begin(self, args: str) -> None:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame in tracebacks
        frame = sys._getframe(1)
        if "$" in args or "{" in args:
            args = self.shell.var_expand(args, 1)
        parsed = _CELL_PARSER.parse_argstring(args)
        if parsed.help:
            raise UsageError(_help(_CELL_PARSER))
        count = cells.cell_number(frame.f_code.co_filename, self.shell)
        if count is None:
            count = _current_count(self.shell)
        _start(self.shell, parsed, "cell", count, root_files=frozenset({frame.f_code.co_filename}),
               frame=frame, is_async=bool(frame.f_code.co_flags & _CO_COROUTINE))

    def keep(self, value) -> None:
        self._value = value

    def result(self):
        value, self._value = self._value, None
        return value

    def end(self) -> None:
        session = _session
        if session is None or session.kind != "cell" or session.frame is not sys._getframe(1):
            return  # begin() failed (bad options, already running): nothing to stop
        session.frame = None
        try:
            name, profile = _finish(self.shell, session)
            if session.show:
                show(profile, name, shell=self.shell)
        except BaseException as exc:  # noqa: BLE001 - never replace the cell's own exception
            if session.sampler.running:
                try:
                    session.sampler.stop()
                except Exception:  # noqa: BLE001
                    pass
            _end_live(session, None, f"{type(exc).__name__}: {exc}")
            print(f"ddprof: could not finish the profile: {type(exc).__name__}: {exc}", file=sys.stderr)


# ----------------------------------------------------------------------------------
# the magics


@magics_class
class DDProfMagics(Magics):
    """``%%ddprof`` and ``%ddprof``: see ``%ddprof help``."""

    @no_var_expand
    @line_cell_magic
    def ddprof(self, line: str = "", cell: str | None = None):
        """Profile a cell (``%%ddprof [options]``) or one statement (``%ddprof [options]
        STATEMENT``), or manage profiles: start, stop, show, list, save, load, diff, top,
        status.  Run ``%ddprof help`` for the full usage."""
        if cell is not None:
            return self._cell_fallback(line, cell)
        stripped = line.strip()
        word, _, rest = stripped.partition(" ")
        if word == _MARKER:
            print("ddprof: this %%ddprof cell was not rewritten by the ddprof_nb extension "
                  "(%reload_ext ddprof_nb); it ran without profiling", file=sys.stderr)
            return None
        if not stripped or word in ("help", "-h", "--help"):
            print(USAGE)
            return None
        if word in _SUBCOMMANDS:
            rest = self._expand(rest)
            return getattr(self, f"_cmd_{word.replace('-', '_')}")(rest.strip())
        return self._statement(line)

    def _expand(self, text: str) -> str:
        if "$" in text or "{" in text:
            return self.shell.var_expand(text, 1000)  # user namespace only
        return text

    # -- %%ddprof called directly ---------------------------------------------------
    def _cell_fallback(self, line: str, cell: str):
        """``shell.run_cell_magic('ddprof', line, cell)`` outside the transformer: run the
        text as a cell, which the transformers handle."""
        if _cell_transform not in self.shell.input_transformers_cleanup:
            raise UsageError("%%ddprof: the ddprof_nb extension is not loaded in this shell (%load_ext ddprof_nb)")
        # the nested run shows the cell's output (and its last value) itself
        self.shell.run_cell(f"%%ddprof {line}\n{cell}", store_history=False)
        return None

    # -- %ddprof STATEMENT ------------------------------------------------------------
    def _statement(self, line: str):
        opts, statement = _split_statement(line)
        args = _STMT_PARSER.parse_argstring(opts)
        if args.help:
            print(_help(_STMT_PARSER) + "\n  STATEMENT             the Python statement to profile")
            return None
        if not statement.strip():
            raise UsageError("%ddprof: nothing to profile; give a statement (or see %ddprof help)")
        shell = self.shell
        count = _current_count(shell) or 0
        source = shell.transform_cell(statement)
        filename = shell.compile.cache(source, count, raw_code=statement)
        try:
            tree = shell.compile.ast_parse(source, filename=filename)
            tree = shell.transform_ast(tree)
        except SyntaxError as exc:
            raise UsageError(f"%ddprof: invalid statement: {exc.msg} ({statement.strip()!r})") from None
        is_expr = len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr)
        code = shell.compile(ast.Expression(tree.body[0].value) if is_expr else tree, filename,
                             "eval" if is_expr else "exec")
        session = _start(shell, args, "line", count, root_files=frozenset({filename}), what="%ddprof")
        value = None
        try:
            if is_expr:
                value = eval(code, shell.user_global_ns, shell.user_ns)
            else:
                exec(code, shell.user_global_ns, shell.user_ns)
        finally:
            try:
                name, profile = _finish(shell, session)
                if session.show:
                    show(profile, name, shell=shell)
            except Exception as exc:  # noqa: BLE001 - never replace the statement's own exception
                print(f"ddprof: could not finish the profile: {type(exc).__name__}: {exc}", file=sys.stderr)
        return value

    # -- subcommands -----------------------------------------------------------------
    def _cmd_start(self, rest: str):
        args = _START_PARSER.parse_argstring(rest)
        if args.help:
            print(_help(_START_PARSER))
            return
        _start(self.shell, args, "span", _current_count(self.shell), what="%ddprof start")
        print("ddprof: profiling until %ddprof stop")

    def _cmd_stop(self, rest: str):
        if rest:
            raise UsageError(f"%ddprof stop takes no arguments (got {rest!r})")
        session = _session
        if session is None or session.kind != "span":
            raise UsageError("%ddprof stop: no profile is running (start one with %ddprof start)")
        name, profile = _finish(self.shell, session)
        if session.show:
            show(profile, name, shell=self.shell)

    def _get(self, name: str | None) -> tuple[str, Profile]:
        if name is None:
            latest = history.latest_name
            if latest is None:
                raise UsageError("ddprof: the history is empty; profile a cell with %%ddprof first")
            return latest, history[latest]
        try:
            return history._key(name), history[name]
        except KeyError as exc:
            raise UsageError(exc.args[0]) from None

    def _cmd_show(self, rest: str):
        parts = _split(rest)
        if len(parts) > 1:
            raise UsageError("usage: %ddprof show [NAME]")
        name, profile = self._get(parts[0] if parts else None)
        show(profile, name, shell=self.shell)

    def _cmd_list(self, rest: str):
        if rest:
            raise UsageError("usage: %ddprof list")
        print(history.table())

    def _cmd_top(self, rest: str):
        p = _Parser("%ddprof top")
        p.add_argument("args", nargs="*")
        p.add_argument("-e", "--event", default=None)
        p.add_argument("--by", choices=("function", "line"), default="function")
        a = p.parse_argstring(rest)
        if len(a.args) > 2:
            raise UsageError("usage: %ddprof top [N] [NAME] [-e EVENT] [--by function|line]")
        n, name = 10, None
        if a.args:
            try:
                n = int(a.args[0])
                name = a.args[1] if len(a.args) > 1 else None
            except ValueError:
                if len(a.args) > 1:
                    raise UsageError(f"%ddprof top: N must be a number, not {a.args[0]!r}") from None
                name = a.args[0]
        if n < 1:
            raise UsageError(f"%ddprof top: N must be at least 1, not {n}")
        name, profile = self._get(name)
        try:
            events = [a.event] if a.event else list(profile.events)
            tables = [render_text.top_table(profile, e, n=n, by=a.by) for e in events]
        except ValueError as exc:
            raise UsageError(f"%ddprof top: {exc}") from None
        print(f"ddprof [{name}]\n" + ("\n\n".join(tables) if tables else "(no samples)"))

    def _cmd_sandwich(self, rest: str):
        p = _Parser("%ddprof sandwich")
        p.add_argument("function")
        p.add_argument("profile", nargs="?", default=None)
        p.add_argument("-e", "--event", default=None)
        p.add_argument("-n", type=int, default=10)
        a = p.parse_argstring(rest)
        if a.n < 1:
            raise UsageError(f"%ddprof sandwich: -n must be at least 1, not {a.n}")
        name, profile = self._get(a.profile)
        try:
            callers, callees = profile.sandwich(a.function, event=a.event)
            (key,) = transforms.function_keys(profile, a.function)
            function = transforms.function_frame(profile, key).label()
            tables = []
            for e in [a.event] if a.event else callees.events:
                tables.append(f"callers of {function} (self: called directly from it; total: reached through it)\n"
                              + render_text.top_table(transforms.caller_chains(callers), e, n=a.n))
                tables.append(f"callees of {function} (from its outermost call down)\n"
                              + render_text.top_table(callees, e, n=a.n))
        except ValueError as exc:
            raise UsageError(f"%ddprof sandwich: {str(exc).removeprefix('sandwich: ')}") from None
        if not len(callees):
            print(f"ddprof [{name}]: {function} has no samples" + (f" of {a.event}" if a.event else ""))
            return
        print(f"ddprof [{name}] sandwich of {function}\n\n" + "\n\n".join(tables))

    def _cmd_save(self, rest: str):
        parts = _split(rest)
        if len(parts) != 2:
            raise UsageError("usage: %ddprof save NAME PATH  (.pprof, .pb.gz, .speedscope.json, .folded, .html)")
        _, profile = self._get(parts[0])
        if not _save(profile, parts[1]):
            raise UsageError(f"%ddprof save: could not write {parts[1]}")

    def _cmd_load(self, rest: str):
        p = _Parser("%ddprof load")
        p.add_argument("path")
        p.add_argument("-o", "--name", default=None)
        p.add_argument("-e", "--event", default=None,
                       help="the event of a folded file whose name does not say it (cpu, wall, ...)")
        p.add_argument("-i", "--interval", default=None, metavar="INTERVAL",
                       help="what one sample is worth where the file counts samples, e.g. 10ms (py-spy --format raw)")
        a = p.parse_argstring(rest)
        path = os.path.expanduser(a.path)
        try:
            interval_ns = parse_duration_ns(a.interval) if a.interval is not None else None
        except ValueError as exc:
            raise UsageError(f"%ddprof load: {exc}") from None
        try:
            profile = load(path, a.event, interval_ns=interval_ns)
        except Exception as exc:  # noqa: BLE001 - a one-line reason, not our traceback
            raise UsageError(f"%ddprof load: cannot read {a.path}: {exc}") from None
        name = history.add(profile, a.name or Path(path).name)
        print(f"ddprof: loaded {a.path} as {name!r} ({render_text.status_line(profile)})")

    def _cmd_diff(self, rest: str):
        parts = _split(rest)
        if len(parts) != 2:
            raise UsageError("usage: %ddprof diff A B  (names in the history)")
        a_name, a = self._get(parts[0])
        b_name, b = self._get(parts[1])
        show(a, f"{a_name} -> {b_name}", other=b, shell=self.shell)

    def _cmd_status(self, rest: str):
        s = _session
        if s is None:
            print("ddprof: not profiling")
        else:
            started = {"cell": "%%ddprof", "line": "%ddprof", "span": "%ddprof start"}[s.kind]
            cfg = s.sampler.config
            print(f"ddprof: profiling for {format_duration((time.perf_counter() - s.started) * 1e9)} "
                  f"(started by {started}{f' in In[{s.count}]' if s.count is not None else ''}; "
                  f"{s.sampler.engine_name} engine; events {','.join(e.label for e in cfg.events)}; "
                  f"interval {format_duration(cfg.interval_ns)})")
        print(f"history: {len(history)} of at most {history.max_count} profiles, "
              f"{format_bytes(history.nbytes)} of {format_bytes(history.max_bytes)}"
              + (f"; latest {history.latest_name!r}" if len(history) else ""))

    def _cmd_help(self, rest: str):
        print(USAGE)

    # -- other kernels (ddprof_nb.kernels, ddprof_nb.remote) ----------------------------
    def _cmd_kernels(self, rest: str):

        if rest:
            raise UsageError(f"%ddprof kernels takes no arguments (got {rest!r})")
        found = list_kernels()
        if not found:
            print(f"ddprof: no kernel connection files in {runtime_dir()}")
            return
        print(f"{'kernel id':<38} {'pid':>8}  {'state':<10}  notebook")
        for k in found:
            mine = " (this kernel)" if k.pid == os.getpid() else ""
            state = k.state or ("no process" if k.pid is None else "?")
            print(f"{k.kernel_id:<38} {k.pid or '-':>8}  {state:<10}  {k.notebook or '-'}{mine}")

    def _cmd_dump(self, rest: str):

        if not rest or len(_split(rest)) != 1:
            raise UsageError("usage: %ddprof dump KERNEL  (a PID or a kernel id prefix, see %ddprof kernels)")
        try:
            pid = find_kernel(_split(rest)[0])
            if pid == os.getpid():
                raise UsageError("%ddprof dump: that is this kernel; its threads can be read with "
                                 "%ddprof start/stop, or from another notebook")
            print(dump_text(pid), end="")
        except VersionMismatch:
            # another Python: the command line hands it to the target's interpreter when it can
            import subprocess

            done = subprocess.run([sys.executable, "-m", "ddprof_nb", "dump", str(pid)], capture_output=True,
                                  text=True, timeout=120)
            if done.returncode == 0:
                print(done.stdout, end="")
            else:
                print(done.stderr.strip(), file=sys.stderr)
        except (ValueError, RemoteError) as exc:
            print(f"ddprof: {exc}", file=sys.stderr)

    def _cmd_attach(self, rest: str):

        args = _ATTACH_PARSER.parse_argstring(rest)
        if args.help:
            print(_help(_ATTACH_PARSER))
            return
        try:
            interval_ns = SamplerConfig.make(interval=args.interval).interval_ns
            if not args.duration > 0:
                raise ValueError(f"-d {args.duration!r}: give a positive number of seconds")
            pid = find_kernel(args.kernel)
            if pid == os.getpid():
                raise ValueError("that is this kernel: profile it with %%ddprof or %ddprof start/stop")
        except ValueError as exc:
            raise UsageError(f"%ddprof attach: {exc}") from None
        print(f"ddprof: sampling process {pid} for {args.duration:g} s from outside")
        try:
            with Target(pid) as target:
                profile = record(target, args.duration, interval_ns)
        except VersionMismatch:
            profile = _record_with_command_line(pid, args.duration, interval_ns)
        except RemoteError as exc:
            print(f"ddprof: {exc}", file=sys.stderr)
            return
        if profile is None:
            return
        name = history.add(profile, args.name or f"pid{pid}")
        print(render_text.status_line(profile, name))
        show(profile, name, shell=self.shell)

    def _cmd_allow_attach(self, rest: str):

        if rest in ("-h", "--help", "help"):
            print(ALLOW_ATTACH_HELP)
            return
        if rest not in ("", "on", "off"):
            raise UsageError("usage: %ddprof allow-attach [off]  (see %ddprof allow-attach -h)")
        print(f"ddprof: {allow_attach(rest != 'off')}")


def _record_with_command_line(pid: int, duration_s: float, interval_ns: int) -> Profile | None:
    """Sample a process of another Python version: the command line hands it to the target's
    interpreter.  None (the reason printed) when that fails."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "attach.pprof")
        done = subprocess.run([sys.executable, "-m", "ddprof_nb", "record", "--pid", str(pid), "--duration",
                               str(duration_s), "-i", f"{interval_ns}ns", "-o", out],
                              capture_output=True, text=True, timeout=duration_s + 120)
        if done.returncode != 0:
            print(done.stderr.strip(), file=sys.stderr)
            return None
        return load(out)


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"ddprof: {exc}") from None


_VALUE_OPTIONS = {"-e", "--events", "-i", "--interval", "--alloc-rate", "-l", "--label", "-o", "--name",
                  "--save", "--engine", "--asyncio"}


def _split_statement(line: str) -> tuple[str, str]:
    """``-e cpu -i 5ms f(x, "a b")`` -> (``-e cpu -i 5ms``, ``f(x, "a b")``): options
    are read up to the first word that is not one; the statement is kept verbatim."""
    pos = 0
    n = len(line)
    expect_value = False
    while pos < n:
        while pos < n and line[pos].isspace():
            pos += 1
        if pos >= n:
            break
        m = re.compile(r"""("[^"]*"|'[^']*'|\S)+""").match(line, pos)
        word = m.group(0)
        if expect_value:
            expect_value = False
        elif word.startswith("-") and not re.match(r"-\d", word):
            opt = word.split("=", 1)[0]
            expect_value = opt in _VALUE_OPTIONS and "=" not in word
        else:
            return line[:pos], line[pos:]
        pos = m.end()
    return line, ""


# ----------------------------------------------------------------------------------
# extension entry points


def load_ipython_extension(ipython) -> None:
    """Register the magics, the %%ddprof input and AST transformers, and the cell hooks."""
    ipython.register_magics(DDProfMagics)
    if _cell_transform not in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.append(_cell_transform)
    ipython.ast_transformers[:] = [t for t in ipython.ast_transformers if not isinstance(t, _CellWrapper)]
    ipython.ast_transformers.insert(0, _CellWrapper(ipython))
    setattr(ipython, _HOOKS_ATTR, _CellHooks(ipython))


def unload_ipython_extension(ipython) -> None:
    """Stop a running profile (it is stored in the history), then remove everything
    ``load_ipython_extension`` added."""
    session = _session
    if session is not None:
        try:
            name, _ = _finish(ipython, session)
            print(f"ddprof: the extension was unloaded; the running profile was stopped and stored as {name!r}")
        except Exception as exc:  # noqa: BLE001
            print(f"ddprof: stopping the running profile failed: {exc}", file=sys.stderr)
    while _cell_transform in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.remove(_cell_transform)
    ipython.ast_transformers[:] = [t for t in ipython.ast_transformers if not isinstance(t, _CellWrapper)]
    if hasattr(ipython, _HOOKS_ATTR):
        delattr(ipython, _HOOKS_ATTR)
    manager = ipython.magics_manager
    for kind in ("line", "cell"):
        fn = manager.magics[kind].get("ddprof")
        if getattr(fn, "__self__", None) is not None and isinstance(fn.__self__, DDProfMagics):
            del manager.magics[kind]["ddprof"]
    manager.registry.pop(DDProfMagics.__name__, None)
