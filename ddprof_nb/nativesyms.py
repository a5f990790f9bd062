"""Names of native code addresses, resolved off the hot path.

A sampled native frame is a bare address.  Here it becomes (function, library): the
library from the process's memory map, the function from the library's ELF ``.symtab``
and ``.dynsym`` (function symbols sorted by address, read once per library), demangled
(``demangle.py``).  An address no symbol covers is ``library+0xoffset``, never ``??``.
"""

from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass

from . import elfsyms
from .demangle import demangle as _default_demangle

__all__ = ["NativeFrame", "Symbolizer"]

_SHT_SYMTAB, _SHT_DYNSYM, _STT_FUNC, _STT_GNU_IFUNC = 2, 11, 2, 10


@dataclass(frozen=True)
class NativeFrame:
    """A resolved address: its function (or ``lib+0xoff``) and the library's path."""

    name: str
    library: str
    offset: int  # in the library's file address space (symbol values' space)


class _Library:
    """One mapped ELF file's function symbols: starts, ends and names, sorted by start."""

    def __init__(self, path: str, bias: int):
        self.path, self.bias = path, bias
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.names: list[str] = []

    @classmethod
    def load(cls, path: str, maps: list[elfsyms.Mapping]) -> _Library | None:
        try:
            with open(path, "rb") as f:
                data = f.read()
            bias = elfsyms.load_base(data, maps, path)
        except (OSError, elfsyms.ElfError):
            return None
        lib = cls(path, bias or 0)
        lib._read_symbols(data)
        return lib

    def _read_symbols(self, data: bytes) -> None:
        h = elfsyms._header(data)
        shoff, shentsize, shnum = h[6], h[11], h[12]
        sections = [elfsyms._SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)
                    if shoff + (i + 1) * shentsize <= len(data)]
        best: dict[int, tuple[int, bytes]] = {}
        sym = elfsyms._SYM
        for sh in sections:
            # (name, type, flags, addr, offset, size, link, info, align, entsize); NOBITS tables: stripped
            if sh[1] not in (_SHT_SYMTAB, _SHT_DYNSYM) or sh[6] >= len(sections) or sh[4] + sh[5] > len(data):
                continue
            strtab = sections[sh[6]]
            s_off, s_end = strtab[4], min(strtab[4] + strtab[5], len(data))
            table = memoryview(data)[sh[4]:sh[4] + sh[5] // sym.size * sym.size]
            for name_off, info, _other, shndx, value, size in sym.iter_unpack(table):
                if not value or not shndx or (info & 0xF) not in (_STT_FUNC, _STT_GNU_IFUNC):
                    continue
                at = s_off + name_off
                if at >= s_end:
                    continue
                end = data.find(b"\0", at, s_end)
                name = data[at:end if end >= 0 else s_end]
                prev = best.get(value)
                # aliases at one address: keep the sized, then the global (bind 1), then the shorter
                key = (size > 0, info >> 4 == 1, -len(name))
                if prev is None or key > prev[2]:
                    best[value] = (size, name, key)
        for value in sorted(best):
            size, name, _ = best[value]
            self.starts.append(value)
            self.ends.append(value + size if size else value + 1)  # unsized: covers only up to the next
            self.names.append(name.decode("utf-8", "replace"))
        # an unsized symbol extends to the next symbol's start
        for i in range(len(self.starts)):
            if self.ends[i] == self.starts[i] + 1 and i + 1 < len(self.starts):
                self.ends[i] = self.starts[i + 1]

    def lookup(self, offset: int) -> str | None:
        i = bisect.bisect_right(self.starts, offset) - 1
        if i >= 0 and offset < self.ends[i]:
            return self.names[i]
        return None


class Symbolizer:
    """Resolves addresses of this (or another) process; libraries are read once each."""

    def __init__(self, pid: int | None = None, demangle=None):
        self.pid = pid or os.getpid()
        self._demangle = demangle or _default_demangle
        self._maps: list[elfsyms.Mapping] = []
        self._starts: list[int] = []
        self._libs: dict[str, _Library | None] = {}
        self._names: dict[str, str] = {}
        self.refresh()

    def refresh(self) -> None:
        """Re-read the memory map (after libraries were loaded)."""
        self._maps = sorted((m for m in elfsyms.mappings(self.pid) if "x" in m.perms), key=lambda m: m.start)
        self._all_maps = elfsyms.mappings(self.pid)
        self._starts = [m.start for m in self._maps]

    def _mapping(self, addr: int) -> elfsyms.Mapping | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self._maps[i].end:
            return self._maps[i]
        return None

    def resolve(self, addr: int) -> NativeFrame:
        m = self._mapping(addr)
        if m is None:
            self.refresh()  # loaded since the last read?
            m = self._mapping(addr)
        if m is None:
            return NativeFrame(f"[unknown]+{addr:#x}", "[unknown]", addr)
        path = m.path or "[anon]"
        if not path.startswith("/"):  # [vdso], a JIT page: no file to read symbols from
            return NativeFrame(f"{path}+{addr - m.start:#x}", path, addr - m.start)
        lib = self._libs.get(path, False)
        if lib is False:
            lib = self._libs[path] = _Library.load(path, self._all_maps)
        if lib is None:
            off = addr - m.start + m.offset
            return NativeFrame(f"{os.path.basename(path)}+{off:#x}", path, off)
        off = addr - lib.bias
        raw = lib.lookup(off)
        if raw is None:
            return NativeFrame(f"{os.path.basename(path)}+{off:#x}", path, off)
        name = self._names.get(raw)
        if name is None:
            name = self._names[raw] = self._demangle(raw)
        return NativeFrame(name, path, off)
