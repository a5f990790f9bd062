"""The native-frames option (native=True) from each front end to the sampler's config,
and the merge of native frames between Python frames (engines/native/nativeframes.py)."""

from __future__ import annotations

import struct

import pytest

from ddprof_nb.config import SamplerConfig
from ddprof_nb.engines.native import binding
from ddprof_nb.events import FrameKind
from ddprof_nb.model import Frame


def test_config_keeps_native_and_hands_it_on():
    assert SamplerConfig.make().native is False
    c = SamplerConfig.make(native=True)
    assert c.native is True
    assert SamplerConfig.from_spec(c.to_spec()).native is True
    with pytest.raises(ValueError, match="native"):
        SamplerConfig.make(native="yes")
    c = SamplerConfig.make(native="interpreter")  # eval-loop frames kept
    assert SamplerConfig.from_spec(c.to_spec()).native == "interpreter"


def test_magic_and_cli_options():
    from IPython.core.error import UsageError

    from ddprof_nb.__main__ import CLIError, _parser, _record_config
    from ddprof_nb.magics.options import CELL_PARSER, START_PARSER, sampler_config

    assert sampler_config(CELL_PARSER.parse_argstring("--native")).native is True
    assert sampler_config(START_PARSER.parse_argstring("--native")).native is True
    assert sampler_config(CELL_PARSER.parse_argstring("")).native is False
    assert sampler_config(CELL_PARSER.parse_argstring("--native --interpreter-frames")).native == "interpreter"
    with pytest.raises(UsageError, match="needs --native"):
        sampler_config(CELL_PARSER.parse_argstring("--interpreter-frames"))
    args, _ = _parser().parse_known_args(["record", "--native", "-o", "x.pprof", "--", "script.py"])
    assert args.native is True
    args, _ = _parser().parse_known_args(["record", "--native", "--interpreter-frames", "--", "script.py"])
    assert _record_config(args).native == "interpreter"
    args, _ = _parser().parse_known_args(["record", "--interpreter-frames", "--", "script.py"])
    with pytest.raises(CLIError, match="needs --native"):
        _record_config(args)


class _Builder:
    """A stand-in ProfileBuilder: frame ids are indexes of the frames seen."""

    def __init__(self):
        self.frames: list[Frame] = []

    def frame_id(self, f: Frame) -> int:
        if f not in self.frames:
            self.frames.append(f)
        return self.frames.index(f)


class _Symbols:
    def __init__(self, names):
        self.names = names

    def resolve(self, pc):
        from ddprof_nb.nativesyms import NativeFrame

        return NativeFrame(self.names[pc], "/lib/x.so", pc)


_F = struct.Struct("<QQii")
lib = binding.lib


def _raw(python, natives, cut=False):
    """python: [(code, entry)] leaf first; natives: pcs leaf first"""
    out = b"".join(_F.pack(code, 7, 0, 5 | (lib.DDP_FRAME_ENTRY if entry else 0)) for code, entry in python)
    out += b"".join(_F.pack(lib.DDP_NATIVE_CODE, pc, -1, 0) for pc in natives)
    if cut:
        out += _F.pack(lib.DDP_NATIVE_CUT, 0, -1, 0)
    return out


