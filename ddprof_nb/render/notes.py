"""A profile's notes, sorted for a reader: warnings first, then the rest.

A warning is a note that says the profile is less than what ran: samples lost or
dropped, a sampler degraded or refused, a hook taken by another tool, a session ended
early.  Everything else (rates, sources, how a value was computed) is a plain note.
Engines write notes as sentences; the words below are how they say "less than what
ran", so this one pattern is where that reading lives.
"""

from __future__ import annotations

import re

from ..events import EventType
from ..model import Profile

__all__ = ["is_warning", "sorted_notes", "warning_count"]

_WARNING = re.compile(
    r"\bdegraded\b|\bdropped\b|\blost\b|\bmissing\b|\bunreadable\b|\bfailed\b|\bcould not\b|\bcannot\b"
    r"|\bfell back\b|\bstopped (early|refreshing)\b|\bignored\b|\bnot (tracked|kept|recorded|profiled)\b"
    r"|\bwere not seen\b|\bnot in this profile\b|\bleft unhooked\b|\bunderestimated\b|\bsampling error"
    r"|\banother (tool|library|allocator)\b|\bsomeone else\b|\bleft the cluster\b|\brestarted\b",
    re.IGNORECASE,
)


def is_warning(note: str) -> bool:
    """Whether ``note`` says something was lost, degraded, refused or taken by another tool."""
    return bool(_WARNING.search(note))


def _dropped_note(profile: Profile) -> str | None:
    """The metadata's dropped counts as one warning (they are not always in the notes)."""
    dropped = {EventType.parse(e): int(v) for e, v in dict(profile.metadata.dropped).items() if int(v)}
    if not dropped:
        return None
    per = ", ".join(f"{e.label} {v:,}" for e, v in dropped.items())
    return (f"samples dropped while recording ({per}): a full buffer or a stack that changed while it was read; "
            "the totals are that much lower than what ran")


def sorted_notes(profile: Profile) -> tuple[list[str], list[str]]:
    """(warnings, other notes) of ``profile``, each in the order the engine wrote them."""
    notes = list(dict.fromkeys(profile.metadata.notes))
    warnings = [n for n in notes if is_warning(n)]
    dropped = _dropped_note(profile)
    if dropped is not None and not any("dropped" in w for w in warnings):  # the engine said it already
        warnings.insert(0, dropped)
    return warnings, [n for n in notes if not is_warning(n)]


def warning_count(profile: Profile) -> int:
    return len(sorted_notes(profile)[0])
