"""The layouts another process is read with (ddprof_nb.remote_layouts), checked against real
interpreters: each local CPython 3.11+ (this one, pyenv's, the 3.14/3.15 chroot when it can
run) loads the module by path, takes its own layout (its published ``_Py_DebugOffsets`` on
3.13+, the built-in table on 3.11/3.12) and follows it through its own memory to objects it
knows: its interpreter, its thread state and native id, the frames of the running function
and its caller, their code objects' fields, a str of each form, a bytes object, the GIL it
holds.  A wrong offset in any of them points somewhere else and fails."""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ddprof_nb import remote_layouts as rl

MODULE = str(Path(rl.__file__).resolve())
REPO = Path(MODULE).parent.parent
CHROOT = REPO / "tools" / "pychroot.sh"

PROBE = r'''
import ctypes, importlib.util, json, sys, threading, types
spec = importlib.util.spec_from_file_location("remote_layouts", sys.argv[1])
rl = importlib.util.module_from_spec(spec)
sys.modules["remote_layouts"] = rl
spec.loader.exec_module(rl)

def u64(addr):
    return int.from_bytes(ctypes.string_at(addr, 8), "little")

def i32(addr):
    return int.from_bytes(ctypes.string_at(addr, 4), "little", signed=True)

def probe_named_frame():
    # the current frame pointer is read with C calls only: no Python frame is pushed above this
    # one; the frames below it (this one, its callers) stay in place while it runs
    cell = ctypes.c_uint64()
    ctypes.memmove(ctypes.addressof(cell), me + lay.tstate_frame, 8)
    frame = cell.value
    if lay.cframe_current_frame is not None:
        ctypes.memmove(ctypes.addressof(cell), frame + lay.cframe_current_frame, 8)
        frame = cell.value
    codes = []
    while frame and len(codes) < 2:
        owner = ctypes.string_at(frame + lay.frame_owner, 1)[0]
        code = u64(frame + lay.frame_code) & ~lay.code_tag_bits
        if lay.owner_shim_min is None or owner < lay.owner_shim_min:
            codes.append((code, u64(frame + lay.frame_instr)))
        frame = u64(frame + lay.frame_previous)
    return codes

def caller_of_probe():
    return probe_named_frame()

runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
version = sys.version_info[:2]
if version >= (3, 13):
    lay = rl.from_debug_offsets(ctypes.string_at(runtime, rl.DEBUG_OFFSETS_SIZE), version)
else:
    lay = rl.for_version(version)
api = ctypes.pythonapi
api.PyInterpreterState_Get.restype = api.PyThreadState_Get.restype = ctypes.c_void_p
me = api.PyThreadState_Get()
out = {}
interp = u64(runtime + lay.interpreters_head)
out["interpreter"] = interp == api.PyInterpreterState_Get()
states, ts = [], u64(interp + lay.threads_head)
while ts and len(states) < 100:
    states.append(ts)
    ts = u64(ts + lay.tstate_next)
out["thread state listed"] = me in states
out["native thread id"] = u64(me + lay.tstate_native_thread_id) == threading.get_native_id()

codes = caller_of_probe()
probe_code, caller_code = probe_named_frame.__code__, caller_of_probe.__code__
out["frame code"] = codes[0][0] == id(probe_code)
out["previous frame code"] = len(codes) > 1 and codes[1][0] == id(caller_code)
lasti = (codes[0][1] - id(probe_code) - lay.code_adaptive) // 2
out["instruction inside its code"] = 0 <= lasti < len(probe_code.co_code) // 2
out["code type"] = u64(id(probe_code) + rl.OB_TYPE) == id(types.CodeType)
for name in ("filename", "name", "qualname", "linetable"):
    out[f"co_{name}"] = u64(id(probe_code) + getattr(lay, "code_" + name)) == id(getattr(probe_code, "co_" + name))
out["co_firstlineno"] = i32(id(probe_code) + lay.code_firstlineno) == probe_code.co_firstlineno
out["code length"] = u64(id(probe_code) + 16) == len(probe_code.co_code) // 2

def text_state(s):
    return i32(id(s) + lay.unicode_state)
ascii_text, latin, wide = "ascii" + "x" * 20, "caf\xe9" * 3, "\u0444\u0430\u0439\u043b" * 2
out["str length"] = u64(id(ascii_text) + lay.unicode_length) == len(ascii_text)
out["ascii str"] = (text_state(ascii_text) >> 6 & 1 == 1
                    and ctypes.string_at(id(ascii_text) + lay.ascii_size, len(ascii_text)) == ascii_text.encode())
out["latin-1 str"] = ((text_state(latin) >> 2) & 7 == 1 and text_state(latin) >> 5 & 1 == 1
                      and ctypes.string_at(id(latin) + lay.compact_size, len(latin)) == latin.encode("latin-1"))
out["two-byte str"] = ((text_state(wide) >> 2) & 7 == 2
                       and ctypes.string_at(id(wide) + lay.compact_size, 2 * len(wide)) == wide.encode("utf-16-le"))
table = probe_code.co_linetable
out["bytes"] = (u64(id(table) + lay.bytes_size) == len(table)
                and ctypes.string_at(id(table) + lay.bytes_data, len(table)) == table)
gil = runtime + lay.gil_in_runtime if lay.gil_in_runtime is not None else u64(interp + lay.gil_pointer)
out["gil locked by this thread"] = i32(gil + lay.gil_locked) == 1 and u64(gil + lay.gil_holder) == me
print(json.dumps({"version": "%d.%d" % version, "checks": out}))
'''


