"""The Firefox Profiler's "processed" profile JSON (what profiler.firefox.com saves, and
what CPython 3.15's ``python -m profiling.sampling run --gecko`` writes).

The facts this reader relies on:

* The document is an object with ``meta`` and ``threads``.  ``meta.interval`` is the
  sampling interval in milliseconds; ``meta.startTime`` the time origin in milliseconds
  (epoch milliseconds when Firefox writes it, a monotonic clock for CPython).
* Strings are indexes into ``shared.stringArray`` (newer versions) or the thread's own
  ``stringArray`` (older ones); a stack, frame or function table a thread lacks is
  looked up in ``shared`` too (where newer versions may share them).
* Each thread has column tables (an object of equal-length lists plus ``length``):
  ``samples`` (``stack``, ``time`` in ms from ``meta.startTime`` or ``timeDeltas``,
  ``weight`` (null: 1 each) and ``weightType``: ``samples``, ``tracing-ms`` or
  ``bytes``), ``stackTable`` (``frame``, ``prefix``: the parent stack, null for a
  root, always an earlier row), ``frameTable`` (``func``, ``line``) and ``funcTable``
  (``name``, ``fileName``, ``lineNumber``).  A sample whose stack is null has no stack
  (the thread was idle) and is skipped.

Mapping: each thread becomes a Thread (``tid``, ``name``); a sample adds count =
weight and quantity = weight x interval (``samples``), count 1 and quantity = weight
ms (``tracing-ms``), or count 1 and quantity = weight bytes (``bytes``).  The event
is wall time (Firefox and CPython sample threads whether they run or not; CPython's
gecko output exists in wall mode only) or alloc for ``bytes``, unless ``event=``
says otherwise.  Sample times are kept (the profile has a time axis).  Markers
(CPython's GIL and CPU states) are not read.

Firefox's own unprocessed ("raw gecko") profile, whose tables are ``schema`` + ``data``
arrays, is refused with a message saying so.
"""

from __future__ import annotations

import math

import numpy as np

from ..events import EventType
from ..model import Frame, Metadata, Profile, ProfileBuilder
from ..exporters.files import finish_profile

__all__ = ["from_json", "looks_like"]

_EPOCH_MS = 1e12  # a startTime past this (September 2001) is epoch milliseconds
_INT64 = 1 << 63
# Stacks are stored as a prefix tree, so a small file can describe stacks whose frames
# add up to its size squared: refuse to expand more than this many frames.
MAX_STACK_FRAMES = 1 << 25


class _Bad(Exception):
    """A format problem; turned into ValueError naming the input."""


def looks_like(doc) -> bool:
    """Is this parsed JSON a Firefox Profiler document (``meta`` and ``threads``)?"""
    return isinstance(doc, dict) and isinstance(doc.get("meta"), dict) and "threads" in doc


def from_json(doc, *, name: str = "<gecko>", event=None) -> Profile:
    """The Profile in a parsed Firefox Profiler document; ``ValueError`` naming ``name``
    and the problem for anything that is not a readable processed profile."""
    forced = EventType.parse(event) if event is not None else None
    try:
        return _read(doc, forced)
    except _Bad as e:
        raise ValueError(f"{name}: Firefox Profiler (gecko) file: {e}") from None


def _want(cond, msg: str) -> None:
    if not cond:
        raise _Bad(msg)


def _number(v, what: str) -> float:
    _want(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
          f"{what} must be a finite number, got {str(v)[:40]!r}")
    return v


def _ns(ms: float, what: str) -> int:
    """Milliseconds as integer nanoseconds; ``_Bad`` past the int64 range."""
    ns = ms * 1e6
    _want(abs(ns) < _INT64, f"{what} is too large")
    return round(ns)


def _index(v, size: int, what: str, nullable: bool = False) -> int | None:
    if v is None and nullable:
        return None
    _want(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < size,
          f"{what} is out of range: {str(v)[:40]!r} (table of {size})")
    return v


def _table(thread: dict, key: str, columns: tuple[str, ...], where: str, shared=None) -> tuple[int, dict]:
    """(length, {column: list}) of a column table, every listed column checked; the
    thread's own, else the document's ``shared`` one."""
    t = thread.get(key) if key in thread or not isinstance(shared, dict) else shared.get(key)
    _want(isinstance(t, dict), f"{where}: no {key} (a column table)")
    cols = {}
    length = t.get("length")
    for c in columns:
        col = t.get(c)
        _want(isinstance(col, list), f"{where}: {key}.{c} is missing or not a list")
        if length is None:
            length = len(col)
        _want(len(col) == length, f"{where}: {key}.{c} has {len(col)} entries, not {length}")
        cols[c] = col
    _want(isinstance(length, int) and not isinstance(length, bool), f"{where}: {key}.length is not an integer")
    return length, cols


