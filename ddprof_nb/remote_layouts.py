"""Where CPython 3.11 to 3.15 keep what a stack walk reads, as data: one ``Layout`` per target.

3.13 and later publish their offsets at the start of ``_PyRuntime`` (``_Py_DebugOffsets``:
the cookie ``xdebugpy``, the version, then sections of 64-bit offsets and sizes); the list of
fields of each section differs between minor versions, so ``SECTIONS`` names them per version
and ``from_debug_offsets`` takes each value by name.  3.11 and 3.12 publish nothing: their
offsets are built-in tables (x86-64 and aarch64 share them: LP64, same alignment), taken from
each version's internal headers and checked against real interpreters by the tests.

Facts every version shares (non-free-threaded builds): ``ob_type`` at 8; the unicode
``state`` word holds kind in bits 2-4, compact in bit 5, ascii in bit 6; the GIL's state
structure is 208 bytes; the location table has one format.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["Layout", "LayoutError", "COOKIE", "DEBUG_OFFSETS_SIZE", "TABLES", "SECTIONS", "from_debug_offsets",
           "for_version", "line_of"]

COOKIE = b"xdebugpy"
OB_TYPE = 8
GIL_SIZE = 208


class LayoutError(ValueError):
    """The target's layout is not one this reader knows (the message names the version)."""


@dataclass(frozen=True)
class Layout:
    """Byte offsets of what a walk reads; ``None`` where a version has no such field."""

    version: tuple[int, int]
    interpreters_head: int  # in _PyRuntime
    threads_head: int  # in PyInterpreterState
    gil_in_runtime: int | None  # 3.11: the GIL state lives in _PyRuntime at this offset
    gil_pointer: int | None  # 3.12+: PyInterpreterState holds a pointer to its GIL state here
    gil_locked: int  # in the GIL state (an int)
    gil_holder: int  # in the GIL state (the last holder's thread state)
    tstate_next: int
    tstate_native_thread_id: int
    tstate_frame: int  # 3.13+: current_frame; 3.11/3.12: the pointer to the _PyCFrame
    cframe_current_frame: int | None  # 3.11/3.12: current_frame inside _PyCFrame
    frame_previous: int
    frame_code: int  # f_code (3.11/3.12), f_executable (3.13+)
    frame_instr: int  # prev_instr (3.11/3.12), instr_ptr (3.13+)
    frame_owner: int  # a one-byte enum
    code_tag_bits: int  # 3.14+: f_executable is a tagged reference (mask these low bits)
    owner_shim_min: int | None  # owners from here up are interpreter/C-stack shims: not shown
    owner_max: int  # the highest valid owner value (above: a torn read)
    code_filename: int
    code_name: int
    code_qualname: int
    code_linetable: int
    code_firstlineno: int  # an int
    code_adaptive: int  # co_code_adaptive: the first code unit
    unicode_length: int
    unicode_state: int
    ascii_size: int  # sizeof(PyASCIIObject): where compact ASCII text starts
    compact_size: int  # sizeof(PyCompactUnicodeObject): where other compact text starts
    bytes_size: int  # ob_size of a bytes object
    bytes_data: int  # ob_sval

    @property
    def frame_span(self) -> int:
        """Bytes of a frame to read at once: up to its last field read."""
        return max(self.frame_previous, self.frame_code, self.frame_instr, self.frame_owner) + 8

    @property
    def code_span(self) -> int:
        return max(self.code_filename, self.code_name, self.code_qualname, self.code_linetable,
                   self.code_firstlineno, OB_TYPE, 16) + 8


# 3.11 and 3.12 (offsetof in each version's internal headers, x86-64/aarch64)
TABLES = {
    (3, 11): Layout(
        version=(3, 11), interpreters_head=40, threads_head=16, gil_in_runtime=360, gil_pointer=None,
        gil_locked=16, gil_holder=8, tstate_next=8, tstate_native_thread_id=160, tstate_frame=56,
        cframe_current_frame=8, frame_previous=48, frame_code=32, frame_instr=56, frame_owner=69, code_tag_bits=0,
        owner_shim_min=None, owner_max=2, code_filename=112, code_name=120, code_qualname=128, code_linetable=136,
        code_firstlineno=72, code_adaptive=184, unicode_length=16, unicode_state=32, ascii_size=48, compact_size=72,
        bytes_size=16, bytes_data=32),
    (3, 12): Layout(
        version=(3, 12), interpreters_head=40, threads_head=72, gil_in_runtime=None, gil_pointer=384,
        gil_locked=16, gil_holder=8, tstate_next=8, tstate_native_thread_id=144, tstate_frame=56,
        cframe_current_frame=0, frame_previous=8, frame_code=0, frame_instr=56, frame_owner=70, code_tag_bits=0,
        owner_shim_min=3, owner_max=3, code_filename=112, code_name=120, code_qualname=128, code_linetable=136,
        code_firstlineno=68, code_adaptive=192, unicode_length=16, unicode_state=32, ascii_size=40, compact_size=56,
        bytes_size=16, bytes_data=32),
}

