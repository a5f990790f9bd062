"""``load(path)``: read a profile file of any format ddprof_nb understands.

The format is sniffed from the content, not trusted from the name: gzip -> pprof;
JSON object -> speedscope; UTF-8 text whose first line is ``frames value`` -> folded
stacks (event from ``event=`` or a file named ``<event>.folded``); anything else is
tried as raw (uncompressed) pprof.  A directory is read as ``<event>.folded`` files.

Files are untrusted input.  Loading never executes code (no pickle, no eval), refuses
files over 1 GiB (256 MiB for JSON and text, which grow ~10x as Python objects), caps
what gzip may inflate to (``MAX_DECOMPRESSED``), and raises ``ValueError`` naming the
file for truncated, corrupt or unrecognised content.  A missing file stays an OSError.
"""

from __future__ import annotations

import codecs
import os
import re

from .exporters import MAX_FILE_BYTES, MAX_TEXT_BYTES, human_size, read_source
from .model import Profile

__all__ = ["load", "sniff", "MAX_DECOMPRESSED"]

MAX_DECOMPRESSED = 512 << 20  # what a gzipped pprof may inflate to
_SNIFF = 1 << 16
_FOLDED_LINE = re.compile(r"^[^\x00-\x08\x0b-\x1f\x7f]* [-+]?\d{1,19}\r?$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
FORMATS = "gzipped or raw pprof, speedscope JSON, folded stacks"


def sniff(data: bytes) -> str | None:
    """``"pprof"`` (gzip), ``"speedscope"`` (a JSON object), ``"folded"`` (folded-stack
    text), or None when the content could still be raw protobuf."""
    if data[:2] == b"\x1f\x8b":
        return "pprof"
    head = data[:_SNIFF]
    text = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        head_text = text.decode(head, final=len(data) <= _SNIFF)
    except UnicodeDecodeError:
        return None
    head_text = head_text.lstrip("\ufeff")
    stripped = head_text.lstrip(" \t\r\n")
    if stripped.startswith("{"):
        return "speedscope"
    if _CONTROL.search(head_text):
        return None
    for line in stripped.split("\n"):
        if line.strip():
            return "folded" if _FOLDED_LINE.match(line) else None
    return None


def load(source, *, name: str | None = None, event=None, max_decompressed: int = MAX_DECOMPRESSED) -> Profile:
    """The Profile stored in ``source`` (a path, a directory of folded files, or bytes).

    ``event`` names the event of a folded file whose name does not (and forces the event
    of other tools' speedscope profiles).  ``ValueError`` naming the file for anything
    that is not a readable profile.
    """
    from .exporters import folded, pprof, speedscope

    is_bytes = isinstance(source, (bytes, bytearray, memoryview))
    if not is_bytes and os.path.isdir(source):
        return folded.read(source, name=name)
    data, name = read_source(source, name, MAX_FILE_BYTES)
    if not data:
        raise ValueError(f"{name}: empty file (not a profile; expected {FORMATS})")
    kind = sniff(data)
    if kind in ("speedscope", "folded") and len(data) > MAX_TEXT_BYTES:
        raise ValueError(f"{name}: {kind} file is {len(data)} bytes, more than the {human_size(MAX_TEXT_BYTES)} limit")
    if kind == "pprof":
        return pprof.loads(data, name=name, max_uncompressed=max_decompressed)
    if kind == "speedscope":
        return speedscope.read(data, name=name, event=event)
    if kind == "folded":
        if event is None:
            event = folded.event_from_filename(name)
            if event is None:
                raise ValueError(
                    f"{name}: looks like folded stacks, but the name does not say which event they "
                    f"hold; name it <event>.folded (e.g. cpu.folded) or pass event=..."
                )
        return folded.read(data, name=name, event=event)
    try:
        return pprof.loads(data, name=name, max_uncompressed=max_decompressed)
    except ValueError as e:
        reason = str(e).removeprefix(f"{name}: ")
        raise ValueError(f"{name}: not a profile ddprof_nb can read (expected {FORMATS}); "
                         f"as raw pprof: {reason}") from None
