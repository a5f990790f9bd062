"""Selection: which samples and frames a view keeps.  ``filter`` (events, threads, labels,
time, focus/ignore/hide), ``merge`` (several profiles into one), ``map_stacks`` (every stack
rewritten) and ``drop_threads_only_in``.  Each returns a NEW Profile, made with its input's
``replace``; inputs are never modified.  (``Profile`` in the annotations is
``model.profile.Profile``, which imports this module for its methods: this one reads
Profiles, never makes one from scratch.)

Frame-regex semantics follow pprof: a regex matches a frame when it is found
(``re.search``) in the frame's name or its filename.
- ``focus``: keep samples whose stack has a matching frame;
- ``ignore``: drop samples whose stack has a matching frame;
- ``hide``: remove matching frames from stacks (samples kept, stacks re-merged).
"""

from __future__ import annotations

import os
import re
import threading
from typing import Callable, Mapping, Sequence

import numpy as np

from ..events import EventType
from .data import CSRStacks, Frame, Interner, aggregate_columns, columns, tick_for

__all__ = ["filter", "merge", "map_stacks", "map_stack_ids", "frame_matches", "compile_regex", "drop_threads_only_in"]


def compile_regex(pattern: str | None, what: str = "regex"):
    """``re.compile(pattern)``, or None for an empty pattern; a bad one raises ValueError naming it."""
    if pattern is None or pattern == "":
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid {what} {pattern!r}: {exc}") from None


def frame_matches(profile: Profile, pattern) -> np.ndarray:
    """Boolean mask over ``profile.frames``: does the regex find the frame's name or file?

    Cached per (frames table, pattern): a regex is tested once per distinct frame, and
    the views of one profile (which share its frames table) reuse the answer."""
    rx = compile_regex(pattern) if isinstance(pattern, str) else pattern
    frames = profile.frames
    return memo((frames,), ("frames", rx.pattern, rx.flags), lambda: np.fromiter(
        (bool(rx.search(f.name) or (f.filename and rx.search(f.filename))) for f in frames),
        dtype=bool,
        count=len(frames),
    ))


def _stacks_containing(profile: Profile, frame_mask: np.ndarray) -> np.ndarray:
    """Boolean mask over ``profile.stacks``: does the stack hold any frame in ``frame_mask``?"""
    flat, offsets = profile.flat_stacks()
    if len(flat) == 0:
        return np.zeros(len(profile.stacks), dtype=bool)
    # hits per stack from a running sum: empty stacks (also at the end) count 0
    csum = np.concatenate(([0], np.cumsum(frame_mask[flat], dtype=np.int64)))
    return csum[offsets[1:]] > csum[offsets[:-1]]


def _stacks_matching(profile: Profile, rx) -> np.ndarray:
    """``_stacks_containing`` for a regex, cached per (stacks table, frames table, regex)."""
    return memo((profile.stacks, profile.frames), ("stacks", rx.pattern, rx.flags),
                 lambda: _stacks_containing(profile, frame_matches(profile, rx)))


# Identity-keyed LRU memo of per-table results (frame/stack masks, hide's stack rewrite).
# Filter views share their base's frames/stacks tuples, so every control change of the
# explorer reuses them; entries hold their key objects, so ids cannot be recycled.
_MEMO_SIZE = 16
_memo_items: dict[tuple, tuple[tuple, object]] = {}
_memo_lock = threading.Lock()


def _after_fork_child() -> None:
    # every session's stop passes here (drop_sampler_frames filters): a fork taken while
    # another thread held the lock would leave it held in the child for good
    global _memo_lock
    _memo_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_child)


def memo(objs: tuple, extra: tuple, make):
    key = tuple(id(o) for o in objs) + extra
    with _memo_lock:
        hit = _memo_items.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], objs)):
            _memo_items[key] = _memo_items.pop(key)  # least recently used goes first
            return hit[1]
    value = make()
    with _memo_lock:
        while len(_memo_items) >= _MEMO_SIZE:
            _memo_items.pop(next(iter(_memo_items)))
        _memo_items[key] = (objs, value)
    return value


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """Unique values by sorting (numpy 2's default unique hashes, ~15x slower on 1M int64)."""
    if len(values) == 0:
        return values
    v = np.sort(values, kind="stable")
    keep = np.empty(len(v), dtype=bool)
    keep[0] = True
    np.not_equal(v[1:], v[:-1], out=keep[1:])
    return v[keep]


