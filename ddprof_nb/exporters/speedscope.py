"""speedscope JSON (https://www.speedscope.app/file-format-schema.json).

Writing: one ``"sampled"`` profile per (event, thread), in event-table order then thread
order, named ``"<event display name> — <thread name> (tid <tid>)"``; frames shared in
``shared.frames`` with ``name``, ``file`` and ``line`` (pseudo-frames: name only).  A
sample is one row of the Profile (stack, labels, time tick), in time order, weighted by
the event's primary quantity; the unit is ``nanoseconds`` or ``bytes`` (``none`` for any
other unit).

What speedscope's schema cannot hold — frame kinds and first lines, thread ids, counts,
time ticks, labels, metadata — goes into one extra top-level key, ``"ddprof_nb"`` (the
schema allows extra properties; speedscope ignores them), with arrays parallel to
``shared.frames`` and ``profiles``.  Our reader restores a Profile exactly from it.

Reading other tools' files: ``sampled`` and ``evented`` profiles are accepted; each
profile becomes one thread named after it (py-spy's ``Thread <tid> "<name>"`` gives the
thread's id and name).  The event comes from ``event=`` or the unit: time units -> wall
(converted to nanoseconds; cpu for py-spy, which records only the samples where a
thread is not idle unless run with ``--idle``), ``bytes`` -> alloc, ``none`` -> cpu
with weights taken as sample counts (quantity = weight x ``interval_ns``).  Sampled
weights give count 1 per sample; evented profiles give one count per stack interval.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np

from ..events import EventType, FrameKind
from ..model import MIN_TICK_NS, Frame, LabelSet, Metadata, Profile, ProfileBuilder
from .files import MAX_TEXT_BYTES, finish_profile, gc_paused, read_source, write_atomic

__all__ = ["write", "read", "dumps", "loads", "to_json", "SCHEMA", "FORMAT_VERSION"]

SCHEMA = "https://www.speedscope.app/file-format-schema.json"
FORMAT_VERSION = 1
_KEY = "ddprof_nb"
_TIME_UNITS = {"nanoseconds": 1, "microseconds": 1_000, "milliseconds": 1_000_000, "seconds": 1_000_000_000}
_UNITS = set(_TIME_UNITS) | {"bytes", "none"}
_INT64 = 1 << 63
_PY_SPY_THREAD = re.compile(r'^Thread (?P<tid>\d+) "(?P<name>.*)"$', re.S)


def _exporter() -> str:
    try:
        from importlib.metadata import version

        return f"ddprof_nb@{version('ddprof_nb')}"
    except Exception:  # not installed (source checkout)
        return "ddprof_nb"


# ----------------------------------------------------------------------------- writing


def to_json(profile: Profile, *, name: str | None = None) -> dict:
    """The speedscope document for ``profile`` as plain JSON-able objects."""
    frames: list[dict] = []
    frame_extra: list[list] = []
    index: dict[int, int] = {}

    def frame_index(fi: int) -> int:
        i = index.get(fi)
        if i is None:
            fr = profile.frames[fi]
            d: dict = {"name": fr.name}
            if fr.filename:
                d["file"] = fr.filename
            if fr.line:
                d["line"] = fr.line
            i = index[fi] = len(frames)
            frames.append(d)
            frame_extra.append([fr.kind.label, fr.first_line])
        return i

    labelsets: list[list] = []
    ls_index: dict[int, int] = {}
    order = np.lexsort((profile.labels, profile.stack, profile.time_ns, profile.thread, profile.event))
    ev, st, th, lb = (c[order].tolist() for c in (profile.event, profile.stack, profile.thread, profile.labels))
    tm = profile.time_ns[order].tolist()
    vals = profile.values[order].tolist()
    stacks: dict[int, list[int]] = {}

    profiles: list[dict] = []
    extras: list[dict] = []
    i, n = 0, len(ev)
    while i < n:
        j = i
        while j < n and ev[j] == ev[i] and th[j] == th[i]:
            j += 1
        event = EventType.from_id(ev[i])
        thread = profile.threads[th[i]]
        samples, weights, counts, times, labels = [], [], [], [], []
        for k in range(i, j):
            s = st[k]
            stack = stacks.get(s)
            if stack is None:
                stack = stacks[s] = [frame_index(f) for f in profile.stacks[s]]
            li = ls_index.get(lb[k])
            if li is None:
                li = ls_index[lb[k]] = len(labelsets)
                labelsets.append([list(kv) for kv in profile.labelsets[lb[k]].items])
            samples.append(stack)
            counts.append(vals[k][0])
            weights.append(vals[k][1])
            times.append(tm[k])
            labels.append(li)
        profiles.append(_sampled(event, thread, samples, weights))
        extras.append({"event": event.label, "tid": thread.tid, "thread": thread.name,
                       "counts": counts, "times": times, "labels": labels})
        i = j

    return {
        "$schema": SCHEMA,
        "exporter": _exporter(),
        "name": name or "ddprof_nb profile",
        "activeProfileIndex": 0,
        "shared": {"frames": frames},
        "profiles": profiles,
        _KEY: {
            "format": FORMAT_VERSION,
            "metadata": _metadata_json(profile.metadata),
            "tick_ns": profile.tick_ns,
            "frames": frame_extra,
            "labelsets": labelsets,
            "profiles": extras,
        },
    }


def _sampled(event: EventType, thread, samples: list, weights: list) -> dict:
    """One speedscope "sampled" profile: one event of one thread."""
    return {
        "type": "sampled",
        "name": f"{event.display_name} — {thread.name} (tid {thread.tid})",
        "unit": event.unit if event.unit in _UNITS else "none",
        "startValue": 0,
        "endValue": sum(weights),
        "samples": samples,
        "weights": weights,
    }


def _metadata_json(meta) -> dict:
    return {
        "start_ns": meta.start_ns, "end_ns": meta.end_ns, "interval_ns": meta.interval_ns,
        "engine": meta.engine, "python_version": meta.python_version, "pid": meta.pid,
        "host": meta.host,
        "dropped": {EventType.parse(e).label: int(v) for e, v in meta.dropped.items()},
        "notes": list(meta.notes),
        "extra": {str(k): str(v) for k, v in meta.extra.items()},
    }


def dumps(profile: Profile, *, name: str | None = None, indent: int | None = None) -> str:
    """The speedscope JSON text of ``profile``."""
    separators = (",", ":") if indent is None else (",", ": ")
    with gc_paused():
        doc = to_json(profile, name=name)
        return json.dumps(doc, ensure_ascii=False, indent=indent, separators=separators) + "\n"


def write(profile: Profile, dest, *, name: str | None = None, indent: int | None = None) -> None:
    """Write ``profile`` as speedscope JSON to ``dest`` (path: mode 0600, atomic; or a binary file).

    ``name`` is the profile-group name speedscope shows; ``indent`` pretty-prints.
    """
    write_atomic(dest, dumps(profile, name=name, indent=indent))


# ----------------------------------------------------------------------------- reading


class _Bad(Exception):
    """A validation failure; turned into ValueError naming the input."""


def _reject_constant(c: str):
    raise _Bad(f"non-finite number {c} is not valid JSON")


def _want(cond, msg: str) -> None:
    if not cond:
        raise _Bad(msg)


def _int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad(f"{what} must be an integer, got {type(v).__name__}")
    if isinstance(v, float):
        _want(math.isfinite(v) and v == int(v), f"{what} must be an integer, got {v!r}")
        v = int(v)
    _want(-_INT64 <= v < _INT64, f"{what} does not fit in 64 bits")
    return v


def _num(v, what: str) -> float | int:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _Bad(f"{what} must be a number, got {type(v).__name__}")
    _want(not isinstance(v, float) or math.isfinite(v), f"{what} must be finite")
    return v


def _str(v, what: str) -> str:
    _want(isinstance(v, str), f"{what} must be a string, got {type(v).__name__}")
    return v


def _list(v, what: str) -> list:
    _want(isinstance(v, list), f"{what} must be a list, got {type(v).__name__}")
    return v


def _dict(v, what: str) -> dict:
    _want(isinstance(v, dict), f"{what} must be an object, got {type(v).__name__}")
    return v


def parse_json(data: bytes, name: str):
    """``json.loads`` with every failure (bad UTF-8, syntax, NaN, nesting) as ValueError."""
    try:
        return json.loads(data.decode("utf-8-sig"), parse_constant=_reject_constant)
    except _Bad as e:
        raise ValueError(f"{name}: {e}") from None
    except UnicodeDecodeError as e:
        if e.reason == "unexpected end of data":
            raise ValueError(f"{name}: JSON cut short inside a character (the file looks truncated)") from None
        raise ValueError(f"{name}: not UTF-8 text, so not JSON (byte {e.start})") from None
    except RecursionError:
        raise ValueError(f"{name}: JSON nested too deeply") from None
    except json.JSONDecodeError as e:
        # a cut anywhere leaves a valid prefix: the parser fails in its last token (a cut
        # literal or number: within 5 characters of the end), or in a string that runs to it
        cut = e.pos >= len(e.doc.rstrip()) - 5 or e.msg.startswith("Unterminated string")
        raise ValueError(f"{name}: not valid JSON ({e})" + ("; the file looks truncated" if cut else "")) from None
    except ValueError as e:  # int digit limit
        raise ValueError(f"{name}: not valid JSON ({e})") from None


def read(source, *, name: str | None = None, event=None, interval_ns: int = 10_000_000) -> Profile:
    """The Profile in a speedscope JSON file (path or bytes).

    ``event`` forces the event type of other tools' profiles; ``interval_ns`` weighs
    their unit-less (``none``) samples.  ``ValueError`` naming the input for anything
    malformed.
    """
    data, name = read_source(source, name, MAX_TEXT_BYTES)
    with gc_paused():
        return from_json(parse_json(data, name), name=name, event=event, interval_ns=interval_ns)


def loads(data: bytes | str, *, name: str = "<bytes>", event=None, interval_ns: int = 10_000_000) -> Profile:
    """The Profile in speedscope JSON text; see ``read``."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return read(data, name=name, event=event, interval_ns=interval_ns)


