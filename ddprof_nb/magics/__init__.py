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

The package, one job a module: ``options`` (the usage text and the option parsers),
``session`` (what a running profile records and the facts its stop needs), ``display``
(how a profile is shown), ``stored`` (the subcommands over the history: show, list, top,
sandwich, save, load, diff), ``other_kernels`` (kernels, dump, attach, allow-attach).
This module holds what is set once per process: the running session, the display mode,
the magic and the cell hooks that start and finish sessions.
"""

from __future__ import annotations

import ast
import inspect
import sys
import threading
import time

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand

from .. import cells, pipeline
from ..cell_rewrite import HOOKS_ATTR as _HOOKS_ATTR, MARKER as _MARKER
from ..cell_rewrite import CellWrapper as _CellWrapper, cell_transform as _cell_transform
from ..errors import ProfilerBusyError, ProfilerError
from ..history import history
from ..live_display import line_sink, widget_sink
from ..model import Profile
from ..render import text as render_text
from ..render.format import format_bytes, format_duration
from ..sampler import Sampler
from . import other_kernels, stored
from .display import fallback_bundle  # noqa: F401 - ddprof_nb.magics.fallback_bundle: the static view's bundle
from .display import mode_for, preload, prepare, show_as
from .options import CELL_PARSER, START_PARSER, STMT_PARSER, SUBCOMMANDS, USAGE, help_text, sampler_config
from .options import split_statement
from .recording import Session, busy_message, current_count, dask_client, default_name, save, stop_facts

__all__ = ["DDProfMagics", "load_ipython_extension", "unload_ipython_extension", "display_mode"]

# "auto": widget inside a kernel, text in terminal IPython, static (text + HTML) elsewhere;
# or force one of "widget", "static", "text".
display_mode = "auto"

_CO_COROUTINE = inspect.CO_COROUTINE

_session: Session | None = None
_session_lock = threading.Lock()


def _mode(shell) -> str:
    return mode_for(shell, display_mode)


def show(profile: Profile, name: str | None = None, other: Profile | None = None, shell=None) -> None:
    """Display ``profile`` (or the diff ``profile`` -> ``other``) the best way the
    frontend allows (``display``; ``display_mode`` forces one)."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    show_as(_mode(shell), profile, name, other)


# ----------------------------------------------------------------------------------
# the running profile


def _start(shell, args, kind: str, count: int | None, *, root_files=None, frame=None,
           is_async: bool = False, what: str = "%%ddprof") -> Session:
    """Parse-checked options -> a running session, or UsageError with one line."""
    global _session
    config = sampler_config(args)
    if args.name is not None and not args.name.strip():
        raise UsageError(f"{what}: invalid name {args.name!r} for -o: give a non-empty name")
    live = getattr(args, "live", False)
    if live and args.no_show:
        raise UsageError(f"{what}: --live shows the profile while it runs; it cannot go with --no-show")
    with _session_lock:
        if _session is not None:
            raise UsageError(busy_message(_session, what))
        sampler = Sampler(config, children=getattr(args, "children", False),  # [children/dask]
                          dask=dask_client(shell, args, what))
        session = Session(sampler, kind, threading.get_native_id(), args.name, args.save,
                          not args.no_show, count, root_files, frame, is_async,
                          getattr(args, "all_threads", False))
        if live:
            session.live = _live_sink(shell, session)
        elif not args.no_show:
            prepare(shell, display_mode)  # before the sampler starts: its work stays out of the profile
        try:
            sampler.start(trim="none", live=session.live)
        except ProfilerBusyError:
            _end_live(session, None, "a profile is already running")
            raise UsageError(busy_message(_session, what)) from None
        except (ProfilerError, ValueError, OSError) as exc:
            _end_live(session, None, str(exc))
            raise UsageError(f"{what}: cannot start profiling: {exc}") from None
        _session = session
        return _session


def _live_sink(shell, session: Session):
    """--live: the live view widget in a notebook, else a progress line on a terminal's
    stderr, else None (``live_display``); its snapshots are shaped as the final profile."""
    def shape(profile: Profile) -> Profile:
        return session.sampler.shape_live(profile, pipeline.MAGIC, **stop_facts(shell, session))

    where = f"In[{session.count}]" if session.count is not None else ""
    sink = widget_sink(shape, f"ddprof live {where}".rstrip()) if _mode(shell) == "widget" else None
    return sink if sink is not None else line_sink()


