"""Another process's threads and stacks read in Python, for any CPython 3.11 to 3.15.

The native walker reads a target of the version it is compiled for; this reader takes the
target's layout as data (ddprof_nb.remote_layouts) and reads its memory with
process_vm_readv, one read per structure: a frame, a code object's header, a string.
Nothing read is trusted: pointers are checked for alignment, chains for cycles and length,
objects for their type, sizes and indices for bounds.  A check that fails means the target
changed under the read (``Torn``: the caller tries again) or a freed code object (``None``);
a failed system call is an ``OSError`` with its errno (no rights, process gone).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

from .remote_layouts import DEBUG_OFFSETS_SIZE, GIL_SIZE, OB_TYPE, Layout, for_version, from_debug_offsets

__all__ = ["Torn", "PyReader", "read_memory"]

MAX_CHAIN = 100_000  # thread states or frames followed before calling the chain a cycle
MAX_TEXT = 1 << 20  # characters of a name or file name
MAX_BYTES = 1 << 22  # bytes of a location table

_U64 = struct.Struct("<Q")


class Torn(Exception):
    """What was read does not hold together: the target changed under the read."""


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_readv = getattr(ctypes.CDLL(None, use_errno=True), "process_vm_readv", None)  # Linux only
if _readv is not None:
    _readv.restype = ctypes.c_ssize_t
    _readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                       ctypes.c_ulong]


class _Memory:
    """Reads of one process's memory into a buffer reused from read to read (a read costs a
    system call and a copy, nothing more: a walk makes two per frame)."""

    def __init__(self, pid: int):
        self.pid = pid
        self._grow(1 << 12)

    def _grow(self, n: int) -> None:
        self._buf = ctypes.create_string_buffer(n)
        self._local, self._remote = _IoVec(ctypes.addressof(self._buf), 0), _IoVec(0, 0)
        self._args = (self.pid, ctypes.byref(self._local), 1, ctypes.byref(self._remote), 1, 0)

    def read(self, addr: int, n: int) -> bytes:
        """``n`` bytes at ``addr``: Torn when the address is not (or no longer wholly) mapped,
        OSError for anything else (no rights, no such process)."""
        if _readv is None:
            raise OSError(errno.ENOSYS, "this system cannot read another process's memory (no process_vm_readv)")
        if not 0 < addr < 1 << 63 or n < 0:
            raise Torn(f"address {addr:#x}")
        if n > len(self._buf):
            self._grow(n)
        self._local.len = self._remote.len = n
        self._remote.base = addr
        got = _readv(*self._args)
        if got == n:
            return self._buf.raw[:n] if n > 256 else ctypes.string_at(self._local.base, n)
        err = ctypes.get_errno() if got < 0 else errno.EFAULT
        if err == errno.EFAULT:
            raise Torn(f"unmapped address {addr:#x}")
        raise OSError(err, os.strerror(err))


def read_memory(pid: int, addr: int, n: int) -> bytes:
    """One read of ``pid``'s memory (see ``_Memory.read``)."""
    return _Memory(pid).read(addr, n)


def _u64(raw: bytes, at: int) -> int:
    return _U64.unpack_from(raw, at)[0]


def _i32(raw: bytes, at: int) -> int:
    return struct.unpack_from("<i", raw, at)[0]


def _pointer(value: int) -> int:
    if value & 7:
        raise Torn(f"misaligned pointer {value:#x}")
    return value


