"""Engine choice on an interpreter whose layout the native engine does not know.

The native engine reads CPython internals, so on a version it was not written for it
must refuse, never misread: engine="auto" falls back to the python engine and the
profile's notes say why, naming the version; engine="native" raises
EngineUnavailableError naming the version.

The version is perturbed two ways: a fake native engine class (independent of the
native code), and the real NativeEngine with the ``sys``/``platform`` it consults
replaced by proxies that report CPython 3.99 (its reason is then recomputed).
"""

import importlib
import pkgutil
import platform
import sys
import time
from pathlib import Path

import pytest

import ddprof_nb
from ddprof_nb import EngineUnavailableError, EventType
from ddprof_nb import sampler as sampler_mod
from ddprof_nb.config import SamplerConfig
from ddprof_nb.engines.base import Engine
from ddprof_nb.engines.python import PythonEngine

FUTURE = (3, 99, 0)
FUTURE_STR = "3.99.0"
NATIVE_SOURCE = Path(ddprof_nb.__file__).resolve().parent / "engines" / "native" / "engine.py"
# The versions the native engine is written for (3.11-3.15, the binding's SUPPORTED table,
# which must name them exactly); outside them it must refuse.
NATIVE_VERSIONS = ((3, 11), (3, 12), (3, 13), (3, 14), (3, 15))


def burn(cpu_seconds):
    end = time.thread_time() + cpu_seconds
    x = 0
    while time.thread_time() < end:
        x += 1
    return x


def profile_something(engine="auto"):
    with ddprof_nb.profile(events=("cpu", "wall"), engine=engine, interval="5ms") as p:
        burn(0.1)
    return p.profile


def assert_fell_back_naming(prof, version):
    assert prof.metadata.engine == "python"
    fallback = [n for n in prof.metadata.notes if n.startswith("fell back to the python engine")]
    assert fallback, prof.metadata.notes
    assert version in fallback[0], fallback
    # and the python engine's profile is a real one, not a misread
    assert prof.total("cpu") > 0.03e9
    assert any(s.stack[-1].name == "burn" for s in prof.samples() if s.event is EventType.CPU)


# -- a fake native engine: the choice logic alone ---------------------------------------
class FutureNative(Engine):
    """A native engine on an interpreter it does not know."""

    name = "native"
    supported_events = frozenset({EventType.CPU, EventType.WALL})

    @classmethod
    def unavailable_reason(cls):
        return f"the native engine supports CPython 3.11-3.15, not {FUTURE_STR}; use engine='python'"

    def start(self):
        raise AssertionError("an unavailable native engine must never be started")

    def stop(self):
        raise AssertionError("an unavailable native engine must never be stopped")


@pytest.fixture
def fake_native(monkeypatch):
    monkeypatch.setattr(sampler_mod, "_engine_classes", lambda: {"python": PythonEngine, "native": FutureNative})


def test_auto_falls_back_to_python_naming_the_version(fake_native):
    cls, note = sampler_mod.choose_engine(SamplerConfig.make(engine="auto"))
    assert cls is PythonEngine
    assert FUTURE_STR in note
    assert_fell_back_naming(profile_something("auto"), FUTURE_STR)


def test_native_requested_raises_naming_the_version(fake_native):
    with pytest.raises(EngineUnavailableError, match=FUTURE_STR.replace(".", r"\.")):
        sampler_mod.choose_engine(SamplerConfig.make(engine="native"))
    with pytest.raises(EngineUnavailableError, match=FUTURE_STR.replace(".", r"\.")):
        profile_something("native")
    assert sampler_mod.active() is None  # nothing left running


def test_a_native_module_that_fails_to_import_falls_back_too(monkeypatch):
    broken = ImportError("ddprof_nb._native: undefined symbol _PyFoo")
    monkeypatch.setattr(sampler_mod, "_engine_classes", lambda: {"python": PythonEngine, "native": broken})
    prof = profile_something("auto")
    assert prof.metadata.engine == "python"
    assert any("undefined symbol _PyFoo" in n for n in prof.metadata.notes), prof.metadata.notes
    with pytest.raises(EngineUnavailableError, match="undefined symbol"):
        profile_something("native")


# -- the real native engine ----------------------------------------------------------------
class _VersionInfo(tuple):
    major = property(lambda self: self[0])
    minor = property(lambda self: self[1])
    micro = property(lambda self: self[2])
    releaselevel = property(lambda self: self[3])
    serial = property(lambda self: self[4])


class _Proxy:
    """A module stand-in: the given attributes, everything else from the real module."""

    def __init__(self, real, **overrides):
        self.__dict__.update(overrides)
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)


