"""The profile history: every profile the magics take, kept by name, oldest evicted first.

``ddprof_nb.history`` is the process-wide ``History``.  Profiles are named by the
execution count of the cell that took them (``"12"`` for ``In[12]``) unless the user
names them (``%%ddprof -o NAME``).  The history is bounded twice: by count
(``max_count``, default 20) and by estimated memory (``max_bytes``, default 512 MiB,
estimated from the profile's numpy columns and tables); when either bound is passed the
oldest profiles are evicted and a one-line message is printed.  The newest profile is
never evicted, even alone over the memory bound.

Access is dict-like::

    ddprof_nb.history["12"]        # or history[12]
    ddprof_nb.history.latest       # the newest profile (None when empty)
    ddprof_nb.history.list()       # names, oldest first

Importing the submodule (``import ddprof_nb.history``) makes the package attribute
``ddprof_nb.history`` this *module* rather than the ``History`` object; the module's class
is therefore swapped for one that forwards to the object, so both spellings behave the
same.
"""

from __future__ import annotations

import sys
import threading
import time
import types
from dataclasses import dataclass
from typing import Iterator

from .config import parse_size_bytes
from .model import Profile
from .render.format import format_bytes
from .render.text import history_table

__all__ = ["History", "Entry", "history", "estimate_bytes", "DEFAULT_MAX_COUNT", "DEFAULT_MAX_BYTES"]

DEFAULT_MAX_COUNT = 20
DEFAULT_MAX_BYTES = 512 * 1024 * 1024

# rough per-object costs of the Python tables (CPython 3.11, 64-bit): a Frame dataclass
# with slots plus its tuple slot, a stack tuple header, a Thread namedtuple, a LabelSet
_FRAME_BYTES = 120
_STACK_BYTES = 64
_THREAD_BYTES = 120
_LABELSET_BYTES = 200


def estimate_bytes(profile: Profile) -> int:
    """Estimated memory held by ``profile``: its numpy columns plus its tables.

    Strings are counted per frame (interned strings shared between frames are counted
    more than once, so the estimate errs high, which is the safe side for a bound).
    """
    n = sum(int(c.nbytes) for c in (profile.event, profile.stack, profile.thread, profile.labels,
                                     profile.time_ns, profile.values))
    n += sum(_FRAME_BYTES + len(f.name) + len(f.filename) for f in profile.frames)
    n += sum(_STACK_BYTES + 8 * len(s) for s in profile.stacks)
    n += _THREAD_BYTES * len(profile.threads)
    n += sum(_LABELSET_BYTES + sum(len(k) + len(v) for k, v in ls.items) for ls in profile.labelsets)
    return n


@dataclass(frozen=True)
class Entry:
    """One stored profile: its name, the profile, its estimated size and when it was added."""

    name: str
    profile: Profile
    nbytes: int
    added: float  # time.time()


