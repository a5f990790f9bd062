"""The Sample messages of a pprof profile as columns, decoded in bulk.

A profile of a million samples is a million small messages; decoding each into Python
objects (a Sample, its lists, a Label per label) takes about a minute.  This module reads
them with numpy instead, field by field across all samples at once, and keeps the result
as columns (:class:`SampleTable`): repeated location lists and value lists (stacks and
values repeat) are decoded once each, keyed by their encoded bytes.

The bulk reader only accepts the plain layout every producer writes (packed
``location_id`` and ``value``, ``label`` messages of varint fields, no unknown fields, no
field given twice).  For anything else it returns None and the caller decodes the
samples one by one with the careful decoder, which names the problem; both apply the
same checks (known location ids, one value per sample type, string indexes in range,
varints of at most 10 bytes that fit 64 bits).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

__all__ = ["SampleTable", "bulk_samples", "table_of_samples", "samples_of_table"]


@dataclass(slots=True)
class SampleTable:
    """``n`` samples as columns.  Labels are in sample order: sample ``i`` has the labels
    ``lab_off[i]:lab_off[i + 1]``; their key, str and num_unit are string-table indexes."""

    stack_keys: list[tuple[int, ...]]  # unique location-id lists, leaf first
    stack: np.ndarray  # (n,) index into stack_keys
    values: np.ndarray  # (n, nvalues) int64
    lab_off: np.ndarray  # (n + 1,) int64
    lab_key: np.ndarray  # (L,) int64
    lab_str: np.ndarray
    lab_num: np.ndarray  # signed
    lab_unit: np.ndarray
    strings: list[str]

    def __len__(self) -> int:
        return len(self.stack)


def _read_varints(buf: np.ndarray, pos: np.ndarray, lim: np.ndarray):
    """The varints starting at ``pos`` (each before its ``lim``): (values as uint64, or
    uint8 when all are one byte; the positions after them); None if any is truncated,
    longer than 10 bytes or over 64 bits."""
    if (pos >= lim).any():
        return None
    b = buf[pos]
    p = pos + 1
    more = np.flatnonzero(b >= 0x80)  # most varints here are one byte: the rest go round
    if not more.size:
        return b, p  # uint8: callers only compare, store or widen it
    v = (b & 0x7F).astype(np.uint64)
    for k in range(1, 10):
        if not more.size:
            return v, p
        q = p[more]
        if (q >= lim[more]).any():
            return None
        b = buf[q]
        if k == 9 and (b > 1).any():
            return None  # a 10th byte above 1 overflows 64 bits, or an 11th byte follows
        v[more] |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        p[more] = q + 1
        more = more[b >= 0x80]
    return (v, p) if not more.size else None


def _fields(buf: np.ndarray, starts: np.ndarray, stops: np.ndarray, length_delimited: bool):
    """Walk the messages ``buf[starts[i]:stops[i]]`` together, one field of each per round.
    Yields (message indexes, field numbers, payload start, payload stop) for
    length-delimited fields or (message indexes, field numbers, value) for varint fields;
    raises _Unusual for any other wire type, a tag over one byte (field numbers above 15:
    none of the fields read here) or a truncated field."""
    want = 2 if length_delimited else 0
    live = starts < stops
    act = np.flatnonzero(live)
    pos, lim = starts[live], stops[live]
    while act.size:
        tag = buf[pos]
        if (tag >= 0x80).any() or ((tag & 7) != want).any() or (tag < 8).any():
            raise _Unusual
        fno = tag >> 3
        r = _read_varints(buf, pos + 1, lim)
        if r is None:
            raise _Unusual
        val, p = r
        if length_delimited:
            if (val > (lim - p).astype(np.uint64)).any():
                raise _Unusual
            a, p = p, p + val.astype(np.int64)
            yield act, fno, a, p
        else:
            yield act, fno, val
        more = p < lim
        if more.all():
            pos = p
        else:
            act, pos, lim = act[more], p[more], lim[more]


class _Unusual(Exception):
    """Input the bulk reader leaves to the careful decoder."""


def bulk_samples(data: bytes, starts, stops, nvalues: int, loc_ids: set[int],
                 strings: list[str]) -> SampleTable | None:
    """The samples at ``data[starts[i]:stops[i]]`` as a SampleTable, or None when they
    are not in the plain layout or fail a check (the careful decoder then says why)."""
    try:
        return _bulk(data, starts, stops, nvalues, loc_ids, strings)
    except _Unusual:
        return None


def _bulk(data, starts, stops, nvalues, loc_ids, strings) -> SampleTable:
    buf = np.frombuffer(data, np.uint8)
    starts = np.asarray(starts, np.int64)
    stops = np.asarray(stops, np.int64)
    n = len(starts)
    ids_a = np.zeros(n, np.int64)
    ids_b = np.zeros(n, np.int64)
    val_a = np.zeros(n, np.int64)
    val_b = np.zeros(n, np.int64)
    seen_ids = np.zeros(n, bool)
    seen_val = np.zeros(n, bool)
    lab_parts = []  # (sample indexes, payload starts, payload stops) of each round
    for act, fno, a, b in _fields(buf, starts, stops, True):
        for f, seen, ca, cb in ((1, seen_ids, ids_a, ids_b), (2, seen_val, val_a, val_b)):
            m = fno == f
            if m.any():
                who = act[m]
                if seen[who].any():
                    raise _Unusual  # a packed field given twice: concatenated, left to the careful decoder
                seen[who] = True
                ca[who] = a[m]
                cb[who] = b[m]
        m = fno == 3
        if m.any():
            lab_parts.append((act[m], a[m], b[m]))
        if (fno > 3).any():
            raise _Unusual

    stack_keys, stack = _intern(data, ids_a, ids_b, loc_ids)
    values = _values(buf, val_a, val_b, nvalues)

    if lab_parts:
        who, la, lb = (np.concatenate(c) for c in zip(*lab_parts))
        order = np.argsort(who, kind="stable")  # by sample, then round: each sample's labels in order
        who, la, lb = who[order], la[order], lb[order]
    else:
        who = la = lb = np.zeros(0, np.int64)
    nl = len(who)
    cols = [np.zeros(nl, np.uint64) for _ in range(4)]  # key, str, num, num_unit
    for act, fno, val in _fields(buf, la, lb, False):
        # a field given twice: the later round overwrites, the last value wins as in protobuf;
        # other field numbers are skipped, as the careful decoder skips them
        for f in range(1, 5):
            m = fno == f
            if m.any():
                cols[f - 1][act[m]] = val[m]
    key, sval, num, unit = cols
    nstr = np.uint64(len(strings))
    if nl and ((key >= nstr).any() or (sval >= nstr).any() or (unit >= nstr).any()):
        raise _Unusual
    lab_off = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(who, minlength=n), out=lab_off[1:])
    return SampleTable(stack_keys, stack, values, lab_off, key.astype(np.int64), sval.astype(np.int64),
                       num.view(np.int64), unit.astype(np.int64), strings)


def _intern(data: bytes, a: np.ndarray, b: np.ndarray, loc_ids: set[int]) -> tuple[list[tuple], np.ndarray]:
    """The unique location-id lists (told apart by their bytes: stacks repeat) and each
    sample's index among them."""
    memo: dict[bytes, int] = {}
    # each sample's list -> the index of the first sample with the same bytes (C-level loops)
    first = np.fromiter(map(memo.setdefault, map(data.__getitem__, map(slice, a.tolist(), b.tolist())),
                            itertools.count()), np.int64, len(a))
    _, idx = np.unique(first, return_inverse=True)  # first indexes ascend as memo's keys do
    idx = idx.reshape(-1)
    raw = np.frombuffer(b"".join(memo), np.uint8)
    ends = np.cumsum([len(k) for k in memo], dtype=np.int64)
    term = raw < 0x80
    if any(memo) and not term[ends[ends > 0] - 1].all():
        raise _Unusual  # a list that ends inside a varint
    ids = _split_varints(raw, term)
    if ids.size and not np.isin(ids, np.fromiter(loc_ids, np.uint64, len(loc_ids))).all():
        raise _Unusual
    cut = np.cumsum(term)[ends - 1] if raw.size else np.zeros(len(ends), np.int64)
    cut[ends == 0] = 0
    cut = np.maximum.accumulate(cut).tolist()  # varints before each list's end
    flat = ids.tolist()
    keys = [tuple(flat[i:j]) for i, j in zip([0] + cut[:-1], cut)]
    return keys, idx