def from_json(doc, *, name: str = "<speedscope>", event=None, interval_ns: int = 10_000_000) -> Profile:
    """The Profile for a parsed speedscope document; ``ValueError`` naming ``name``."""
    forced = EventType.parse(event) if event is not None else None
    try:
        doc = _dict(doc, "the document")
        _want("profiles" in doc and "shared" in doc,
              "not a speedscope file (no 'profiles' and 'shared' keys)")
        if "$schema" in doc:
            _want(_str(doc["$schema"], "$schema").startswith("https://www.speedscope.app/"),
                  f"$schema is not speedscope's: {doc['$schema'][:80]!r}")
        frames = _list(_dict(doc["shared"], "shared").get("frames"), "shared.frames")
        profiles = _list(doc["profiles"], "profiles")
        parsed_frames = []
        for i, f in enumerate(frames):
            f = _dict(f, f"frame {i}")
            fname = _str(f.get("name"), f"frame {i} name")
            # (pyinstrument writes null file and line for its [self] frames)
            ffile = _str(f.get("file") or "", f"frame {i} file")
            fline = _int(f.get("line") or 0, f"frame {i} line")
            parsed_frames.append((fname, ffile, fline))
        if _KEY in doc and forced is None:
            return _read_ours(_dict(doc[_KEY], _KEY), parsed_frames, profiles, name)
        return _read_foreign(doc, parsed_frames, profiles, forced, interval_ns, name)
    except _Bad as e:
        raise ValueError(f"{name}: {e}") from None


