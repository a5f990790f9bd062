"""Names of native code addresses, resolved off the hot path.

A sampled native frame is a bare address.  Here it becomes (function, library): the
library from the process's memory map, the function from the library's ELF ``.symtab``
and ``.dynsym`` (function symbols sorted by address, read once per library) and from the
xz-compressed ``.symtab`` of its ``.gnu_debugdata`` (the "MiniDebugInfo" of distributions
that strip their binaries but keep the local functions' names there), demangled
(``demangle.py``).  An address no symbol covers is ``library+0xoffset``, never ``??``.
"""

from __future__ import annotations

import bisect
import copy
import lzma
import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

from . import elfsyms
from .demangle import demangle as _default_demangle

__all__ = ["NativeFrame", "Symbolizer"]

_SHT_SYMTAB, _SHT_DYNSYM, _STT_FUNC, _STT_GNU_IFUNC = 2, 11, 2, 10
_NAME_BITS = 48  # a symbol's name: its offset in one of the library's buffers, the buffer's index above
_DEBUGDATA_MAX = 256 << 20  # a .gnu_debugdata that inflates beyond this is not read
_READ_MAX = 256  # files whose symbols stay read (a process maps a few dozen)
_SYM_DTYPE = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                       ("value", "<u8"), ("size", "<u8")])


@dataclass(frozen=True)
class NativeFrame:
    """A resolved address: its function (or ``lib+0xoff``) and the library's path."""

    name: str
    library: str
    offset: int  # in the library's file address space (symbol values' space)


_read: dict[tuple, _Library] = {}  # (path, device, inode, size, mtime) -> its symbols, bias 0