# _Py_DebugOffsets per minor version: (section, its fields) in order, every field a uint64
# after the 8-byte cookie; only the sections up to the last one used are listed
_V313 = (
    ("", ("version", "free_threaded")),
    ("runtime_state", ("size", "finalizing", "interpreters_head")),
    ("interpreter_state", ("size", "id", "next", "threads_head", "gc", "imports_modules", "sysdict", "builtins",
                           "ceval_gil", "gil_runtime_state", "gil_runtime_state_enabled", "gil_runtime_state_locked",
                           "gil_runtime_state_holder")),
    ("thread_state", ("size", "prev", "next", "interp", "current_frame", "thread_id", "native_thread_id",
                      "datastack_chunk", "status")),
    ("interpreter_frame", ("size", "previous", "executable", "instr_ptr", "localsplus", "owner")),
    ("code_object", ("size", "filename", "name", "qualname", "linetable", "firstlineno", "argcount",
                     "localsplusnames", "localspluskinds", "co_code_adaptive")),
    ("pyobject", ("size", "ob_type")),
    ("type_object", ("size", "tp_name", "tp_repr", "tp_flags")),
    ("tuple_object", ("size", "ob_item", "ob_size")),
    ("list_object", ("size", "ob_item", "ob_size")),
    ("dict_object", ("size", "ma_keys", "ma_values")),
    ("float_object", ("size", "ob_fval")),
    ("long_object", ("size", "lv_tag", "ob_digit")),
    ("bytes_object", ("size", "ob_size", "ob_sval")),
    ("unicode_object", ("size", "state", "length", "asciiobject_size")),
)
_V314 = (
    _V313[0], _V313[1],
    ("interpreter_state", ("size", "id", "next", "threads_head", "threads_main", "gc", "imports_modules", "sysdict",
                           "builtins", "ceval_gil", "gil_runtime_state", "gil_runtime_state_enabled",
                           "gil_runtime_state_locked", "gil_runtime_state_holder", "code_object_generation",
                           "tlbc_generation")),
    _V313[3],
    ("interpreter_frame", ("size", "previous", "executable", "instr_ptr", "localsplus", "owner", "stackpointer",
                           "tlbc_index")),
    ("code_object", _V313[5][1] + ("co_tlbc",)),
    _V313[6], _V313[7], _V313[8], _V313[9],
    ("set_object", ("size", "used", "table", "mask")),
    *_V313[10:],
)
_V315 = (
    *_V314[:3],
    ("thread_state", ("size", "prev", "next", "interp", "current_frame", "base_frame", "last_profiled_frame",
                      "last_profiled_frame_seq", "thread_id", "native_thread_id", "datastack_chunk", "status",
                      "holds_gil", "gil_requested", "current_exception", "exc_state")),
    ("err_stackitem", ("exc_value",)),
    _V314[4], _V314[5], _V314[6],
    ("type_object", ("size", "tp_name", "tp_repr", "tp_flags", "tp_basicsize", "tp_dictoffset")),
    ("heap_type_object", ("size", "ht_cached_keys")),
    *_V314[8:-1],
    ("unicode_object", ("size", "state", "length", "asciiobject_size", "compactunicodeobject_size")),
)
SECTIONS = {(3, 13): _V313, (3, 14): _V314, (3, 15): _V315}
# frame owners: 3.13 CSTACK = 3; 3.14 INTERPRETER = 3, CSTACK = 4; 3.15 INTERPRETER = 3
_OWNER_MAX = {(3, 13): 3, (3, 14): 4, (3, 15): 3}
_TAG_BITS = {(3, 13): 0, (3, 14): 3, (3, 15): 3}

DEBUG_OFFSETS_SIZE = 8 + 8 * max(sum(len(f) for _, f in s) for s in SECTIONS.values())


def _fields(raw: bytes, sections) -> dict[str, int]:
    names = [f"{sec}.{f}" if sec else f for sec, fields in sections for f in fields]
    if len(raw) < 8 + 8 * len(names):
        raise LayoutError("the published offsets are shorter than their layout")
    return dict(zip(names, struct.unpack_from(f"<{len(names)}Q", raw, 8)))


