"""Another CPython process, read from outside: its threads, their stacks and states.

The target's ``_PyRuntime`` and type objects are found from its ELF symbols (libpython, or
the executable of a static build) plus their load base in /proc/PID/maps.  A target of this
interpreter's minor version is read by the native frame walker (native/pyframes.c), compiled
with that version's layout (3.13+: the target's published ``debug_offsets`` are compared with
ours before anything else is read); any other CPython 3.11 to 3.15 is read by the Python
reader (ddprof_nb.remote_walk), which takes the target's layout as data: its published
offsets (3.13+) or a built-in table (3.11, 3.12).  Thread names and states come from
/proc/PID/task/TID: ``comm``, ``stat`` (state, CPU times) and ``syscall`` (a futex wait on
the GIL's own memory is a wait for the GIL).

Everything that can go wrong is a ``RemoteError`` with a message naming the problem:
no such process, not CPython, a version or build it cannot read (older than 3.11,
free-threaded, a layout it does not know), no ptrace rights (with the Yama setting and how
to allow it), the process exiting while read.
"""

from __future__ import annotations

import errno
import os
import platform
import re
import sys
from dataclasses import dataclass, field

from . import elfsyms
from .model import Frame
from .remote_layouts import LayoutError, line_of
from .remote_walk import PyReader, Torn, read_memory

__all__ = ["RemoteError", "TornRead", "Target", "ThreadInfo", "thread_stat", "permission_help", "format_dump",
           "dump_text"]

_SYMBOLS = ("_PyRuntime", "PyCode_Type", "PyUnicode_Type", "PyBytes_Type", "Py_Version")
_LIBPYTHON = re.compile(r"/libpython(\d+)\.(\d+)(t?)[^/]*\.so[^/]*$")
_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
MAX_DEPTH = 512


class RemoteError(Exception):
    """The target cannot be read; the message says why (and what to do, when anything can be)."""


class TornRead(RemoteError):
    """The target's interpreter state changed under every try of a read (a sampler skips the look)."""


def _yama_scope() -> int | None:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def permission_help(pid: int) -> str:
    """Why this process may not read ``pid``'s memory, and how to allow it."""
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        owner = None
    me = os.geteuid()
    if owner is not None and owner != me and me != 0:
        return (f"no permission to read process {pid}: it belongs to another user (uid {owner}); run as that user, "
                "or as root")
    scope = _yama_scope()
    if scope == 1:
        return (f"no permission to read process {pid}: the kernel's Yama ptrace_scope is 1 (restricted), so only a "
                "process's ancestors may read its memory. Allow it in one of these ways: in the target kernel run "
                "`%ddprof allow-attach` (it lets processes of the same user read it), run this command as root, or "
                "relax the whole system with `sudo sysctl kernel.yama.ptrace_scope=0`")
    if scope == 2:
        return (f"no permission to read process {pid}: the kernel's Yama ptrace_scope is 2 (admin-only), so only "
                "root (CAP_SYS_PTRACE) may read another process's memory; run this command with sudo")
    if scope == 3:
        return (f"no permission to read process {pid}: the kernel's Yama ptrace_scope is 3 (no attach): no process "
                "may read another's memory until the next reboot")
    return (f"no permission to read process {pid} (the kernel refused access to its memory); it may be "
            "non-dumpable (setuid), in another container, or this process lacks CAP_SYS_PTRACE")


def _os_error(pid: int, err: int, what: str) -> RemoteError:
    if err in (errno.EPERM, errno.EACCES):
        return RemoteError(permission_help(pid))
    if err == errno.ESRCH or err == errno.ENOENT:
        return RemoteError(f"process {pid} exited while {what}")
    return RemoteError(f"cannot read process {pid} while {what}: {os.strerror(err)}")


def _read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


@dataclass
class ThreadStat:
    """A thread's scheduling state from /proc: R (running/runnable), S, D, T, Z..."""

    state: str
    cpu_ticks: int  # utime + stime, in clock ticks (os.sysconf("SC_CLK_TCK") per second)
    futex: int | None  # the futex address it waits on, when it is in futex()


