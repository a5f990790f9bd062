"""The magics' words: the usage text, the option parsers of ``%%ddprof``, ``%ddprof start``,
``%ddprof STATEMENT`` and ``%ddprof attach``, and how a line splits into options and a
statement.  Every parse error is a ``UsageError`` of one line (IPython shows no traceback)."""

from __future__ import annotations

import argparse
import os
import re
import shlex

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser
from IPython.utils.process import arg_split

from ..config import (ASYNCIO_MODES, DEFAULT_ALLOC_RATE, DEFAULT_EVENTS, DEFAULT_INTERVAL_NS,
                      DEFAULT_NATIVE_THREADS, ENGINES, NATIVE_THREADS_MODES, SamplerConfig)

SUBCOMMANDS = ("start", "stop", "show", "list", "save", "load", "diff", "top", "sandwich", "status", "help",
               "kernels", "dump", "attach", "allow-attach")

USAGE = """\
%%ddprof [-e EVENTS] [-i INTERVAL] [--alloc-rate SIZE] [--no-native-alloc] [--native]
         [--native-threads attribute|raw|off] [-l KEY=VALUE ...]
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


class Parser(MagicArgumentParser):
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


def _sampler_options(p: Parser, statement: bool = False) -> None:
    p.add_argument("-e", "--events", action="append", default=None, metavar="EVENTS",
                   help="event types, comma separated: cpu,wall,alloc,lock,park "
                        f"(default {','.join(e.label for e in DEFAULT_EVENTS)})")
    p.add_argument("-i", "--interval", default=None, metavar="INTERVAL",
                   help=f"sampling interval for cpu and wall, e.g. 10ms (default {DEFAULT_INTERVAL_NS // 1_000_000}ms)")
    p.add_argument("--alloc-rate", default=None, metavar="SIZE",
                   help=f"mean bytes between allocation samples, e.g. 512KiB (default {DEFAULT_ALLOC_RATE // 1024}KiB)")
    p.add_argument("--no-native-alloc", action="store_true",
                   help="alloc/live: Python objects only (no numpy array data or C extensions' malloc)")
    p.add_argument("--native", action="store_true",
                   help="samples also carry the C/C++/Rust frames between the Python ones (native engine)")
    p.add_argument("--interpreter-frames", action="store_true",
                   help="with --native: keep the interpreter's eval-loop frames (_PyEval_EvalFrameDefault) "
                        "between the Python frames they run, instead of merging them away")
    p.add_argument("--native-threads", default=DEFAULT_NATIVE_THREADS, choices=NATIVE_THREADS_MODES,
                   help="CPU and allocations of threads that run no Python (BLAS, OpenMP pools): under the line that "
                        f"asked (attribute), per thread (raw), or left out (off); default {DEFAULT_NATIVE_THREADS}")
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


def _make_parser(prog: str, statement: bool = False) -> Parser:
    p = Parser(prog)
    _sampler_options(p, statement)
    return p


CELL_PARSER = _make_parser("%%ddprof")
START_PARSER = _make_parser("%ddprof start")
STMT_PARSER = _make_parser("%ddprof", statement=True)
ATTACH_PARSER = Parser("%ddprof attach")
ATTACH_PARSER.add_argument("kernel", metavar="KERNEL", help="a PID or a kernel id prefix (see %%ddprof kernels)")
ATTACH_PARSER.add_argument("-d", "--duration", type=float, default=10.0, metavar="S", help="seconds to sample (default 10)")
ATTACH_PARSER.add_argument("-i", "--interval", default=f"{DEFAULT_INTERVAL_NS // 1_000_000}ms", metavar="INTERVAL",
                           help=f"sampling interval (default {DEFAULT_INTERVAL_NS // 1_000_000}ms)")
ATTACH_PARSER.add_argument("-o", "--name", default=None, help="name of the profile in ddprof_nb.history (default pidPID)")
ATTACH_PARSER.add_argument("-h", "--help", action="store_true", help="show this help")


def _labels(items) -> dict[str, str]:
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"invalid label {item!r}: use -l key=value")
        out[key.strip()] = value
    return out


def sampler_config(args) -> SamplerConfig:
    """The parsed sampler options -> a SamplerConfig, or UsageError with one line."""
    options = {"engine": args.engine, "labels": _labels(args.label), "asyncio": args.asyncio}
    if args.events:
        options["events"] = ",".join(args.events)
    if args.interval is not None:
        options["interval"] = args.interval
    if args.alloc_rate is not None:
        options["alloc_rate"] = args.alloc_rate
    if args.no_native_alloc:
        options["native_alloc"] = False
    if args.native:
        options["native"] = "interpreter" if args.interpreter_frames else True
    elif args.interpreter_frames:
        raise UsageError("--interpreter-frames needs --native")
    options["native_threads"] = args.native_threads
    try:
        return SamplerConfig.make(**options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def help_text(parser: Parser) -> str:
    return parser.format_help().rstrip()


def split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"ddprof: {exc}") from None


_VALUE_OPTIONS = {"-e", "--events", "-i", "--interval", "--alloc-rate", "-l", "--label", "-o", "--name",
                  "--save", "--engine", "--asyncio"}


def split_statement(line: str) -> tuple[str, str]:
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
