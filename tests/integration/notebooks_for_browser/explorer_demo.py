"""A synthetic profile for the browser test: realistic shape, deterministic.

Three threads, CPU and wall events (wall samples carry a ``state`` label), a call
graph through user code, the stdlib and site-packages, and one function whose name is
``<script>alert(1)</script>`` so the browser test can check nothing runs it.
"""

from __future__ import annotations

import numpy as np

from ddprof_nb.events import EventType
from ddprof_nb.model import Frame, Metadata, ProfileBuilder

EVIL = "<script>alert(1)</script>"


def make_profile(n_samples: int = 200_000, n_stacks: int = 4_000, seed: int = 7):
    rng = np.random.default_rng(seed)
    files = (
        [f"/home/user/project/app/{m}.py" for m in ("main", "pipeline", "model", "io_utils", "report")]
        + [f"/usr/lib/python3.11/{m}.py" for m in ("json/decoder", "threading", "selectors", "re/_compiler")]
        + [f"/venv/lib/python3.11/site-packages/{m}.py" for m in ("numpy/core/numeric", "pandas/core/frame",
                                                                   "requests/sessions")]
    )
    names = ["load", "parse", "transform", "score", "fit", "predict", "encode", "decode", "read", "write",
             "step", "run", "compute", "merge", "sort", "apply", "validate", "render", "flush", "wait"]
    frames = []
    for i in range(300):
        fn = files[i % len(files)]
        name = EVIL if i == 7 else f"{names[i % len(names)]}_{i}"
        first = 10 + (i // len(files)) * 23
        frames.append(Frame(name, fn, first + 2, first))
    b = ProfileBuilder(Metadata(start_ns=1_700_000_000_000_000_000, end_ns=1_700_000_020_000_000_000,
                                interval_ns=10_000_000, engine="synthetic"))
    fid = [b.frame_id(f) for f in frames]
    # a skewed call graph: most calls take the first callee, so paths share prefixes
    callees = rng.integers(0, len(frames), size=(len(frames), 4))
    pick = np.array([0.55, 0.25, 0.12, 0.08])
    seen, stacks = set(), []
    while len(stacks) < n_stacks:
        depth = int(rng.integers(3, 24))
        f = int(rng.choice([0, 1, 2, 7], p=[0.5, 0.3, 0.15, 0.05]))
        path = [f]
        for c in rng.choice(4, size=depth - 1, p=pick):
            f = int(callees[f, c])
            path.append(f)
        key = tuple(path)
        if key not in seen:
            seen.add(key)
            stacks.append(b.stack_id([fid[x] for x in key]))
    stacks_arr = np.array(stacks, dtype=np.int32)
    w = 1.0 / np.arange(1, n_stacks + 1) ** 1.1
    w /= w.sum()
    threads = np.array([b.thread_id(101, "MainThread"), b.thread_id(102, "loader"), b.thread_id(103, "writer")],
                       dtype=np.int32)
    states = np.array([b.labels_id({"state": s}) for s in ("cpu", "off-cpu", "lock")], dtype=np.int32)
    half = n_samples // 2
    for event, n in ((EventType.CPU, half), (EventType.WALL, n_samples - half)):
        th = threads[rng.choice(3, size=n, p=[0.6, 0.25, 0.15])]
        t = rng.integers(0, 20_000_000_000, size=n)
        if event is EventType.WALL:
            # the loader blocks in the second half: a visible change of state on the timeline
            p_off = np.where((th == threads[1]) & (t > 10_000_000_000), 0.8, 0.2)
            lb = np.where(rng.random(n) < p_off, states[1], states[0])
            lb = np.where(rng.random(n) < 0.05, states[2], lb).astype(np.int32)
        else:
            lb = np.zeros(n, dtype=np.int32)
        vals = np.column_stack([np.ones(n, dtype=np.int64), np.full(n, 10_000_000, dtype=np.int64)])
        b.add_many(event, stacks_arr[rng.choice(n_stacks, size=n, p=w)], th, lb, t, vals)
    return b.build()
