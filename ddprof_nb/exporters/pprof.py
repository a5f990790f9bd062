"""pprof: Profile <-> gzipped ``perftools.profiles.Profile`` (github.com/google/pprof).

``write``/``dumps`` produce files that ``go tool pprof`` reads; ``read``/``loads`` read
any valid pprof and restore our own files exactly.

How a Profile maps onto pprof (what makes the round trip through ``read`` exact):

* Sample types: both value types (count, quantity) of every event present, in the
  events.h table order.  A pprof sample holds ONE row of ONE event: its two values at
  that event's positions, zeros elsewhere.  ``default_sample_type`` and ``period_type``
  are the first event's quantity type; ``period`` is ``metadata.interval_ns``.
* Functions: one per (name, filename, first_line, kind); ``start_line`` = first_line.
  Frame kinds live in ``Function.system_name``: ``"[kind:<label>]"`` (e.g. ``[kind:gc]``)
  for every non-Python frame, empty for Python frames (an empty system_name also stops
  pprof's C++ demangling heuristics, which would turn ``<module>`` into an empty name).  A Python frame whose name itself starts with ``[kind:`` is tagged
  ``[kind:python]`` so the reader can never mistake it.  Tags are shared strings.
* Locations: one per (function, line), one Line each, no address; each points at a
  Mapping that declares functions present, so pprof tools never try to symbolize them:
  a native frame's at its library's (``filename`` = the library), every other at id 1
  (``[ddprof_nb]``, files and lines present too).
* Labels, in this order: ``thread id`` (num), ``thread name`` (str), ``time_ns`` (num,
  unit nanoseconds: the row's time tick relative to ``time_nanos``), then — only when
  both values are zero, the one case values cannot name the event — ``ddprof_nb.event``
  (str), then every LabelSet pair as a str label.  The reader parses our files by
  position, so user labels with the same keys are kept as user labels.
* Metadata: ``time_nanos`` = start_ns, ``duration_nanos`` = end_ns - start_ns; comments
  ``ddprof_nb.format=1``, ``ddprof_nb.engine=``, ``.python_version=``, ``.pid=``,
  ``.host=``, ``.tick_ns=``, ``ddprof_nb.dropped.<event>=<n>``, ``ddprof_nb.note=<text>``
  and ``ddprof_nb.extra=<JSON [key, value]>``.  Keys never contain ``=``; values may.

Reading other tools' files: sample types are mapped to events by exact (type, unit)
match with an event's value types, or through ``ALIASES`` (Go's heap/mutex names,
Datadog's names).  Unmapped sample types are ignored and named in a metadata note; a
file with samples none of whose types map raises ``ValueError`` listing the types.  A
sample with nonzero values for several events becomes one row per event.  An event with
only its quantity mapped gets count 0 (and vice versa).  Threads come from ``thread id``
/ ``thread name`` labels (else thread 0); other labels become LabelSet pairs (num labels
as ``"<num>"`` or ``"<num> <unit>"``).  Comments become metadata notes.  Locations
without lines become native frames named by address.

Reading is columnar, for files of a million samples: ``pprof_samples`` decodes the samples
into numpy columns, ``pprof_rows`` turns them into the Profile's rows.
"""

from __future__ import annotations

import json

import numpy as np

from ..events import EventType, FrameKind
from ..model import MIN_TICK_NS, Frame, Metadata, Profile, ProfileBuilder
from . import pprof_proto as pb
from .files import MAX_FILE_BYTES, finish_profile, gc_paused, read_source, write_atomic
from .pprof_rows import add_rows
from .pprof_samples import table_of_samples

__all__ = ["write", "read", "dumps", "loads", "to_pprof", "from_pprof", "ALIASES", "FORMAT_VERSION"]

FORMAT_VERSION = 1
_P = "ddprof_nb."
_MARKER = f"{_P}format="
_KIND_PREFIX = "[kind:"
_MAPPING_ID = 1

# Sample types other tools write, mapped to (event, value index: 0 count / 1 quantity).
ALIASES: dict[tuple[str, str], tuple[EventType, int]] = {
    # Go runtime/pprof: heap, mutex (block profiles share mutex's types)
    ("alloc_objects", "count"): (EventType.ALLOC, 0),
    ("alloc_space", "bytes"): (EventType.ALLOC, 1),
    ("inuse_objects", "count"): (EventType.LIVE, 0),
    ("inuse_space", "bytes"): (EventType.LIVE, 1),
    ("contentions", "count"): (EventType.LOCK, 0),
    ("delay", "nanoseconds"): (EventType.LOCK, 1),
    # Datadog profilers
    ("cpu-time", "nanoseconds"): (EventType.CPU, 1),
    ("wall-time", "nanoseconds"): (EventType.WALL, 1),
    ("alloc-samples", "count"): (EventType.ALLOC, 0),
    ("heap-live-samples", "count"): (EventType.LIVE, 0),
    ("heap-space", "bytes"): (EventType.LIVE, 1),
    ("heap-live-size", "bytes"): (EventType.LIVE, 1),
    ("lock-acquire", "count"): (EventType.LOCK, 0),
    ("lock-acquire-wait", "nanoseconds"): (EventType.LOCK, 1),
}


