"""Dependency-free codec for Google's pprof format (``profile.proto``).

The wire format is written by hand so that we do not pin the user's
``protobuf`` major version.  Field numbers and types follow the public
``perftools.profiles`` schema (github.com/google/pprof, proto/profile.proto).

The dataclasses below mirror the proto messages, except that every string is a
plain ``str``: :func:`encode` builds the string table (index 0 is ``""``) and
:func:`decode` resolves it.  Files come from users, so decoding is a security
boundary: any malformed input raises :class:`ValueError` naming the input,
gzip is inflated incrementally under a size cap, declared lengths are checked
against the remaining bytes, and every index / id reference is checked.

Fields of the schema that are not modelled here (e.g. ``Sample.breakdown``)
are skipped on decode.  Empty strings and zero numbers are proto3 defaults and
are not written; ``default_sample_type=""`` therefore decodes as ``None``.
``encode`` refuses profiles that ``decode`` would refuse, and writes the string
table last so that any truncation of its output is detected on decode.

Size: over 600 lines as one module because it is one codec: the message dataclasses,
the encoder and the decoder mirror each other field number by field number, and each
check on decode has its twin on encode ("encode refuses what decode would refuse"); in
one file a field's tag is read and written side by side.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field

from .pprof_samples import SampleTable, bulk_samples, table_of_samples

__all__ = [
    "ValueType", "Label", "Sample", "Line", "Location", "Function", "Mapping",
    "PprofProfile", "encode", "decode", "dumps", "loads", "MAX_UNCOMPRESSED",
]

MAX_UNCOMPRESSED = 512 * 1024 * 1024
_U64 = 1 << 64
_I63 = 1 << 63
_MASK64 = _U64 - 1
_CHUNK = 1 << 20  # inflate output granularity


# --------------------------------------------------------------------------- model

@dataclass(slots=True)
class ValueType:
    type: str = ""
    unit: str = ""


@dataclass(slots=True)
class Label:
    key: str
    str: str = ""
    num: int = 0
    num_unit: str = ""


@dataclass(slots=True)
class Sample:
    location_ids: list[int] = field(default_factory=list)  # leaf first
    values: list[int] = field(default_factory=list)
    labels: list[Label] = field(default_factory=list)


@dataclass(slots=True)
class Line:
    function_id: int = 0
    line: int = 0
    column: int = 0


@dataclass(slots=True)
class Location:
    id: int
    address: int = 0
    lines: list[Line] = field(default_factory=list)  # inlined callee first
    mapping_id: int = 0
    is_folded: bool = False


@dataclass(slots=True)
class Function:
    id: int
    name: str = ""
    system_name: str = ""
    filename: str = ""
    start_line: int = 0


@dataclass(slots=True)
class Mapping:
    id: int
    memory_start: int = 0
    memory_limit: int = 0
    file_offset: int = 0
    filename: str = ""
    build_id: str = ""
    has_functions: bool = False
    has_filenames: bool = False
    has_line_numbers: bool = False
    has_inline_frames: bool = False


@dataclass(slots=True)
class PprofProfile:
    sample_types: list[ValueType] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    locations: list[Location] = field(default_factory=list)
    functions: list[Function] = field(default_factory=list)
    mappings: list[Mapping] = field(default_factory=list)
    time_nanos: int = 0
    duration_nanos: int = 0
    period_type: ValueType | None = None
    period: int = 0
    comments: list[str] = field(default_factory=list)
    default_sample_type: str | None = None
    drop_frames: str = ""
    keep_frames: str = ""
    # decode(..., columns=True) leaves ``samples`` empty and puts them here as columns
    sample_table: SampleTable | None = None


# --------------------------------------------------------------------------- encoder

def _varint_bytes(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


class _UVarints(dict):
    """Per-encode memo ``int -> varint bytes`` for uint64 fields."""

    def __missing__(self, v):
        if not isinstance(v, int):
            raise TypeError(f"pprof: expected int, got {type(v).__name__}")
        if not 0 <= v < _U64:
            raise ValueError(f"pprof: value {v} out of range for uint64")
        b = self[v] = _varint_bytes(v)
        return b


class _SVarints(dict):
    """Per-encode memo for int64 fields; negatives become 10-byte two's complement."""

    def __missing__(self, v):
        if not isinstance(v, int):
            raise TypeError(f"pprof: expected int, got {type(v).__name__}")
        if not -_I63 <= v < _I63:
            raise ValueError(f"pprof: value {v} out of range for int64")
        b = self[v] = _varint_bytes(v & _MASK64)
        return b


