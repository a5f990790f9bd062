"""The small C extensions tests build with cffi, compiled once per test run.

One run of the suite asks for the same extension (same source, flags and interpreter) from
several pytest processes: the tests marked alone, each xdist worker, modules that share an
extension, the sanitizer phase (the same interpreter as 3.11's).  With
``DDPROF_NB_TEST_EXT_CACHE`` naming a directory (scripts/test.sh makes one per run), the
first caller compiles it there under a file lock and every caller gets copies of the built
files in its own directory: tests may load, copy or unload them as they like, and a library
one process has mapped is never rewritten under it.  Without the variable, each call
compiles into its own directory.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import sys
import sysconfig

import pytest

CACHE_VARIABLE = "DDPROF_NB_TEST_EXT_CACHE"


def build(out, name: str, cdef: str, source: str, **kw) -> str:
    """Module ``name`` (cffi: ``cdef``, ``source``, set_source's ``kw``) built into the
    directory ``out``; returns ``out``."""
    cffi = pytest.importorskip("cffi")
    out = str(out)
    cache = os.environ.get(CACHE_VARIABLE)
    if not cache:
        _compile(cffi, out, name, cdef, source, kw)
    else:
        built = _cached(cffi, cache, name, cdef, source, kw)
        os.makedirs(out, exist_ok=True)
        for path in glob.glob(os.path.join(built, f"{name}*.so")):
            shutil.copy2(path, out)
    assert glob.glob(os.path.join(out, f"{name}*.so")), f"{name} was not built in {out}"
    return out


def _compile(cffi, out: str, name: str, cdef: str, source: str, kw: dict) -> None:
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    ffi.set_source(name, source, **kw)
    ffi.compile(tmpdir=out, verbose=False)


def _cached(cffi, cache: str, name: str, cdef: str, source: str, kw: dict) -> str:
    # everything the built file depends on: the C, its flags, the interpreter's ABI and
    # headers, cffi's generated glue, the compiler the environment names
    key = hashlib.sha256(repr((
        name, cdef, source, sorted(kw.items()), sys.version, sys.abiflags,
        sysconfig.get_config_var("EXT_SUFFIX"), sysconfig.get_paths()["include"], cffi.__version__,
        os.environ.get("CC"), os.environ.get("CFLAGS"), os.environ.get("LDFLAGS"),
    )).encode()).hexdigest()[:20]
    built = os.path.join(cache, f"{name}-{key}")
    os.makedirs(cache, exist_ok=True)
    with open(built + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes)
        if not os.path.isdir(built):
            partial = built + ".partial"
            shutil.rmtree(partial, ignore_errors=True)
            _compile(cffi, partial, name, cdef, source, kw)
            os.rename(partial, built)  # whole or absent, if a caller dies mid-build
    return built
