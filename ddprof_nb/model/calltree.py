"""Call-tree transforms: pure functions from a Profile to a new Profile.

The views people reach for when a top-down flame graph is unreadable (speedscope's
sandwich, the Firefox Profiler's inverted tree and call-tree transforms).  Each rewrites
stacks (root first, as in ``model``) and leaves threads, labels, sample times and
metadata as they were; stacks that become equal are merged and their values added.
They compose: every one takes and returns a Profile, and ``Profile`` has a method for
each (``p.collapse_recursion().merge_function("helper").inverted()``).

Regexes follow ``selection`` (and pprof): a regex matches a frame when ``re.search``
finds it in the frame's name or file name.  A *function* is a frame's
``function_key`` (name, file, first line, kind): the frames of its lines are one function.

* ``sandwich(p, function)`` -> (callers, callees): every sample whose stack holds the
  function, split at its outermost call (so recursion counts once).  ``callers`` is
  inverted: the function is the root, then its caller, that caller's caller...;
  ``callees`` starts at the function and goes down to the leaves.  Both roots are the
  function itself (one frame, ``function_frame``), so each tree's total is the
  function's total, merged over every call site.  ``caller_chains(callers)`` turns
  ``callers`` back into top-down chains for a table of callers.
* ``inverted(p)``: stacks reversed (bottom-up): the roots are the leaves, so a root's
  total is that function's self time.
* ``merge_function(p, regex)``: the matching frames are removed; their time goes to
  their caller.
* ``drop_function(p, regex)``: the samples whose stack holds a matching frame are dropped.
* ``collapse_recursion(p, regex=None, direct_only=False)``: when a function is already
  on the stack, a later call of it (directly, or through other functions) and the frames
  between are removed: ``main;f;g;f;h`` -> ``main;f;h``.  Each function then appears
  once per stack, leaves (so self times) and the total are unchanged; a function between
  two calls of another loses those samples from its total.  ``direct_only`` merges only
  a function calling itself directly (``f;f;f`` -> ``f``); ``regex`` limits it to the
  matching functions.
* ``collapse_module(p, regex)``: the consecutive frames whose FILE NAME matches become
  one frame named after the matched directory or file (``site-packages/numpy/`` ->
  ``numpy``), so a library called from user code (or calling back into it) is one box.
"""

from __future__ import annotations

import difflib
import os
from typing import Callable, Sequence

import numpy as np

from ..events import EventType
from . import selection
from .data import CSRStacks, Frame, aggregate_columns, columns

__all__ = [
    "sandwich", "inverted", "merge_function", "drop_function", "collapse_recursion",
    "collapse_module", "function_keys", "function_frame", "caller_chains",
]


def _restack(profile: Profile, fn: Callable[[tuple[int, ...]], Sequence[int]], extra: Sequence[Frame] = ()) -> Profile:
    """``profile`` with every stack its samples use replaced by ``fn(frame indexes)``
    (root first; indexes into ``profile.frames`` followed by ``extra``); stacks that
    become equal merge, and so do their rows.  (Indexes, not Frames: hashing a Frame
    costs a microsecond, and a large profile holds a million stack entries.)"""
    stacks = profile.stacks
    interned: dict[tuple[int, ...], int] = {}
    new_stacks: list[tuple[int, ...]] = []
    stack_map = np.zeros(max(1, len(stacks)), dtype=np.int32)
    for s in np.unique(profile.stack).tolist():
        t = tuple(fn(stacks[s]))
        sid = interned.get(t)
        if sid is None:
            sid = interned[t] = len(new_stacks)
            new_stacks.append(t)
        stack_map[s] = sid
    cols = aggregate_columns(profile.event, stack_map[profile.stack], profile.thread, profile.labels,
                             profile.time_ns, profile.values)
    return profile.replace(frames=profile.frames + tuple(extra), stacks=new_stacks, **columns(cols))


