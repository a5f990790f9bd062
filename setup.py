"""Build glue only: metadata lives in pyproject.toml.

The native core is compiled by cffi (build_native.py).  If it cannot be compiled
(no compiler, unsupported OS or Python), the install still succeeds without it and
starting the native sampler raises an error saying why (see ddprof_nb/engines/native/binding.py).
"""

import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildPyWithEventTable(build_py):
    """Ship native/events.h inside the package: Python reads the event table from it."""

    def run(self):
        super().run()
        if not self.editable_mode:
            target = Path(self.build_lib) / "ddprof_nb" / "_events.h"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(HERE / "native" / "events.h", target)


class OptionalBuildExt(build_ext):
    """Compile the native core; on failure, install the pure-Python part and say why."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any compiler failure
            self._report(exc)

    def build_extension(self, ext):
        # the native core is ~50 C files of one extension, which setuptools compiles one after
        # another: each in its own compiler process, on every core (the objects keep their order)
        serial = self.compiler.compile

        def compile_on_every_core(sources, *args, **kwargs):
            if len(sources) < 2:
                return serial(sources, *args, **kwargs)
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                parts = pool.map(lambda source: serial([source], *args, **kwargs), sources)
                return [obj for part in parts for obj in part]

        self.compiler.compile = compile_on_every_core
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._report(exc)
        finally:
            self.compiler.compile = serial

    def _report(self, exc):
        if os.environ.get("DDPROF_NB_REQUIRE_NATIVE") == "1":
            raise exc
        sys.stderr.write(
            f"\nWARNING: ddprof_nb's native sampler could not be built ({exc}).\n"
            "ddprof_nb installs without it; the portable Python engine will be used.\n\n"
        )


native_supported = sys.platform.startswith("linux") and sys.implementation.name == "cpython"

setup(
    cffi_modules=["build_native.py:ffibuilder"] if native_supported else [],
    cmdclass={"build_py": BuildPyWithEventTable, "build_ext": OptionalBuildExt},
)