def test_each_eval_frame_becomes_the_python_frames_of_one_entry():
    # GIVEN Python frames f, g (entry) | h (entry) and native frames
    #   kernel, ufunc, eval, call, eval, main (leaf first)
    # WHEN merged
    # THEN kernel, ufunc, f, g, call, h, main: each eval frame replaced by one entry's frames
    from ddprof_nb.engines.native.nativeframes import NativeMerger

    names = {1: "kernel", 2: "ufunc", 3: "_PyEval_EvalFrameDefault", 4: "call", 5: "_PyEval_EvalFrameDefault",
             6: "main"}
    b = _Builder()
    m = NativeMerger(b, symbolizer=_Symbols(names))
    py = {0x1000: "f", 0x2000: "g", 0x3000: "h"}
    ids = m.merge(_raw([(0x1000, False), (0x2000, True), (0x3000, True)], [1, 2, 3, 4, 5, 6]),
                  lambda code, fp, lasti: b.frame_id(Frame(py[code])))
    assert [b.frames[i].name for i in ids] == ["kernel", "ufunc", "f", "g", "call", "h", "main"]
    assert b.frames[ids[0]].kind is FrameKind.NATIVE and b.frames[ids[0]].filename == "/lib/x.so"
    # a walk cut short: [truncated] after what it found, the Python frames left over above it
    ids = m.merge(_raw([(0x1000, False), (0x2000, True), (0x3000, True)], [1, 3], cut=True),
                  lambda code, fp, lasti: b.frame_id(Frame(py[code])))
    assert [b.frames[i].name for i in ids] == ["kernel", "f", "g", "[truncated]", "h"]
    # keep_eval: the eval frames stay, and the Python frames go above the native ones
    k = NativeMerger(_Builder(), keep_eval=True, symbolizer=_Symbols(names))
    ids = k.merge(_raw([(0x1000, True)], [1, 3]), lambda code, fp, lasti: k.builder.frame_id(Frame(py[code])))
    assert [k.builder.frames[i].name for i in ids] == ["kernel", "_PyEval_EvalFrameDefault", "f"]


def test_a_stripped_interpreter_keeps_the_frames_above_it():
    # GIVEN no native frame named as an eval loop (a stripped interpreter): kernel, ufunc in
    #   a library, then unnamed frames in the interpreter's object, and Python frames f | g
    # WHEN merged
    # THEN the library's frames, then the Python frames; the interpreter's are left out
    from ddprof_nb.engines.native.nativeframes import NativeMerger
    from ddprof_nb.nativesyms import NativeFrame

    class Symbols:
        def resolve(self, pc):
            return NativeFrame(f"f{pc}", "/lib/x.so" if pc < 10 else "/usr/bin/python3", pc)

    b = _Builder()
    m = NativeMerger(b, symbolizer=Symbols())
    m._interp = "/usr/bin/python3"
    py = {0x1000: "f", 0x2000: "g"}
    ids = m.merge(_raw([(0x1000, True), (0x2000, True)], [1, 2, 11, 12, 13]),
                  lambda code, fp, lasti: b.frame_id(Frame(py[code])))
    assert [b.frames[i].name for i in ids] == ["f1", "f2", "f", "g"]
    # a walk cut before it reached the interpreter: [truncated] between the two
    ids = m.merge(_raw([(0x1000, True), (0x2000, True)], [1, 2], cut=True),
                  lambda code, fp, lasti: b.frame_id(Frame(py[code])))
    assert [b.frames[i].name for i in ids] == ["f1", "f2", "[truncated]", "f", "g"]
    # a cut through the interpreter's frames leaves them out as before
    ids = m.merge(_raw([(0x1000, True), (0x2000, True)], [1, 11], cut=True),
                  lambda code, fp, lasti: b.frame_id(Frame(py[code])))
    assert [b.frames[i].name for i in ids] == ["f1", "f", "g"]


def test_a_sample_with_no_native_frame_seen_ends_in_truncated():
    # GIVEN Python frames f | g and only a cut (a running thread sampled from outside)
    # WHEN merged THEN the Python frames under [truncated] at the leaf; without the cut, as they are
    from ddprof_nb.engines.native.nativeframes import NativeMerger

    b = _Builder()
    m = NativeMerger(b, symbolizer=_Symbols({}))
    py = {0x1000: "f", 0x2000: "g"}
    ids = m.merge(_raw([(0x1000, False), (0x2000, True)], [], cut=True), lambda code, fp, lasti: b.frame_id(Frame(py[code])))
    assert [b.frames[i].name for i in ids] == ["[truncated]", "f", "g"]
    ids = m.merge(_raw([(0x1000, False), (0x2000, True)], []), lambda code, fp, lasti: b.frame_id(Frame(py[code])))
    assert [b.frames[i].name for i in ids] == ["f", "g"]
