"""Exporters: write a Profile to pprof, speedscope, folded stacks or HTML, and read them back.

Every format module has the same small protocol:

* ``write(profile, dest, **own_options)`` — ``dest`` is a path (or a binary file object);
* ``read(path_or_bytes, *, name=None, ...) -> Profile`` — ``name`` names the input in errors.

This package is the dispatcher: ``save(profile, path, format=None, **options)`` (public as
``ddprof_nb.save``) picks the format from ``format`` or the file name.  What the formats
share (``write_atomic``, ``read_source``...) is ``exporters.files``; ``ddprof_nb.loading.load``
sniffs the format of a file to read.  A format module loads when a file of its format is
written (``import ddprof_nb`` imports this package).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["save", "FORMATS", "SUPPORTED_NAMES"]

FORMATS = ("pprof", "speedscope", "folded", "html")

SUPPORTED_NAMES = (
    "*.pprof or *.pb.gz (pprof), *.speedscope.json (speedscope), "
    "<event>.folded or *.<event>.folded (folded stacks of one event, e.g. cpu.folded; "
    "or pass event=...), an existing directory (one <event>.folded file per event), "
    "*.html (self-contained HTML report)"
)



def _format_of(p: Path, format: str | None) -> str:
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"format={format!r}: expected one of {', '.join(FORMATS)}")
        return format
    lower = p.name.lower()
    if p.is_dir() or lower.endswith(".folded"):
        return "folded"
    for fmt, endings in (("pprof", (".pprof", ".pb.gz")), ("speedscope", (".speedscope.json",)), ("html", (".html",))):
        if lower.endswith(endings):
            return fmt
    raise ValueError(f"{p}: cannot tell the format from this name; supported: {SUPPORTED_NAMES}")


def save(profile, path, format: str | None = None, **options) -> None:
    """Write ``profile`` to ``path`` in ``format`` (one of ``FORMATS``), by default the one its
    name asks for:

    * ``*.pprof``, ``*.pb.gz`` — gzipped pprof (``exporters.pprof``);
    * ``*.speedscope.json`` — speedscope JSON (``exporters.speedscope``);
    * ``*.folded`` — folded stacks of ONE event: named by the file (``cpu.folded``,
      ``run1.wall.folded``) or by ``event=``;
    * an existing directory — one ``<event>.folded`` file per event present;
    * ``*.html`` — self-contained HTML report (``exporters.html``).

    ``options`` go to the chosen format's ``write``.  A name that says no format raises
    ``ValueError`` listing the supported names.
    """
    p = Path(os.fspath(path))
    fmt = _format_of(p, format)
    if fmt == "pprof":
        from . import pprof

        pprof.write(profile, p, **options)
    elif fmt == "speedscope":
        from . import speedscope

        speedscope.write(profile, p, **options)
    elif fmt == "html":
        from . import html

        html.write(profile, p, **options)
    else:
        from . import folded

        if not p.is_dir() and options.get("event") is None:
            options["event"] = folded.event_from_filename(p.name)
            if options["event"] is None:
                raise ValueError(
                    f"{p}: a .folded file holds one event type; name it after the event "
                    f"(e.g. cpu.folded) or pass event=..."
                )
        folded.write(profile, p, **options)
