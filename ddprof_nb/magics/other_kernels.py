"""The subcommands on other kernels of this user (``ddprof_nb.kernels``, ``ddprof_nb.remote``):
kernels, dump, attach, allow-attach.  A target of any CPython 3.11 to 3.15 is read from this
kernel, whatever its own version (ddprof_nb.remote)."""

from __future__ import annotations

import os
import sys

from IPython.core.error import UsageError

from ..config import SamplerConfig
from ..history import history
from ..kernels import ALLOW_ATTACH_HELP, allow_attach as _allow_attach, find_kernel, list_kernels, runtime_dir
from ..model import Profile
from ..remote import RemoteError, Target, dump_text
from ..remote_record import record
from ..render import text as render_text
from .options import ATTACH_PARSER, help_text, split


def kernels(rest: str) -> None:
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


def dump(rest: str) -> None:
    if not rest or len(split(rest)) != 1:
        raise UsageError("usage: %ddprof dump KERNEL  (a PID or a kernel id prefix, see %ddprof kernels)")
    try:
        pid = find_kernel(split(rest)[0])
        if pid == os.getpid():
            raise UsageError("%ddprof dump: that is this kernel; its threads can be read with "
                             "%ddprof start/stop, or from another notebook")
        print(dump_text(pid), end="")
    except (ValueError, RemoteError) as exc:
        print(f"ddprof: {exc}", file=sys.stderr)


def attach(rest: str) -> tuple[str, Profile] | None:
    """Sample another kernel from outside and store the profile; (its name, the profile) to
    show, or None (help printed, or the reason it failed)."""
    args = ATTACH_PARSER.parse_argstring(rest)
    if args.help:
        print(help_text(ATTACH_PARSER))
        return None
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
    except RemoteError as exc:
        print(f"ddprof: {exc}", file=sys.stderr)
        return None
    name = history.add(profile, args.name or f"pid{pid}")
    print(render_text.status_line(profile, name))
    return name, profile


def allow_attach(rest: str) -> None:
    if rest in ("-h", "--help", "help"):
        print(ALLOW_ATTACH_HELP)
        return
    if rest not in ("", "on", "off"):
        raise UsageError("usage: %ddprof allow-attach [off]  (see %ddprof allow-attach -h)")
    print(f"ddprof: {_allow_attach(rest != 'off')}")

