"""Child processes: each Python child started while profiling profiles itself and hands
its profile back to the parent as a pprof file; the parent merges them with ``pid`` and
``process`` labels.

How a child learns it must profile itself (the least invasive hook per start method):

- **fork** (``multiprocessing`` fork, ``os.fork``): ``os.register_at_fork(after_in_child=)``
  starts a fresh Sampler in the child (the native engine resets itself in fork children).
- **spawn / forkserver** (``multiprocessing``, ``ProcessPoolExecutor``): every Process
  object copies ``current_process()._config`` when it is created, and that dict is pickled
  to the child.  While profiling, the parent puts a small ``_ChildSpec`` in it whose
  ``__reduce__`` calls ``_boot_from_spec`` when the child unpickles its Process object —
  before the target runs.  This also works with a forkserver started *before* profiling
  (which an inherited environment could not reach).
- **Python subprocesses** (``subprocess``, ``os.system``, ...): the environment carries
  ``DDPROF_NB_CHILD`` (the options) and ``PYTHONPATH`` gets a temporary folder whose only
  file is a ``sitecustomize.py`` that starts the sampler and then runs any other
  ``sitecustomize`` the child would have imported.  It does nothing for multiprocessing's
  own helpers (spawn/forkserver/resource tracker; they are covered above).

A child writes ``<dir>/<pid>.started`` when it starts and ``<dir>/<pid>.pprof`` (atomically)
when it exits (multiprocessing finalizers, atexit, SIGTERM) or when the parent stops
(the parent creates ``<dir>/stop``; a daemon thread in the child polls for it every
0.2 s, so long-lived pool workers hand their profile back too).  At stop the parent
waits briefly for the children it heard of; a child that died without writing is named
in the profile's notes and everything else is kept.

Not covered: children started with ``-E``/``-I`` or with an ``env=`` that drops our
variables, non-Python children, and processes started before profiling began.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

from . import sources
from .model import selection
from . import sampler as _sampler
from .config import SamplerConfig
from .exporters.files import write_atomic

ENV_VAR = "DDPROF_NB_CHILD"
_CONFIG_KEY = "ddprof_nb_child"
_STOP_FILE = "stop"
_POLL_S = 0.2
_WATCH_THREAD = "ddprof_nb-child"

_SITECUSTOMIZE = '''\
# written by ddprof_nb.children: profile this Python child process, then run the
# sitecustomize it would otherwise have imported (if any)
def _ddprof_nb_boot():
    import os, sys
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = os.environ.get("DDPROF_NB_CHILD")
    helper = any(a.startswith("from multiprocessing.") for a in getattr(sys, "orig_argv", ()))
    if spec and not helper:
        try:
            import json
            root = json.loads(spec).get("root")
            try:
                import ddprof_nb.children as children
            except ImportError:
                sys.path.append(root)
                try:
                    import ddprof_nb.children as children
                finally:
                    sys.path.remove(root)
            children.boot_from_env(spec)
        except Exception as exc:  # never break the child
            sys.stderr.write("ddprof_nb: could not profile child process %d: %s\\n" % (os.getpid(), exc))
    # chain to the next sitecustomize on sys.path; the import system pops this
    # module's own entry when we return, so leave one in place either way
    me = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401
    except ImportError:
        if me is not None:
            sys.modules["sitecustomize"] = me


_ddprof_nb_boot()
del _ddprof_nb_boot
'''


# ----------------------------------------------------------------------------------
# the child side


class _ChildState:
    """This process's own child profile (at most one)."""

    def __init__(self, spec: dict, how: str):
        self.spec = spec
        self.how = how
        self.sampler = None
        self.lock = threading.Lock()
        self.written = False


_child: _ChildState | None = None


def _process_name() -> str:
    mp = sys.modules.get("multiprocessing")
    if mp is not None:
        try:
            proc = mp.current_process()
            if proc.name != "MainProcess":
                return proc.name
        except Exception:  # noqa: BLE001
            pass
    argv = getattr(sys, "argv", None) or []
    if argv and argv[0] not in ("", "-c"):
        return os.path.basename(argv[0])
    if argv and argv[0] == "-c":
        return "python -c"
    return "python"