def _select(profile: Profile, rows: np.ndarray) -> Profile:
    """The same tables with only the sample rows in ``rows`` (a boolean mask, or
    ``slice(None)``: all rows, the columns shared rather than copied)."""
    cols = (profile.event, profile.stack, profile.thread, profile.labels, profile.time_ns, profile.values)
    if isinstance(rows, slice):
        cols = tuple(c[rows] for c in cols)
    else:
        # the mask made indices once: a boolean index scans the mask again per column
        # (six columns of a 1 M-row profile: ~55 ms by masks, ~10-30 ms by indices)
        idx = np.flatnonzero(rows)
        cols = tuple(np.take(c, idx, axis=0) for c in cols)
    return profile.replace(**columns(cols))  # (the same stacks table: its flat form is shared)


def filter(
    profile: Profile,
    *,
    events=None,
    threads=None,
    labels: Mapping[str, object] | None = None,
    time_range: tuple[int | None, int | None] | None = None,
    focus: str | None = None,
    ignore: str | None = None,
    hide: str | None = None,
) -> Profile:
    """A view of ``profile`` keeping the samples that meet every criterion given.

    events: EventTypes or names; threads: tids or thread names; labels: key -> value
    (or a list of accepted values); time_range: (start, end) ns relative to the
    profile's start, either end None for open; focus/ignore/hide: regexes (see module
    docstring).  Invalid regexes raise ValueError before any work is done.
    """
    focus_rx, ignore_rx, hide_rx = (compile_regex(p, w) for p, w in ((focus, "focus"), (ignore, "ignore"), (hide, "hide")))
    rows = np.ones(len(profile), dtype=bool)
    if events is not None:
        if isinstance(events, (str, EventType)):
            events = [events]
        ids = [EventType.parse(e).value for e in events]
        rows &= np.isin(profile.event, ids)
    if threads is not None:
        if isinstance(threads, (str, int)):
            threads = [threads]
        wanted = set(threads)
        keep = [i for i, t in enumerate(profile.threads) if t.tid in wanted or t.name in wanted]
        rows &= np.isin(profile.thread, keep)
    if labels:
        accepted = {k: {str(x) for x in (v if isinstance(v, (list, tuple, set, frozenset)) else [v])} for k, v in labels.items()}
        keep = [i for i, ls in enumerate(profile.labelsets) if all(ls.get(k) in vs for k, vs in accepted.items())]
        rows &= np.isin(profile.labels, keep)
    if time_range is not None:
        start, end = time_range
        if start is not None:
            rows &= profile.time_ns + profile.tick_ns > start
        if end is not None:
            rows &= profile.time_ns < end
    if focus_rx is not None:
        rows &= _stacks_matching(profile, focus_rx)[profile.stack]
    if ignore_rx is not None:
        rows &= ~_stacks_matching(profile, ignore_rx)[profile.stack]
    view = _select(profile, rows) if not rows.all() else _select(profile, slice(None))
    if hide_rx is not None:
        view = _hide(view, hide_rx)
    return view


