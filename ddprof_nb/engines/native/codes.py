"""Captured code pointers -> names, files and lines, with the process's code caches.

``Resolver`` asks the native side for a sampled code object's qualname, filename and line
table (read safely, checked against the fingerprint taken at sample time) and keeps the
answers for the process; ``frame_cache`` holds the resulting Frames per (code,
fingerprint, lasti) for ``decode.RecordConverter``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .binding import ffi, lib

__all__ = ["CodeInfo", "Resolver", "frame_cache", "cache_put"]

@dataclass(frozen=True)
class CodeInfo:
    qualname: str
    filename: str
    firstlineno: int
    linetable: bytes


# Resolutions are kept for the process, not per session: a notebook profiles many cells in
# one kernel, and every cffi call releases the GIL, so a drain that resolved its frames
# anew each session handed the GIL to the profiled thread and back at each call (~40 per
# session of the asyncio benchmark: one context switch each for the profiled thread).
# Keys carry the fingerprint, so a reused address never lends a name (see Resolver).
_CACHE_MAX = 100_000  # entries of each cache; past it a cache starts over
_code_cache: dict[tuple[int, int], "CodeInfo"] = {}  # (code, fingerprint) -> CodeInfo
frame_cache: dict[tuple[int, int, int], object] = {}  # (code, fingerprint, lasti) -> model.Frame


def cache_put(cache: dict, key, value) -> None:
    if len(cache) >= _CACHE_MAX:
        cache.clear()
        if cache is _code_cache:  # the C "known" filter says which code this cache holds
            lib.ddp_known_clear()
    cache[key] = value


class Resolver:
    """Captured (code pointer, fingerprint, lasti) -> Frame, with the GIL, never unsafely.

    The native side reads the code object through process_vm_readv (a freed object's
    memory cannot crash us), checks its type and that its fingerprint — a hash of its
    qualname and filename *contents*, firstlineno and size, taken at sample time — still
    matches: a recycled address holding another function can therefore never lend its
    name.  Sampled code objects that die before a drain (a module's ``<module>`` code once
    its import ends, exec'd strings) are resolved as they die, into the graveyard: by a
    code watcher on 3.12+, by a wrapper of ``PyCode_Type``'s dealloc on 3.11.  Residual
    risk: a new code object at the same address with the same qualname, filename,
    firstlineno and size but a different body could give a sample a wrong *line* (never a
    wrong name).
    """

    def __init__(self):
        self._codes = _code_cache
        self._info = ffi.new("ddp_code_info *")
        self._qcap, self._fcap, self._lcap = 512, 2048, 1 << 16
        self._alloc()
        self.unresolved = 0

    def _alloc(self):
        self._q = ffi.new("char[]", self._qcap)
        self._f = ffi.new("char[]", self._fcap)
        self._lt = ffi.new("uint8_t[]", self._lcap)

    def _grow(self):
        i = self._info
        self._qcap = max(self._qcap, i.qualname_len + 1)
        self._fcap = max(self._fcap, i.filename_len + 1)
        self._lcap = max(self._lcap, i.linetable_len + 1)
        self._alloc()

    def _take(self) -> CodeInfo:
        i = self._info
        return CodeInfo(
            ffi.unpack(self._q, i.qualname_len).decode("utf-8", "surrogatepass"),
            ffi.unpack(self._f, i.filename_len).decode("utf-8", "surrogatepass"),
            int(i.firstlineno),
            ffi.unpack(ffi.cast("char *", self._lt), i.linetable_len),
        )

    def absorb_graveyard(self) -> int:
        """Move code objects that died while profiling into the cache."""
        n = 0
        if not lib.ddp_graveyard_len:  # (a variable: no cffi call, no GIL handoff)
            return 0
        while True:
            rc = lib.ddp_graveyard_pop(self._info, self._q, self._qcap, self._f, self._fcap, self._lt, self._lcap)
            if rc == 0:
                return n
            if rc == 2:
                self._grow()
                continue
            cache_put(self._codes, (int(self._info.code), int(self._info.fp)), self._take())
            n += 1

    def code(self, code: int, fp: int) -> CodeInfo | None:
        key = (code, fp)
        found = self._codes.get(key)
        if found is not None:
            return found
        for _ in range(2):
            rc = lib.ddp_resolve_code(code, fp, self._info, self._q, self._qcap, self._f, self._fcap, self._lt, self._lcap)
            if rc == 1:
                self._grow()
                continue
            if rc == 0:
                found = self._take()
                cache_put(self._codes, key, found)
                return found
            break
        # It may have died since the last look at the graveyard: look again.
        if self.absorb_graveyard():
            return self._codes.get(key)
        return None

    def line(self, info: CodeInfo, lasti: int) -> int:
        buf = ffi.from_buffer(info.linetable) if info.linetable else ffi.NULL
        return int(lib.ddp_addr2line(buf, len(info.linetable), info.firstlineno, lasti))