class _Strings(dict):
    """String table under construction: ``str -> index`` in insertion order."""

    def __missing__(self, s):
        if not isinstance(s, str):
            raise TypeError(f"pprof: expected str, got {type(s).__name__}")
        i = self[s] = len(self)
        return i


class _KnownIds(dict):
    """``id -> varint bytes`` of the ids defined so far; unknown ids are refused."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def __missing__(self, i):
        raise ValueError(f"pprof: reference to unknown {self.kind} id {i!r}")


def encode(p: PprofProfile) -> bytes:
    """Serialise ``p`` to an uncompressed ``perftools.profiles.Profile`` message.

    Raises ValueError for profiles that ``decode`` would refuse (zero/duplicate
    ids, dangling references, value count != sample type count, out-of-range ints).
    """
    U = _UVarints().__getitem__
    S = _SVarints().__getitem__
    strings = _Strings()
    X = strings.__getitem__
    X("")
    parts: list[bytes] = []
    put = parts.append
    for vt in p.sample_types:
        b = _value_type(vt, X, U)
        put(b"\x0a"); put(U(len(b))); put(b)
    maps = _encode_mappings(p.mappings, put, X, U)
    funcs = _encode_functions(p.functions, put, X, U, S)
    locs = _encode_locations(p.locations, maps, funcs, put, U, S)
    _encode_samples(p, locs, put, X, U, S)
    put(_encode_scalars(p, X, U, S))
    # The string table goes last: every string in it is referenced, so any
    # truncation of the output leaves a dangling index (or a cut field) behind.
    for s in strings:
        b = s.encode("utf-8")
        put(b"\x32"); put(U(len(b))); put(b)
    return b"".join(parts)


def _value_type(vt: ValueType, X, U) -> bytes:
    b = bytearray()
    if i := X(vt.type):
        b += b"\x08"; b += U(i)
    if i := X(vt.unit):
        b += b"\x10"; b += U(i)
    return bytes(b)


def _encode_mappings(mappings: list[Mapping], put, X, U) -> _KnownIds:
    """Write the Mapping messages; returns their ids (encoded), for the locations to check."""
    maps = _KnownIds("mapping")
    for m in mappings:
        _check_new_id(m.id, maps, "mapping")
        b = bytearray(b"\x08"); b += maps.setdefault(m.id, U(m.id))
        for tag, v in ((b"\x10", m.memory_start), (b"\x18", m.memory_limit), (b"\x20", m.file_offset)):
            if v:
                b += tag; b += U(v)
        if i := X(m.filename):
            b += b"\x28"; b += U(i)
        if i := X(m.build_id):
            b += b"\x30"; b += U(i)
        for tag, flag in ((b"\x38\x01", m.has_functions), (b"\x40\x01", m.has_filenames),
                          (b"\x48\x01", m.has_line_numbers), (b"\x50\x01", m.has_inline_frames)):
            if flag:
                b += tag
        put(b"\x1a"); put(U(len(b))); put(b)
    return maps


def _encode_functions(functions: list[Function], put, X, U, S) -> _KnownIds:
    """Write the Function messages; returns their ids (encoded), for the lines to check."""
    funcs = _KnownIds("function")
    for f in functions:
        _check_new_id(f.id, funcs, "function")
        b = bytearray(b"\x08"); b += funcs.setdefault(f.id, U(f.id))
        if i := X(f.name):
            b += b"\x10"; b += U(i)
        if i := X(f.system_name):
            b += b"\x18"; b += U(i)
        if i := X(f.filename):
            b += b"\x20"; b += U(i)
        if v := f.start_line:
            b += b"\x28"; b += S(v)
        put(b"\x2a"); put(U(len(b))); put(b)
    return funcs


def _encode_locations(locations: list[Location], maps: _KnownIds, funcs: _KnownIds, put, U, S) -> _KnownIds:
    """Write the Location messages (their mapping and function ids checked); returns their ids
    (encoded), for the samples to check."""
    locs = _KnownIds("location")
    M, F = maps.__getitem__, funcs.__getitem__
    for loc in locations:
        lid = loc.id
        if not lid or lid in locs:
            _check_new_id(lid, locs, "location")
        b = bytearray(b"\x08"); b += locs.setdefault(lid, U(lid))
        if v := loc.mapping_id:
            b += b"\x10"; b += M(v)
        if v := loc.address:
            b += b"\x18"; b += U(v)
        for ln in loc.lines:
            lb = bytearray()
            if v := ln.function_id:
                lb += b"\x08"; lb += F(v)
            if v := ln.line:
                lb += b"\x10"; lb += S(v)
            if v := ln.column:
                lb += b"\x18"; lb += S(v)
            b += b"\x22"; b += U(len(lb)); b += lb
        if loc.is_folded:
            b += b"\x28\x01"
        put(b"\x22"); put(U(len(b))); put(b)
    return locs


def _encode_samples(p: PprofProfile, locs: _KnownIds, put, X, U, S) -> None:
    """Write the Sample messages (their location ids checked, one value per sample type)."""
    join = b"".join
    nvalues = len(p.sample_types)
    L = locs.__getitem__  # encodes *and* validates location ids at C speed
    label_cache: dict[tuple, bytes] = {}
    for n, s in enumerate(p.samples):
        vals = s.values
        if len(vals) != nvalues:
            raise ValueError(f"pprof: sample #{n} has {len(vals)} values for {nvalues} sample types")
        ids = join(map(L, s.location_ids))
        vals = join(map(S, vals))
        b = [b"\x0a", U(len(ids)), ids] if ids else []
        if vals:
            b += (b"\x12", U(len(vals)), vals)
        for lab in s.labels:
            key = (lab.key, lab.str, lab.num, lab.num_unit)
            lb = label_cache.get(key)
            if lb is None:
                lb = label_cache[key] = _encode_label(lab, n, X, U, S)
            b.append(lb)
        b = join(b)
        put(b"\x12"); put(U(len(b))); put(b)


def _encode_scalars(p: PprofProfile, X, U, S) -> bytes:
    """Fields 7-14; their strings are registered here, before the string table is written."""
    tail = bytearray()
    for tag, s in ((b"\x38", p.drop_frames), (b"\x40", p.keep_frames)):
        if s:
            tail += tag; tail += U(X(s))
    for tag, v in ((b"\x48", p.time_nanos), (b"\x50", p.duration_nanos)):
        if v:
            tail += tag; tail += S(v)
    if p.period_type is not None:
        b = _value_type(p.period_type, X, U)
        tail += b"\x5a"; tail += U(len(b)); tail += b
    if p.period:
        tail += b"\x60"; tail += S(p.period)
    if p.comments:
        b = b"".join([U(X(c)) for c in p.comments])
        tail += b"\x6a"; tail += U(len(b)); tail += b
    if p.default_sample_type:
        tail += b"\x70"; tail += U(X(p.default_sample_type))
    return bytes(tail)


def _encode_label(lab: Label, n: int, X, U, S) -> bytes:
    """Label message including its Sample.label tag and length prefix."""
    b = bytearray()
    if i := X(lab.key):
        b += b"\x08"; b += U(i)
    if lab.str:
        if lab.num or lab.num_unit:
            raise ValueError(f"pprof: label {lab.key!r} of sample #{n} has both str and num")
        b += b"\x10"; b += U(X(lab.str))
    if lab.num:
        b += b"\x18"; b += S(lab.num)
    if lab.num_unit:
        b += b"\x20"; b += U(X(lab.num_unit))
    return b"\x1a" + U(len(b)) + b


def _check_new_id(i, seen, kind: str, name: str = "pprof") -> None:
    if not i:
        raise ValueError(f"{name}: {kind} id must be nonzero")
    if i in seen:
        raise ValueError(f"{name}: duplicate {kind} id {i}")


def dumps(p: PprofProfile) -> bytes:
    """``encode`` then gzip (the on-disk pprof format); deterministic output."""
    return gzip.compress(encode(p), compresslevel=6, mtime=0)


# --------------------------------------------------------------------------- decoder

_SKIP, _INT, _INTS, _LEN, _RUN = 0, 1, 2, 3, 4  # per-field kinds, indexed by field number

# _RUN: Profile.sample, a million of them back to back; read by _sample_run
_K_PROFILE = (_SKIP, _LEN, _RUN, _LEN, _LEN, _LEN, _LEN, _INT, _INT, _INT, _INT, _LEN, _INT, _INTS, _INT)
_K_VALUE_TYPE = (_SKIP, _INT, _INT)
_K_SAMPLE = (_SKIP, _INTS, _INTS, _LEN)
_K_LABEL = (_SKIP, _INT, _INT, _INT, _INT)
_K_MAPPING = (_SKIP,) + (_INT,) * 10
_K_LOCATION = (_SKIP, _INT, _INT, _INT, _LEN, _INT)
_K_LINE = (_SKIP, _INT, _INT, _INT)
_K_FUNCTION = (_SKIP, _INT, _INT, _INT, _INT, _INT)
_WIRE_NAMES = {0: "varint", 1: "fixed64", 2: "length-delimited", 5: "fixed32"}
_LABEL_MEMO_MAX = 1 << 17


def _varint(data, pos: int, end: int, name: str) -> tuple[int, int]:
    start = pos
    result = shift = 0
    while True:
        if pos >= end:
            raise ValueError(f"{name}: truncated varint at byte {start}")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift >= 70:
            raise ValueError(f"{name}: varint longer than 10 bytes at byte {start}")
    if result >= _U64:
        raise ValueError(f"{name}: varint at byte {start} overflows 64 bits")
    return result, pos


def _packed(data, pos: int, end: int, name: str) -> list[int]:
    """Decode the varints of a packed repeated field ``data[pos:end]``."""
    chunk = data[pos:end]
    if chunk.isascii():  # every value fits in one byte: C-speed fast path
        return list(chunk)
    if chunk[-1] < 0x80:  # ends on a terminating byte, so the inner loop cannot overrun
        out = []
        append = out.append
        i, n = 0, len(chunk)
        while i < n:
            b = chunk[i]
            i += 1
            if b < 0x80:
                append(b)
                continue
            v, shift = b & 0x7F, 7
            while True:
                b = chunk[i]
                i += 1
                v |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
                if shift > 63:
                    break
            if shift > 63 or v >= _U64:
                break  # malformed: let the careful loop below report where
            append(v)
        else:
            return out
    out = []
    while pos < end:
        v, pos = _varint(data, pos, end, name)
        out.append(v)
    return out


def _sample_run(data, pos: int, stop: int, end: int, starts: list, stops: list) -> int:
    """Add the Profile.sample field whose payload is ``data[pos:stop]``, then those that
    follow it back to back (tag 0x12), to ``starts``/``stops``.  Returns where they end;
    stops early at anything unusual (a long tag or length, a truncated field), which
    _parse then reads or reports."""
    starts.append(pos)
    stops.append(stop)
    pos = stop
    append_start, append_stop = starts.append, stops.append
    while pos < end - 1 and data[pos] == 0x12:
        n = data[pos + 1]
        p = pos + 2
        if n >= 0x80:
            if p < end and data[p] < 0x80:  # two-byte length: samples of 128 bytes to 16 KiB
                n = (n & 0x7F) | (data[p] << 7)
                p += 1
            else:
                break
        stop = p + n
        if stop > end:
            break
        append_start(p)
        append_stop(stop)
        pos = stop
    return pos


def _parse(data, pos: int, end: int, name: str, kinds: tuple) -> list:
    """Scan one message. Returns a list indexed by field number: the last value of
    ``_INT`` fields, a list of ints for ``_INTS`` (packed or not), a list of
    ``(start, stop)`` spans for ``_LEN``, a pair of lists (starts, stops) for ``_RUN``;
    ``None`` where absent."""
    nk = len(kinds)
    res = [None] * nk
    while pos < end:
        tag_pos = pos
        b = data[pos]
        if b < 0x80:
            key = b
            pos += 1
        else:
            key, pos = _varint(data, pos, end, name)
        fno, wt = key >> 3, key & 7
        if fno == 0:
            raise ValueError(f"{name}: invalid field number 0 at byte {tag_pos}")
        kind = kinds[fno] if fno < nk else _SKIP
        if wt == 0:
            if pos < end and data[pos] < 0x80:
                v = data[pos]
                pos += 1
            else:
                v, pos = _varint(data, pos, end, name)
            if kind == _INT:
                res[fno] = v
            elif kind == _INTS:
                if res[fno] is None:
                    res[fno] = [v]
                else:
                    res[fno].append(v)
            elif kind >= _LEN:
                break  # wrong wire type, reported below
        elif wt == 2:
            if pos < end and data[pos] < 0x80:
                n = data[pos]
                pos += 1
            else:
                n, pos = _varint(data, pos, end, name)
            if n > end - pos:
                raise ValueError(f"{name}: field {fno} at byte {tag_pos} declares {n} bytes "
                                 f"but only {end - pos} remain (truncated?)")
            stop = pos + n
            if kind == _LEN:
                if res[fno] is None:
                    res[fno] = [(pos, stop)]
                else:
                    res[fno].append((pos, stop))
            elif kind == _RUN:
                if res[fno] is None:
                    res[fno] = ([], [])
                stop = _sample_run(data, pos, stop, end, *res[fno])
            elif kind == _INTS:
                if res[fno] is None:
                    res[fno] = _packed(data, pos, stop, name)
                else:
                    res[fno] += _packed(data, pos, stop, name)
            elif kind == _INT:
                break
            pos = stop
        elif wt == 1 or wt == 5:
            size = 8 if wt == 1 else 4
            if end - pos < size:
                raise ValueError(f"{name}: truncated fixed{size * 8} field at byte {tag_pos}")
            if kind != _SKIP:
                break
            pos += size
        elif wt == 3 or wt == 4:
            raise ValueError(f"{name}: unsupported group wire type {wt} at byte {tag_pos}")
        else:
            raise ValueError(f"{name}: invalid wire type {wt} at byte {tag_pos}")
    else:
        return res
    raise ValueError(f"{name}: field {fno} at byte {tag_pos} has unexpected wire type "
                     f"{_WIRE_NAMES.get(wt, wt)}")


def _signed(v: int) -> int:
    return v - _U64 if v >= _I63 else v


def decode(data: bytes, *, name: str = "<bytes>", columns: bool = False) -> PprofProfile:
    """Parse an uncompressed ``Profile`` message.  Raises ValueError on bad input.

    ``columns``: the samples as one SampleTable in ``sample_table`` (decoded in bulk with
    numpy, for large files), not as Sample objects in ``samples``; ``encode`` writes only
    ``samples``."""
    if not isinstance(data, bytes):
        if not isinstance(data, (bytearray, memoryview)):
            raise TypeError(f"decode() expects bytes, got {type(data).__name__}")
        data = bytes(data)
    if not data:
        raise ValueError(f"{name}: empty input")
    if data[:2] == b"\x1f\x8b":
        raise ValueError(f"{name}: data is gzip-compressed (use loads(); double-compressed?)")
    top = _parse(data, 0, len(data), name, _K_PROFILE)
    r = _Reader(data, name, _string_table(data, top[6], name))
    sx = r.sx
    sample_types = [r.value_type(sp, "sample_type") for sp in top[1] or ()]
    mappings = r.mappings(top[3] or ())
    functions = r.functions(top[5] or ())
    locations = r.locations(top[4] or ())
    table = None
    starts, stops = top[2] or ((), ())
    if columns:
        samples = []
        table = bulk_samples(data, starts, stops, len(sample_types), r.loc_ids, r.table)
        if table is None:  # an unusual layout, or a check failed: the careful decoder says which
            table = table_of_samples(r.samples(zip(starts, stops), len(sample_types)), r.table)
    else:
        samples = r.samples(zip(starts, stops), len(sample_types))
    period_type = r.value_type(top[11][-1], "period_type") if top[11] else None
    dst = top[14]
    return PprofProfile(
        sample_types=sample_types, samples=samples, locations=locations,
        functions=functions, mappings=mappings,
        time_nanos=_signed(top[9] or 0), duration_nanos=_signed(top[10] or 0),
        period_type=period_type, period=_signed(top[12] or 0),
        comments=[sx(i, "comment") for i in top[13] or ()],
        default_sample_type=sx(dst, "default_sample_type") if dst else None,
        drop_frames=sx(top[7], "drop_frames"), keep_frames=sx(top[8], "keep_frames"),
        sample_table=table,
    )


def _string_table(data: bytes, spans, name: str) -> list[str]:
    try:
        table = [str(data[s:e], "utf-8") for s, e in spans or ()]
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: string table entry is not valid UTF-8 ({e.reason})") from None
    if not table:
        raise ValueError(f"{name}: missing string table (not a pprof profile?)")
    if table[0] != "":
        raise ValueError(f"{name}: string_table[0] must be the empty string")
    return table


class _Reader:
    """The messages of one Profile, in the order their references need: mappings and
    functions, then the locations that name them, then the samples that name locations;
    every string index and id checked."""

    def __init__(self, data: bytes, name: str, table: list[str]):
        self.data, self.name, self.table = data, name, table
        self.map_ids: set[int] = set()
        self.fn_ids: set[int] = set()
        self.loc_ids: set[int] = set()

    def sx(self, i, what: str) -> str:
        if i is None:
            return ""
        if i >= len(self.table):
            raise ValueError(f"{self.name}: string index {i} in {what} out of range "
                             f"(string table has {len(self.table)} entries)")
        return self.table[i]

    def value_type(self, span, what: str) -> ValueType:
        r = _parse(self.data, span[0], span[1], self.name, _K_VALUE_TYPE)
        return ValueType(self.sx(r[1], what), self.sx(r[2], what))

    def new_id(self, i, seen: set, kind: str) -> int:
        if not i:
            raise ValueError(f"{self.name}: {kind} id must be nonzero")
        if i in seen:
            raise ValueError(f"{self.name}: duplicate {kind} id {i}")
        seen.add(i)
        return i

    def mappings(self, spans) -> list[Mapping]:
        data, name, sx = self.data, self.name, self.sx
        out = []
        for s, e in spans:
            r = _parse(data, s, e, name, _K_MAPPING)
            out.append(Mapping(self.new_id(r[1], self.map_ids, "mapping"), r[2] or 0, r[3] or 0, r[4] or 0,
                               sx(r[5], "mapping filename"), sx(r[6], "mapping build_id"),
                               bool(r[7]), bool(r[8]), bool(r[9]), bool(r[10])))
        return out

    def functions(self, spans) -> list[Function]:
        data, name, sx = self.data, self.name, self.sx
        out = []
        for s, e in spans:
            r = _parse(data, s, e, name, _K_FUNCTION)
            out.append(Function(self.new_id(r[1], self.fn_ids, "function"), sx(r[2], "function name"),
                                sx(r[3], "function system_name"), sx(r[4], "function filename"),
                                _signed(r[5] or 0)))
        return out

    def locations(self, spans) -> list[Location]:
        data, name = self.data, self.name
        map_ids, fn_ids, loc_ids = self.map_ids, self.fn_ids, self.loc_ids
        out = []
        for s, e in spans:
            r = _parse(data, s, e, name, _K_LOCATION)
            lid = r[1]
            if not lid or lid in loc_ids:
                self.new_id(lid, loc_ids, "location")
            loc_ids.add(lid)
            if (m := r[2] or 0) and m not in map_ids:
                raise ValueError(f"{name}: location {lid} references unknown mapping id {m}")
            lines = []
            for ls, le in r[4] or ():
                lr = _parse(data, ls, le, name, _K_LINE)
                if (f := lr[1] or 0) and f not in fn_ids:
                    raise ValueError(f"{name}: location {lid} references unknown function id {f}")
                lines.append(Line(f, _signed(lr[2] or 0), _signed(lr[3] or 0)))
            out.append(Location(lid, r[3] or 0, lines, m, bool(r[5])))
        return out

    def samples(self, spans, nvalues: int) -> list[Sample]:
        data, name, sx, loc_ids = self.data, self.name, self.sx, self.loc_ids
        samples = []
        has_locs = loc_ids.issuperset
        label_memo: dict[bytes, tuple] = {}
        for s, e in spans:
            r = _parse(data, s, e, name, _K_SAMPLE)
            ids = r[1] or []
            if not has_locs(ids):
                raise ValueError(f"{name}: sample #{len(samples)} references unknown location id "
                                 f"{min(set(ids) - loc_ids)}")
            vals = r[2] or []
            if len(vals) != nvalues:
                raise ValueError(f"{name}: sample #{len(samples)} has {len(vals)} values "
                                 f"for {nvalues} sample types")
            if vals and max(vals) >= _I63:
                vals = [v - _U64 if v >= _I63 else v for v in vals]
            labels = []
            for ls, le in r[3] or ():
                raw = data[ls:le]
                t = label_memo.get(raw)
                if t is None:
                    lr = _parse(data, ls, le, name, _K_LABEL)
                    t = (sx(lr[1], "label key"), sx(lr[2], "label str"), _signed(lr[3] or 0),
                         sx(lr[4], "label num_unit"))
                    if len(label_memo) < _LABEL_MEMO_MAX:
                        label_memo[raw] = t
                labels.append(Label(*t))
            samples.append(Sample(ids, vals, labels))
        return samples


# --------------------------------------------------------------------------- files

def _fmt_size(n: int) -> str:
    return f"{n >> 20} MiB" if n and n % (1 << 20) == 0 else f"{n} bytes"


def gunzip(data, name: str, limit: int) -> bytearray:
    """The inflated bytes of a gzip file (every member), at most ``limit`` of them;
    ValueError naming ``name`` for corrupt, truncated or over-limit data."""
    out = bytearray()
    buf = data
    while True:  # one iteration per gzip member (multi-member files are valid gzip)
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            while not d.eof:
                chunk = d.decompress(buf, min(_CHUNK, limit - len(out) + 1))
                buf = d.unconsumed_tail
                if chunk:
                    out += chunk
                    if len(out) > limit:
                        raise ValueError(f"{name}: decompressed size exceeds {_fmt_size(limit)} "
                                         f"(decompression bomb?)")
                elif not buf:
                    raise ValueError(f"{name}: truncated gzip stream")
        except zlib.error as e:
            raise ValueError(f"{name}: corrupt gzip data ({e})") from None
        buf = d.unused_data
        if not buf:
            return out
        if buf[:2] != b"\x1f\x8b":
            raise ValueError(f"{name}: trailing garbage after gzip stream")


def _looks_like_profile(data: bytes) -> bool:
    """True if ``data`` is protobuf with a pprof-style string table (for error wording)."""
    try:
        table = _parse(data, 0, len(data), "", _K_PROFILE)[6]
    except ValueError:
        return False
    return bool(table) and table[0][0] == table[0][1]


def loads(data: bytes, *, name: str = "<bytes>", max_uncompressed: int = MAX_UNCOMPRESSED,
          columns: bool = False) -> PprofProfile:
    """Parse a pprof file's contents, gzip-compressed or raw protobuf.

    ``name`` is used in error messages; ``max_uncompressed`` caps the protobuf
    size (after decompression).  Malformed input raises ValueError.  ``columns``: as
    for ``decode``.
    """
    if not isinstance(data, bytes):
        if not isinstance(data, (bytearray, memoryview)):
            raise TypeError(f"loads() expects bytes, got {type(data).__name__}")
        data = bytes(data)
    if max_uncompressed < 1:
        raise ValueError(f"max_uncompressed must be positive, got {max_uncompressed}")
    if not data:
        raise ValueError(f"{name}: empty input (not a pprof profile)")
    if data[:2] == b"\x1f\x8b":
        payload = bytes(gunzip(data, name, max_uncompressed))
        what = "gzip data is not a pprof profile"
    elif len(data) > max_uncompressed:
        raise ValueError(f"{name}: size exceeds {_fmt_size(max_uncompressed)}")
    else:
        payload = data
        what = "not a pprof profile (not gzip and not protobuf)"
    try:
        return decode(payload, name=name, columns=columns)
    except ValueError as e:
        if _looks_like_profile(payload):
            raise
        detail = str(e).removeprefix(f"{name}: ")
        raise ValueError(f"{name}: {what}: {detail}") from None