class _Library:
    """One mapped ELF file's function symbols: starts and ends sorted by start, names read
    from the (memory-mapped) string table when first asked for."""

    def __init__(self, path: str, bias: int, data):
        self.path, self.bias = path, bias
        self._buffers = [data]  # the file, then its .gnu_debugdata inflated (when it has one)
        self.starts: list[int] = []
        self.ends: list[int] = []
        self._name_at: list[int] = []
        self._names: dict[int, str] = {}

    @classmethod
    def load(cls, path: str, maps: list[elfsyms.Mapping]) -> _Library | None:
        """The library at ``path`` as ``maps`` load it; its symbols read once per file and
        process (every session's symbolizer shares them: numpy's BLAS alone took 5 ms a session)."""
        try:
            st = os.stat(path)
            key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            known = _read.get(key)
            if known is None:
                with open(path, "rb") as f:
                    data = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
                known = cls(path, 0, data)
                known._read_symbols()
                _read[key] = known
                while len(_read) > _READ_MAX:
                    del _read[next(iter(_read))]  # (the oldest: a file replaced, a library unloaded)
            lib = copy.copy(known)  # (its tables shared; only the bias is this load's)
            lib.bias = elfsyms.load_base(known._buffers[0], maps, path) or 0
        except (OSError, ValueError, struct.error):  # ElfError is a ValueError; a truncated file
            return None
        return lib

    def _read_symbols(self) -> None:
        parts, debugdata = self._symbol_parts(0)
        if debugdata is not None:
            try:
                inner = lzma.LZMADecompressor().decompress(debugdata, max_length=_DEBUGDATA_MAX)
                self._buffers.append(inner)
                parts += self._symbol_parts(1)[0]
            except (lzma.LZMAError, ValueError, struct.error):  # damaged: the file's own symbols stay
                del self._buffers[1:]
        self._index(parts)

    def _symbol_parts(self, buffer: int):
        """The function symbols of one buffer's symbol tables, and its .gnu_debugdata bytes."""
        data = self._buffers[buffer]
        h = elfsyms._header(data)
        shoff, shentsize, shnum, shstrndx = h[6], h[11], h[12], h[13]
        sections = [elfsyms._SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)
                    if shoff + (i + 1) * shentsize <= len(data)]
        parts, debugdata = [], None
        if shstrndx < len(sections):
            names_at = sections[shstrndx][4]
            for sh in sections:
                if data[names_at + sh[0]:names_at + sh[0] + 15] == b".gnu_debugdata\0" and sh[4] + sh[5] <= len(data):
                    debugdata = bytes(data[sh[4]:sh[4] + sh[5]])
        for sh in sections:
            # (name, type, flags, addr, offset, size, link, info, align, entsize); NOBITS tables: stripped
            if sh[1] not in (_SHT_SYMTAB, _SHT_DYNSYM) or sh[6] >= len(sections) or sh[4] + sh[5] > len(data):
                continue
            strtab = sections[sh[6]]
            s_off, s_end = strtab[4], min(strtab[4] + strtab[5], len(data))
            syms = np.frombuffer(data, _SYM_DTYPE, count=sh[5] // _SYM_DTYPE.itemsize, offset=sh[4])
            kind = syms["info"] & 0xF
            keep = ((syms["value"] != 0) & (syms["shndx"] != 0) & ((kind == _STT_FUNC) | (kind == _STT_GNU_IFUNC))
                    & (syms["name"].astype(np.int64) < s_end - s_off))
            syms = syms[keep]
            at = syms["name"].astype(np.int64) + s_off
            first = np.frombuffer(data, np.uint8)[at] if len(at) else np.zeros(0, np.uint8)
            # aliases at one address: a sized symbol, then one not starting with "_" (getpid,
            # weak, over __getpid), then a global one (bind 1), then the first met
            rank = ((syms["size"] > 0).astype(np.int64) * 4 + (first != 95) * 2 + ((syms["info"] >> 4) == 1))
            parts.append((syms["value"], syms["size"], at + (buffer << _NAME_BITS), rank))
        return parts, debugdata

    def _index(self, parts) -> None:
        if not parts:
            return
        value, size, at, rank = (np.concatenate(x) for x in zip(*parts))
        order = np.lexsort((-rank, value))  # by value, best rank first
        value, size, at = value[order], size[order], at[order]
        uniq = np.ones(len(value), bool)
        uniq[1:] = value[1:] != value[:-1]
        value, size, at = value[uniq], size[uniq], at[uniq]
        nxt = np.append(value[1:], value[-1:] + 1) if len(value) else value
        end = np.where(size > 0, value + size, nxt)  # unsized: up to the next symbol
        self.starts, self.ends, self._name_at = value.tolist(), end.tolist(), at.tolist()

    def lookup(self, offset: int) -> str | None:
        i = bisect.bisect_right(self.starts, offset) - 1
        if i < 0 or offset >= self.ends[i]:
            return None
        name = self._names.get(i)
        if name is None:
            data = self._buffers[self._name_at[i] >> _NAME_BITS]
            at = self._name_at[i] & ((1 << _NAME_BITS) - 1)
            end = data.find(b"\0", at)
            name = self._names[i] = data[at:end if end >= 0 else len(data)].decode("utf-8", "replace")
        return name


_maps_seen: tuple = (None, None, None)  # (pid, loader generation, its code and file mappings)


class Symbolizer:
    """Resolves addresses of this (or another) process; libraries are read once each.

    ``loader_generation``: a function whose value moves with every dlopen and dlclose of
    this process; symbolizers then share one read of the memory map while it stays (a
    process with a few thousand mappings took 15 ms a read, each session)."""

    def __init__(self, pid: int | None = None, demangle=None, loader_generation=None):
        self.pid = pid or os.getpid()
        self._demangle = demangle or _default_demangle
        self._generation = loader_generation if self.pid == os.getpid() else None
        self._maps: list[elfsyms.Mapping] = []
        self._starts: list[int] = []
        self._libs: dict[str, _Library | None] = {}
        self._names: dict[str, str] = {}
        self._all_maps: list[elfsyms.Mapping] | None = None  # read at the first resolve

    def refresh(self, reread: bool = True) -> None:
        """Re-read the memory map (after libraries were loaded); without ``reread``, the last
        read of any symbolizer while the loader's generation has not moved."""
        global _maps_seen
        gen = self._generation() if self._generation else None
        if not reread and gen is not None and _maps_seen[:2] == (self.pid, gen):
            self._all_maps = _maps_seen[2]
        else:
            self._all_maps = elfsyms.mappings(self.pid, code_and_files=True)
            if gen is not None:
                _maps_seen = (self.pid, gen, self._all_maps)
        self._maps = sorted((m for m in self._all_maps if "x" in m.perms), key=lambda m: m.start)
        self._starts = [m.start for m in self._maps]

    def _mapping(self, addr: int) -> elfsyms.Mapping | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self._maps[i].end:
            return self._maps[i]
        return None

    def resolve(self, addr: int) -> NativeFrame:
        if self._all_maps is None:
            self.refresh(reread=False)
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
