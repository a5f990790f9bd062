"""ProfileBuilder: raw samples in, one aggregated Profile out."""

from __future__ import annotations

import numpy as np

from ..events import EventType
from .data import MIN_TICK_NS, Interner, Metadata, aggregate_columns, tick_for
from .profile import Profile

__all__ = ["ProfileBuilder"]

_PENDING_ROWS = 4096  # rows added one by one are held as tuples (~200 bytes each) up to this many


class ProfileBuilder(Interner):
    """Accumulates raw samples and interns frames, stacks, threads and labels.

    Ingestion is batched: ``add_many`` takes numpy columns; ``add`` buffers single rows.
    Raw rows are compacted (aggregated) whenever ``compact_every`` accumulate, so the
    builder's memory stays proportional to unique keys.  ``build()`` returns the Profile.
    Not thread-safe: one consumer owns a builder.
    """

    def __init__(self, metadata: Metadata | None = None, compact_every: int = 2_000_000):
        super().__init__()
        self.metadata = metadata or Metadata()
        self._chunks: list[tuple[np.ndarray, ...]] = []
        self._pending: list[tuple[int, int, int, int, int, int, int]] = []
        self._raw_rows = 0
        self._compact_every = compact_every
        self._tick_ns = MIN_TICK_NS
        self._max_time = 0
        # a live view's running aggregate (ddprof_nb.live): called with every batch of rows as
        # it arrives, in the consumer's thread, as tap(builder, event, stack, thread, labels, time, values)
        self.tap = None

    # -- samples ------------------------------------------------------------------------
    def add(self, event, stack_id: int, thread_id: int, labels_id: int, time_ns: int, count: int, quantity: int) -> None:
        """Add one raw sample (time relative to metadata.start_ns)."""
        self._pending.append((EventType.parse(event).value, stack_id, thread_id, labels_id, time_ns, count, quantity))
        if len(self._pending) >= _PENDING_ROWS:
            self._flush_pending()

    def add_rows(self, rows: list[tuple[int, int, int, int, int, int, int]]) -> None:
        """Add raw samples given as (event id, stack id, thread id, labels id, time_ns,
        count, quantity) tuples, event ids already checked (the native drain's small
        batches: cheaper than columns for a few dozen rows)."""
        self._pending.extend(rows)
        if len(self._pending) >= _PENDING_ROWS:
            self._flush_pending()

    def add_many(self, event, stack_ids, thread_ids, labels_ids, times_ns, values) -> None:
        """Add raw samples as columns.  ``event`` is one EventType or an array of ids;
        ``values`` has shape (n, 2)."""
        stack_ids = np.asarray(stack_ids, dtype=np.int32)
        n = len(stack_ids)
        if n == 0:
            return
        if isinstance(event, (EventType, str)):
            ev = np.full(n, EventType.parse(event).value, dtype=np.uint8)
        else:
            ev = np.asarray(event, dtype=np.uint8)
            for v in np.flatnonzero(np.bincount(ev)).tolist():  # (np.unique costs ~10x on small arrays)
                EventType.from_id(int(v))
        t = np.asarray(times_ns, dtype=np.int64)
        vals = np.asarray(values, dtype=np.int64).reshape(n, 2)
        thr = np.broadcast_to(np.asarray(thread_ids, dtype=np.int32), (n,))
        lab = np.broadcast_to(np.asarray(labels_ids, dtype=np.int32), (n,))
        self._max_time = max(self._max_time, int(t.max()))
        self._chunks.append((ev, stack_ids, thr, lab, t, vals))
        self._raw_rows += n
        if self.tap is not None:
            self.tap(self, ev, stack_ids, thr, lab, t, vals)
        if self._raw_rows >= self._compact_every:
            self._compact()

    def flush(self) -> None:
        """Hand the rows added one by one to ``add_many`` now (and so to ``tap``), not when
        ``_PENDING_ROWS`` of them have gathered: a live view reads what was drained so far."""
        self._flush_pending()

    def _flush_pending(self) -> None:
        if not self._pending:
            return
        arr = np.array(self._pending, dtype=np.int64)
        self._pending = []
        self.add_many(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4], arr[:, 5:7])

    def _compact(self, final_tick: int | None = None) -> None:
        tick = final_tick or max(self._tick_ns, tick_for(self._max_time))
        ev, st, th, lb, t, vals = (np.concatenate(c) for c in zip(*self._chunks))
        t = (t // tick) * tick
        self._chunks = [aggregate_columns(ev, st, th, lb, t, vals)]
        self._raw_rows = len(self._chunks[0][0])
        self._tick_ns = tick

    def build(self, end_ns: int | None = None) -> Profile:
        """The aggregated Profile.  ``end_ns`` (epoch) closes the metadata's time range."""
        self._flush_pending()
        meta = self.metadata
        if end_ns is not None:
            meta = meta.replace(end_ns=end_ns)
        elif not meta.end_ns:
            meta = meta.replace(end_ns=meta.start_ns + self._max_time)
        tick = max(self._tick_ns, tick_for(max(meta.duration_ns, self._max_time)))
        if self._chunks:
            self._compact(final_tick=tick)
            cols = self._chunks[0]
        else:
            cols = (np.zeros(0, np.uint8), np.zeros(0, np.int32), np.zeros(0, np.int32),
                    np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros((0, 2), np.int64))
        return Profile(
            **self.tables(),
            event=cols[0], stack=cols[1], thread=cols[2], labels=cols[3], time_ns=cols[4], values=cols[5],
            metadata=meta,
            tick_ns=tick,
        )
