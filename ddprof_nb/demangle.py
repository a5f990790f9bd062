"""Readable names for C++ (Itanium) and Rust (legacy and v0) symbols.

C++ goes through libstdc++'s own ``__cxa_demangle`` (ctypes; no dependency), when the
library is there.  Rust's legacy scheme (``_ZN...17h<hash>E``) is decoded here: it is an
Itanium-shaped path plus ``$..$`` escapes, and ``__cxa_demangle`` would keep the hash;
Rust's v0 scheme (``_R...``) in ``demangle_rust_v0.py``.
A name that is not mangled, or not understood, comes back unchanged.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
from functools import lru_cache

from .demangle_rust_v0 import demangle_v0

__all__ = ["demangle"]

_RUST_ESCAPES = {"SP": "@", "BP": "*", "RF": "&", "LT": "<", "GT": ">", "LP": "(", "RP": ")", "C": ","}
_RUST_HASH = re.compile(r"^h[0-9a-f]{16}$")
# a mangled name, then compiler clone suffixes (Rust's ".." inside a name is not one)
_LLVM_SUFFIX = re.compile(r"\.llvm\.\d+|^\.\d+$")  # uniquing suffixes: LTO's, a bare .N
_CLONE_SUFFIX = re.compile(r"^(.*?)((?:\.[A-Za-z_]+(?:\.\d+)?|\.\d+)*)$", re.S)


@lru_cache(maxsize=1)
def _cxa():
    for name in (ctypes.util.find_library("stdc++"), "libstdc++.so.6"):
        if not name:
            continue
        try:
            fn = ctypes.CDLL(name).__cxa_demangle
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
        return fn
    return None


_libc_free = ctypes.CDLL(None).free
_libc_free.argtypes = [ctypes.c_void_p]


def _itanium(name: str) -> str | None:
    fn = _cxa()
    if fn is None:
        return None
    status = ctypes.c_int(0)
    out = fn(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not out:
        return None
    try:
        return ctypes.string_at(out).decode("utf-8", "replace")
    finally:
        _libc_free(out)


def _rust_legacy(name: str) -> str | None:
    """``_ZN`` + length-prefixed parts + ``17h<16 hex>E`` -> ``a::b::c``."""
    body = name[3:] if name.startswith("_ZN") else name[4:] if name.startswith("__ZN") else None
    if body is None:
        return None
    parts, i = [], 0
    while i < len(body) and body[i] != "E":
        j = i
        while j < len(body) and body[j].isdigit():
            j += 1
        if j == i:
            return None
        n = int(body[i:j])
        parts.append(body[j:j + n])
        i = j + n
        if i > len(body):
            return None
    if i >= len(body) or not parts or not _RUST_HASH.match(parts[-1]):
        return None  # no hash: an ordinary C++ name
    return "::".join(_rust_part(p) for p in parts[:-1])


def _rust_part(p: str) -> str:
    if p.startswith("_$"):
        p = p[1:]
    out, i = [], 0
    while i < len(p):
        if p[i] == "$":
            end = p.find("$", i + 1)
            code = p[i + 1:end] if end > 0 else ""
            if code in _RUST_ESCAPES:
                out.append(_RUST_ESCAPES[code])
            elif code.startswith("u") and len(code) > 1:
                try:
                    out.append(chr(int(code[1:], 16)))
                except ValueError:
                    out.append(f"${code}$")
            else:
                out.append(p[i:end + 1] if end > 0 else p[i:])
                if end < 0:
                    break
            i = end + 1
        elif p.startswith("..", i):
            out.append("::")
            i += 2
        else:
            out.append(p[i])
            i += 1
    return "".join(out)


def demangle(name: str) -> str:
    """The readable form of a linker symbol (unchanged when it is not mangled)."""
    if not name.startswith(("_Z", "__Z", "_R", "__R")):
        return name
    base, suffix = _CLONE_SUFFIX.match(name).groups()  # .cold, .isra.0, .llvm.123: compiler clones
    if base.startswith(("_R", "__R")):
        readable = demangle_v0(base)
    else:
        readable = _rust_legacy(base) or _itanium(base)
    if readable is None:
        return name
    suffix = _LLVM_SUFFIX.sub("", suffix)  # (uniquing: says nothing to a reader)
    return readable + (f" [{suffix[1:]}]" if suffix else "")