def _pyenv_pythons() -> dict[str, list[str]]:
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    out = {}
    for exe in sorted(glob.glob(f"{root}/versions/3.1[1-9]*/bin/python3")):
        minor = ".".join(Path(exe).parent.parent.name.split(".")[:2])
        out.setdefault(minor, [exe])
    return out


def local_pythons() -> dict[str, list[str]]:
    """Command prefixes running each local CPython 3.11+ (minor version -> argv)."""
    out = {"%d.%d" % sys.version_info[:2]: [sys.executable]}
    for minor, argv in _pyenv_pythons().items():
        out.setdefault(minor, argv)
    if os.geteuid() == 0 and CHROOT.exists():  # the chroot is built on first use (needs root)
        for minor in ("3.14", "3.15"):
            out.setdefault(minor, [str(CHROOT), "run", minor, "--", f"python{minor}"])
    return out


def _probe(argv: list[str], tmp_path) -> dict:
    if argv[0] == str(CHROOT):  # the chroot sees its own /tmp only: the module goes in with the script
        return _probe_in_chroot(argv)
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    done = subprocess.run([*argv, str(script), MODULE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _probe_in_chroot(argv: list[str]) -> dict:
    source = Path(MODULE).read_text()
    code = (f"import sys, tempfile, os; d = tempfile.mkdtemp(); p = os.path.join(d, 'remote_layouts.py'); "
            f"open(p, 'w').write({source!r}); sys.argv = ['probe', p]; exec(compile({PROBE!r}, 'probe', 'exec'))")
    done = subprocess.run([*argv, "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYCHROOT_QUIET="1"))
    if done.returncode != 0 and "pychroot" in done.stderr and "error" in done.stderr:
        pytest.skip(f"the 3.14/3.15 chroot does not run here: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


IN_CHROOT = [pytest.param(m, marks=[pytest.mark.slow, pytest.mark.chroot]) for m in ("3.14", "3.15")]


@pytest.mark.parametrize("minor", ["3.11", "3.12", "3.13", *IN_CHROOT])
def test_layout_finds_the_interpreters_own_objects(minor, tmp_path):
    argv = local_pythons().get(minor)
    if argv is None:
        pytest.skip(f"no CPython {minor} here (pyenv, or the chroot as root)")
    got = _probe(argv, tmp_path)
    assert got["version"] == minor
    failed = [name for name, ok in got["checks"].items() if not ok]
    assert not failed, f"CPython {minor}: the layout misses {failed}"
    assert len(got["checks"]) == 19  # every check ran


def _debug_offsets_of(minor: str) -> bytes:
    argv = local_pythons().get(minor)
    if argv is None or argv[0] == str(CHROOT):
        pytest.skip(f"no local CPython {minor} outside the chroot")
    code = ("import ctypes, sys; a = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, '_PyRuntime')); "
            f"sys.stdout.write(ctypes.string_at(a, {rl.DEBUG_OFFSETS_SIZE}).hex())")
    done = subprocess.run([*argv, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return bytes.fromhex(done.stdout)


def test_published_offsets_of_another_layout_are_refused_by_name():
    raw = _debug_offsets_of("3.13")
    assert rl.from_debug_offsets(raw, (3, 13)).frame_code >= 0
    with pytest.raises(rl.LayoutError, match="CPython 3.13 publishes no debug offsets"):
        rl.from_debug_offsets(b"\0" * 8 + raw[8:], (3, 13))
    with pytest.raises(rl.LayoutError, match="CPython 3.16: the layout of its published offsets is not known"):
        rl.from_debug_offsets(raw, (3, 16))
    with pytest.raises(rl.LayoutError, match="another version"):
        rl.from_debug_offsets(raw, (3, 14))  # a 3.13 struct read as 3.14's: its version says 3.13
    free = raw[:16] + struct.pack("<Q", 1) + raw[24:]
    with pytest.raises(rl.LayoutError, match="free-threaded"):
        rl.from_debug_offsets(free, (3, 13))
    # interpreter_frame.owner (a field past every earlier section) pointing outside its frame
    names = [f"{s}.{f}" if s else f for s, fields in rl.SECTIONS[(3, 13)] for f in fields]
    at = 8 + 8 * names.index("interpreter_frame.owner")
    bad = raw[:at] + struct.pack("<Q", 1 << 40) + raw[at + 8:]
    with pytest.raises(rl.LayoutError, match="interpreter_frame.owner"):
        rl.from_debug_offsets(bad, (3, 13))


def _sample_function(n):
    total = 0
    for i in range(n):
        if i % 3:
            total += i
        else:
            total -= (
                i
                * 2
            )
    return total


@pytest.mark.parametrize("func", [_sample_function, test_published_offsets_of_another_layout_are_refused_by_name,
                                  json.dumps, subprocess.run])
def test_line_of_matches_the_interpreters_own_line_table(func):
    code = func.__code__
    checked = 0
    for start, end, line in code.co_lines():
        for unit in range(start // 2, end // 2):
            assert rl.line_of(code.co_linetable, code.co_firstlineno, unit) == (
                line if line is not None else code.co_firstlineno), (func.__name__, unit)
            checked += 1
    assert checked == len(code.co_code) // 2
    assert rl.line_of(code.co_linetable, code.co_firstlineno, -1) == code.co_firstlineno


def test_line_of_a_malformed_table_is_a_number():
    import random

    rng = random.Random(7)
    tables = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))) for _ in range(2000)]
    for table in tables:
        assert isinstance(rl.line_of(table, 10, rng.randrange(-1, 40)), int)
    # one long-form entry whose line-delta varint never ends: malformed, so the first line (an
    # unbounded varint would grow a 120-kilobit delta instead, step by step)
    assert rl.line_of(b"\xf0" + b"\xff" * 20_000, 10, 0) == 10