def from_debug_offsets(raw: bytes, version: tuple[int, int]) -> Layout:
    """The layout a 3.13+ target publishes in ``raw`` (the start of its ``_PyRuntime``)."""
    named = ".".join(map(str, version))
    if raw[:8] != COOKIE:
        raise LayoutError(f"CPython {named} publishes no debug offsets (no {COOKIE.decode()} cookie at _PyRuntime)")
    sections = SECTIONS.get(version)
    if sections is None:
        raise LayoutError(f"CPython {named}: the layout of its published offsets is not known to this ddprof_nb "
                          "(it reads CPython 3.11 to 3.15)")
    d = _fields(raw, sections)
    if (d["version"] >> 24, (d["version"] >> 16) & 0xFF) != version:
        raise LayoutError(f"CPython {named}: its published offsets carry another version ({d['version']:#x})")
    if d["free_threaded"]:
        raise LayoutError(f"CPython {named} is a free-threaded build: its layout is not supported")
    gil = d["interpreter_state.gil_runtime_state"]
    compact = d.get("unicode_object.compactunicodeobject_size", d["unicode_object.asciiobject_size"] + 16)
    layout = Layout(
        version=version, interpreters_head=d["runtime_state.interpreters_head"],
        threads_head=d["interpreter_state.threads_head"], gil_in_runtime=None,
        gil_pointer=d["interpreter_state.ceval_gil"], gil_locked=d["interpreter_state.gil_runtime_state_locked"] - gil,
        gil_holder=d["interpreter_state.gil_runtime_state_holder"] - gil, tstate_next=d["thread_state.next"],
        tstate_native_thread_id=d["thread_state.native_thread_id"], tstate_frame=d["thread_state.current_frame"],
        cframe_current_frame=None, frame_previous=d["interpreter_frame.previous"],
        frame_code=d["interpreter_frame.executable"], frame_instr=d["interpreter_frame.instr_ptr"],
        frame_owner=d["interpreter_frame.owner"], code_tag_bits=_TAG_BITS[version], owner_shim_min=3,
        owner_max=_OWNER_MAX[version], code_filename=d["code_object.filename"], code_name=d["code_object.name"],
        code_qualname=d["code_object.qualname"], code_linetable=d["code_object.linetable"],
        code_firstlineno=d["code_object.firstlineno"], code_adaptive=d["code_object.co_code_adaptive"],
        unicode_length=d["unicode_object.length"], unicode_state=d["unicode_object.state"],
        ascii_size=d["unicode_object.asciiobject_size"], compact_size=compact,
        bytes_size=d["bytes_object.ob_size"], bytes_data=d["bytes_object.ob_sval"])
    _check(layout, d, named)
    return layout


def _check(layout: Layout, d: dict[str, int], named: str) -> None:
    """Refuse values no real interpreter has: a wrong section list reads garbage as offsets."""
    bounds = {"interpreter_frame": ("previous", "executable", "instr_ptr", "owner"),
              "code_object": ("filename", "name", "qualname", "linetable", "firstlineno", "co_code_adaptive"),
              "thread_state": ("next", "native_thread_id", "current_frame"),
              "interpreter_state": ("threads_head", "ceval_gil", "gil_runtime_state_holder"),
              "bytes_object": ("ob_size", "ob_sval"), "unicode_object": ("state", "length")}
    for sec, fields in bounds.items():
        size = d[f"{sec}.size"]
        for f in fields:
            if not 0 <= d[f"{sec}.{f}"] < size <= 1 << 20:
                raise LayoutError(f"CPython {named}: its published offset {sec}.{f} ({d[f'{sec}.{f}']}) is outside "
                                  f"its structure ({size} bytes): the layout is not the one this ddprof_nb knows")
    gil_fields_inside = 0 <= layout.gil_locked < GIL_SIZE and 0 <= layout.gil_holder < GIL_SIZE
    if d["pyobject.ob_type"] != OB_TYPE or not gil_fields_inside:
        raise LayoutError(f"CPython {named}: its published object or GIL offsets are not the ones this ddprof_nb knows")


def for_version(version: tuple[int, int]) -> Layout:
    """The built-in table of a version that publishes no offsets (3.11, 3.12)."""
    try:
        return TABLES[version]
    except KeyError:
        raise LayoutError(f"CPython {'.'.join(map(str, version))}: no built-in layout") from None


def line_of(linetable: bytes, firstlineno: int, lasti: int) -> int:
    """The line of code unit ``lasti`` from a 3.11+ location table (``firstlineno`` when none).
    Entries start with a byte 1CCCCLLL: code C, L+1 code units; 15: no location; 14: long
    form (a signed varint line delta, then three varints); 13: no column (a signed varint
    line delta); 10-12: one-line form (delta C-10, two bytes); 0-9: short form (one byte)."""
    if lasti < 0:
        return firstlineno
    try:
        return _line_of(linetable, firstlineno, lasti)
    except ValueError:
        return firstlineno


def _line_of(linetable: bytes, firstlineno: int, lasti: int) -> int:
    line, addr, i, n = firstlineno, 0, 0, len(linetable)

    def varint() -> int:
        nonlocal i
        v = shift = 0
        while i < n:
            if shift > 24:
                raise ValueError("an over-long varint")  # malformed (a hostile table could be megabytes of it)
            c = linetable[i]
            i += 1
            v |= (c & 63) << shift
            shift += 6
            if not c & 64:
                break
        return v

    while i < n:
        b = linetable[i]
        i += 1
        if not b & 0x80:
            return firstlineno  # not an entry start: malformed
        code, units = (b >> 3) & 15, (b & 7) + 1
        delta = 0
        if code in (13, 14):
            v = varint()
            delta = -(v >> 1) if v & 1 else v >> 1
            if code == 14:
                for _ in range(3):
                    varint()
        elif code >= 10 and code != 15:
            delta, i = code - 10, i + 2
        elif code < 10:
            i += 1
        line += delta
        if lasti < addr + units:
            return firstlineno if code == 15 else line
        addr += units
    return line