def _sample_type_map() -> dict[tuple[str, str], tuple[EventType, int]]:
    exact = {}
    for e in EventType:
        for i, vt in enumerate(e.value_types):
            exact[(vt.type, vt.unit)] = (e, i)
    return {**ALIASES, **exact}


# ----------------------------------------------------------------------------- writing


def _system_name(frame: Frame) -> str:
    if frame.kind is not FrameKind.PYTHON or frame.name.startswith(_KIND_PREFIX):
        return f"{_KIND_PREFIX}{frame.kind.label}]"
    # Empty, not the name: pprof tools "demangle" a function whose system_name equals its
    # name, and their C++ heuristics turn "<module>" into "" and strip "[...]".
    return ""


def _comments(meta: Metadata, tick_ns: int) -> list[str]:
    out = [
        f"{_MARKER}{FORMAT_VERSION}",
        f"{_P}engine={meta.engine}",
        f"{_P}python_version={meta.python_version}",
        f"{_P}pid={meta.pid}",
        f"{_P}host={meta.host}",
        f"{_P}tick_ns={tick_ns}",
    ]
    for event, n in meta.dropped.items():
        out.append(f"{_P}dropped.{EventType.parse(event).label}={int(n)}")
    out.extend(f"{_P}note={note}" for note in meta.notes)
    out.extend(f"{_P}extra=" + json.dumps([str(k), str(v)], ensure_ascii=False) for k, v in meta.extra.items())
    return out


class _Mappings:
    """ddprof_nb's own mapping (id 1: functions, files and lines present) and one per
    library of native frames (functions present): nothing is left for pprof to symbolize."""

    def __init__(self):
        self.all = [pb.Mapping(_MAPPING_ID, filename="[ddprof_nb]", has_functions=True, has_filenames=True,
                               has_line_numbers=True)]
        self._by_library: dict[str, int] = {}

    def of(self, frame: Frame) -> int:
        if frame.kind is not FrameKind.NATIVE or not frame.filename:
            return _MAPPING_ID
        mid = self._by_library.get(frame.filename)
        if mid is None:
            mid = self._by_library[frame.filename] = len(self.all) + 1
            self.all.append(pb.Mapping(mid, filename=frame.filename, has_functions=True))
        return mid


def to_pprof(profile: Profile) -> pb.PprofProfile:
    """The pprof message for ``profile`` (see the module docstring for the mapping)."""
    events = profile.events
    sample_types: list[pb.ValueType] = []
    slot: dict[int, int] = {}
    for e in events:
        slot[e.value] = len(sample_types)
        sample_types.extend(pb.ValueType(vt.type, vt.unit) for vt in e.value_types)
    nvals = len(sample_types)

    functions: list[pb.Function] = []
    locations: list[pb.Location] = []
    fn_ids: dict[tuple, int] = {}
    loc_ids: dict[tuple[int, int], int] = {}
    frame_loc: dict[int, int] = {}  # frame index -> location id
    mappings = _Mappings()

    def location_of(fi: int) -> int:
        fr = profile.frames[fi]
        fkey = fr.function_key
        fid = fn_ids.get(fkey)
        if fid is None:
            fid = fn_ids[fkey] = len(functions) + 1
            functions.append(pb.Function(fid, fr.name, _system_name(fr), fr.filename, fr.first_line))
        lkey = (fid, fr.line)
        lid = loc_ids.get(lkey)
        if lid is None:
            lid = loc_ids[lkey] = len(locations) + 1
            locations.append(pb.Location(lid, 0, [pb.Line(fid, fr.line)], mappings.of(fr)))
        frame_loc[fi] = lid
        return lid

    stack_locs: dict[int, list[int]] = {}
    for s in np.unique(profile.stack).tolist():
        # pprof stacks are leaf first; ours are root first
        stack_locs[s] = [frame_loc.get(fi) or location_of(fi) for fi in reversed(profile.stacks[s])]

    thread_labels = [
        [pb.Label("thread id", num=t.tid), pb.Label("thread name", str=t.name)] for t in profile.threads
    ]
    user_labels = [[pb.Label(k, str=v) for k, v in ls.items] for ls in profile.labelsets]
    time_labels: dict[int, pb.Label] = {}
    zero_labels = {e.value: pb.Label(f"{_P}event", str=e.label) for e in events}

    samples: list[pb.Sample] = []
    append = samples.append
    Sample, Label = pb.Sample, pb.Label
    zeros = [0] * nvals
    for ev, st, th, lb, t, (c, q) in zip(
        profile.event.tolist(), profile.stack.tolist(), profile.thread.tolist(),
        profile.labels.tolist(), profile.time_ns.tolist(), profile.values.tolist(),
    ):
        row = zeros.copy()
        i = slot[ev]
        row[i] = c
        row[i + 1] = q
        tl = time_labels.get(t)
        if tl is None:
            tl = time_labels[t] = Label("time_ns", num=t, num_unit="nanoseconds")
        labels = thread_labels[th] + [tl]
        if not c and not q:
            labels.append(zero_labels[ev])
        append(Sample(stack_locs[st], row, labels + user_labels[lb]))

    meta = profile.metadata
    main = sample_types[1] if sample_types else None
    return pb.PprofProfile(
        sample_types=sample_types,
        samples=samples,
        locations=locations,
        functions=functions,
        mappings=mappings.all,
        time_nanos=meta.start_ns,
        duration_nanos=meta.end_ns - meta.start_ns,
        period_type=pb.ValueType(main.type, main.unit) if main else None,
        period=meta.interval_ns,
        comments=_comments(meta, profile.tick_ns),
        default_sample_type=main.type if main else None,
    )


