"""Native frames of a record, named and merged between its Python frames.

With ``native=True`` a record a thread takes of itself (a CPU sample, an allocation, a wait)
holds its Python frames, then its native frames (both leaf first; native/ddprof.h says how
they are encoded).  Merged as py-spy merges them: walking the native frames leaf to root,
each of the interpreter's eval-loop frames is replaced by the Python frames it runs — those
up to and including the next entry frame (a frame the interpreter marks as the first of
an eval loop's run) — and every other native frame stays where it is.  A walk that stopped
early ends in ``[truncated]``; Python frames left over go above it, at the root.  When no
eval-loop frame has a name (a stripped interpreter), the native frames above the
interpreter's own go below the leaf Python frame and the interpreter's are left out.
"""

from __future__ import annotations

import functools
import struct

from ...events import FrameKind
from ...model import Frame
from ...nativesyms import Symbolizer
from . import binding

__all__ = ["NativeMerger", "EVAL_FRAMES", "has_native"]

_FRAME = struct.Struct("<QQii")  # ddp_frame: code, fingerprint (a native frame: its pc), lasti, firstlineno
# The interpreter's own frames that run Python code: shown as the Python frames they run.
EVAL_FRAMES = frozenset({"_PyEval_EvalFrameDefault", "_PyEval_EvalFrame", "PyEval_EvalFrameEx",
                         "PyEval_EvalFrame", "_PyEval_EvalFrameDefault [cold]"})


@functools.cache
def _codes() -> tuple[int, int, int]:
    """The record encoding's markers (native/ddprof.h): read when first needed, since this
    module is importable where the native module is refused."""
    lib = binding.require()
    return lib.DDP_NATIVE_CODE, lib.DDP_NATIVE_CUT, lib.DDP_FRAME_ENTRY


def has_native(raw) -> bool:
    """A record's frame bytes end with a native frame (they then hold at least one)."""
    native, cut, _ = _codes()
    return len(raw) >= _FRAME.size and _FRAME.unpack_from(raw, len(raw) - _FRAME.size)[0] in (native, cut)


class NativeMerger:
    """Frame ids of native frames (a builder's), and the merged stacks of records."""

    def __init__(self, builder, keep_eval: bool = False, symbolizer: Symbolizer | None = None):
        self.builder = builder
        self.keep_eval = keep_eval
        self.symbolizer = symbolizer or Symbolizer(loader_generation=binding.require().ddp_loader_generation)
        self._by_pc: dict[int, tuple[int, bool]] = {}  # pc -> (frame id, an eval-loop frame)
        self._cut = builder.frame_id(Frame("[truncated]", kind=FrameKind.TRUNCATED))
        self._interp: str | None = None  # the interpreter's object (libpython or the executable)

    def _native(self, pc: int) -> tuple[int, bool]:
        got = self._by_pc.get(pc)
        if got is None:
            f = self.symbolizer.resolve(pc)
            is_eval = f.name in EVAL_FRAMES and not self.keep_eval
            got = self._by_pc[pc] = (self.builder.frame_id(Frame(f.name, f.library, kind=FrameKind.NATIVE)), is_eval)
        return got

    def merge(self, raw, python_id) -> list[int]:
        """Leaf-first frame ids of a record's frames ``raw``; ``python_id(code, fp, lasti)``
        names a Python frame."""
        groups: list[list[int]] = [[]]
        natives: list[int] = []
        cut = False
        native_code, cut_code, entry = _codes()
        for code, fp, lasti, first in _FRAME.iter_unpack(raw):
            if code == native_code:
                natives.append(fp)
            elif code == cut_code:
                cut = True
            else:
                groups[-1].append(python_id(code, fp, lasti))
                if first & entry:
                    groups.append([])
        if not groups[-1]:
            groups.pop()
        if not natives:  # none seen (a running thread sampled from outside): cut at the leaf
            return ([self._cut] if cut else []) + [fid for g in groups for fid in g]
        resolved = [self._native(pc) for pc in natives]
        if groups and not self.keep_eval and not any(is_eval for _, is_eval in resolved):
            return self._unnamed_interpreter(natives, resolved, groups, cut)
        out: list[int] = []
        g = 0
        for fid, is_eval in resolved:
            if is_eval:
                if g < len(groups):
                    out.extend(groups[g])
                    g += 1
                continue
            out.append(fid)
        if cut:
            out.append(self._cut)
        for rest in groups[g:]:
            out.extend(rest)
        return out

    def _unnamed_interpreter(self, natives, resolved, groups, cut) -> list[int]:
        """No eval-loop frame could be named (a stripped interpreter: Debian's python3.14 keeps
        only exported symbols, and its eval loop is split in unnamed pieces): the native frames
        above the interpreter's own, then the Python frames; the interpreter's frames between
        Python frames cannot be placed, and are left out.  A walk cut before it reached the
        interpreter says so between the two."""
        out: list[int] = []
        for pc, (fid, _) in zip(natives, resolved):
            if self._in_interpreter(pc):
                break
            out.append(fid)
        else:
            if cut:
                out.append(self._cut)
        for g in groups:
            out.extend(g)
        return out

    def _in_interpreter(self, pc: int) -> bool:
        if self._interp is None:
            import ctypes

            at = ctypes.cast(ctypes.pythonapi.Py_IsInitialized, ctypes.c_void_p).value
            self._interp = self.symbolizer.resolve(at).library
        return self.symbolizer.resolve(pc).library == self._interp