def _frame_index(profile: Profile, extra: list[Frame]) -> Callable[[Frame], int]:
    """Index of a frame in ``profile.frames`` + ``extra``, appending it to ``extra`` when new."""
    index = {f: i for i, f in enumerate(profile.frames)}

    def of(frame: Frame) -> int:
        i = index.get(frame)
        if i is None:
            i = index[frame] = len(profile.frames) + len(extra)
            extra.append(frame)
        return i

    return of


# ----------------------------------------------------------------------------- simple


def inverted(profile: Profile) -> Profile:
    """The bottom-up profile: every stack reversed, so its roots are the leaves.  Reversal
    maps distinct stacks to distinct stacks: rows stay as they are, and the stacks table
    is reversed segment by segment in numpy."""
    return profile.replace(stacks=_reversed_stacks(profile))


# The explorer's filters make views that share their base's stacks table, and the call
# tree's shape is cached per table: one reversed table per base keeps that cache warm
# while the inverted view is on (its shape cost 0.2-0.3 s of CPU at every filter change).
_reversed: list[tuple[object, CSRStacks]] = []


def _reversed_stacks(profile: Profile) -> CSRStacks:
    for stacks, rev in _reversed:
        if stacks is profile.stacks:
            return rev
    flat, offsets = profile.flat_stacks()
    lengths = np.diff(offsets)
    seg_start = np.repeat(offsets[:-1], lengths)
    seg_end = np.repeat(offsets[1:], lengths)
    positions = np.arange(len(flat), dtype=np.int64)
    rev = CSRStacks(flat[seg_start + seg_end - 1 - positions] if len(flat) else flat, offsets)
    _reversed[:] = [(profile.stacks, rev)] + _reversed[:1]  # the last two tables
    return rev


def merge_function(profile: Profile, pattern: str) -> Profile:
    """The matching frames removed from every stack: their time goes to their caller."""
    if selection.compile_regex(pattern, "merge_function regex") is None:
        raise ValueError("merge_function: the regex is empty")
    return selection.filter(profile, hide=pattern)


def drop_function(profile: Profile, pattern: str) -> Profile:
    """Only the samples whose stack holds no matching frame."""
    if selection.compile_regex(pattern, "drop_function regex") is None:
        raise ValueError("drop_function: the regex is empty")
    return selection.filter(profile, ignore=pattern)


def collapse_recursion(profile: Profile, pattern: str | None = None, *, direct_only: bool = False) -> Profile:
    """Recursion collapsed (see the module docstring): each function (or each matching
    one) once per stack; ``direct_only``: only a function calling itself directly."""
    rx = selection.compile_regex(pattern, "collapse_recursion regex")
    eligible = selection.frame_matches(profile, rx).tolist() if rx is not None else None
    function_ids: dict[tuple, int] = {}
    fn_of = [function_ids.setdefault(f.function_key, len(function_ids)) for f in profile.frames]

    def collapse(stack: tuple[int, ...]) -> list[int]:
        out: list[int] = []
        where: dict[int, int] = {}  # function -> its position in out
        for fi in stack:
            fn = fn_of[fi]
            at = where.get(fn)
            if at is not None and (eligible is None or eligible[fi]) and (
                    not direct_only or at == len(out) - 1):
                for dropped in out[at + 1:]:
                    where.pop(fn_of[dropped], None)
                del out[at + 1:]
                continue
            where[fn] = len(out)
            out.append(fi)
        return out

    return _restack(profile, collapse)


def collapse_module(profile: Profile, pattern: str) -> Profile:
    """Consecutive frames whose file name matches ``pattern`` collapsed into one frame
    named after the matched directory or file (its file name: the path up to the match)."""
    rx = selection.compile_regex(pattern, "collapse_module regex")
    if rx is None:
        raise ValueError("collapse_module: the regex is empty")
    extra: list[Frame] = []
    index_of = _frame_index(profile, extra)
    module_of: list[int | None] = []
    for f in profile.frames:
        m = rx.search(f.filename) if f.filename else None
        if m is None:
            module_of.append(None)
            continue
        path = f.filename[:m.end()]
        name = os.path.basename(path.rstrip("/\\")) or m.group(0) or path
        module_of.append(index_of(Frame(name, path, 0, 0, f.kind)))

    def collapse(stack: tuple[int, ...]) -> list[int]:
        out: list[int] = []
        previous = None
        for fi in stack:
            module = module_of[fi]
            if module is None:
                out.append(fi)
            elif module != previous:
                out.append(module)
            previous = module
        return out

    return _restack(profile, collapse, extra)