def _start_child(spec: dict, how: str) -> None:
    """Start profiling this process for the parent described by ``spec``."""
    global _child
    if _child is not None and _child.sampler is not None and _child.spec.get("dir") == spec.get("dir"):
        return
    if _child is not None or _sampler._active is not None:
        # a fork child inherits the parent's running Sampler object: its engine is gone
        _sampler._active = None
        _sampler._active_lock = threading.Lock()
    state = _ChildState(spec, how)
    _child = state
    d = spec["dir"]
    if not os.path.isdir(d) or os.path.exists(os.path.join(d, _STOP_FILE)):
        return  # the parent already stopped
    config = SamplerConfig.from_spec(spec)
    s = _sampler.Sampler(config)
    s.start(trim="none")
    state.sampler = s
    try:
        with open(os.path.join(d, f"{os.getpid()}.started"), "w") as f:
            f.write(json.dumps({"pid": os.getpid(), "how": how}))
    except OSError:
        pass
    atexit.register(_finish_child)
    _register_mp_finalizer()
    try:
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):
        pass
    threading.Thread(target=_watch_stop, args=(state,), name=_WATCH_THREAD, daemon=True).start()


def _register_mp_finalizer() -> None:
    """multiprocessing children leave through os._exit: its finalizers are our exit hook.
    ``_bootstrap`` clears the finalizer registry first, so (re-)register after that."""
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is None:
        return
    mp_util.Finalize(None, _finish_child, exitpriority=100)
    mp_util.register_after_fork(_child_marker, lambda _obj: mp_util.Finalize(None, _finish_child, exitpriority=100))


class _Marker:
    pass


_child_marker = _Marker()  # kept alive: register_after_fork holds it weakly


def _on_sigterm(signum, frame):
    _finish_child()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _watch_stop(state: _ChildState) -> None:
    # our own thread: not sampled at all where the engine can leave it out (a wall sample
    # and, with park, a sleep record every tick cost drain time); _finish_child filters it otherwise
    if state.sampler is not None:
        state.sampler.exclude_thread(threading.get_native_id())
    stop = os.path.join(state.spec["dir"], _STOP_FILE)
    while not state.written:
        if os.path.exists(stop) or not os.path.isdir(state.spec["dir"]):
            _finish_child(state)
            return
        time.sleep(_POLL_S)


def _finish_child(state: _ChildState | None = None) -> None:
    """Stop this child's sampler and write its profile (once; errors are swallowed)."""
    state = state or _child
    if state is None or state.sampler is None:
        return
    with state.lock:
        if state.written or state.sampler is None:
            return
        state.written = True
        try:
            from .exporters import pprof  # (import cost: every `import ddprof_nb` imports this module)

            profile = state.sampler.stop()
            profile = selection.filter(profile, ignore=r"[/\\]ddprof_nb[/\\]children\.py$")
            keep = [t.tid for t in profile.threads if t.name != _WATCH_THREAD]
            profile = selection.filter(profile, threads=keep)
            extra = dict(profile.metadata.extra)
            extra["process"] = _process_name()
            profile = profile.with_metadata(extra=extra)
            d = state.spec["dir"]
            if os.path.isdir(d):  # (the parent reads only <pid>.pprof: the writer's temporary name is not one)
                write_atomic(os.path.join(d, f"{os.getpid()}.pprof"), pprof.dumps(profile))
        except Exception as exc:  # noqa: BLE001 - never break the child's exit
            try:
                sys.stderr.write(f"ddprof_nb: child {os.getpid()} could not write its profile: {exc}\n")
            except Exception:  # noqa: BLE001
                pass


def boot_from_env(text: str) -> None:
    """Called by our sitecustomize in a Python subprocess."""
    _start_child(json.loads(text), "subprocess")


class _ChildSpec:
    """Rides in ``current_process()._config``; unpickling it in a spawn/forkserver child
    starts that child's profile."""

    def __init__(self, spec: dict):
        self.spec = spec

    def __reduce__(self):
        return (_boot_from_spec, (self.spec,))


def _boot_from_spec(spec: dict) -> _ChildSpec:
    if os.getpid() != spec.get("parent"):
        try:
            _start_child(spec, "multiprocessing")
        except Exception as exc:  # noqa: BLE001 - never break the child
            sys.stderr.write(f"ddprof_nb: could not profile child process {os.getpid()}: {exc}\n")
    return _ChildSpec(spec)


# ----------------------------------------------------------------------------------
# the parent side

_collector: "ChildCollector | None" = None
_fork_hook_installed = False


def _after_fork_in_child() -> None:
    global _collector
    parent = _collector
    _collector = None  # the child collects nothing; its own children write to the same dir
    spec = parent.spec if parent is not None else (_child.spec if _child is not None and _child.sampler else None)
    if spec is None:
        return
    try:
        _start_child(spec, "fork")
    except Exception as exc:  # noqa: BLE001
        sys.stderr.write(f"ddprof_nb: could not profile forked child {os.getpid()}: {exc}\n")