def _split_varints(raw: np.ndarray, term: np.ndarray) -> np.ndarray:
    """The varints of ``raw`` (whole varints, back to back) as uint64."""
    ends = np.flatnonzero(term)
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    lens = ends - starts + 1
    if lens.size and (lens.max() > 10 or (raw[starts[lens == 10] + 9] > 1).any()):
        raise _Unusual  # longer than 10 bytes, or over 64 bits
    v = (raw[starts] & 0x7F).astype(np.uint64)
    for k in range(1, int(lens.max()) if lens.size else 0):
        m = np.flatnonzero(lens > k)
        v[m] |= (raw[starts[m] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    return v


def _values(buf: np.ndarray, a: np.ndarray, b: np.ndarray, nvalues: int) -> np.ndarray:
    """(n, nvalues) int64: the packed ``value`` field ``buf[a[i]:b[i]]`` of each sample, which
    must hold exactly ``nvalues`` varints (int64 in two's complement)."""
    out = np.zeros((len(a), nvalues), np.int64)
    pos = a
    for j in range(nvalues):
        r = _read_varints(buf, pos, b)
        if r is None:
            raise _Unusual
        out[:, j] = r[0].astype(np.uint64, copy=False).view(np.int64)
        pos = r[1]
    if (pos != b).any():
        raise _Unusual
    return out


def table_of_samples(samples, strings_of) -> SampleTable:
    """A SampleTable for Sample objects (made in code, or decoded one by one).
    ``strings_of`` gives the string table to index label strings into."""
    strings: list[str] = []
    index: dict[str, int] = {}

    def sx(s: str) -> int:
        i = index.get(s)
        if i is None:
            i = index[s] = len(strings)
            strings.append(s)
        return i

    sx("")
    for s in strings_of:
        sx(s)
    memo: dict[tuple, int] = {}
    stack_keys: list[tuple] = []
    stack = np.zeros(len(samples), np.int64)
    rows = []
    lab_off = np.zeros(len(samples) + 1, np.int64)
    lk, ls, ln, lu = [], [], [], []
    for i, s in enumerate(samples):
        key = tuple(s.location_ids)
        j = memo.get(key)
        if j is None:
            j = memo[key] = len(stack_keys)
            stack_keys.append(key)
        stack[i] = j
        rows.append(s.values)
        for lab in s.labels:
            lk.append(sx(lab.key))
            ls.append(sx(lab.str))
            ln.append(lab.num)
            lu.append(sx(lab.num_unit))
        lab_off[i + 1] = len(lk)
    width = len(rows[0]) if rows else 0
    if any(len(r) != width for r in rows):
        raise ValueError("pprof: samples have different numbers of values")
    values = np.array(rows, dtype=np.int64).reshape(len(rows), width)
    return SampleTable(stack_keys, stack, values, lab_off, np.array(lk, np.int64), np.array(ls, np.int64),
                       np.array(ln, np.int64), np.array(lu, np.int64), strings)


def samples_of_table(t: SampleTable, Sample, Label) -> list:
    """The Sample objects of a table (for callers that want messages, not columns)."""
    st = t.strings
    keys = [list(k) for k in t.stack_keys]
    labs = [Label(st[k], st[s], n, st[u]) for k, s, n, u in
            zip(t.lab_key.tolist(), t.lab_str.tolist(), t.lab_num.tolist(), t.lab_unit.tolist())]
    off = t.lab_off.tolist()
    return [Sample(keys[k].copy(), v, labs[off[i]:off[i + 1]])
            for i, (k, v) in enumerate(zip(t.stack.tolist(), t.values.tolist()))]
