"""Sample another CPython process from outside into a normal Profile.

At every tick (0.5 to 1.5 intervals apart, at random: a fixed period locked onto the phase
of a target sleeping in multiples of it and read a sleeper's 10 ms / 30 ms split 5-8
points off) each thread of the target is walked (ddprof_nb.remote) and gets a WALL
sample weighted by the time since its previous one, labelled with its state (``cpu``:
running or runnable in /proc, ``gil``: in a futex wait on the GIL's memory, ``off-cpu``).
CPU comes from the thread's own CPU time in /proc (utime + stime, counted in clock ticks):
each increase is spread evenly over the samples taken since the previous increase that
saw the thread on CPU (all of them when none did), so a thread's CPU total is exactly
what the kernel counted, at the kernel's tick resolution.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field

from .events import EventType, FrameKind
from .model import Frame, Metadata, Profile, ProfileBuilder
from .remote import RemoteError, Target, TornRead, thread_stat

__all__ = ["record"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class _Thread:
    index: int  # the builder's thread id
    last_wall: int  # monotonic ns of its previous sample
    last_ticks: int | None  # utime + stime at its previous sample
    # samples per stack since the last CPU increase: those that saw the thread on CPU, and all
    # (counts, not lists: a thread idle for hours keeps one entry per stack)
    pending: dict[int, int] = field(default_factory=dict)
    pending_any: dict[int, int] = field(default_factory=dict)


def record(target: Target, duration_s: float | None, interval_ns: int = 10_000_000, should_stop=None,
           events=(EventType.CPU, EventType.WALL), labels: dict[str, str] | None = None) -> Profile:
    """Sample ``target`` for ``duration_s`` seconds (None: until it exits or ``should_stop()``
    says so) into a profile of ``events`` (cpu and/or wall), every sample labelled with
    ``labels``.  The profile ends early, with a note, when the target exits."""
    want_wall, want_cpu = EventType.WALL in events, EventType.CPU in events
    if not (want_wall or want_cpu) or set(events) - {EventType.CPU, EventType.WALL}:
        raise ValueError("sampling from outside records cpu and wall only")
    start_ns, start_mono = time.time_ns(), time.monotonic_ns()
    builder = ProfileBuilder(Metadata(start_ns=start_ns, interval_ns=interval_ns, engine="remote", pid=target.pid,
                                      python_version=target.version_text))
    labels = dict(labels or {})
    states = {s: builder.labels_id({**labels, "state": s}) for s in ("cpu", "off-cpu", "gil")}
    unknown = builder.labels_id(labels or None)
    truncated = builder.frame_id(Frame("[truncated]", kind=FrameKind.TRUNCATED))
    stacks: dict[tuple, int] = {}
    threads: dict[int, _Thread] = {}
    torn = ticks = 0
    end_reason = ""
    deadline = None if duration_s is None else start_mono + int(duration_s * 1e9)
    next_tick = start_mono
    jitter = random.Random(target.pid ^ start_mono)
    try:  # Ctrl-C ends the sampling; the profile of what was sampled is still built
        while True:
            now = time.monotonic_ns()
            if (deadline is not None and now >= deadline) or (should_stop is not None and should_stop()):
                break
            if now < next_tick:
                time.sleep((next_tick - now) / 1e9)
                continue
            # the next tick 0.5 to 1.5 intervals after this one (a late tick is never caught up
            # in a burst): a jittered period cannot lock onto a periodic target's phase
            next_tick = now + int(interval_ns * (0.5 + jitter.random()))
            try:
                listed = target.threads()
            except TornRead:
                continue  # the thread list changed under every try: the next tick looks again
            except RemoteError as exc:
                end_reason = str(exc)
                break
            ticks += 1
            for tstate, tid in listed:
                st = thread_stat(target.pid, tid)
                if st is None:
                    continue  # it ended between the list and the look
                try:
                    sid = _stack_id(target, builder, stacks, truncated, tstate, tid)
                except RemoteError as exc:
                    end_reason = str(exc)
                    break
                if sid is None:
                    torn += 1  # its time goes to the thread's next sample
                    continue
                sample_at = time.monotonic_ns()
                th = threads.get(tid)
                if th is None:
                    th = threads[tid] = _Thread(builder.thread_id(tid, target.thread_name(tid) or f"Thread {tid}"),
                                                sample_at - interval_ns, None)
                state = target.state_of(st)
                rel = sample_at - start_mono
                if want_wall:
                    builder.add(EventType.WALL, sid, th.index, states.get(state, unknown), rel, 1,
                                sample_at - th.last_wall)
                th.last_wall = sample_at
                if want_cpu:
                    _account_cpu(builder, th, st.cpu_ticks, sid, state == "cpu", rel, unknown)
            if end_reason:
                break
    except KeyboardInterrupt:
        end_reason = "interrupted (Ctrl-C)"
    end_mono = time.monotonic_ns()
    builder.metadata = builder.metadata.replace(
        notes=_notes(target, ticks, (end_mono - start_mono) / 1e9, end_reason),
        dropped={EventType.WALL: torn} if torn else {},
        extra={"wall_state_label": "state=cpu|off-cpu|gil", "target_pid": str(target.pid)})
    return builder.build(end_ns=start_ns + (end_mono - start_mono))


def _notes(target: Target, ticks: int, seconds: float, end_reason: str) -> tuple[str, ...]:
    """What the profile says of how it was taken: the target, the tick rate, why it ended early."""
    notes = [f"sampled from outside: process {target.pid} ({target.cmdline or '?'}), CPython {target.version_text}",
             f"wall: {ticks} ticks ({ticks / max(seconds, 1e-9):.0f}/s); "
             f"cpu: each thread's /proc CPU time, spread over its samples ({_CLK_TCK} ticks/s resolution)"]
    if target.layout_note:
        notes.append(f"stacks {target.layout_note}")
    if end_reason:
        notes.append(f"stopped early: {end_reason}")
    return tuple(notes)


def _stack_id(target: Target, builder: ProfileBuilder, stacks: dict, truncated: int, tstate: int, tid: int,
              tries: int = 3) -> int | None:
    """The builder's stack id of the thread's stack now; None when every try was torn.  A torn
    read is tried again at once: its time would otherwise go to the next sample, which is
    biased toward what the thread does after the change that tore it."""
    for _ in range(tries):
        raw = target.raw_stack(tstate, tid)
        if raw is None:
            continue
        key = (raw[1], *raw[0])
        sid = stacks.get(key)
        if sid is not None:
            return sid
        frames = [target.frame(c, fp, lasti) for c, fp, lasti, _first in raw[0]]
        if any(f is None for f in frames):
            continue
        ids = [builder.frame_id(f) for f in reversed(frames)]  # root first
        if raw[1]:
            ids.insert(0, truncated)
        sid = stacks[key] = builder.stack_id(ids)
        return sid
    return None


def _account_cpu(builder: ProfileBuilder, th: _Thread, cpu_ticks: int, sid: int, on_cpu: bool, rel: int,
                 labels_id: int) -> None:
    """Spread the thread's CPU increase since its previous sample over the samples waiting for
    it, evenly per sample (so per stack in proportion to its samples)."""
    th.pending_any[sid] = th.pending_any.get(sid, 0) + 1
    if on_cpu:
        th.pending[sid] = th.pending.get(sid, 0) + 1
    if th.last_ticks is None:  # first sight: CPU used before it is not ours to place
        th.last_ticks = cpu_ticks
        th.pending_any.clear(), th.pending.clear()
        return
    delta = cpu_ticks - th.last_ticks
    if delta <= 0:
        return
    th.last_ticks = cpu_ticks
    ns = delta * 1_000_000_000 // _CLK_TCK
    owners = th.pending or th.pending_any
    samples = sum(owners.values())
    given = 0
    for i, (owner, n) in enumerate(owners.items()):
        part = ns - given if i == len(owners) - 1 else ns * n // samples  # the last takes the rounding
        given += part
        builder.add(EventType.CPU, owner, th.index, labels_id, rel, n, part)
    th.pending.clear(), th.pending_any.clear()