def _native_modules():
    if not NATIVE_SOURCE.is_file():
        pytest.skip("ddprof_nb/engines/native/engine.py is not written yet")
    native = importlib.import_module("ddprof_nb.engines.native")  # must import when it exists
    # every module of the engine imported now, with the real verdict: a module first imported
    # while a test fakes the version would keep the fake's missing ``lib`` for the process
    for info in pkgutil.iter_modules(native.__path__, native.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - a refused engine may not import every part
            pass
    mods = [native]
    binding = sys.modules.get("ddprof_nb.engines.native.binding")
    if binding is not None:
        mods.append(binding)
    return native, mods


def perturb_version(monkeypatch, version):
    """Make the native engine see CPython ``version`` and recompute its verdict."""
    native, mods = _native_modules()
    major, minor, micro = version
    fake_sys = _Proxy(sys, version_info=_VersionInfo((major, minor, micro, "final", 0)),
                      hexversion=(major << 24) | (minor << 16) | (micro << 8) | 0xF0,
                      version=f"{major}.{minor}.{micro} (fake)")
    fake_platform = _Proxy(platform, python_version=lambda: f"{major}.{minor}.{micro}",
                           python_version_tuple=lambda: (str(major), str(minor), str(micro)))
    for mod in mods:
        if getattr(mod, "sys", None) is sys:
            monkeypatch.setattr(mod, "sys", fake_sys)
        if getattr(mod, "platform", None) is platform:
            monkeypatch.setattr(mod, "platform", fake_platform)
        if getattr(mod, "version_info", None) is sys.version_info:
            monkeypatch.setattr(mod, "version_info", fake_sys.version_info)
    # the verdict may be computed once at import (binding._load) or cached: recompute it,
    # with every global it may set restored afterwards
    for mod in mods:
        load = getattr(mod, "_load", None)
        if callable(load):
            for name in ("_reason", "ffi", "lib"):
                if hasattr(mod, name):
                    monkeypatch.setattr(mod, name, getattr(mod, name))
            load()
    _clear_cache(native.NativeEngine)
    return native.NativeEngine


def _clear_cache(cls):
    clear = getattr(cls.unavailable_reason, "cache_clear", None)
    if clear is not None:
        clear()


@pytest.fixture
def perturbed(monkeypatch):
    """``perturbed(version)`` -> NativeEngine seeing that version; undone after the test."""
    used = []

    def apply(version):
        cls = perturb_version(monkeypatch, version)
        used.append(cls)
        return cls

    yield apply
    for cls in used:  # (monkeypatch restores the names after this; a cache must not keep the fake)
        _clear_cache(cls)


@pytest.fixture
def future_native(perturbed):
    return perturbed(FUTURE)


def test_real_native_engine_refuses_an_unknown_version(future_native):
    reason = future_native.unavailable_reason()
    assert reason and FUTURE_STR in reason, reason
    # auto -> python with the reason in the notes
    cls, note = sampler_mod.choose_engine(SamplerConfig.make(engine="auto"))
    assert cls is PythonEngine and FUTURE_STR in note, note
    assert_fell_back_naming(profile_something("auto"), FUTURE_STR)
    # native -> EngineUnavailableError naming the version, also when started directly
    with pytest.raises(EngineUnavailableError, match=FUTURE_STR.replace(".", r"\.")):
        sampler_mod.choose_engine(SamplerConfig.make(engine="native"))
    with pytest.raises(EngineUnavailableError, match=FUTURE_STR.replace(".", r"\.")):
        future_native(SamplerConfig.make(engine="native")).start()
    assert sampler_mod.active() is None


def test_real_native_engine_refuses_a_build_for_another_version(perturbed):
    """A module compiled for one supported version never reads another's layout."""
    native, _ = _native_modules()
    if native.NativeEngine.unavailable_reason() is not None:
        pytest.skip(f"native engine unavailable here: {native.NativeEngine.unavailable_reason()}")
    here = sys.version_info[:2]
    other = next(v for v in NATIVE_VERSIONS if v != here)
    cls = perturbed((*other, 0))
    reason = cls.unavailable_reason()
    assert reason, "a module built for another CPython must be refused"
    assert f"{other[0]}.{other[1]}" in reason, reason
    with pytest.raises(EngineUnavailableError):
        sampler_mod.choose_engine(SamplerConfig.make(engine="native"))


@pytest.mark.quick
def test_this_interpreter_gets_a_clear_verdict():
    from ddprof_nb.engines.native import binding as _binding

    assert tuple(_binding.SUPPORTED) == NATIVE_VERSIONS  # one table, named the same everywhere
    native, _ = _native_modules()
    reason = native.NativeEngine.unavailable_reason()
    cls, note = sampler_mod.choose_engine(SamplerConfig.make(engine="auto"))
    if sys.version_info[:2] not in NATIVE_VERSIONS:
        # the native engine is written for 3.11-3.15: here it must refuse, naming the version
        assert reason and platform.python_version() in reason, reason
    if reason is None:
        assert cls is native.NativeEngine and note is None
    else:
        assert cls is PythonEngine and reason in note
        prof = profile_something("auto")
        assert prof.metadata.engine == "python"
        assert any(reason in n for n in prof.metadata.notes)
