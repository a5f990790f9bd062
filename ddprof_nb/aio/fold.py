"""Asyncio job 3: folding the loop's frames (``fold_loop_frames``), a Profile transform.

**Folding the loop** (``fold_loop_frames``): a Profile transform that folds the event
loop's machinery (asyncio's run/run_forever/_run_once/Handle._run/Task.__step,
selectors, tornado/ipykernel/IPython loop runners) into one ``[asyncio loop]`` frame,
marks each task entry (the Python proxy's ``send`` frame; with the C proxy, which
has no frame, the coroutine's first frame under the loop's callback runner) with
``[task <name>]`` and drops the profiler's own wrapper frames.
"""

from __future__ import annotations

import re

import numpy as np

from ..events import FrameKind
from ..model import Frame, Interner, Profile, selection

LOOP_FRAME = Frame("[asyncio loop]", kind=FrameKind.THREAD)
IDLE_FRAME = Frame("[idle]", kind=FrameKind.BLOCKER)
TASK_MARK = Frame("[task]", kind=FrameKind.THREAD)
SAMPLER_FRAME = Frame("[ddprof_nb asyncio sampler]", kind=FrameKind.THREAD)
OTHER_TASKS = "[other]"  # the task name of tasks past MAX_TASK_NAMES


_OTHER, _ASYNCIO, _RUNNER = 0, 1, 2
_AUTO_NAME = re.compile(r"^Task-\d+$")
_ASYNCIO_FILE = re.compile(r"(^|[/\\])asyncio[/\\]\w+\.py$")
_RUNNER_FILE = re.compile(
    r"(^|[/\\])("
    r"ipykernel[/\\].*|ipykernel_launcher\.py|tornado[/\\].*|zmq[/\\].*|jupyter_client[/\\].*|"
    r"traitlets[/\\]config[/\\]application\.py|IPython[/\\]core[/\\](async_helpers|interactiveshell)\.py|"
    r"nest_asyncio\.py|runpy\.py|<frozen runpy>|selectors\.py"
    r")$"
)
_file_kinds: dict[str, int] = {}


def _file_kind(filename: str) -> int:
    kind = _file_kinds.get(filename)
    if kind is None:
        if _ASYNCIO_FILE.search(filename):
            kind = _ASYNCIO
        elif _RUNNER_FILE.search(filename):
            kind = _RUNNER
        else:
            kind = _OTHER
        if len(_file_kinds) < 100_000:
            _file_kinds[filename] = kind
    return kind


# frame classes for folding
_F_OTHER, _F_LOOP, _F_DRIVER, _F_SELECT, _F_ENTRY, _F_DROP, _F_OWN, _F_ENTRY_BEFORE = range(8)
_STEP_RUNNERS = {"Handle._run", "Task.__step", "Task.__step_run_and_handle_result"}
_LOOP_MODULES = {"base_events", "events", "runners", "selector_events", "unix_events", "proactor_events",
                 "windows_events", "base_subprocess"}
_DRIVERS = {"BaseEventLoop.run_forever", "BaseEventLoop._run_once", "BaseEventLoop.run_until_complete",
            "Runner.run", "run", "Handle._run", "BaseEventLoop._run_forever_setup",
            "Task.__step", "Task.__wakeup", "Task.__step_run_and_handle_result", "Task.__eager_start"}
# our own asyncio modules (the proxy's send, create_task, the sampler's ticks)
_THIS_FILE = re.compile(r"(^|[/\\])ddprof_nb[/\\](asyncio_support|aio[/\\]\w+)\.py$")
_LABELING_FILE = re.compile(r"(^|[/\\])ddprof_nb[/\\]labeling\.py$")


def _frame_class(f: Frame) -> int:
    if f.kind is not FrameKind.PYTHON:
        return _F_ENTRY if f == TASK_MARK else _F_OTHER
    fn = f.filename
    if _THIS_FILE.search(fn):
        if f.name in ("_PyTaskCoro.send", "_TaskCoroMethods.throw", "_TaskCoro.send", "_TaskCoro.throw"):
            return _F_ENTRY
        if f.name.startswith("TaskSampler."):
            return _F_OWN
        return _F_DROP
    if _LABELING_FILE.search(fn):
        return _F_DROP
    kind = _file_kind(fn)
    if kind == _ASYNCIO:
        module = re.split(r"[/\\]", fn)[-1][:-3]
        if module in _LOOP_MODULES or (module == "tasks" and f.name in _DRIVERS):
            return _F_DRIVER if f.name in _DRIVERS else _F_LOOP
        return _F_OTHER
    if kind == _RUNNER:
        return _F_SELECT if fn.endswith("selectors.py") else _F_DRIVER
    return _F_OTHER


def _implicit_entries(frames: tuple[Frame, ...], classes: list[int]) -> set[int]:
    """Where a task's coroutine begins with no stepper frame above it: the C stepper
    (``_CTaskCoro``) runs between asyncio's C Task and the coroutine, so its first frame
    sits right under the loop's callback runner (``Handle._run``; ``Task.__step`` for
    asyncio's Python Task) or, for an eager start, under the profiler's create_task
    wrapper."""
    out = set()
    for i in range(1, len(frames)):
        if classes[i] == _F_OTHER:
            above, c = frames[i - 1].name, classes[i - 1]
            if (c == _F_DRIVER and above in _STEP_RUNNERS) or (c == _F_DROP and above == "BaseEventLoop.create_task"):
                out.add(i)
    return out