def _stack(raw, nframes: int, ids: list[int], what: str) -> tuple[int, ...]:
    raw = _list(raw, what)
    if set(map(type, raw)) <= {int} and (not raw or (min(raw) >= 0 and max(raw) < nframes)):
        return tuple(map(ids.__getitem__, raw))
    out = []
    for x in raw:
        _want(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < nframes,
              f"{what} has a frame index out of range: {x!r}")
        out.append(ids[x])
    return tuple(out)


def _stack_memo(raw, ids: list[int], memo: dict, what: str) -> tuple[int, ...]:
    """``_stack`` of ``raw``, checked once per distinct list (see ``_stack_ids``)."""
    try:
        key = tuple(raw) if type(raw) is list else None
        out = memo.get(key)
    except TypeError:
        key = out = None
    if out is None:
        out = _stack(raw, len(ids), ids, what)
        if key is not None:
            memo[key] = out
    return out


def _stack_ids(samples: list, builder: ProfileBuilder, ids: list[int], memo: dict, what: str) -> list[int]:
    """The stack id of each sample.  Samples repeat (a million samples, fifty thousand
    stacks, in every profile): each distinct list is checked and made once (``memo``,
    shared by the profiles).  (A list equal to an earlier valid one in Python's sense,
    ``[1.0]`` after ``[1]``, is taken as that one.)"""
    out = []
    append = out.append
    for j, raw in enumerate(samples):
        try:
            key = tuple(raw) if type(raw) is list else None
            sid = memo.get(key)
        except TypeError:  # an unhashable element: _stack says what is wrong
            key = sid = None
        if sid is None:
            sid = builder.stack_id(_stack(raw, len(ids), ids, f"{what} sample {j}"))
            if key is not None:
                memo[key] = sid
        append(sid)
    return out


