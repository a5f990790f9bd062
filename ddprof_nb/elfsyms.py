"""Symbol addresses of an ELF file mapped into another process (reading it from outside).

Only what a dump needs: the values of a few named symbols in the file's ``.dynsym`` and
``.symtab`` (64-bit little-endian ELF), and where the file is loaded in a process
(``/proc/PID/maps``), so that ``address = load base + symbol value``.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

__all__ = ["ElfError", "Mapping", "symbols", "load_base", "mappings"]

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_ET_EXEC, _PT_LOAD, _SHT_SYMTAB, _SHT_DYNSYM = 2, 1, 2, 11
_PF_X = 1  # p_flags: an executable segment


class ElfError(ValueError):
    """Not an ELF file this reader understands."""


class Mapping(NamedTuple):
    """One line of /proc/PID/maps."""

    start: int
    end: int
    perms: str
    offset: int
    path: str


def mappings(pid: int, code_and_files: bool = False) -> list[Mapping]:
    """The memory map of ``pid`` (OSError when it cannot be read); with ``code_and_files``,
    without the anonymous data mappings (most of a busy process's lines: heaps, stacks)."""
    with open(f"/proc/{pid}/maps") as f:
        lines = f.read().splitlines()
    out = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 5 or (code_and_files and len(parts) == 5 and "x" not in parts[1]):
            continue
        lo, _, hi = parts[0].partition("-")
        out.append(Mapping(int(lo, 16), int(hi, 16), parts[1], int(parts[2], 16),
                           parts[5].strip() if len(parts) > 5 else ""))
    return out


def _header(data: bytes):
    if len(data) < _EHDR.size or data[:4] != b"\x7fELF":
        raise ElfError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    return _EHDR.unpack_from(data)


def symbols(data: bytes, names) -> dict[str, int]:
    """Values (st_value) of those of ``names`` the file defines."""
    h = _header(data)
    shoff, shentsize, shnum = h[6], h[11], h[12]
    wanted = {n.encode() for n in names}
    found: dict[str, int] = {}
    sections = [_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)
                if shoff + (i + 1) * shentsize <= len(data)]
    for sh in sections:
        if sh[1] not in (_SHT_SYMTAB, _SHT_DYNSYM) or not sh[9] or sh[6] >= len(sections):
            continue
        strtab = sections[sh[6]]
        s_off, s_end = strtab[4], strtab[4] + strtab[5]
        table = data[sh[4]:sh[4] + sh[5]]
        for name_off, _info, _other, shndx, value, _size in _SYM.iter_unpack(table[:len(table) // _SYM.size * _SYM.size]):
            if not value or not shndx:  # undefined here (imported from another object)
                continue
            at = s_off + name_off
            if at >= s_end:
                continue
            name = data[at:data.index(b"\0", at)]
            if name in wanted:
                found.setdefault(name.decode(), value)
        if len(found) == len(wanted):
            break
    return found


def load_base(data: bytes, maps: list[Mapping], path: str) -> int | None:
    """What to add to a symbol value of the file at ``path`` to get its address in the
    process whose map is ``maps`` (None when the file is not mapped there)."""
    h = _header(data)
    if h[1] == _ET_EXEC:  # a fixed-address executable: values are addresses
        return 0
    phoff, phentsize, phnum = h[5], h[9], h[10]
    loads = [_PHDR.unpack_from(data, phoff + i * phentsize) for i in range(phnum)]
    loads = [p for p in loads if p[0] == _PT_LOAD]
    if not loads:
        raise ElfError("no loadable segment")
    first = min(loads, key=lambda p: p[3])  # (p_type, p_flags, p_offset, p_vaddr, ...)
    code = [p for p in loads if p[1] & _PF_X]
    page = os.sysconf("SC_PAGE_SIZE")
    mine = [m for m in maps if m.path == path]
    executable = {m.start for m in mine if "x" in m.perms}
    for m in mine:
        if m.offset == first[2] & ~(page - 1):
            bias = m.start - (first[3] & ~(page - 1))
            # the loader's mapping, not a whole-file mmap of the same file (a symbol reader's,
            # ours among them): its code segment is mapped where the bias puts it
            if not code or bias + (code[0][3] & ~(page - 1)) in executable:
                return bias
    return None