def _hide(view: Profile, rx) -> Profile:
    """``view`` with the frames matching ``rx`` removed from its stacks; stacks that
    become equal are merged, and so are their samples' rows."""
    stack_map, stacks, flat, merged = memo((view.stacks, view.frames), ("hide", rx.pattern, rx.flags),
                                            lambda: _hidden_stacks(view, frame_matches(view, rx)))
    if stack_map is None:  # nothing to hide
        return view
    new_stack = stack_map[view.stack]
    cols = (view.event, new_stack, view.thread, view.labels, view.time_ns, view.values)
    if merged is not None:
        # rows of two old stacks may now share a key: re-aggregate those rows only
        # (the others keep unique keys because the rest of the map is one-to-one)
        need = merged[new_stack]
        if need.any():
            agg = aggregate_columns(*(c[need] for c in cols))
            rest = np.flatnonzero(~need)
            k = len(rest)
            out = []
            for c, g in zip(cols, agg):
                o = np.empty((k + len(g),) + c.shape[1:], dtype=c.dtype)
                np.take(c, rest, axis=0, out=o[:k])
                o[k:] = g
                out.append(o)
            cols = tuple(out)
    out = view.replace(stacks=stacks, **columns(cols))
    out._flat = flat
    return out


def _hidden_stacks(profile: Profile, hidden: np.ndarray):
    """The stacks table without the ``hidden`` frames, in numpy over the CSR form.

    Returns (old stack -> new stack map, the new stacks table (CSR-backed), its CSR
    form, mask of new stacks that several old ones merged into, or None), or Nones
    when no frame is hidden."""
    flat, offsets = profile.flat_stacks()
    n = len(profile.stacks)
    keep = ~hidden[flat] if len(flat) else np.ones(0, dtype=bool)
    if keep.all():
        return None, None, None, None
    ck = np.zeros(len(flat) + 1, dtype=np.int64)
    np.cumsum(keep, out=ck[1:])
    k_off = ck[offsets]  # offsets of each stack in the kept positions
    k_flat = flat[keep]
    stack_map, first = intern_segments(k_flat, k_off)
    m = len(first)
    merged = np.bincount(stack_map, minlength=m) > 1 if m < n else None
    # the new table: each new stack's first old stack, cut from the kept positions
    f_len = k_off[first + 1] - k_off[first]
    f_off = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(f_len, out=f_off[1:])
    new_flat = k_flat[_segment_gather(k_off[first], f_len, f_off)].astype(np.int32, copy=False)
    return stack_map, CSRStacks(new_flat, f_off), (new_flat, f_off), merged


_HASH_MULT: np.ndarray = np.zeros(0, dtype=np.uint64)