class ChildCollector:
    """Parent side, a ``sources.Source``: arms the hooks at ``start()``, disarms them at
    ``stop()``, gathers the children's profiles at ``collect(profile)``.  One per Sampler;
    not re-entrant."""

    name = "children"
    provides = frozenset()
    remote = True

    def __init__(self, config, *, wait_s: float = 5.0):
        self.config = config
        self.wait_s = wait_s
        self.dir: str | None = None
        self.spec: dict = {}
        self._saved_env: dict[str, str | None] = {}
        self._mp_config = None

    def start(self) -> None:
        global _collector, _fork_hook_installed
        if _collector is not None:
            raise RuntimeError("child-process profiling is already active in this process")
        # the native engine's own at-fork reset is registered before ours
        _sampler._engine_classes()
        self.dir = tempfile.mkdtemp(prefix="ddprof_nb-children-")
        boot = os.path.join(self.dir, "boot")
        os.mkdir(boot)
        with open(os.path.join(boot, "sitecustomize.py"), "w") as f:
            f.write(_SITECUSTOMIZE)
        c = self.config
        self.spec = {
            "dir": self.dir,
            "parent": os.getpid(),
            "root": os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            **c.to_spec(),
        }
        for k in (ENV_VAR, "PYTHONPATH"):
            self._saved_env[k] = os.environ.get(k)
        os.environ[ENV_VAR] = json.dumps(self.spec)
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = boot + (os.pathsep + old if old else "")
        import multiprocessing

        self._mp_config = multiprocessing.current_process()._config
        self._mp_config[_CONFIG_KEY] = _ChildSpec(self.spec)
        if not _fork_hook_installed:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook_installed = True
        _collector = self

    def _disarm(self) -> None:
        global _collector
        if _collector is self:
            _collector = None
        if self._mp_config is not None:
            self._mp_config.pop(_CONFIG_KEY, None)
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}

    def stop(self) -> None:
        """No child started from now on profiles itself (the session is stopping)."""
        self._disarm()

    def release(self) -> None:
        pass

    def collect(self, profile):
        """``profile`` merged with every child's profile (labels ``pid``, ``process``);
        children that died without writing, or did not answer in time, are named in
        the notes."""
        from .exporters import pprof  # (import cost: every `import ddprof_nb` imports this module)

        self._disarm()
        d = self.dir
        if d is None:
            return profile
        try:
            open(os.path.join(d, _STOP_FILE), "w").close()
            deadline = time.monotonic() + self.wait_s
            while True:
                started = _pids(d, ".started")
                written = _pids(d, ".pprof")
                pending = [p for p in started if p not in written and _alive(p)]
                if not pending or time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
            notes = []
            parts, labels = [profile], [{"pid": str(os.getpid()), "process": "main"}]
            for pid in sorted(written):
                try:
                    with open(os.path.join(d, f"{pid}.pprof"), "rb") as f:
                        child = pprof.loads(f.read(), name=f"child {pid}")
                except Exception as exc:  # noqa: BLE001 - one bad child loses only itself
                    notes.append(f"child process pid {pid}: unreadable profile ({exc})")
                    continue
                name = child.metadata.extra.get("process", "") or str(pid)
                parts.append(child)
                labels.append({"pid": str(pid), "process": name})
            for pid in sorted(set(started) - written):
                if _alive(pid):
                    notes.append(f"child process pid {pid} was still running and did not hand back its "
                                 f"profile within {self.wait_s:g}s; its samples are missing")
                else:
                    notes.append(f"child process pid {pid} exited without writing its profile "
                                 f"(killed?); its samples are missing")
            merged = selection.merge(*parts, labels=labels)
            extra = dict(profile.metadata.extra)
            extra["children"] = str(len(parts) - 1)
            merged = merged.with_metadata(extra=extra, pid=profile.metadata.pid,
                                          notes=merged.metadata.notes + tuple(notes))
            return merged
        finally:
            shutil.rmtree(d, ignore_errors=True)
            self.dir = None

    def abort(self) -> None:
        self._disarm()
        if self.dir:
            try:
                open(os.path.join(self.dir, _STOP_FILE), "w").close()
            except OSError:
                pass
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


sources.register("children", lambda config, on: ChildCollector(config) if on else None)


def _pids(d: str, suffix: str) -> set[int]:
    out = set()
    for name in os.listdir(d):
        if name.endswith(suffix) and name[: -len(suffix)].isdigit():
            out.add(int(name[: -len(suffix)]))
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie — exited but not yet reaped — counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