def _ints(values: list, what: str) -> np.ndarray:
    """``values`` as int64, each checked as ``_int`` checks it (in bulk when all are ints)."""
    if set(map(type, values)) <= {int}:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            pass  # _int names the value
    return np.array([_int(v, what) for v in values], dtype=np.int64)


def _read_ours(side: dict, frames: list, profiles: list, name: str) -> Profile:
    _want(side.get("format") == FORMAT_VERSION, f"unsupported ddprof_nb format {side.get('format')!r}")
    m = _dict(side.get("metadata"), "ddprof_nb.metadata")
    try:
        dropped = {EventType.parse(_str(k, "dropped event")): _int(v, "dropped count")
                   for k, v in _dict(m.get("dropped", {}), "dropped").items()}
    except ValueError as e:
        raise _Bad(str(e)) from None
    meta = Metadata(
        start_ns=_int(m.get("start_ns", 0), "start_ns"),
        end_ns=_int(m.get("end_ns", 0), "end_ns"),
        interval_ns=_int(m.get("interval_ns", 0), "interval_ns"),
        engine=_str(m.get("engine", ""), "engine"),
        python_version=_str(m.get("python_version", ""), "python_version"),
        pid=_int(m.get("pid", 0), "pid"),
        host=_str(m.get("host", ""), "host"),
        dropped=dropped,
        notes=tuple(_str(x, "note") for x in _list(m.get("notes", []), "notes")),
        extra={_str(k, "extra key"): _str(v, "extra value") for k, v in _dict(m.get("extra", {}), "extra").items()},
    )
    kinds = _list(side.get("frames"), "ddprof_nb.frames")
    _want(len(kinds) == len(frames), "ddprof_nb.frames does not match shared.frames")
    extras = _list(side.get("profiles"), "ddprof_nb.profiles")
    _want(len(extras) == len(profiles), "ddprof_nb.profiles does not match profiles")
    builder = ProfileBuilder(meta)
    ids = []
    for i, ((fname, ffile, fline), k) in enumerate(zip(frames, kinds)):
        k = _list(k, f"ddprof_nb.frames[{i}]")
        _want(len(k) == 2, f"ddprof_nb.frames[{i}] must be [kind, first_line]")
        try:
            kind = FrameKind.parse(_str(k[0], "frame kind"))
        except ValueError as e:
            raise _Bad(str(e)) from None
        ids.append(builder.frame_id(Frame(fname, ffile, fline, _int(k[1], "first_line"), kind)))
    labelsets = []
    for i, ls in enumerate(_list(side.get("labelsets", []), "ddprof_nb.labelsets")):
        pairs = []
        for kv in _list(ls, f"label set {i}"):
            kv = _list(kv, f"label set {i} entry")
            _want(len(kv) == 2, f"label set {i} entries must be [key, value]")
            pairs.append((_str(kv[0], "label key"), _str(kv[1], "label value")))
        labelsets.append(builder.labels_id(LabelSet.of(pairs)))
    memo: dict[tuple, int] = {}
    for pi, (p, x) in enumerate(zip(profiles, extras)):
        p = _dict(p, f"profile {pi}")
        x = _dict(x, f"ddprof_nb.profiles[{pi}]")
        _want(p.get("type") == "sampled", f"profile {pi}: ddprof_nb writes only sampled profiles")
        try:
            event = EventType.parse(_str(x.get("event"), "event"))
        except ValueError as e:
            raise _Bad(f"profile {pi}: {e}") from None
        thread = builder.thread_id(_int(x.get("tid"), "tid"), _str(x.get("thread"), "thread"))
        samples = _list(p.get("samples"), f"profile {pi} samples")
        weights = _list(p.get("weights"), f"profile {pi} weights")
        counts = _list(x.get("counts"), "counts")
        times = _list(x.get("times"), "times")
        labels = _list(x.get("labels"), "labels")
        _want(len(samples) == len(weights) == len(counts) == len(times) == len(labels),
              f"profile {pi}: samples, weights, counts, times and labels differ in length")
        stack_ids = _stack_ids(samples, builder, ids, memo, f"profile {pi}")
        rows = np.column_stack([_ints(counts, "count"), _ints(weights, "weight")])
        li = _ints(labels, "label set index")
        bad = np.flatnonzero((li < 0) | (li >= len(labelsets)))
        _want(not bad.size, f"profile {pi} sample {bad[0] if bad.size else 0}: label set index out of range")
        if stack_ids:
            builder.add_many(event, stack_ids, thread, np.asarray(labelsets, np.int64)[li],
                             _ints(times, "time"), rows)
    return finish_profile(builder, meta, _int(side.get("tick_ns", MIN_TICK_NS), "tick_ns"))