def _hash_multipliers(n: int) -> np.ndarray:
    """Fixed random odd 64-bit multipliers, one per position in a stack."""
    global _HASH_MULT
    if len(_HASH_MULT) < n:
        rng = np.random.default_rng(0x5EED)
        _HASH_MULT = rng.integers(0, 2**63, size=max(n, 256), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    return _HASH_MULT


def intern_segments(flat: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intern the CSR segments ``flat[offsets[i]:offsets[i+1]]``: equal segments get one
    id, ids handed out in order of first appearance.  Returns (id per segment (int32),
    index of each id's first segment).

    Vectorised: a position-weighted 64-bit hash groups the segments, then every segment
    is compared with its group's first one; a hash collision (never seen, but possible)
    falls back to interning tuples in a dict.  Exact either way."""
    n = len(offsets) - 1
    if n == 0:
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64)
    lengths = np.diff(offsets)
    pos = np.arange(len(flat), dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    mult = _hash_multipliers(int(lengths.max()) + 1)
    with np.errstate(over="ignore"):
        terms = (flat.astype(np.uint64) + np.uint64(1)) * mult[pos]
        csum = np.zeros(len(flat) + 1, dtype=np.uint64)
        np.cumsum(terms, out=csum[1:])
        h = csum[offsets[1:]] - csum[offsets[:-1]] + lengths.astype(np.uint64) * mult[-1]
    order = np.argsort(h, kind="stable")  # stable: a group's first member is its first segment
    hs = h[order]
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    np.not_equal(hs[1:], hs[:-1], out=starts[1:])
    rep = np.empty(n, dtype=np.int64)
    rep[order] = order[starts][np.cumsum(starts) - 1]
    dup = np.flatnonzero(rep != np.arange(n))
    if len(dup) and not _segments_equal(flat, offsets, dup, rep[dup]):
        return _intern_segments_dict(flat, offsets)
    is_first = rep == np.arange(n)
    first = np.flatnonzero(is_first)
    ids = np.cumsum(is_first) - 1
    return ids[rep].astype(np.int32), first


def _segments_equal(flat, offsets, a: np.ndarray, b: np.ndarray) -> bool:
    """Is segment a[i] equal to segment b[i] for every i?"""
    la = offsets[a + 1] - offsets[a]
    if not np.array_equal(la, offsets[b + 1] - offsets[b]):
        return False
    out = np.zeros(len(a) + 1, dtype=np.int64)
    np.cumsum(la, out=out[1:])
    return bool(np.array_equal(flat[_segment_gather(offsets[a], la, out)], flat[_segment_gather(offsets[b], la, out)]))


def _intern_segments_dict(flat, offsets) -> tuple[np.ndarray, np.ndarray]:
    vals, bounds = flat.tolist(), offsets.tolist()
    interned: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    ids = np.empty(len(bounds) - 1, dtype=np.int32)
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        k = interned.setdefault(tuple(vals[a:b]), len(interned))
        if k == len(first):
            first.append(i)
        ids[i] = k
    return ids, np.array(first, dtype=np.int64)


def _segment_gather(starts: np.ndarray, lengths: np.ndarray, out_offsets: np.ndarray) -> np.ndarray:
    """Positions of the segments [starts[i], starts[i] + lengths[i]) laid end to end."""
    return np.repeat(starts - out_offsets[:-1], lengths) + np.arange(int(out_offsets[-1]))


def map_stacks(profile: Profile, fn: Callable[[tuple[Frame, ...], tuple[int, ...]], Sequence[Frame]]) -> Profile:
    """A new Profile whose every stack is ``fn(frames, frame_indexes)`` (root first).

    Stacks that become equal are merged and their samples' values summed.
    """
    tables = Interner()
    known = tables.frame_ids(profile.frames)
    frames = profile.frames
    new_stack = np.fromiter(
        (known.stack_of(fn(tuple(frames[i] for i in s), s)) for s in profile.stacks),
        dtype=np.int32,
        count=len(profile.stacks),
    )
    return restacked(profile, tables, new_stack[profile.stack] if len(profile) else profile.stack)


def map_stack_ids(profile: Profile, fn: Callable[[tuple[int, ...]], Sequence[int]]) -> Profile:
    """A new Profile whose every stack is ``fn(frame_indexes)`` (root first, indexes into the
    same frame table, which is kept: a frame no stack holds any more stays in it, as ``hide``
    leaves it).  Stacks that become equal are merged and their samples' values summed."""
    interned: dict[tuple[int, ...], int] = {}
    new_stack = np.fromiter((interned.setdefault(tuple(fn(s)), len(interned)) for s in profile.stacks),
                            dtype=np.int32, count=len(profile.stacks))
    cols = aggregate_columns(profile.event, new_stack[profile.stack] if len(profile) else profile.stack,
                             profile.thread, profile.labels, profile.time_ns, profile.values)
    return profile.replace(stacks=list(interned), **columns(cols))


def restacked(profile: Profile, tables: Interner, row_stack: np.ndarray, keep: np.ndarray | None = None) -> Profile:
    """``profile``'s rows (those in ``keep``, a mask, or all) on the stacks ``row_stack`` (one
    per row, indexes into ``tables``' stacks), their threads and label sets interned in
    ``tables`` too, and rows that now share a key merged; metadata and tick as they were."""
    rows = slice(None) if keep is None else keep
    thread_map = np.array([tables.thread_id(t.tid, t.name) for t in profile.threads] or [0], dtype=np.int32)
    label_map = np.array([tables.labels_id(ls) for ls in profile.labelsets] or [0], dtype=np.int32)
    thread, labels = profile.thread[rows], profile.labels[rows]
    cols = aggregate_columns(
        profile.event[rows],
        np.asarray(row_stack, dtype=np.int32)[rows],
        thread_map[thread] if len(thread) else thread,
        label_map[labels] if len(labels) else labels,
        profile.time_ns[rows],
        profile.values[rows],
    )
    return profile.replace(**tables.tables(), **columns(cols))


def _merged_sample_counts(profiles) -> dict[str, str]:
    """The engines' ``samples_<event>`` counts, added up; "" (unknown) where a profile
    holding the event does not say its count, since the sum would then be short."""
    out = {}
    for key in {k for p in profiles for k in p.metadata.extra if k.startswith("samples_")}:
        try:
            event = EventType.parse(key[len("samples_"):])
            out[key] = str(sum(int(p.metadata.extra[key]) for p in profiles
                               if key in p.metadata.extra or event in p.events))
        except (KeyError, ValueError):
            out[key] = ""
    return out


def merge(*profiles: Profile, labels: Sequence[Mapping[str, object] | None] | None = None) -> Profile:
    """One Profile holding every sample of ``profiles``; identical keys sum their values.

    ``labels``, if given, adds per-profile labels (e.g. ``pid``/``worker``) to that
    profile's samples.  Times are re-based on the earliest start; dropped counts add up.
    """
    if not profiles:
        raise ValueError("merge() needs at least one profile")
    labels = list(labels) if labels is not None else [None] * len(profiles)
    if len(labels) != len(profiles):
        raise ValueError("merge(): one labels entry per profile, or none")
    start = min(p.metadata.start_ns for p in profiles)
    end = max(p.metadata.end_ns for p in profiles)
    dropped: dict[EventType, int] = {}
    for p in profiles:
        for e, n in p.metadata.dropped.items():
            dropped[e] = dropped.get(e, 0) + n
    first = profiles[0].metadata
    meta = first.replace(
        start_ns=start,
        end_ns=end,
        dropped=dropped,
        notes=tuple(dict.fromkeys(n for p in profiles for n in p.metadata.notes)),
        extra={**first.extra, **_merged_sample_counts(profiles)},
    )
    tables = Interner()
    parts = []
    for p, extra in zip(profiles, labels):
        stack_map = np.array(tables.stacks_of(p) or [0], dtype=np.int32)
        thread_map = np.array([tables.thread_id(t.tid, t.name) for t in p.threads] or [0], dtype=np.int32)
        label_map = np.array(
            [tables.labels_id(ls.merged(extra) if extra else ls) for ls in p.labelsets] or [0], dtype=np.int32
        )
        if len(p):
            parts.append((p.event, stack_map[p.stack], thread_map[p.thread], label_map[p.labels],
                          p.time_ns + (p.metadata.start_ns - start), p.values))
    tick = max([tick_for(meta.duration_ns)] + [p.tick_ns for p in profiles])
    if parts:
        ev, st, th, lb, t, v = (np.concatenate(c) for c in zip(*parts))
        cols = aggregate_columns(ev, st, th, lb, (t // tick) * tick, v)
    else:
        cols = (np.zeros(0, np.uint8), np.zeros(0, np.int32), np.zeros(0, np.int32),
                np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros((0, 2), np.int64))
    return profiles[0].replace(**tables.tables(), **columns(cols), metadata=meta, tick_ns=tick)


def drop_threads_only_in(profile: Profile, infrastructure: str, keep_tids=()) -> tuple[Profile, list[str]]:
    """Drop the threads whose every sampled frame matches ``infrastructure`` (a regex over
    frame names/files), except ``keep_tids``: e.g. a kernel's idle IOPub/heartbeat threads,
    which otherwise fill a notebook cell's wall view.  Returns the view and the dropped
    thread names (so callers can say what they hid)."""
    if not len(profile):
        return profile, []
    user_frame = ~frame_matches(profile, infrastructure)
    has_user = _stacks_containing(profile, user_frame)[profile.stack]
    keep = set(np.unique(profile.thread[has_user]).tolist())
    keep |= {i for i, t in enumerate(profile.threads) if t.tid in set(keep_tids)}
    present = set(np.unique(profile.thread).tolist())
    dropped = sorted(present - keep)
    if not dropped:
        return profile, []
    rows = np.isin(profile.thread, sorted(keep))
    return _select(profile, rows), [profile.threads[i].name for i in dropped]