def _fold(frames: tuple[Frame, ...], classes: list[int], task: str | None, keep_loop: bool,
          task_frames: str) -> tuple[Frame, ...]:
    out: list[Frame] = []
    n = len(frames)
    # implicit entries only when the sample is of a task step (labelled with its task)
    implicit = _implicit_entries(frames, classes) if task is not None else set()
    last_entry = max([i for i, c in enumerate(classes) if c == _F_ENTRY] + list(implicit), default=-1)
    i = 0
    while i < n:
        c = classes[i]
        if i in implicit:
            c = _F_ENTRY_BEFORE
        if c in (_F_LOOP, _F_DRIVER, _F_SELECT) and not keep_loop:
            j = i
            folds = False
            while j < n and classes[j] in (_F_LOOP, _F_DRIVER, _F_SELECT):
                folds = folds or classes[j] != _F_LOOP
                j += 1
            if not folds:  # a loop method called from user code (create_task, call_soon ...)
                out.extend(frames[i:j])
            elif out and out[-1].name.startswith("[task") and j < n:
                pass  # a task's own runner frames (a notebook's dispatch task): drop
            else:
                if not (out and out[-1] == LOOP_FRAME):
                    out.append(LOOP_FRAME)
                if j == n and classes[j - 1] == _F_SELECT:
                    out.append(IDLE_FRAME)
            i = j
            continue
        if c in (_F_ENTRY, _F_ENTRY_BEFORE):
            if task_frames != "none":
                name = task if i == last_entry else None
                if name is None or (task_frames == "named" and (_AUTO_NAME.match(name) or name == OTHER_TASKS)):
                    out.append(Frame("[task]", kind=FrameKind.THREAD))
                else:
                    out.append(Frame(f"[task {name}]", kind=FrameKind.THREAD))
            if c == _F_ENTRY_BEFORE:  # the marker goes before the coroutine's own frame
                out.append(frames[i])
        elif c == _F_OWN:
            out.append(SAMPLER_FRAME)
            break
        elif c != _F_DROP:
            out.append(frames[i])
        i += 1
    # only the profiler's wrapper frames (a chain the wall sampler read while the thread
    # changed it): keep them as they are rather than make an empty stack
    return tuple(out) if out else frames


def fold_loop_frames(profile: Profile, keep_loop: bool = False, task_frames: str = "named") -> Profile:
    """A new Profile whose stacks show asyncio tasks instead of the loop's machinery.

    - Each run of event-loop frames (asyncio's runners, ``run_forever``, ``_run_once``,
      ``Handle._run``, ``Task.__step``, selectors, and the tornado/ipykernel/IPython
      loop runners) becomes one ``[asyncio loop]`` frame, followed by ``[idle]`` when the
      loop was waiting in its selector (``keep_loop=True`` keeps those frames as they are).
    - Each task entry (the Python task proxy's frame, the task sampler's marker, or,
      in a sample labelled with a task, a coroutine's first frame right under the loop's
      callback runner, where the C proxy leaves no frame) gets a ``[task <name>]`` frame
      from the sample's ``task`` label.  ``task_frames``: ``"named"``
      (default) writes names given by the program and a bare ``[task]`` for asyncio's
      automatic ``Task-<n>`` names (unique counters that would split every flame graph
      into slivers; the exact name stays in the ``task`` label); ``"all"`` writes every
      name; ``"none"`` drops task frames.
    - The profiler's own wrapper frames (task proxy, create_task and thread-label
      wrappers) are removed; the task sampler's ticks show as one
      ``[ddprof_nb asyncio sampler]`` frame.

    Values are unchanged: stacks that become equal merge and their values add up.
    Returns ``profile`` itself when no stack holds such frames.
    """
    if task_frames not in ("named", "all", "none"):
        raise ValueError(f"task_frames={task_frames!r}: expected 'named', 'all' or 'none'")
    classes = [_frame_class(f) for f in profile.frames]
    if not any(c != _F_OTHER for c in classes) or not len(profile):
        return profile
    task_of = [ls.get("task") for ls in profile.labelsets]
    nl = max(1, len(profile.labelsets))
    key = profile.stack.astype(np.int64) * nl + profile.labels.astype(np.int64)
    uniq, inverse = np.unique(key, return_inverse=True)
    tables = Interner()
    known = tables.frame_ids(profile.frames)
    memo: dict[tuple[int, str | None], int] = {}
    new_ids = np.empty(len(uniq), dtype=np.int32)
    for k, u in enumerate(uniq.tolist()):
        s, lab = divmod(u, nl)
        stack = profile.stacks[s]
        name = task_of[lab]
        m = (s, name)
        sid = memo.get(m)
        if sid is None:
            frames = tuple(profile.frames[i] for i in stack)
            sid = memo[m] = known.stack_of(
                _fold(frames, [classes[i] for i in stack], name, keep_loop, task_frames))
        new_ids[k] = sid
    return selection.restacked(profile, tables, new_ids[inverse])