def _end_live(session: Session, profile: Profile | None, error: str | None = None) -> None:
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


def _finish(shell, session: Session) -> tuple[str, Profile]:
    """Stop ``session``; root and name its stacks; store it in the history; a live view
    becomes the explorer of the result."""
    global _session
    with _session_lock:
        if _session is session:
            _session = None
    elapsed = time.perf_counter() - session.started
    try:
        profile = session.sampler.stop(pipeline.MAGIC, **stop_facts(shell, session))
    except BaseException as exc:
        _end_live(session, None, f"{type(exc).__name__}: {exc}")
        raise
    name = default_name(shell, session)
    extra = dict(profile.metadata.extra)
    if session.count is not None:
        extra.setdefault("cell", f"In[{session.count}]")
    profile = profile.with_metadata(extra=extra)
    name = history.add(profile, name)
    print(render_text.status_line(profile, name, wall_s=elapsed))
    if session.save:
        save(profile, session.save)
    _end_live(session, profile)
    return name, profile


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
        parsed = CELL_PARSER.parse_argstring(args)
        if parsed.help:
            raise UsageError(help_text(CELL_PARSER))
        count = cells.cell_number(frame.f_code.co_filename, self.shell)
        if count is None:
            count = current_count(self.shell)
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
        if word in SUBCOMMANDS:
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
        opts, statement = split_statement(line)
        args = STMT_PARSER.parse_argstring(opts)
        if args.help:
            print(help_text(STMT_PARSER) + "\n  STATEMENT             the Python statement to profile")
            return None
        if not statement.strip():
            raise UsageError("%ddprof: nothing to profile; give a statement (or see %ddprof help)")
        shell = self.shell
        count = current_count(shell) or 0
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
        args = START_PARSER.parse_argstring(rest)
        if args.help:
            print(help_text(START_PARSER))
            return
        _start(self.shell, args, "span", current_count(self.shell), what="%ddprof start")
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

    def _cmd_status(self, rest: str):
        s = _session
        if s is None:
            print("ddprof: not profiling")
        else:
            cfg = s.sampler.config
            print(f"ddprof: profiling for {format_duration((time.perf_counter() - s.started) * 1e9)} "
                  f"(started by {s.started_by}{f' in In[{s.count}]' if s.count is not None else ''}; "
                  f"{s.sampler.engine_name} engine; events {','.join(e.label for e in cfg.events)}; "
                  f"interval {format_duration(cfg.interval_ns)})")
        print(f"history: {len(history)} of at most {history.max_count} profiles, "
              f"{format_bytes(history.nbytes)} of {format_bytes(history.max_bytes)}"
              + (f"; latest {history.latest_name!r}" if len(history) else ""))

    def _cmdhelp_text(self, rest: str):
        print(USAGE)

    # -- stored profiles (stored) ------------------------------------------------------
    def _cmd_show(self, rest: str):
        name, profile = stored.show(rest)
        show(profile, name, shell=self.shell)

    def _cmd_diff(self, rest: str):
        a, label, b = stored.diff(rest)
        show(a, label, other=b, shell=self.shell)

    def _cmd_list(self, rest: str):
        stored.list_(rest)

    def _cmd_top(self, rest: str):
        stored.top(rest)

    def _cmd_sandwich(self, rest: str):
        stored.sandwich(rest)

    def _cmd_save(self, rest: str):
        stored.save(rest)

    def _cmd_load(self, rest: str):
        stored.load(rest)

    # -- other kernels (other_kernels) ---------------------------------------------------
    def _cmd_kernels(self, rest: str):
        other_kernels.kernels(rest)

    def _cmd_dump(self, rest: str):
        other_kernels.dump(rest)

    def _cmd_attach(self, rest: str):
        taken = other_kernels.attach(rest)
        if taken is not None:
            name, profile = taken
            show(profile, name, shell=self.shell)

    def _cmd_allow_attach(self, rest: str):
        other_kernels.allow_attach(rest)


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
    preload(ipython, display_mode)


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