def dumps(profile: Profile) -> bytes:
    """The gzipped pprof bytes of ``profile``."""
    with gc_paused():
        return pb.dumps(to_pprof(profile))


def write(profile: Profile, dest) -> None:
    """Write ``profile`` as gzipped pprof to ``dest`` (path: mode 0600, atomic; or a binary file)."""
    write_atomic(dest, dumps(profile))


# ----------------------------------------------------------------------------- reading


def read(source, *, name: str | None = None, max_uncompressed: int = pb.MAX_UNCOMPRESSED) -> Profile:
    """The Profile in a pprof file (path or bytes; gzipped or raw protobuf).

    ``ValueError`` naming the input for anything that is not a valid pprof profile, a
    file over 1 GiB, or one that inflates past ``max_uncompressed`` bytes.
    """
    data, name = read_source(source, name, MAX_FILE_BYTES)
    return loads(data, name=name, max_uncompressed=max_uncompressed)


def loads(data: bytes, *, name: str = "<bytes>", max_uncompressed: int = pb.MAX_UNCOMPRESSED) -> Profile:
    """The Profile in pprof bytes (gzipped or raw); see ``read``."""
    with gc_paused():
        return from_pprof(pb.loads(data, name=name, max_uncompressed=max_uncompressed, columns=True), name=name)


class _Meta:
    """Metadata fields gathered from our comments."""

    def __init__(self):
        self.fields: dict[str, str] = {}
        self.dropped: dict[EventType, int] = {}
        self.notes: list[str] = []
        self.extra: dict[str, str] = {}


def _parse_comments(comments: list[str], name: str) -> tuple[bool, _Meta]:
    ours = any(c.startswith(_MARKER) for c in comments)
    m = _Meta()
    for c in comments:
        if not (ours and c.startswith(_P) and "=" in c):
            m.notes.append(c)
            continue
        key, value = c[len(_P):].split("=", 1)
        try:
            if key == "note":
                m.notes.append(value)
            elif key == "extra":
                k, v = json.loads(value)
                m.extra[str(k)] = str(v)
            elif key.startswith("dropped."):
                m.dropped[EventType.parse(key[len("dropped."):])] = int(value)
            else:
                m.fields[key] = value  # unknown keys from newer writers are kept harmlessly
        except (ValueError, TypeError, RecursionError) as e:
            raise ValueError(f"{name}: bad ddprof_nb comment {c[:80]!r} ({e})") from None
    return ours, m


def _int_field(m: _Meta, key: str, default: int, name: str) -> int:
    value = m.fields.get(key)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}: comment ddprof_nb.{key} is not an integer: {value[:40]!r}") from None


def _frame_of_function(fn: pb.Function | None, line: int, name: str) -> Frame:
    if fn is None:
        return Frame("[unknown]", line=line, kind=FrameKind.UNKNOWN)
    sysname = fn.system_name
    if sysname.startswith(_KIND_PREFIX) and sysname.endswith("]"):
        try:
            kind = FrameKind.parse(sysname[len(_KIND_PREFIX):-1])
        except ValueError as e:
            raise ValueError(f"{name}: function {fn.id}: {e}") from None
        return Frame(fn.name, fn.filename, line, fn.start_line, kind)
    return Frame(fn.name or sysname, fn.filename, line, fn.start_line, FrameKind.PYTHON)


