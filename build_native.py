"""cffi build script for ddprof_nb._native (API mode, out of line).  Not installed.

The cdef is the marked section of native/ddprof.h, so the header stays the one
description of the native boundary.  Sources are every native/*.c; the module is
compiled against the running interpreter's headers (internal ones included) and is
version-specific (py_limited_api=False), as it reads interpreter internals.
"""

import os
import re
import shlex
import sys
import sysconfig
from pathlib import Path

from cffi import FFI

NATIVE = Path(__file__).resolve().parent / "native"


def _cdef() -> str:
    text = (NATIVE / "ddprof.h").read_text()
    match = re.search(r"/\* cdef-begin \*/(.*?)/\* cdef-end \*/", text, re.S)
    if not match:
        raise RuntimeError("native/ddprof.h lacks its cdef markers")
    return match.group(1)


def _extra_compile_args() -> list[str]:
    # an undeclared function is an error in GCC 14 (Debian's 3.14/3.15): make it one everywhere
    args = ["-O2", "-g", "-std=gnu11", "-Wall", "-Wno-unused-function", "-fno-strict-aliasing",
            "-Werror=implicit-function-declaration"]
    if os.environ.get("DDPROF_NB_SANITIZE") == "1":  # ASan + UBSan build (tests/native under sanitizers)
        args += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1"]
    return args


def _core_macros() -> list[tuple[str, str | None]]:
    """The -D flags the interpreter's own core was compiled with that are not in pyconfig.h.

    They change internal struct layouts: Debian's 3.14/3.15 are configured with
    --enable-experimental-jit=yes-off, whose -D_Py_TIER2=3 -D_Py_JIT (PY_CORE_CFLAGS only)
    add fields to _PyThreadStateImpl and so to PyInterpreterState.  pyframes.c reads those
    structs, so it must see them as the core does (pyframes.c then checks every offset it
    uses against _PyRuntime.debug_offsets).  Py_BUILD_CORE itself stays local to pyframes.c.
    """
    out = []
    for tok in shlex.split(sysconfig.get_config_var("PY_CORE_CFLAGS") or ""):
        if not tok.startswith("-D"):
            continue
        name, eq, value = tok[2:].partition("=")
        if name.startswith(("_Py_", "Py_")) and not name.startswith("Py_BUILD_CORE"):
            out.append((name, value if eq else None))
    return out


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "ddprof_nb._native",
    '#include "ddprof.h"\n',
    sources=[str(p.relative_to(Path(__file__).resolve().parent)) for p in sorted(NATIVE.glob("*.c"))],
    include_dirs=[str(NATIVE)],
    define_macros=_core_macros(),
    extra_compile_args=_extra_compile_args(),
    extra_link_args=["-fsanitize=address,undefined"] if os.environ.get("DDPROF_NB_SANITIZE") == "1" else [],
    libraries=["rt", "pthread"],
    py_limited_api=False,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