def _read_foreign(doc: dict, frames: list, profiles: list, forced, interval_ns: int, name: str) -> Profile:
    notes = []
    if isinstance(doc.get("name"), str):
        notes.append(f"speedscope profile group: {doc['name']}")
    meta = Metadata(engine="", python_version="", pid=0, host="", notes=tuple(notes),
                    extra={"source_format": "speedscope"})
    exporter = doc.get("exporter")
    py_spy = isinstance(exporter, str) and exporter.startswith("py-spy")
    if py_spy and forced is None:
        meta = meta.replace(notes=meta.notes + (
            "py-spy samples threads only when they are not idle (unless run with --idle): read as CPU time",))
    builder = ProfileBuilder(meta)
    unitless: set[str] = set()
    ids = [builder.frame_id(Frame(n, f, ln)) for n, f, ln in frames]
    for pi, p in enumerate(profiles):
        p = _dict(p, f"profile {pi}")
        ptype = p.get("type")
        unit = p.get("unit", "none")
        _want(isinstance(unit, str) and unit in _UNITS,
              f"profile {pi}: unknown unit {str(unit)[:40]!r} (expected one of {sorted(_UNITS)})")
        if forced is not None:
            event = forced
        elif unit in _TIME_UNITS:
            event = EventType.CPU if py_spy else EventType.WALL
        elif unit == "bytes":
            event = EventType.ALLOC
        else:
            event = EventType.CPU
        if unit in _TIME_UNITS:
            scale = _TIME_UNITS[unit]
        elif unit == "none":
            scale = interval_ns
            unitless.add("none")
        else:
            scale = 1
        pname = _str(p.get("name", f"profile {pi}"), f"profile {pi} name") or f"profile {pi}"
        m = _PY_SPY_THREAD.match(pname)
        if m and len(m["tid"]) < 19:
            thread = builder.thread_id(int(m["tid"]), m["name"])
        else:
            thread = builder.thread_id(pi + 1, pname)
        if ptype == "sampled":
            samples = _list(p.get("samples"), f"profile {pi} samples")
            weights = _list(p.get("weights", [1] * len(samples)), f"profile {pi} weights")
            _want(len(samples) == len(weights), f"profile {pi}: {len(samples)} samples but {len(weights)} weights")
            memo: dict[tuple, tuple] = {}
            rows = [(_stack_memo(s, ids, memo, f"profile {pi} sample {j}"), 1,
                     _num(w, f"profile {pi} weight {j}")) for j, (s, w) in enumerate(zip(samples, weights))]
        elif ptype == "evented":
            rows = _evented_rows(p, pi, ids)
        else:
            raise _Bad(f"profile {pi}: unknown profile type {ptype!r} (expected 'sampled' or 'evented')")
        if not rows:
            continue
        stack_ids = [builder.stack_id(s) for s, _, _ in rows]
        vals = []
        for _, c, w in rows:
            q = w * scale
            _want(isinstance(q, int) or math.isfinite(q), f"profile {pi}: a weight overflows")
            q = round(q)
            _want(-_INT64 <= q < _INT64, f"profile {pi}: a weight does not fit in 64 bits")
            vals.append((c, q))
        builder.add_many(event, stack_ids, thread, 0, np.zeros(len(rows), dtype=np.int64),
                         np.asarray(vals, dtype=np.int64).reshape(-1, 2))
    if "none" in unitless:
        builder.metadata = meta = meta.replace(
            interval_ns=interval_ns,
            notes=meta.notes + (f"unit-less weights read as sample counts at {interval_ns} ns each",))
    return finish_profile(builder, meta)