def _read(doc, forced: EventType | None) -> Profile:
    _want(looks_like(doc), "not a Firefox Profiler document (no 'meta' object and 'threads' list)")
    meta = doc["meta"]
    threads = doc["threads"]
    _want(isinstance(threads, list), "'threads' is not a list")
    interval_ms = _number(meta.get("interval", 1), "meta.interval")
    _want(interval_ms > 0, "meta.interval must be positive")
    start_ms = _number(meta.get("startTime", 0), "meta.startTime")
    shared = doc.get("shared")
    shared_strings = shared.get("stringArray") if isinstance(shared, dict) else None
    interval_ns = _ns(interval_ms, "meta.interval")
    start_ns = _ns(start_ms, "meta.startTime") if start_ms > _EPOCH_MS else 0
    product = meta.get("importedFrom") or meta.get("product")
    notes = (f"Firefox Profiler profile from {str(product)[:80]}",) if product else ()
    builder = ProfileBuilder(Metadata(start_ns=start_ns, interval_ns=interval_ns, engine="", python_version="",
                                      pid=0, host="", notes=notes, extra={"source_format": "gecko"}))
    max_time = 0
    for ti, thread in enumerate(threads):
        where = f"thread {ti}"
        _want(isinstance(thread, dict), f"{where} is not an object")
        strings = thread.get("stringArray", thread.get("stringTable", shared_strings))
        _want(isinstance(strings, list), f"{where}: no string table (shared.stringArray)")
        max_time = max(max_time, _read_thread(builder, thread, shared, strings, where, interval_ns, forced))
    end_ns = min(start_ns + max_time + interval_ns, _INT64 - 1) if max_time else start_ns
    meta_out = builder.metadata.replace(end_ns=end_ns)
    builder.metadata = meta_out
    return finish_profile(builder, meta_out)


def _string(strings: list, i, what: str, default: str = "") -> str:
    if i is None:
        return default
    s = strings[_index(i, len(strings), what)]
    _want(isinstance(s, str), f"{what} is not a string")
    return s


def _frame_ids(builder: ProfileBuilder, funcs: dict, nfunc: int, frames: dict, nframe: int, strings: list,
               where: str) -> list[int]:
    """The builder's frame id of each row of the frameTable (its function's name and file,
    its line, else the function's first line)."""
    func_frames: dict[tuple[int, int], int] = {}
    frame_ids = []
    for i in range(nframe):
        f = _index(frames["func"][i], nfunc, f"{where}: frameTable.func[{i}]")
        line = frames["line"][i]
        first = funcs["lineNumber"][f]
        first = first if isinstance(first, int) and not isinstance(first, bool) and first > 0 else 0
        line = line if isinstance(line, int) and not isinstance(line, bool) and line > 0 else first
        fid = func_frames.get((f, line))
        if fid is None:
            fname = _string(strings, funcs["name"][f], f"{where}: funcTable.name[{f}]")
            ffile = _string(strings, funcs["fileName"][f], f"{where}: funcTable.fileName[{f}]")
            fid = func_frames[(f, line)] = builder.frame_id(Frame(fname or "[unknown]", ffile, line, first))
        frame_ids.append(fid)
    return frame_ids


def _stack_paths(frame_ids: list[int], stacks: dict, nstack: int, where: str) -> list[tuple[int, ...]]:
    """Each row of the stackTable as the frame ids from its root (a prefix points to an
    earlier row); at most MAX_STACK_FRAMES frames in all, so a small file cannot expand
    into a huge one."""
    nframe = len(frame_ids)
    paths: list[tuple[int, ...]] = []
    expanded = 0
    for i in range(nstack):
        fr = frame_ids[_index(stacks["frame"][i], nframe, f"{where}: stackTable.frame[{i}]")]
        prefix = _index(stacks["prefix"][i], nstack, f"{where}: stackTable.prefix[{i}]", nullable=True)
        if prefix is None:
            paths.append((fr,))
        else:
            _want(prefix < i, f"{where}: stackTable.prefix[{i}] does not point to an earlier stack")
            paths.append(paths[prefix] + (fr,))
            expanded += len(paths[-1])
            _want(expanded <= MAX_STACK_FRAMES,
                  f"{where}: its stacks hold more than {MAX_STACK_FRAMES:,} frames in all")
    return paths


def _plain_samples(builder: ProfileBuilder, times: list, stacks: list, nstack: int, paths: list,
                   time_col: str, weights, weight_type: str, interval_ns: int):
    """(stack ids, times, values) of a samples table, as arrays, when it holds only what
    writers write (numbers, stack indexes or null, no weight column); None otherwise, and
    the one-by-one loop below reads it and names any problem.  The same arithmetic: float
    milliseconds summed in order, rounded half to even."""
    if weights is not None or not abs(interval_ns) < _INT64:
        return None
    if not set(map(type, times)) <= {int, float} or not set(map(type, stacks)) <= {int, type(None)}:
        return None
    try:
        ms = np.array(times, dtype=np.float64)
    except OverflowError:
        return None
    if not np.isfinite(ms).all():
        return None
    keep = np.array([s is not None for s in stacks], dtype=bool)
    st = np.array([s for s in stacks if s is not None], dtype=np.int64) if keep.any() else np.zeros(0, np.int64)
    if st.size and (st.min() < 0 or st.max() >= nstack):
        return None
    now = np.cumsum(ms) if time_col == "timeDeltas" else ms
    ns = now[keep] * 1e6
    if not (np.abs(ns) < _INT64).all():
        return None
    t_ns = np.maximum(np.rint(ns), 0).astype(np.int64)
    uniq, first, inv = np.unique(st, return_index=True, return_inverse=True)
    sid = np.zeros(len(uniq), np.int64)
    for u in np.argsort(first, kind="stable").tolist():  # stacks made in order of first use
        sid[u] = builder.stack_id(paths[int(uniq[u])])
    quantity = {"samples": interval_ns, "tracing-ms": 1_000_000, "bytes": 1}[weight_type]
    vals = np.empty((len(st), 2), np.int64)
    vals[:, 0] = 1
    vals[:, 1] = quantity
    return sid[inv.reshape(-1)], t_ns, vals


