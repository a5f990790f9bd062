"""The rows of a Profile from a pprof SampleTable, built as columns.

A million samples usually carry a few dozen distinct label lists once the per-sample
time is set aside (thread, thread name, user labels), and a few tens of thousands of
distinct stacks.  So the samples are grouped by their labels (the time label's number
left out) with numpy, each group's labels are read once (:func:`parse_labels`), each
stack is made once, and the rows go to ``ProfileBuilder.add_many`` in one call.  The
result is exactly what reading the samples one by one gives, in the same order.
"""

from __future__ import annotations

import numpy as np

from ..events import EventType
from ..model import LabelSet, ProfileBuilder
from . import pprof_proto as pb
from .pprof_samples import SampleTable

__all__ = ["add_rows", "parse_labels", "EVENT_LABEL"]

EVENT_LABEL = "ddprof_nb.event"
_I64_MAX = (1 << 63) - 1
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def add_rows(builder: ProfileBuilder, t: SampleTable, event_cols, ours: bool, start: int,
             frames_of_stack, name: str) -> None:
    """Add the rows of every sample of ``t`` to ``builder``: one per event with a nonzero
    value (``event_cols``: [(event, count column, quantity column)]), or for our files one
    for a zero sample that names its event.  ``frames_of_stack(location ids)`` gives the
    frame ids, root first."""
    n = len(t)
    zeros = np.zeros(n, np.int64)
    per_event = []
    any_nz = np.zeros(n, bool)
    for e, ci, qi in event_cols:
        c = t.values[:, ci] if ci is not None else zeros
        q = t.values[:, qi] if qi is not None else zeros
        nz = (c != 0) | (q != 0)
        per_event.append((e.value, c, q, nz))
        any_nz |= nz
    kept = np.arange(n) if ours else np.flatnonzero(any_nz)  # other files: nothing to hold
    if not kept.size:
        return
    times, group, reps = _label_groups(t, kept, any_nz, ours, start)
    th_g, lb_g, ze_g = [], [], []
    for r in reps.tolist():
        th, lb, _, ze = parse_labels(_labels_of(t, r), ours, bool(any_nz[r]), start, builder, name)
        th_g.append(th)
        lb_g.append(lb)
        ze_g.append(-1 if ze is None else ze)
    th_s = np.asarray(th_g, np.int64)[group]
    lb_s = np.asarray(lb_g, np.int64)[group]
    ze_s = np.asarray(ze_g, np.int64)[group]

    parts = []  # (position among kept, event, count, quantity)
    for ev, c, q, nz in per_event:
        at = np.flatnonzero(nz[kept])
        parts.append((at, np.full(len(at), ev, np.int64), c[kept[at]], q[kept[at]]))
    at = np.flatnonzero(~any_nz[kept] & (ze_s >= 0))
    parts.append((at, ze_s[at], zeros[:len(at)], zeros[:len(at)]))
    pos, ev, c, q = (np.concatenate(x) for x in zip(*parts))
    order = np.argsort(pos, kind="stable")  # sample order; a sample's events in column order
    pos, ev, c, q = pos[order], ev[order], c[order], q[order]
    if not len(pos):
        return
    st = t.stack[kept[pos]]
    # stacks are made in the order samples first use them, as one-by-one reading does
    uniq, first, inv = np.unique(st, return_index=True, return_inverse=True)
    sid = np.zeros(len(uniq), np.int64)
    for u in np.argsort(first, kind="stable").tolist():
        sid[u] = builder.stack_id(frames_of_stack(t.stack_keys[int(uniq[u])]))
    builder.add_many(ev.astype(np.uint8), sid[inv.reshape(-1)], th_s[pos], lb_s[pos], times[pos],
                     np.column_stack([c, q]).astype(np.int64))


def _labels_of(t: SampleTable, i: int) -> list:
    a, b = int(t.lab_off[i]), int(t.lab_off[i + 1])
    s = t.strings
    return [pb.Label(s[k], s[v], n, s[u]) for k, v, n, u in zip(
        t.lab_key[a:b].tolist(), t.lab_str[a:b].tolist(), t.lab_num[a:b].tolist(), t.lab_unit[a:b].tolist())]


def _time_labels(t: SampleTable, ours: bool, start: int):
    """(label positions whose number is the sample's time, each one's sample index, the
    times); a sample has at most one (for others' files the later of the two kinds)."""
    off = t.lab_off
    n = len(t)
    counts = np.diff(off)
    if ours:
        has = np.flatnonzero(counts >= 3)
        return off[has] + 2, has, t.lab_num[off[has] + 2]
    s = t.strings
    idx = {v: i for i, v in enumerate(s)}
    owner = np.repeat(np.arange(n), counts)
    cands = []
    k_t, k_e, u_ns = idx.get("time_ns", -1), idx.get("end_timestamp_ns", -1), idx.get("nanoseconds", -1)
    for rank, m in ((0, (t.lab_key == k_t) & (t.lab_unit == u_ns)), (1, (t.lab_key == k_e) & (t.lab_num != 0))):
        at = np.flatnonzero(m)
        _, first = np.unique(owner[at], return_index=True)  # the first of its kind in each sample
        cands.append(at[first])
    at = np.concatenate(cands)
    if not at.size:
        return at, at, at
    at = np.sort(at)
    own = owner[at]
    last = np.ones(len(at), bool)
    last[:-1] = own[1:] != own[:-1]  # where a sample has both kinds, the later label wins
    at, own = at[last], own[last]
    nums = t.lab_num[at]
    is_end = t.lab_key[at] == k_e
    if is_end.any():  # Datadog: an absolute end time, made relative to the profile's start
        rel = [min(max(0, v - start), _I64_MAX) for v in nums[is_end].tolist()]
        nums = nums.copy()
        nums[is_end] = np.asarray(rel, np.int64)
    return at, own, nums