def _evented_rows(p: dict, pi: int, ids: list[int]) -> list:
    """(stack, count, weight) per stack interval of an evented profile."""
    events = _list(p.get("events"), f"profile {pi} events")
    start = _num(p.get("startValue", 0), f"profile {pi} startValue")
    stack: list[int] = []
    raw_stack: list[int] = []
    totals: dict[tuple[int, ...], list] = {}
    last = start
    for j, e in enumerate(events):
        e = _dict(e, f"profile {pi} event {j}")
        at = _num(e.get("at"), f"profile {pi} event {j} at")
        _want(at >= last, f"profile {pi} event {j}: 'at' goes backwards")
        f = e.get("frame")
        _want(isinstance(f, int) and not isinstance(f, bool) and 0 <= f < len(ids),
              f"profile {pi} event {j}: frame index out of range: {f!r}")
        if stack and at > last:
            acc = totals.setdefault(tuple(stack), [0, 0])
            acc[0] += 1
            acc[1] += at - last
        last = at
        kind = e.get("type")
        if kind == "O":
            stack.append(ids[f])
            raw_stack.append(f)
        elif kind == "C":
            _want(raw_stack and raw_stack[-1] == f, f"profile {pi} event {j}: closes a frame that is not open")
            stack.pop()
            raw_stack.pop()
        else:
            raise _Bad(f"profile {pi} event {j}: unknown event type {kind!r} (expected 'O' or 'C')")
    return [(s, c, w) for s, (c, w) in totals.items()]
