"""The one importer of ``ddprof_nb._native``: loading, checks, error codes.

``import ddprof_nb`` never fails because of the native module: ``unavailable_reason()``
says why it cannot be used (missing build, another Python's build, a table mismatch, an
interpreter layout it cannot confirm).  Every native call that can fail goes through
``check()``, which turns a ``DDP_E*`` code into ``ProfilerBusyError`` /
``EngineUnavailableError`` / ``NotRunningError`` / ``ProfilerError`` with ``ddp_strerror``'s
text and errno.  The rest of the package takes ``ffi`` and ``lib`` from here.
"""

from __future__ import annotations

import os
import platform
import sys
import sysconfig

from ...errors import EngineUnavailableError, NotRunningError, ProfilerBusyError, ProfilerError
from ...events import EventType, FrameKind

__all__ = ["unavailable_reason", "lib", "ffi", "check", "require", "FRAME_SIZE"]

ffi = None
lib = None
_reason: str | None = None

# CPython versions whose internal layout native/pyinternals.h reads (GIL builds only).  On
# 3.13+ the running interpreter's published offsets (_PyRuntime.debug_offsets) are also
# compared with the compiled ones at load: any difference refuses the engine.
SUPPORTED = ((3, 11), (3, 12), (3, 13), (3, 14), (3, 15))

def _version_hex_tuple(v: int) -> tuple[int, int, int]:
    return (v >> 24) & 0xFF, (v >> 16) & 0xFF, (v >> 8) & 0xFF


def _check_tables(lib_, ffi_) -> str | None:
    """None when the compiled events.h table equals ddprof_nb.events' parse of it."""
    if lib_.ddp_event_count() != len(EventType):
        return f"native module has {lib_.ddp_event_count()} event types, events.h has {len(EventType)}"
    for ev in EventType:
        name = lib_.ddp_event_name(ev.value)
        if name == ffi_.NULL or ffi_.string(name).decode() != ev.label:
            return f"event {ev.value} is named differently in the native module"
        (ct, cu), (qt, qu) = ev.value_types
        for i, want in enumerate((ct, cu, qt, qu)):
            got = lib_.ddp_event_value_type(ev.value, i)
            if got == ffi_.NULL or ffi_.string(got).decode() != want:
                return f"event {ev.label}: value type {i} differs in the native module"
        if lib_.ddp_event_leaf_kind(ev.value) != ev.leaf_kind.value:
            return f"event {ev.label}: leaf frame kind differs in the native module"
    if lib_.ddp_frame_kind_count() != len(FrameKind):
        return "the native module's frame-kind table differs from events.h"
    for fk in FrameKind:
        name = lib_.ddp_frame_kind_name(fk.value)
        if name == ffi_.NULL or ffi_.string(name).decode() != fk.label:
            return f"frame kind {fk.value} differs in the native module"
    return None


def _layout_problem(lib_, ffi_) -> str | None:
    """None when the interpreter's published offsets (3.13+) equal the compiled ones."""
    if not hasattr(lib_, "ddp_py_layout_problem"):
        return "the native module predates the layout check; reinstall ddprof_nb"
    msg = ffi_.new("char[]", 512)
    if lib_.ddp_py_layout_problem(msg, 512) == 0:
        return None
    return ffi_.string(msg).decode("utf-8", "replace") or "unknown layout problem"


def _load() -> None:
    global ffi, lib, _reason
    ffi = lib = None  # a refusal must never leave an earlier load usable
    _reason = None
    if not sys.platform.startswith("linux"):
        _reason = f"the native engine needs Linux (this is {sys.platform})"
        return
    if platform.python_implementation() != "CPython":
        _reason = f"the native engine needs CPython (this is {platform.python_implementation()})"
        return
    if sys.version_info[:2] not in SUPPORTED:
        lo, hi = SUPPORTED[0], SUPPORTED[-1]
        _reason = (
            f"the native engine supports CPython {lo[0]}.{lo[1]}-{hi[0]}.{hi[1]}, not {platform.python_version()}; "
            "use engine='python'"
        )
        return
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        _reason = (
            f"the native engine does not support free-threaded CPython ({platform.python_version()} "
            "built with --disable-gil); use engine='python'"
        )
        return
    try:
        from ... import _native  # noqa: PLC0415 - the one place it is imported
    except Exception as exc:  # noqa: BLE001 - missing, or built for something else
        _reason = f"the native module could not be loaded ({type(exc).__name__}: {exc}); reinstall ddprof_nb with a C compiler"
        return
    compiled = _version_hex_tuple(_native.lib.ddp_compiled_python_version())
    running = tuple(sys.version_info[:3])
    if compiled != running:
        _reason = (
            "the native module was compiled against CPython "
            f"{'.'.join(map(str, compiled))} but this is CPython {'.'.join(map(str, running))}: "
            "it reads interpreter internals, so it refuses other versions' layouts; reinstall ddprof_nb"
        )
        return
    mismatch = _check_tables(_native.lib, _native.ffi)
    if mismatch:
        _reason = f"native module out of date ({mismatch}); reinstall ddprof_nb"
        return
    layout = _layout_problem(_native.lib, _native.ffi)
    if layout:
        _reason = (
            f"the native engine refuses CPython {platform.python_version()}: {layout}; "
            "it never reads interpreter memory with a layout it cannot confirm (use engine='python')"
        )
        return
    ffi, lib = _native.ffi, _native.lib


_load()


def unavailable_reason() -> str | None:
    """Why the native engine cannot run here, or None."""
    return _reason


def require():
    """``lib``, or EngineUnavailableError saying why the native engine cannot run."""
    if lib is None:
        raise EngineUnavailableError(_reason or "the native engine is unavailable")
    return lib


_HINTS = {
    -5: (
        "SIGPROF already has a handler (another profiler or library installed it); ddprof_nb "
        "will not replace it. Stop that profiler, or use engine='python'"
    ),
}


def check(rc: int, what: str) -> int:
    """Return ``rc`` when >= 0; otherwise raise the exception its DDP_E* code stands for."""
    if rc >= 0:
        return rc
    text = ffi.string(lib.ddp_strerror(rc)).decode()
    msg = f"{what}: {text}"
    if rc in _HINTS:
        msg += f" ({_HINTS[rc]})"
    err = lib.ddp_last_errno()
    if rc in (lib.DDP_ESYS, lib.DDP_ETIMER) and err:
        msg += f" [errno {err}: {os.strerror(err)}]"
    if rc == lib.DDP_EBUSY:
        raise ProfilerBusyError(msg)
    if rc == lib.DDP_EUNSUPPORTED:
        raise EngineUnavailableError(msg)
    if rc == lib.DDP_ENOTRUNNING:
        raise NotRunningError(msg)
    raise ProfilerError(msg)


FRAME_SIZE = 24  # sizeof(ddp_frame): the record layout's frame stride, checked in Session.__init__