def _event_columns(sample_types: list[pb.ValueType], nsamples: int, name: str) -> tuple[list, list[str]]:
    """[(event, count column, quantity column)] for the sample types that map to our events
    (None: the file has no such column), and the sample types that map to none."""
    # sample type index -> (event, value index); first mapping of each slot wins
    known = _sample_type_map()
    columns: dict[EventType, list[int | None]] = {}
    ignored: list[str] = []
    for i, vt in enumerate(sample_types):
        hit = known.get((vt.type, vt.unit))
        if hit is None or (hit[0] in columns and columns[hit[0]][hit[1]] is not None):
            ignored.append(f"{vt.type}/{vt.unit}")
            continue
        columns.setdefault(hit[0], [None, None])[hit[1]] = i
    event_cols = [(e, c[0], c[1]) for e, c in sorted(columns.items(), key=lambda kv: kv[0].value)]
    if nsamples and not event_cols:
        found = ", ".join(f"{vt.type}/{vt.unit}" for vt in sample_types) or "none"
        raise ValueError(
            f"{name}: no pprof sample type maps to a ddprof_nb event (found: {found}; expected "
            f"e.g. {', '.join(f'{vt.type}/{vt.unit}' for e in EventType for vt in e.value_types)})"
        )
    return event_cols, ignored


def _metadata(pp: pb.PprofProfile, ours: bool, cm, ignored: list[str], name: str) -> tuple[Metadata, int]:
    """The Metadata and tick of the profile: from our comments when we wrote the file, else
    what pprof's own fields say."""
    if ours:
        meta = Metadata(
            start_ns=pp.time_nanos,
            end_ns=pp.time_nanos + pp.duration_nanos,
            interval_ns=pp.period,
            engine=cm.fields.get("engine", ""),
            python_version=cm.fields.get("python_version", ""),
            pid=_int_field(cm, "pid", 0, name),
            host=cm.fields.get("host", ""),
            dropped=cm.dropped,
            notes=tuple(cm.notes),
            extra=cm.extra,
        )
        tick_ns = _int_field(cm, "tick_ns", MIN_TICK_NS, name)
    else:
        notes = list(cm.notes)
        if ignored:
            notes.append(f"ignored pprof sample types: {', '.join(ignored)}")
        ns_period = pp.period_type is not None and pp.period_type.unit == "nanoseconds"
        meta = Metadata(
            start_ns=pp.time_nanos,
            end_ns=pp.time_nanos + max(0, pp.duration_nanos),
            interval_ns=pp.period if ns_period and pp.period > 0 else 0,
            engine="", python_version="", pid=0, host="",
            notes=tuple(notes), extra={"source_format": "pprof"},
        )
        tick_ns = MIN_TICK_NS
    return meta, tick_ns


def _location_frames(pp: pb.PprofProfile, builder: ProfileBuilder, name: str) -> dict[int, list[int]]:
    """Location id -> its frame ids, leaf first (an inlined location has several)."""
    functions = {f.id: f for f in pp.functions}
    mappings = {m.id: m for m in pp.mappings}
    loc_frames: dict[int, list[int]] = {}
    for loc in pp.locations:
        if loc.lines:
            ids = [builder.frame_id(_frame_of_function(functions.get(ln.function_id), ln.line, name))
                   for ln in loc.lines]
        else:
            m = mappings.get(loc.mapping_id)
            label = f"0x{loc.address:x}" if loc.address else "[unknown]"
            kind = FrameKind.NATIVE if loc.address else FrameKind.UNKNOWN
            ids = [builder.frame_id(Frame(label, m.filename if m else "", kind=kind))]
        loc_frames[loc.id] = ids
    return loc_frames


def from_pprof(pp: pb.PprofProfile, *, name: str = "<pprof>") -> Profile:
    """The Profile for a decoded pprof message (its ``sample_table``, else its ``samples``);
    ``ValueError`` naming ``name`` when its sample types cannot be mapped to events."""
    ours, cm = _parse_comments(pp.comments, name)
    table = pp.sample_table
    if table is None:
        table = table_of_samples(pp.samples, ())
    event_cols, ignored = _event_columns(pp.sample_types, len(table), name)
    meta, tick_ns = _metadata(pp, ours, cm, ignored, name)
    builder = ProfileBuilder(meta)
    loc_frames = _location_frames(pp, builder, name)
    if all(len(ids) == 1 for ids in loc_frames.values()):  # the usual case: one frame per location
        single = {lid: ids[0] for lid, ids in loc_frames.items()}.__getitem__

        def frames_of_stack(key):
            return list(map(single, reversed(key)))  # root first
    else:
        def frames_of_stack(key):
            frames = [f for lid in key for f in loc_frames[lid]]
            frames.reverse()  # root first
            return frames
    add_rows(builder, table, event_cols, ours, pp.time_nanos, frames_of_stack, name)
    return finish_profile(builder, meta, tick_ns)
