"""``load(path, event=None)``: read a profile file of any format ddprof_nb understands.

The format is sniffed from the content, not trusted from the name: gzip -> inflated,
then sniffed again (pprof, or gzipped JSON); a JSON object -> speedscope (``profiles``
and ``shared``) or the Firefox Profiler's processed profile (``meta`` and ``threads``:
what CPython 3.15's ``profiling.sampling --gecko`` writes); UTF-8 text whose first
line is ``frames value`` -> folded stacks (py-spy's ``--format raw`` too); anything
else is tried as raw (uncompressed) pprof.  A directory is read as ``<event>.folded``
files.

Other tools' files (py-spy, pyinstrument, Go's runtime/pprof...) need no options, with
one exception: a folded file does not say which event it holds, nor what its numbers
count.  ddprof_nb names its folded files ``<event>.folded`` and writes quantities (ns or
bytes); other tools' folded files (py-spy, perf, flamegraph.pl) hold sample counts, so
pass ``event=`` and ``interval_ns=`` (one sample's worth: py-spy's default rate of
100 Hz is 10 ms)::

    load("py-spy.txt", event="cpu", interval_ns=10_000_000)

Files are untrusted input.  Loading never executes code (no pickle, no eval), refuses
files over 1 GiB (256 MiB for JSON and text, which grow ~10x as Python objects), caps
what gzip may inflate to (``MAX_DECOMPRESSED``), and raises ``ValueError`` naming the
file and the problem for truncated, corrupt or unrecognised content.  A missing file
stays an OSError.
"""

from __future__ import annotations

import codecs
import os
import re

from .exporters.files import MAX_FILE_BYTES, MAX_TEXT_BYTES, gc_paused, human_size, read_source
from .model import Profile

__all__ = ["load", "sniff", "MAX_DECOMPRESSED", "FORMATS"]

MAX_DECOMPRESSED = 512 << 20  # what a gzipped file may inflate to
_SNIFF = 1 << 16
_FOLDED_LINE = re.compile(r"^[^\x00-\x08\x0b-\x1f\x7f]* [-+]?\d{1,19}\r?$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
FORMATS = "gzipped or raw pprof, speedscope JSON, Firefox Profiler (gecko) JSON, folded stacks"


def sniff(data: bytes) -> str | None:
    """``"gzip"``, ``"json"`` (a JSON object: speedscope or Firefox Profiler), ``"folded"``
    (folded-stack text), or None when the content could still be raw protobuf."""
    if data[:2] == b"\x1f\x8b":
        return "gzip"
    head = data[:_SNIFF]
    text = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        head_text = text.decode(head, final=len(data) <= _SNIFF)
    except UnicodeDecodeError:
        return None
    head_text = head_text.lstrip("\ufeff")
    stripped = head_text.lstrip(" \t\r\n")
    if stripped.startswith("{"):
        return "json"
    if _CONTROL.search(head_text):
        return None
    for line in stripped.split("\n"):
        if line.strip():
            return "folded" if _FOLDED_LINE.match(line) else None
    return None


def load(source, event=None, *, name: str | None = None, interval_ns: int | None = None,
         max_decompressed: int = MAX_DECOMPRESSED) -> Profile:
    """The Profile stored in ``source`` (a path, a directory of folded files, or bytes).

    ``event`` names the event of a folded file whose name does not, and forces the event
    of other tools' speedscope and Firefox Profiler profiles.  ``interval_ns`` is what one
    sample is worth where a file counts samples: a folded file's numbers (given: they are
    sample counts; not given: quantities, as ddprof_nb writes them) and unit-less
    speedscope weights (default 10 ms).  ``name`` names the input in errors.
    ``ValueError`` naming the file for anything that is not a readable profile.
    """
    from .exporters import folded, pprof

    if interval_ns is not None and (isinstance(interval_ns, bool) or not isinstance(interval_ns, int)
                                    or interval_ns <= 0):
        raise ValueError(f"interval_ns must be a positive integer (nanoseconds), not {interval_ns!r}")
    is_bytes = isinstance(source, (bytes, bytearray, memoryview))
    if not is_bytes and os.path.isdir(source):
        return folded.read(source, name=name)
    data, name = read_source(source, name, MAX_FILE_BYTES)
    if not data:
        raise ValueError(f"{name}: empty file (not a profile; expected {FORMATS})")
    kind = sniff(data)
    if kind == "gzip":
        from .exporters.pprof_proto import gunzip

        data = bytes(gunzip(data, name, max_decompressed))
        if sniff(data) != "json":
            return pprof.loads(data, name=name, max_uncompressed=max_decompressed)
        kind = "json"
    if kind in ("json", "folded") and len(data) > MAX_TEXT_BYTES:
        raise ValueError(f"{name}: {kind} file is {len(data)} bytes, more than the {human_size(MAX_TEXT_BYTES)} limit")
    if kind == "json":
        return _load_json(data, name, event, interval_ns)
    if kind == "folded":
        if event is None:
            event = folded.event_from_filename(name)
            if event is None:
                raise ValueError(
                    f"{name}: looks like folded stacks, but the name does not say which event they "
                    f"hold; name it <event>.folded (e.g. cpu.folded) or pass event=... (and "
                    f"interval_ns=... when the numbers are sample counts, as py-spy, perf and "
                    f"flamegraph.pl write them)"
                )
        return folded.read(data, name=name, event=event, interval_ns=interval_ns)
    try:
        return pprof.loads(data, name=name, max_uncompressed=max_decompressed)
    except ValueError as e:
        reason = str(e).removeprefix(f"{name}: ")
        raise ValueError(f"{name}: not a profile ddprof_nb can read (expected {FORMATS}); "
                         f"as raw pprof: {reason}") from None


def _load_json(data: bytes, name: str, event, interval_ns: int | None) -> Profile:
    """A speedscope or Firefox Profiler document, told apart by its keys."""
    from .exporters import speedscope
    from .importers import gecko

    options = {} if interval_ns is None else {"interval_ns": interval_ns}
    with gc_paused():
        doc = speedscope.parse_json(data, name)
        if isinstance(doc, dict) and "profiles" in doc and "shared" in doc:
            return speedscope.from_json(doc, name=name, event=event, **options)
        if gecko.looks_like(doc):
            return gecko.from_json(doc, name=name, event=event)
    raise ValueError(f"{name}: JSON, but neither a speedscope file (no 'profiles' and 'shared' keys) "
                     f"nor a Firefox Profiler file (no 'meta' and 'threads' keys)")