class PyReader:
    """One target's interpreter, read with its own layout."""

    def __init__(self, pid: int, version: tuple[int, int], runtime: int, code_type: int, unicode_type: int,
                 bytes_type: int):
        self.pid, self.code_type, self.unicode_type, self.bytes_type = pid, code_type, unicode_type, bytes_type
        self._read = _Memory(pid).read
        if version >= (3, 13):
            self.layout: Layout = from_debug_offsets(self._read(runtime, DEBUG_OFFSETS_SIZE), version)
            self.layout_source = "the offsets the target publishes"
        else:
            self.layout = for_version(version)
            self.layout_source = f"a built-in table of CPython {version[0]}.{version[1]}'s offsets"
        lay = self.layout
        self.interp = _pointer(_u64(self._read(runtime + lay.interpreters_head, 8), 0))
        if not self.interp:
            raise Torn("no interpreter yet (starting up or finalizing)")
        if lay.gil_in_runtime is not None:
            self.gil = runtime + lay.gil_in_runtime
        else:
            self.gil = _pointer(_u64(self._read(self.interp + lay.gil_pointer, 8), 0))
        self._codes: dict[tuple[int, int], tuple[str, str, int, bytes]] = {}

    # -- threads and the GIL ---------------------------------------------------------------
    def threads(self) -> list[tuple[int, int]]:
        """(thread state, native tid) of every thread of the main interpreter."""
        lay = self.layout
        span = max(lay.tstate_next, lay.tstate_native_thread_id) + 8
        out, seen = [], set()
        tstate = _pointer(_u64(self._read(self.interp + lay.threads_head, 8), 0))
        while tstate:
            if tstate in seen or len(seen) > MAX_CHAIN:
                raise Torn("a cycle in the thread list")
            seen.add(tstate)
            raw = self._read(tstate, span)
            out.append((tstate, _u64(raw, lay.tstate_native_thread_id)))
            tstate = _pointer(_u64(raw, lay.tstate_next))
        return out

    def gil_holder(self) -> int:
        """The thread state holding the GIL, 0 when none holds it (or it cannot be read)."""
        if not self.gil:
            return 0
        try:
            raw = self._read(self.gil, GIL_SIZE)
        except (Torn, OSError):
            return 0
        return _u64(raw, self.layout.gil_holder) if _i32(raw, self.layout.gil_locked) else 0

    def gil_range(self) -> tuple[int, int]:
        return self.gil, self.gil + GIL_SIZE if self.gil else 0

    # -- stacks ----------------------------------------------------------------------------
    def _top_frame(self, tstate: int, tid: int) -> int:
        lay = self.layout
        raw = self._read(tstate, max(lay.tstate_frame, lay.tstate_native_thread_id) + 8)
        if _u64(raw, lay.tstate_native_thread_id) != tid:
            raise Torn("the thread state now belongs to another thread")
        top = _pointer(_u64(raw, lay.tstate_frame))
        if lay.cframe_current_frame is not None and top:  # 3.11/3.12: through the _PyCFrame
            top = _pointer(_u64(self._read(top + lay.cframe_current_frame, 8), 0))
        return top

    def walk(self, tstate: int, tid: int, max_depth: int) -> tuple[list[tuple[int, int, int, int]], bool]:
        """(code, fingerprint, lasti, firstlineno) per frame, innermost first, and whether the
        stack is deeper than ``max_depth``; Torn when it does not hold together."""
        lay = self.layout
        out: list[tuple[int, int, int, int]] = []
        seen = set()
        frame = self._top_frame(tstate, tid)
        while frame:
            if frame in seen or len(seen) > MAX_CHAIN:
                raise Torn("a cycle in the frame chain")
            seen.add(frame)
            raw = self._read(frame, lay.frame_span)
            previous = _pointer(_u64(raw, lay.frame_previous))
            owner = raw[lay.frame_owner]
            if owner > lay.owner_max:
                raise Torn(f"frame owner {owner}")
            if lay.owner_shim_min is not None and owner >= lay.owner_shim_min:
                frame = previous  # an entry shim of the eval loop: no Python code of its own
                continue
            bits = _u64(raw, lay.frame_code)
            if bits & lay.code_tag_bits > 1:  # 3.14+: only a strong (0) or deferred (1) reference
                raise Torn("a frame's code reference has an unknown tag")
            code = _pointer(bits & ~lay.code_tag_bits)
            head = self._read(code, lay.code_span) if code else b""
            if not head or _u64(head, OB_TYPE) != self.code_type:
                if lay.version >= (3, 13):
                    frame = previous  # 3.13+: some internal frames run no code object
                    continue
                raise Torn("a frame's code is not a code object")
            units = _u64(head, 16)  # ob_size: the code's length in code units
            lasti = (_u64(raw, lay.frame_instr) - code - lay.code_adaptive) // 2
            if not 0 < units < 1 << 26 or not -1 <= lasti < units:
                raise Torn("a frame's instruction is outside its code")
            if len(out) == max_depth:
                return out, True
            fields = tuple(_u64(head, at) for at in (lay.code_filename, lay.code_name, lay.code_qualname,
                                                      lay.code_linetable))
            first = _i32(head, lay.code_firstlineno)
            out.append((code, _fingerprint(fields, first, units), lasti, first))
            frame = previous
        return out, False

    # -- code objects ----------------------------------------------------------------------
    def code(self, code: int, fp: int) -> tuple[str, str, int, bytes] | None:
        """(qualname, filename, firstlineno, location table) of a code object, None when it is
        no longer the code the walk saw (freed or replaced)."""
        hit = self._codes.get((code, fp))
        if hit is not None:
            return hit
        lay = self.layout
        try:
            head = self._read(code, lay.code_span)
            if _u64(head, OB_TYPE) != self.code_type:
                return None
            fields = tuple(_u64(head, at) for at in (lay.code_filename, lay.code_name, lay.code_qualname,
                                                      lay.code_linetable))
            first = _i32(head, lay.code_firstlineno)
            if _fingerprint(fields, first, _u64(head, 16)) != fp:
                return None
            filename, _name, qualname, linetable = fields
            out = (self._text(qualname), self._text(filename), first, self._bytes(linetable))
        except Torn:
            return None
        self._codes[(code, fp)] = out
        return out

    def _text(self, addr: int) -> str:
        lay = self.layout
        head = self._read(_pointer(addr), lay.compact_size)
        if _u64(head, OB_TYPE) != self.unicode_type:
            raise Torn("not a str")
        length, state = _u64(head, lay.unicode_length), _i32(head, lay.unicode_state)
        kind, compact, ascii_ = (state >> 2) & 7, state >> 5 & 1, state >> 6 & 1
        if not compact or kind not in (1, 2, 4) or length > MAX_TEXT or (ascii_ and kind != 1):
            raise Torn("a str of an unknown form")
        if ascii_:
            return self._read(addr + lay.ascii_size, length).decode("ascii", "replace") if length else ""
        data = self._read(addr + lay.compact_size, length * kind) if length else b""
        return data.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind], "surrogatepass")

    def _bytes(self, addr: int) -> bytes:
        lay = self.layout
        head = self._read(_pointer(addr), lay.bytes_data)
        if _u64(head, OB_TYPE) != self.bytes_type:
            raise Torn("not a bytes object")
        size = _u64(head, lay.bytes_size)
        if size > MAX_BYTES:
            raise Torn("a location table too long")
        return self._read(addr + lay.bytes_data, size) if size else b""


def _fingerprint(fields: tuple[int, ...], first: int, units: int) -> int:
    """What tells a code object from another one later allocated at the same address."""
    return hash((*fields, first, units)) & 0xFFFF_FFFF_FFFF_FFFF or 1