# ----------------------------------------------------------------------------- sandwich


def function_keys(profile: Profile, function) -> set[tuple]:
    """The function keys ``function`` names: a Frame (its function), or a string: a
    function's exact name, ``name (file)`` or ``name (file:first line)``.  ValueError
    when it names no function of the profile, or several (listing them)."""
    if isinstance(function, Frame):
        return {function.function_key}
    if not isinstance(function, str) or not function.strip():
        raise ValueError(f"sandwich: name a function (a non-empty name or a Frame), not {function!r}")
    text = function.strip()
    reps: dict[tuple, Frame] = {}
    for f in profile.frames:
        if text in (f.name, f"{f.name} ({f.filename})", f.label(with_line=False)):
            reps.setdefault(f.function_key, f)
    if len(reps) == 1:
        return set(reps)
    if len(reps) > 1:
        listed = "; ".join(sorted(f.label(with_line=False) for f in reps.values()))
        raise ValueError(f"sandwich: {len(reps)} functions are named {text!r} ({listed}); "
                         f"name one as 'name (file)' or 'name (file:line)'")
    names = sorted({f.name for f in profile.frames})
    close = difflib.get_close_matches(text, names, n=3)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(f"sandwich: no function named {text!r} in this profile{hint}")


def function_frame(profile: Profile, key: tuple) -> Frame:
    """The one frame that stands for function ``key`` (a ``function_key``): at its first
    line, or, when the format does not know it (folded stacks), its lowest line seen."""
    name, filename, first_line, kind = key
    line = first_line or min((f.line for f in profile.frames if f.function_key == key), default=0)
    return Frame(name, filename, line, first_line, kind)


def sandwich(profile: Profile, function, event=None) -> tuple[Profile, Profile]:
    """``(callers, callees)`` of ``function`` (see the module docstring), over the samples
    of ``event`` (default: every event present)."""
    keys = function_keys(profile, function)
    view = profile if event is None else selection.filter(profile, events=[EventType.parse(event)])
    is_target = np.fromiter((f.function_key in keys for f in view.frames), dtype=bool, count=len(view.frames))
    rows = selection._stacks_containing(view, is_target)[view.stack] if len(view) else np.zeros(0, dtype=bool)
    view = selection._select(view, rows)
    extra: list[Frame] = []
    index_of = _frame_index(view, extra)
    roots = {key: index_of(function_frame(view, key)) for key in keys}
    root_of = {i: roots[f.function_key] for i, f in enumerate(view.frames) if is_target[i]}
    target = is_target.tolist()

    def outermost(stack: tuple[int, ...]) -> int:
        return next(i for i, fi in enumerate(stack) if target[fi])

    def callers(stack: tuple[int, ...]) -> list[int]:
        at = outermost(stack)
        return [root_of[stack[at]], *stack[at - 1::-1]] if at else [root_of[stack[at]]]

    def callees(stack: tuple[int, ...]) -> list[int]:
        at = outermost(stack)
        return [root_of[stack[at]], *stack[at + 1:]]

    return _restack(view, callers, extra), _restack(view, callees, extra)


def caller_chains(callers: Profile) -> Profile:
    """A sandwich's ``callers`` as top-down call chains without the function itself:
    root = outermost caller, leaf = direct caller.  Its top table reads per caller:
    self = the function's time in calls made directly from it, total = the function's
    time reached through it (the function's own row would only repeat its total)."""
    return _restack(callers, lambda s: s[:0:-1])