def _mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _label_groups(t: SampleTable, kept: np.ndarray, any_nz: np.ndarray, ours: bool, start: int):
    """(time of each kept sample, its group, each group's first sample): samples are in
    one group when they have the same labels but for the time label's number, and the
    same 'has a nonzero value'; groups in order of first appearance."""
    n = len(t)
    times = np.zeros(n, np.int64)
    num = t.lab_num.copy()
    at, own, tv = _time_labels(t, ours, start)
    times[own] = tv
    num[at] = 0
    counts = np.diff(t.lab_off)
    pos_in = np.arange(len(num)) - np.repeat(t.lab_off[:-1], counts)
    with np.errstate(over="ignore"):
        h = _mix(t.lab_key.view(np.uint64) + np.uint64(1))
        for col in (t.lab_str, t.lab_unit, num, pos_in):
            h = _mix(h ^ col.view(np.uint64))
        cs = np.zeros(len(h) + 1, np.uint64)
        np.cumsum(h, out=cs[1:])
        sig = cs[t.lab_off[1:]] - cs[t.lab_off[:-1]]
        sig = _mix(sig ^ _mix(counts.view(np.uint64) * np.uint64(2) + any_nz.astype(np.uint64)))
    sig = sig[kept]
    _, first, inv = np.unique(sig, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    group = rank[inv]
    reps = kept[np.sort(first)]
    cols = (t.lab_key, t.lab_str, t.lab_unit, num)
    if not _same_as_rep(t, kept, reps[group], any_nz, cols):
        group, reps = _exact_groups(t, kept, any_nz, cols)  # a hash collision (never seen)
    return times[kept], group, reps


def _same_as_rep(t: SampleTable, kept, rep, any_nz, cols) -> bool:
    off = t.lab_off
    cnt = off[kept + 1] - off[kept]
    if (cnt != off[rep + 1] - off[rep]).any() or (any_nz[kept] != any_nz[rep]).any():
        return False
    p = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    mine = np.repeat(off[kept], cnt) + p
    theirs = np.repeat(off[rep], cnt) + p
    return all(np.array_equal(col[mine], col[theirs]) for col in cols)


def _exact_groups(t: SampleTable, kept, any_nz, cols):
    off = t.lab_off.tolist()
    rows = list(zip(*(c.tolist() for c in cols)))
    memo: dict[tuple, int] = {}
    reps, group = [], []
    for i in kept.tolist():
        key = (bool(any_nz[i]), tuple(rows[off[i]:off[i + 1]]))
        g = memo.get(key)
        if g is None:
            g = memo[key] = len(reps)
            reps.append(i)
        group.append(g)
    return np.asarray(group, np.int64), np.asarray(reps, np.int64)


def parse_labels(labels, ours: bool, nonzero: bool, start: int, builder: ProfileBuilder, name: str):
    """(thread index, labelset index, time, zero-row event id or None) for one label list."""
    tid, tname, t, zero_event = 0, "", 0, None
    rest = labels
    if ours:
        if len(labels) < 3 or [lab.key for lab in labels[:3]] != ["thread id", "thread name", "time_ns"]:
            raise ValueError(f"{name}: a sample lacks the thread id / thread name / time_ns labels "
                             f"ddprof_nb writes first")
        tid, tname, t = labels[0].num, labels[1].str, labels[2].num
        rest = labels[3:]
        if not nonzero and rest and rest[0].key == EVENT_LABEL:
            try:
                zero_event = EventType.parse(rest[0].str).value
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
            rest = rest[1:]
        pairs = [(lab.key, lab.str) for lab in rest]
    else:
        seen = set()
        pairs = []
        for lab in labels:
            k = lab.key
            if k == "thread id" and k not in seen and (lab.num or lab.str.isdigit()):
                tid = lab.num or int(lab.str)
            elif k == "thread name" and k not in seen and lab.str:
                tname = lab.str
            elif k == "time_ns" and k not in seen and lab.num_unit == "nanoseconds":
                t = lab.num
            elif k == "end_timestamp_ns" and k not in seen and lab.num:
                t = min(max(0, lab.num - start), _I64_MAX)  # Datadog: absolute sample end time
            else:
                pairs.append((k, _label_text(lab)))
                continue
            seen.add(k)
    return builder.thread_id(tid, tname), builder.labels_id(LabelSet.of(pairs)), t, zero_event


def _label_text(lab) -> str:
    if lab.str or not (lab.num or lab.num_unit):
        return lab.str
    return f"{lab.num} {lab.num_unit}" if lab.num_unit else str(lab.num)
