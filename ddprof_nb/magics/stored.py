"""The subcommands over stored profiles (``ddprof_nb.history``): show, list, top, sandwich,
save, load, diff.  Each takes the rest of the line; those that show a profile return what
to show (the caller shows it: the display mode is the magics' setting)."""

from __future__ import annotations

import os
from pathlib import Path

from IPython.core.error import UsageError

from ..config import parse_duration_ns
from ..history import history
from ..loading import load as load_file
from ..model import Profile, calltree
from ..render import text as render_text
from .options import Parser, split
from .recording import save as save_to


def get(name: str | None) -> tuple[str, Profile]:
    """(its name, the profile) for ``name`` in the history (None: the latest)."""
    if name is None:
        latest = history.latest_name
        if latest is None:
            raise UsageError("ddprof: the history is empty; profile a cell with %%ddprof first")
        return latest, history[latest]
    try:
        return history._key(name), history[name]
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None


def show(rest: str) -> tuple[str, Profile]:
    parts = split(rest)
    if len(parts) > 1:
        raise UsageError("usage: %ddprof show [NAME]")
    return get(parts[0] if parts else None)


def list_(rest: str) -> None:
    if rest:
        raise UsageError("usage: %ddprof list")
    print(history.table())


def _top_args(rest: str):
    p = Parser("%ddprof top")
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
    return a, n, name


def top(rest: str) -> None:
    a, n, name = _top_args(rest)
    name, profile = get(name)
    try:
        events = [a.event] if a.event else list(profile.events)
        tables = [render_text.top_table(profile, e, n=n, by=a.by) for e in events]
    except ValueError as exc:
        raise UsageError(f"%ddprof top: {exc}") from None
    print(f"ddprof [{name}]\n" + ("\n\n".join(tables) if tables else "(no samples)"))


def sandwich(rest: str) -> None:
    p = Parser("%ddprof sandwich")
    p.add_argument("function")
    p.add_argument("profile", nargs="?", default=None)
    p.add_argument("-e", "--event", default=None)
    p.add_argument("-n", type=int, default=10)
    a = p.parse_argstring(rest)
    if a.n < 1:
        raise UsageError(f"%ddprof sandwich: -n must be at least 1, not {a.n}")
    name, profile = get(a.profile)
    try:
        callers, callees = profile.sandwich(a.function, event=a.event)
        (key,) = calltree.function_keys(profile, a.function)
        function = calltree.function_frame(profile, key).label()
        tables = []
        for e in [a.event] if a.event else callees.events:
            tables.append(f"callers of {function} (self: called directly from it; total: reached through it)\n"
                          + render_text.top_table(calltree.caller_chains(callers), e, n=a.n))
            tables.append(f"callees of {function} (from its outermost call down)\n"
                          + render_text.top_table(callees, e, n=a.n))
    except ValueError as exc:
        raise UsageError(f"%ddprof sandwich: {str(exc).removeprefix('sandwich: ')}") from None
    if not len(callees):
        print(f"ddprof [{name}]: {function} has no samples" + (f" of {a.event}" if a.event else ""))
        return
    print(f"ddprof [{name}] sandwich of {function}\n\n" + "\n\n".join(tables))


def save(rest: str) -> None:
    parts = split(rest)
    if len(parts) != 2:
        raise UsageError("usage: %ddprof save NAME PATH  (.pprof, .pb.gz, .speedscope.json, .folded, .html)")
    _, profile = get(parts[0])
    if not save_to(profile, parts[1]):
        raise UsageError(f"%ddprof save: could not write {parts[1]}")


def load(rest: str) -> None:
    p = Parser("%ddprof load")
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
        profile = load_file(path, a.event, interval_ns=interval_ns)
    except Exception as exc:  # noqa: BLE001 - a one-line reason, not our traceback
        raise UsageError(f"%ddprof load: cannot read {a.path}: {exc}") from None
    name = history.add(profile, a.name or Path(path).name)
    print(f"ddprof: loaded {a.path} as {name!r} ({render_text.status_line(profile)})")


def diff(rest: str) -> tuple[Profile, str, Profile]:
    """(A, "A -> B", B) for ``%ddprof diff A B``."""
    parts = split(rest)
    if len(parts) != 2:
        raise UsageError("usage: %ddprof diff A B  (names in the history)")
    a_name, a = get(parts[0])
    b_name, b = get(parts[1])
    return a, f"{a_name} -> {b_name}", b
