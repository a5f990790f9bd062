"""What every format shares: files written atomically and privately, inputs read with a
size limit, a read profile finished with its metadata, the GC paused while a format is built.

Files are written with mode 0600 (profiles reveal code paths, file names and label values)
and atomically: a temporary file in the same directory, then ``os.replace``.  Readers treat
files as untrusted: no pickle, no eval, inputs over ``MAX_FILE_BYTES`` refused.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import stat
from pathlib import Path

from ..model import MIN_TICK_NS

__all__ = ["write_atomic", "read_source", "finish_profile", "gc_paused", "human_size", "MAX_FILE_BYTES", "MAX_TEXT_BYTES"]

MAX_FILE_BYTES = 1 << 30  # no profile file we accept is larger than 1 GiB
# JSON and text formats become Python objects worth ~10x their size: a lower cap keeps
# loading within a few GiB of memory.
MAX_TEXT_BYTES = 256 << 20

def write_atomic(dest, data: bytes | str) -> None:
    """Write ``data`` to ``dest`` (a path or a binary file object).

    For a path: the file ends up with mode 0600 and either its old or its complete new
    contents, never a torn file (temporary file in the same directory, fsync, rename).
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    if hasattr(dest, "write"):
        dest.write(data)
        return
    path = Path(os.fspath(dest))
    directory = path.parent
    fd, tmp = _create_private_temp(directory, path.name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _create_private_temp(directory: Path, base: str) -> tuple[int, str]:
    """An exclusive new file next to the target, created with mode 0600 (O_EXCL: never
    follows or reuses an existing name)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".{base}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file in {directory}")


def read_source(source, name: str | None = None, limit: int = MAX_FILE_BYTES) -> tuple[bytes, str]:
    """The bytes of ``source`` (a path or bytes) and the name to use in error messages.

    Refuses anything that is not a regular file and anything larger than ``limit``
    bytes (``ValueError`` naming the input), before reading it.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        name = name or "<bytes>"
        if len(data) > limit:
            raise ValueError(f"{name}: input is {len(data)} bytes, more than the {human_size(limit)} limit")
        return data, name
    path = os.fspath(source)
    name = name or str(path)
    st = os.stat(path)  # FileNotFoundError etc. stay OSErrors: the input is missing, not malformed
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{name}: not a regular file")
    if st.st_size > limit:
        raise ValueError(f"{name}: file is {st.st_size} bytes, more than the {human_size(limit)} limit")
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # grew since stat
        raise ValueError(f"{name}: file is more than the {human_size(limit)} limit")
    return data, name


def finish_profile(builder, meta, tick_ns: int = 0):
    """``builder.build()`` with exactly ``meta`` and at least ``tick_ns``.

    The builder may derive an earlier end time or a finer tick than the profile that was
    written (its tick follows the data it saw); both are restored when they are
    consistent with the rows.
    """
    p = builder.build(end_ns=meta.end_ns)
    tick = p.tick_ns
    if (
        tick < tick_ns < 1 << 62
        and tick_ns % MIN_TICK_NS == 0
        and not (p.time_ns % tick_ns).any()
    ):
        tick = tick_ns
    if p.metadata == meta and tick == p.tick_ns:
        return p
    return p.replace(metadata=meta, tick_ns=tick)


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic GC while a format is built or parsed: that creates hundreds of
    thousands of small acyclic objects, and every collection they trigger would walk the
    whole heap (a notebook's heap can be large): pausing it more than halves to_pprof's
    time on 50k stacks."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def human_size(n: int) -> str:
    """``n`` bytes as "1 GiB", "256 MiB" or "123 bytes": a size limit in an error message,
    printed exactly (not rounded like ``render.format``'s measured values)."""
    if n % (1 << 30) == 0:
        return f"{n >> 30} GiB"
    if n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    return f"{n} bytes"
