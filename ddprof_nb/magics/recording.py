"""What a running magic profile records (``Session``) and what its stop needs to know:
the frames that root it (the cell), the magics' own frames it drops, where an async
cell's waits go, which threads it hides, its default name.  The one running session
itself is held by ``ddprof_nb.magics``."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

from IPython.core.error import UsageError

from .. import cells
from ..explorer.threads import KERNEL_FRAMES
from ..exporters import save as save_file
from ..model import Frame, Profile

# the magics' own frames (every module of this package), left out of the profiles they take
_HERE = os.path.dirname(__file__)
OWN_FILES = frozenset(f for name in os.listdir(_HERE) if name.endswith(".py")
                      for f in (os.path.join(_HERE, name), os.path.realpath(os.path.join(_HERE, name))))

_STARTED_BY = {"cell": "%%ddprof", "line": "%ddprof", "span": "%ddprof start"}


@dataclass
class Session:
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

    @property
    def started_by(self) -> str:
        return _STARTED_BY[self.kind]


def busy_message(session: Session | None, what: str) -> str:
    """The one line for a second profile while ``session`` runs."""
    s = session
    if s is None:
        return f"{what}: a profile is already running in this process; stop it first"
    where = f" in In[{s.count}]" if s.count is not None else ""
    hint = "; run %ddprof stop first" if s.kind == "span" else ""
    return f"{what}: a profile is already running (started by {s.started_by}{where}){hint}"


def dask_client(shell, args, what: str):
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


def stop_facts(shell, session: Session) -> dict:
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
    return dict(is_root=is_root, drop=lambda f: f.filename in OWN_FILES, outside=outside,
                rename=shell if shell is not None else True,
                hide=None if session.all_threads else KERNEL_FRAMES, hide_reason="--all-threads keeps them")


def default_name(shell, session: Session) -> str | None:
    """The name ``-o`` did not give: the cell's number, or the span's first-last cells."""
    if session.name is not None:
        return session.name
    if session.kind == "span":
        end = current_count(shell)
        return f"{session.count}-{end}" if session.count is not None and end is not None else None
    return str(session.count) if session.count is not None else None


def save(profile: Profile, path: str) -> bool:
    try:
        save_file(profile, os.path.expanduser(path))
    except Exception as exc:  # noqa: BLE001 - one clear line, never a traceback from us
        print(f"ddprof: could not save to {path}: {exc}", file=sys.stderr)
        return False
    print(f"ddprof: saved to {path}")
    return True


def current_count(shell) -> int | None:
    """Execution count of the cell running now (IPython increments before running)."""
    if shell is None:
        return None
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    n = getattr(result, "execution_count", None)
    if isinstance(n, int):
        return n
    n = getattr(shell, "execution_count", None)
    return n - 1 if isinstance(n, int) and n > 0 else None