def thread_stat(pid: int, tid: int, want_syscall: bool = True) -> ThreadStat | None:
    """The thread's /proc state, None when it is gone."""
    text = _read_text(f"/proc/{pid}/task/{tid}/stat")
    if not text or ")" not in text:
        return None
    fields = text[text.rindex(")") + 2:].split()
    try:
        state, ticks = fields[0], int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None
    futex = None
    if want_syscall and _FUTEX is not None and state != "R":
        sc = _read_text(f"/proc/{pid}/task/{tid}/syscall")
        parts = sc.split() if sc else []
        if len(parts) > 1 and parts[0] == str(_FUTEX):
            try:
                futex = int(parts[1], 16)
            except ValueError:
                futex = None
    return ThreadStat(state, ticks, futex)


@dataclass
class ThreadInfo:
    """One thread of the target, as dumped."""

    tid: int
    name: str  # the OS thread name (/proc/PID/task/TID/comm)
    main: bool
    holds_gil: bool
    state: str  # "cpu", "gil" (waiting for it), "off-cpu", or "" when unknown
    frames: list[Frame] = field(default_factory=list)  # innermost first
    truncated: bool = False
    error: str | None = None  # why the stack could not be read


def _version_in_name(path: str) -> tuple[int, int] | None:
    """(major, minor) in a libpython or pythonX.Y file name."""
    hit = _LIBPYTHON.search(path) or re.search(r"/python(\d+)\.(\d+)[^/]*$", path)
    return (int(hit.group(1)), int(hit.group(2))) if hit else None


def _free_threaded_name(path: str) -> bool:
    hit = _LIBPYTHON.search(path)
    return bool(hit.group(3)) if hit else bool(re.search(r"/python\d+\.\d+t$", path))


