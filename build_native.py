"""cffi build script for ddprof_nb._native (API mode, out of line).  Not installed.

The cdef is the marked section of native/ddprof.h, so the header stays the one
description of the native boundary.  Sources are every native/*.c; the module is
compiled against the running interpreter's headers (internal ones included) and is
version-specific (py_limited_api=False), as it reads interpreter internals.
"""

import os
import re
import sys
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
    args = ["-O2", "-g", "-std=gnu11", "-Wall", "-Wno-unused-function", "-fno-strict-aliasing"]
    if os.environ.get("DDPROF_NB_SANITIZE") == "1":  # ASan + UBSan build (tests/native under sanitizers)
        args += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1"]
    return args


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "ddprof_nb._native",
    '#include "ddprof.h"\n',
    sources=[str(p.relative_to(Path(__file__).resolve().parent)) for p in sorted(NATIVE.glob("*.c"))],
    include_dirs=[str(NATIVE)],
    extra_compile_args=_extra_compile_args(),
    extra_link_args=["-fsanitize=address,undefined"] if os.environ.get("DDPROF_NB_SANITIZE") == "1" else [],
    libraries=["rt", "pthread"],
    py_limited_api=False,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