class History:
    """Profiles by name, oldest first, bounded by count and estimated memory.

    Invariants: names are unique (adding an existing name replaces that profile and
    makes it the newest); ``len(self) <= max_count``; the total estimated size is at
    most ``max_bytes`` unless the newest profile alone is larger.  Thread-safe.
    """

    def __init__(self, max_count: int = DEFAULT_MAX_COUNT, max_bytes: int = DEFAULT_MAX_BYTES):
        self._entries: dict[str, Entry] = {}
        self._lock = threading.RLock()
        self._max_count = self._check_count(max_count)
        self._max_bytes = self._check_bytes(max_bytes)

    # -- bounds ---------------------------------------------------------------------
    @staticmethod
    def _check_count(value) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"invalid history max_count {value!r}: must be an int >= 1")
        return value

    @staticmethod
    def _check_bytes(value) -> int:
        if isinstance(value, str):
            return parse_size_bytes(value, "history max_bytes")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"invalid history max_bytes {value!r}: must be a positive int or a size like '512MiB'")
        return value

    @property
    def max_count(self) -> int:
        return self._max_count

    @max_count.setter
    def max_count(self, value: int) -> None:
        with self._lock:
            self._max_count = self._check_count(value)
            self._evict()

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value) -> None:
        with self._lock:
            self._max_bytes = self._check_bytes(value)
            self._evict()

    @property
    def nbytes(self) -> int:
        """Estimated memory of every stored profile."""
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    # -- adding and evicting -----------------------------------------------------------
    def add(self, profile: Profile, name=None) -> str:
        """Store ``profile`` as the newest entry under ``name`` (default: the next free
        number) and evict what the bounds require.  Returns the name used."""
        if not isinstance(profile, Profile):
            raise TypeError(f"history.add() expects a Profile, not {type(profile).__name__}")
        with self._lock:
            if name is None:
                name = self._free_name()
            name = self._key(name)
            self._entries.pop(name, None)
            self._entries[name] = Entry(name, profile, estimate_bytes(profile), time.time())
            self._evict()
            return name

    def _free_name(self) -> str:
        i = len(self._entries) + 1
        while str(i) in self._entries:
            i += 1
        return str(i)

    def _evict(self) -> None:
        evicted: list[tuple[str, str]] = []
        while len(self._entries) > self._max_count:
            evicted.append((self._pop_oldest(), f"more than {self._max_count} profiles"))
        total = sum(e.nbytes for e in self._entries.values())
        while total > self._max_bytes and len(self._entries) > 1:
            oldest = next(iter(self._entries.values()))
            total -= oldest.nbytes
            evicted.append((self._pop_oldest(), f"history over {format_bytes(self._max_bytes)}"))
        for name, why in evicted:
            print(f"ddprof: evicted profile {name!r} from the history ({why}; "
                  f"see ddprof_nb.history.max_count / max_bytes)")

    def _pop_oldest(self) -> str:
        name = next(iter(self._entries))
        del self._entries[name]
        return name

    # -- dict-like access --------------------------------------------------------------
    @staticmethod
    def _key(name) -> str:
        if isinstance(name, bool) or not isinstance(name, (str, int)):
            raise TypeError(f"profile names are strings (or execution counts), not {type(name).__name__}")
        key = str(name).strip()
        if key.startswith("In[") and key.endswith("]"):
            key = key[3:-1]
        if not key:
            raise ValueError("empty profile name")
        return key

    def __getitem__(self, name) -> Profile:
        key = self._key(name)
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            known = ", ".join(self.list()) or "none yet"
            raise KeyError(f"no profile named {key!r} in the history (known: {known})")
        return entry.profile

    def __setitem__(self, name, profile: Profile) -> None:
        self.add(profile, name)

    def __delitem__(self, name) -> None:
        key = self._key(name)
        with self._lock:
            if key not in self._entries:
                raise KeyError(f"no profile named {key!r} in the history")
            del self._entries[key]

    def __contains__(self, name) -> bool:
        try:
            key = self._key(name)
        except (TypeError, ValueError):
            return False
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.list())

    def get(self, name, default=None):
        try:
            return self[name]
        except (KeyError, TypeError, ValueError):
            return default

    def list(self) -> list[str]:
        """Names, oldest first."""
        with self._lock:
            return list(self._entries)

    keys = list

    def values(self) -> list[Profile]:
        with self._lock:
            return [e.profile for e in self._entries.values()]

    def items(self) -> list[tuple[str, Profile]]:
        with self._lock:
            return [(e.name, e.profile) for e in self._entries.values()]

    def entries(self) -> list[Entry]:
        """Entries (name, profile, estimated size, time added), oldest first."""
        with self._lock:
            return list(self._entries.values())

    @property
    def latest(self) -> Profile | None:
        """The newest profile, or None when the history is empty."""
        with self._lock:
            if not self._entries:
                return None
            return next(reversed(self._entries.values())).profile

    @property
    def latest_name(self) -> str | None:
        with self._lock:
            return next(reversed(self._entries), None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    # -- display -----------------------------------------------------------------------
    def table(self) -> str:
        """A text table of the stored profiles (what ``%ddprof list`` prints)."""
        return history_table(self.entries(), self._max_count, self._max_bytes)

    def __repr__(self) -> str:
        return (f"<ddprof_nb History: {len(self)} profiles ({', '.join(self.list()) or 'empty'}), "
                f"{format_bytes(self.nbytes)} of {format_bytes(self._max_bytes)}>")

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.table())


history = History()


class _HistoryModule(types.ModuleType):
    """This module, behaving like ``history`` (see the module docstring for why)."""

    def __getitem__(self, name):
        return history[name]

    def __setitem__(self, name, profile):
        history[name] = profile

    def __delitem__(self, name):
        del history[name]

    def __contains__(self, name):
        return name in history

    def __len__(self):
        return len(history)

    def __iter__(self):
        return iter(history)

    def __repr__(self):
        return repr(history)

    def _repr_pretty_(self, p, cycle):
        history._repr_pretty_(p, cycle)

    latest = property(lambda self: history.latest)
    latest_name = property(lambda self: history.latest_name)
    nbytes = property(lambda self: history.nbytes)
    max_count = property(lambda self: history.max_count, lambda self, v: setattr(history, "max_count", v))
    max_bytes = property(lambda self: history.max_bytes, lambda self, v: setattr(history, "max_bytes", v))

    def __getattr__(self, name):
        # methods of the History object (add, list, get, items, clear, ...)
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(history, name)


sys.modules[__name__].__class__ = _HistoryModule