class Target:
    """A CPython process opened for reading; ``close()`` (or ``with``) when done."""

    def __init__(self, pid: int):
        from .engines.native.binding import ffi, lib

        self._ffi, self._lib = ffi, lib
        if pid <= 0:
            raise RemoteError(f"invalid process id {pid}")
        self.pid = pid
        if not os.path.exists(f"/proc/{pid}"):
            raise RemoteError(f"no process with id {pid}")
        self.cmdline = " ".join((_read_text(f"/proc/{pid}/cmdline") or "").split("\0")).strip()
        try:
            maps = elfsyms.mappings(pid)
        except OSError as exc:
            raise _os_error(pid, exc.errno or errno.EPERM, "reading its memory map") from None
        binary, self.free_threaded = self._python_binary(maps)
        self.binary = binary
        root = f"/proc/{pid}/root"
        try:
            with open(root + binary if os.path.exists(root + binary) else binary, "rb") as f:
                data = f.read()
            syms = elfsyms.symbols(data, _SYMBOLS)
            base = elfsyms.load_base(data, maps, binary)
        except (OSError, elfsyms.ElfError) as exc:
            raise RemoteError(f"process {pid}: cannot read the symbols of {binary}: {exc}") from None
        named = _version_in_name(binary)
        if named and named < (3, 11):
            raise RemoteError(f"process {pid} runs CPython {named[0]}.{named[1]} ({binary}); ddprof_nb reads CPython "
                              "3.11 and later")
        if "_PyRuntime" not in syms or base is None:
            raise RemoteError(f"process {pid} ({self._exe_name()}) is not a CPython process: no _PyRuntime symbol "
                              f"in {binary}")
        if "Py_Version" not in syms:
            raise RemoteError(f"process {pid} runs a CPython older than 3.11 ({binary}); ddprof_nb reads 3.11 and later")
        self.version = self._read_version(base + syms["Py_Version"])
        if self.free_threaded:
            raise RemoteError(f"process {pid} runs a free-threaded CPython {self.version_text} ({binary}): its layout "
                              "is not supported")
        if not (3, 11) <= self.version[:2]:
            raise RemoteError(f"process {pid} runs CPython {self.version_text} ({binary}); ddprof_nb reads CPython "
                              "3.11 and later")
        missing = [s for s in _SYMBOLS if s not in syms]
        if missing:
            raise RemoteError(f"process {pid}: {binary} lacks the symbols {', '.join(missing)}")
        self._codes: dict[tuple[int, int], tuple[str, str, int, bytes] | None] = {}
        self._frame_cache: dict[tuple[int, int, int], Frame] = {}
        self._py: PyReader | None = None
        if self.version[:2] != sys.version_info[:2] or lib is None:
            self._open_foreign(base, syms)
        else:
            self._open_native(base, syms)

    def _open_foreign(self, base: int, syms: dict[str, int]) -> None:
        """Read the target with the Python reader and the target's own layout."""
        try:
            self._py = PyReader(self.pid, self.version[:2], base + syms["_PyRuntime"], base + syms["PyCode_Type"],
                                base + syms["PyUnicode_Type"], base + syms["PyBytes_Type"])
        except LayoutError as exc:
            raise RemoteError(f"process {self.pid}: {exc}") from None
        except Torn as exc:
            raise RemoteError(f"process {self.pid} (CPython {self.version_text}) cannot be read now: {exc}") from None
        except OSError as exc:
            raise _os_error(self.pid, exc.errno or errno.EPERM, "opening it") from None
        self.layout_note = (f"read by ddprof_nb's Python reader, with {self._py.layout_source} (this is CPython "
                            f"{platform.python_version()})")

    def _open_native(self, base: int, syms: dict[str, int]) -> None:
        """Read the target with the native walker, compiled for this (the target's) version."""
        ffi, lib, pid = self._ffi, self._lib, self.pid
        # 3.13+ targets have their published offsets checked at open; 3.11/3.12 publish none,
        # so another patch release is read with this build's layout (every read validated)
        self.layout_note = ""
        if self.version != tuple(sys.version_info[:3]) and self.version[:2] < (3, 13):
            self.layout_note = (f"read with CPython {platform.python_version()}'s layout ({self.version_text} publishes "
                                "no offsets to check it against; every read is validated)")
        t = self._t = ffi.new("ddp_remote *")
        t.pid = pid
        t.runtime = base + syms["_PyRuntime"]
        t.code_type = base + syms["PyCode_Type"]
        t.unicode_type = base + syms["PyUnicode_Type"]
        t.bytes_type = base + syms["PyBytes_Type"]
        msg = ffi.new("char[]", 512)
        rc = lib.ddp_remote_open(t, msg, 512)
        if rc != 0:
            self._raise(rc, "opening it", ffi.string(msg).decode("utf-8", "replace"))
        self._cap = 256
        self._tstates = ffi.new("uint64_t[]", self._cap)
        self._tids = ffi.new("int64_t[]", self._cap)
        self._frames = ffi.new("ddp_frame[]", MAX_DEPTH)
        self._flags = ffi.new("uint16_t *")
        self._info = ffi.new("ddp_code_info *")
        self._bufs = [ffi.new("char[]", 512), ffi.new("char[]", 4096), ffi.new("uint8_t[]", 16384)]

    # -- discovery ------------------------------------------------------------------------
    def _exe_name(self) -> str:
        try:
            return os.readlink(f"/proc/{self.pid}/exe")
        except OSError:
            return self.cmdline.split(" ", 1)[0] or "?"

    def _python_binary(self, maps) -> tuple[str, bool]:
        """The file holding the interpreter (libpython, else the executable), and whether its
        name says free-threaded (libpython3.13t.so, python3.13t)."""
        for m in maps:
            if _LIBPYTHON.search(m.path):
                return m.path, _free_threaded_name(m.path)
        try:
            exe = os.readlink(f"/proc/{self.pid}/exe")
        except OSError as exc:
            if not maps:  # no memory and no executable: it has exited (a zombie) or is a kernel thread
                raise RemoteError(f"process {self.pid} has exited (or is a kernel thread): nothing to read") from None
            raise _os_error(self.pid, exc.errno or errno.EACCES, "finding its executable") from None
        return exe, _free_threaded_name(exe)

    def _read_version(self, addr: int) -> tuple[int, int, int]:
        try:
            v = int.from_bytes(read_memory(self.pid, addr, 8), "little")
        except Torn:
            raise RemoteError(f"process {self.pid}: its Py_Version symbol points to no memory") from None
        except OSError as exc:
            raise _os_error(self.pid, exc.errno or errno.EPERM, "reading its Python version") from None
        return (v >> 24) & 0xFF, (v >> 16) & 0xFF, (v >> 8) & 0xFF

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))

    def _raise(self, rc: int, what: str, msg: str = ""):
        lib = self._lib
        if rc == lib.DDP_ESYS:
            raise _os_error(self.pid, lib.ddp_last_errno(), what)
        if rc == lib.DDP_EUNSUPPORTED:
            raise RemoteError(f"process {self.pid} (CPython {self.version_text}): {msg}")
        if not os.path.exists(f"/proc/{self.pid}"):
            raise RemoteError(f"process {self.pid} exited while {what}")
        raise TornRead(f"process {self.pid}: its interpreter state changed while {what}; try again")

    def _foreign(self, read, what: str):
        """``read()`` of the Python reader, its failures as this module's errors."""
        try:
            return read()
        except Torn:
            if not os.path.exists(f"/proc/{self.pid}"):
                raise RemoteError(f"process {self.pid} exited while {what}") from None
            raise TornRead(f"process {self.pid}: its interpreter state changed while {what}; try again") from None
        except OSError as exc:
            raise _os_error(self.pid, exc.errno or errno.EPERM, what) from None

    # -- reading --------------------------------------------------------------------------
    def threads(self) -> list[tuple[int, int]]:
        """(thread state address, native tid) of every thread of the main interpreter."""
        if self._py is not None:
            return self._foreign(self._py.threads, "listing its threads")
        while True:
            n = self._lib.ddp_remote_threads(self._t, self._tstates, self._tids, self._cap)
            if n < 0:
                self._raise(n, "listing its threads")
            if n <= self._cap:
                return [(self._tstates[i], self._tids[i]) for i in range(n)]
            self._cap = n * 2
            self._tstates = self._ffi.new("uint64_t[]", self._cap)
            self._tids = self._ffi.new("int64_t[]", self._cap)

    def gil_holder(self) -> int:
        """The thread state holding the GIL (0: none)."""
        if self._py is not None:
            return self._py.gil_holder()
        return self._lib.ddp_remote_gil_holder(self._t)

    def gil_range(self) -> tuple[int, int]:
        if self._py is not None:
            return self._py.gil_range()
        return self._t.gil, self._t.gil + self._t.gil_size

    def raw_stack(self, tstate: int, tid: int) -> tuple[list[tuple[int, int, int, int]], bool] | None:
        """(code, fingerprint, lasti, firstlineno) per frame, innermost first, and whether it was
        truncated; None for a torn read (the thread moved under it: the next look may work)."""
        if self._py is not None:
            try:
                return self._foreign(lambda: self._py.walk(tstate, tid, MAX_DEPTH), "reading a thread's stack")
            except TornRead:
                return None
        depth = self._lib.ddp_remote_walk(self._t, tstate, tid, self._frames, MAX_DEPTH, self._flags)
        if depth == self._lib.DDP_EINVAL:
            return None
        if depth < 0:
            self._raise(depth, "reading a thread's stack")
        fr = self._frames
        return ([(fr[i].code, fr[i].fp, fr[i].lasti, fr[i].firstlineno) for i in range(depth)],
                bool(self._flags[0] & self._lib.DDP_REC_TRUNCATED))

    def frame(self, code: int, fp: int, lasti: int) -> Frame | None:
        """The Frame of a captured frame (None when its code object is gone)."""
        key = (code, fp, lasti)
        hit = self._frame_cache.get(key)
        if hit is not None:
            return hit
        info = self._code(code, fp)
        if info is None:
            return None
        qualname, filename, first, lt = info
        if self._py is not None:
            line = line_of(lt, first, lasti)
        else:
            line = self._lib.ddp_addr2line(lt, len(lt), first, lasti) if lt else first
        out = self._frame_cache[key] = Frame(qualname, filename, line, first)
        return out

    def _code(self, code: int, fp: int):
        key = (code, fp)
        if key in self._codes:
            return self._codes[key]
        if self._py is not None:
            return self._foreign(lambda: self._py.code(code, fp), "reading a code object")
        lib, ffi = self._lib, self._ffi
        for _ in range(2):
            q, f, lt = self._bufs
            rc = lib.ddp_remote_resolve(self._t, code, fp, self._info, q, len(q), f, len(f), lt, len(lt))
            if rc == 1:  # a buffer was too small: grow it to what the info says
                i = self._info
                self._bufs = [ffi.new("char[]", max(len(q), i.qualname_len + 1)),
                              ffi.new("char[]", max(len(f), i.filename_len + 1)),
                              ffi.new("uint8_t[]", max(len(lt), i.linetable_len + 1))]
                continue
            break
        if rc == lib.DDP_ESYS:
            self._raise(rc, "reading a code object")
        if rc != 0:
            return None  # freed or replaced since the walk: not cached, it may be another code later
        i = self._info
        out = (ffi.unpack(q, i.qualname_len).decode("utf-8", "surrogatepass"),
               ffi.unpack(f, i.filename_len).decode("utf-8", "surrogatepass"),
               i.firstlineno, bytes(ffi.buffer(lt, i.linetable_len)))
        self._codes[key] = out
        return out

    def stack(self, tstate: int, tid: int, tries: int = 5) -> tuple[list[Frame], bool]:
        """A thread's frames, innermost first, and whether the stack was truncated."""
        for _ in range(tries):
            raw = self.raw_stack(tstate, tid)
            if raw is None:
                continue
            frames = [self.frame(c, fp, lasti) for c, fp, lasti, _first in raw[0]]
            if all(f is not None for f in frames):
                return frames, raw[1]
        raise RemoteError(f"the stack of thread {tid} kept changing while read")

    def thread_name(self, tid: int) -> str:
        return (_read_text(f"/proc/{self.pid}/task/{tid}/comm") or "").strip()

    def state_of(self, st: ThreadStat | None) -> str:
        if st is None:
            return ""
        if st.state == "R":
            return "cpu"
        lo, hi = self.gil_range()
        if st.futex is not None and lo and lo <= st.futex < hi:
            return "gil"
        return "off-cpu"

    def dump(self) -> list[ThreadInfo]:
        """Every thread's stack and state, the main thread first."""
        out = []
        holder = self.gil_holder()
        for tstate, tid in self.threads():
            st = thread_stat(self.pid, tid)
            info = ThreadInfo(tid=tid, name=self.thread_name(tid), main=tid == self.pid, holds_gil=tstate == holder,
                              state=self.state_of(st))
            try:
                info.frames, info.truncated = self.stack(tstate, tid)
            except RemoteError as exc:
                if not os.path.exists(f"/proc/{self.pid}"):
                    raise RemoteError(f"process {self.pid} exited while reading its threads") from None
                if not os.path.exists(f"/proc/{self.pid}/task/{tid}"):
                    continue  # the thread ended while read: it is no longer part of the process
                info.error = str(exc)
            out.append(info)
        out.sort(key=lambda t: (not t.main, t.tid))
        return out

    def close(self) -> None:
        self._codes.clear()
        self._frame_cache.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_STATE_TEXT = {"cpu": "on CPU", "off-cpu": "off CPU", "gil": "waiting for the GIL", "": "state unknown"}


def format_dump(target: Target, threads: list[ThreadInfo]) -> str:
    """The dump as text, innermost call first in each thread (as py-spy prints it)."""
    lines = [f"Process {target.pid}: {target.cmdline or '?'}",
             f"Python {target.version_text} ({target.binary})"
             + (f"; {target.layout_note}" if target.layout_note else ""),
             "Stacks: innermost call first.", ""]
    for t in threads:
        tags = (["main thread"] if t.main else []) + (["holds the GIL"] if t.holds_gil else []) + [_STATE_TEXT[t.state]]
        lines.append(f"Thread {t.tid} \"{t.name}\" ({', '.join(tags)})")
        if t.error:
            lines.append(f"    (stack not read: {t.error})")
        elif not t.frames:
            lines.append("    (no Python frames)")
        for f in t.frames:
            lines.append(f"    {f.name} ({f.filename}:{f.line})")
        if t.truncated:
            lines.append(f"    ... (deeper than {MAX_DEPTH} frames: the outermost are not shown)")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def dump_text(pid: int) -> str:
    """``python -m ddprof_nb dump PID`` as a string (RemoteError when it cannot be read)."""
    with Target(pid) as target:
        return format_dump(target, target.dump())
