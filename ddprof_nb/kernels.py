"""This user's running Jupyter kernels, and letting other processes read this one.

``list_kernels()`` reads the Jupyter runtime folder's ``kernel-*.json`` connection files
and finds each kernel's process by its command line (kernels are started with ``-f
<connection file>``).  The Jupyter servers of the same folder (``jpserver-*.json``: their
URL and token) are asked for their sessions: a kernel's notebook and its own busy/idle
status.  Without a server that knows it, busy or idle is told from the kernel's CPU time
over a short look (a kernel blocked in a long sleep or lock then looks idle: /proc cannot
tell that from waiting for a request).  ``find_kernel()`` takes a PID or a kernel id prefix.  ``allow_attach()`` sets
PR_SET_PTRACER so that processes of the same user may read this kernel's memory under
Yama's ptrace_scope 1 (``%ddprof allow-attach``).
"""

from __future__ import annotations

import ctypes
import errno
import glob
import json
import os
import time
import urllib.request
from dataclasses import dataclass

__all__ = ["KernelInfo", "runtime_dir", "list_kernels", "find_kernel", "allow_attach", "ALLOW_ATTACH_HELP"]

_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value

ALLOW_ATTACH_HELP = """\
%ddprof allow-attach [off]   let processes of your user read this kernel's memory (dump, record --pid)

Under the kernel's Yama setting ptrace_scope = 1 (the default of most distributions), a
process's memory may be read only by its ancestors; another notebook's `%ddprof dump` or
`python -m ddprof_nb dump PID` from a terminal is refused. This sets PR_SET_PTRACER to
"any" for this kernel: any process running as your user may then read (and debug) it.
Trade-off: that includes any other program of yours that is compromised, which could read
secrets held in this kernel (tokens, data) or change its memory. It lasts until the kernel
exits or `%ddprof allow-attach off`. It is off by default; ptrace_scope 2 or 3 still refuse.
"""


def runtime_dir() -> str:
    """Where Jupyter keeps its connection files (jupyter_core's rule when installed)."""
    try:
        from jupyter_core.paths import jupyter_runtime_dir

        return jupyter_runtime_dir()
    except ImportError:
        if os.environ.get("JUPYTER_RUNTIME_DIR"):
            return os.environ["JUPYTER_RUNTIME_DIR"]
        data = os.environ.get("JUPYTER_DATA_DIR") or os.path.join(
            os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "jupyter")
        return os.path.join(data, "runtime")


@dataclass
class KernelInfo:
    kernel_id: str
    connection_file: str
    pid: int | None  # None: no process of this user has that connection file on its command line
    state: str  # "busy", "idle", "" (no process); the server's word when one knows the kernel
    cmdline: str = ""
    notebook: str = ""  # the session's path, when a Jupyter server knows the kernel


def _cmdlines() -> dict[int, list[str]]:
    me = os.getuid()
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != me:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        out[int(entry)] = [a for a in argv if a]
    return out


def _cpu_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def _server_sessions(folder: str, timeout_s: float = 1.0) -> dict[str, tuple[str, str]]:
    """kernel id -> (notebook path, execution state) from the Jupyter servers whose info files
    are in ``folder``; a server that does not answer is skipped."""
    out: dict[str, tuple[str, str]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "jpserver-*.json")) + glob.glob(os.path.join(folder, "nbserver-*.json"))):
        try:
            with open(path) as f:
                info = json.load(f)
            url = info["url"].rstrip("/") + "/api/sessions"
            req = urllib.request.Request(url, headers={"Authorization": f"token {info.get('token', '')}"})
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - the user's own server
                sessions = json.load(resp)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        for sess in sessions if isinstance(sessions, list) else []:
            kernel = sess.get("kernel") if isinstance(sess, dict) else None
            if isinstance(kernel, dict) and kernel.get("id"):
                notebook = str(sess.get("path") or sess.get("name") or "")
                out[kernel["id"]] = (notebook, str(kernel.get("execution_state") or ""))
    return out


def list_kernels(look_s: float = 0.2) -> list[KernelInfo]:
    """The kernels with a connection file in the runtime folder, with their PIDs and states."""
    files = sorted(glob.glob(os.path.join(runtime_dir(), "kernel-*.json")))
    procs = _cmdlines()
    out = []
    for path in files:
        name = os.path.basename(path)
        kid = name[len("kernel-"):-len(".json")]
        pids = [p for p, argv in sorted(procs.items()) if any(a == name or a.endswith("/" + name) for a in argv)]
        # a wrapper (a shell, a launcher) may carry the same argument: the Python process is the kernel
        pythons = [p for p in pids if os.path.basename(procs[p][0]).startswith("python")]
        pid = (pythons or pids or [None])[0]
        out.append(KernelInfo(kid, path, pid, "", " ".join(procs.get(pid, [])) if pid else ""))
    sessions = _server_sessions(runtime_dir()) if out else {}
    for k in out:
        k.notebook, k.state = sessions.get(k.kernel_id, ("", ""))
        if k.state not in ("busy", "idle"):
            k.state = ""
    before = {k.pid: _cpu_ticks(k.pid) for k in out if k.pid and not k.state}
    if before:
        time.sleep(look_s)
    for k in out:
        if k.pid and k.pid in before:
            after = _cpu_ticks(k.pid)
            if after is None or before.get(k.pid) is None:
                k.state = ""
            else:
                k.state = "busy" if after > before[k.pid] else "idle"
    return out


def find_kernel(spec: str) -> int:
    """The PID of a kernel named by PID or kernel id prefix (ValueError naming the problem)."""
    spec = spec.strip()
    matches = [k for k in list_kernels(look_s=0) if k.kernel_id.startswith(spec)]
    if spec.isdigit() and not matches:  # digits are a PID unless a kernel id starts with them (1 in 40 do)
        return int(spec)
    if not matches:
        raise ValueError(f"no running kernel has an id starting with {spec!r} (see %ddprof kernels)")
    if len(matches) > 1:
        raise ValueError(f"{len(matches)} kernels have ids starting with {spec!r}: "
                         f"{', '.join(k.kernel_id for k in matches)}; give more of the id")
    if matches[0].pid is None:
        raise ValueError(f"kernel {matches[0].kernel_id} has a connection file but no process of yours runs it")
    return matches[0].pid


def allow_attach(on: bool = True) -> str:
    """Set (or clear) PR_SET_PTRACER for this process; returns what it did, in words."""
    libc = ctypes.CDLL(None, use_errno=True)
    value = _PR_SET_PTRACER_ANY if on else 0
    rc = libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if rc != 0:
        err = ctypes.get_errno()
        if err == errno.EINVAL:
            return ("this Linux kernel has no Yama ptrace restriction (PR_SET_PTRACER is not available): processes "
                    "of your user may already read this kernel; nothing was changed")
        return f"PR_SET_PTRACER failed: {os.strerror(err)}"
    if on:
        return (f"processes of your user may now read this kernel (pid {os.getpid()}) with ddprof_nb dump / "
                "record --pid, until it exits or %ddprof allow-attach off")
    return f"only ancestors of this kernel (pid {os.getpid()}) may read it again (Yama's default)"