def _tid(thread: dict) -> int:
    tid = thread.get("tid")
    if isinstance(tid, str) and tid.isdigit() and len(tid) < 19:
        tid = int(tid)  # (CPython writes pids as strings; some writers do the same for tids)
    if isinstance(tid, bool) or not isinstance(tid, int) or not 0 <= tid < _INT64:
        tid = 0
    return tid


def _read_thread(builder: ProfileBuilder, thread: dict, shared, strings: list, where: str,
                 interval_ns: int, forced: EventType | None) -> int:
    """Add one thread's samples; returns its last sample time (ns from the origin)."""
    samples = thread.get("samples")
    if isinstance(samples, dict) and "schema" in samples:
        raise _Bad("this is Firefox's raw (unprocessed) gecko profile, whose tables have a "
                   "'schema'; open it in profiler.firefox.com and save the processed profile, "
                   "which ddprof_nb reads")
    nfunc, funcs = _table(thread, "funcTable", ("name", "fileName", "lineNumber"), where, shared)
    nframe, frames = _table(thread, "frameTable", ("func", "line"), where, shared)
    nstack, stacks = _table(thread, "stackTable", ("frame", "prefix"), where, shared)
    _want(isinstance(samples, dict), f"{where}: no samples table")
    time_col = "time" if "time" in samples else "timeDeltas"
    nsample, cols = _table(thread, "samples", ("stack", time_col), where)

    frame_ids = _frame_ids(builder, funcs, nfunc, frames, nframe, strings, where)
    paths = _stack_paths(frame_ids, stacks, nstack, where)
    stack_ids: dict[int, int] = {}

    weight_type = samples.get("weightType", "samples")
    _want(weight_type in ("samples", "tracing-ms", "bytes"),
          f"{where}: unknown samples.weightType {str(weight_type)[:40]!r} "
          f"(expected 'samples', 'tracing-ms' or 'bytes')")
    weights = samples.get("weight")
    _want(weights is None or (isinstance(weights, list) and len(weights) == nsample),
          f"{where}: samples.weight must be null or one number per sample")
    event = forced or (EventType.ALLOC if weight_type == "bytes" else EventType.WALL)

    times = cols[time_col]
    plain = _plain_samples(builder, times, cols["stack"], nstack, paths, time_col, weights,
                           weight_type, interval_ns)
    if plain is not None:
        sids, tvals, vals = plain
        if len(sids):
            tname = thread.get("name") if isinstance(thread.get("name"), str) else ""
            builder.add_many(event, sids, builder.thread_id(_tid(thread), tname), 0, tvals, vals)
        return int(tvals.max()) if len(tvals) else 0
    sids, tvals, vals = [], [], []
    now = 0.0
    for j in range(nsample):
        t = _number(times[j], f"{where}: samples.{time_col}[{j}]")
        now = now + t if time_col == "timeDeltas" else t
        s = _index(cols["stack"][j], nstack, f"{where}: samples.stack[{j}]", nullable=True)
        if s is None:
            continue
        w = 1 if weights is None else _number(weights[j], f"{where}: samples.weight[{j}]")
        if weight_type == "samples":
            count, quantity = w, w * interval_ns
        elif weight_type == "tracing-ms":
            count, quantity = 1, w * 1e6
        else:
            count, quantity = 1, w
        _want(abs(quantity) < _INT64 and abs(count) < _INT64, f"{where}: samples.weight[{j}] is too large")
        sid = stack_ids.get(s)
        if sid is None:
            sid = stack_ids[s] = builder.stack_id(paths[s])
        t_ns = max(0, _ns(now, f"{where}: samples.{time_col}[{j}]"))
        sids.append(sid)
        tvals.append(t_ns)
        vals.append((round(count), round(quantity)))
    if sids:
        tname = thread.get("name") if isinstance(thread.get("name"), str) else ""
        th = builder.thread_id(_tid(thread), tname)
        builder.add_many(event, sids, th, 0, np.asarray(tvals, dtype=np.int64),
                         np.asarray(vals, dtype=np.int64).reshape(-1, 2))
    return max(tvals, default=0)
