"""The native engine (Linux, CPython 3.11-3.15 GIL builds), one job a module:

* ``binding``  loads ``ddprof_nb._native`` (the cffi module built from ``native/``), checks it
  against this interpreter and the event table, and turns ``DDP_E*`` codes into exceptions;
* ``codes``    captured code pointers -> names, files and lines (the process's code caches);
* ``decode``   raw records -> ProfileBuilder rows, one decode pass per batch;
* ``session``  one sampling session: start, wait, drain, stop, counters;
* ``alloc``    allocation samples: type leaves and LIVE rows;
* ``lockpark`` lock/park records: the final event and leaf from the stack;
* ``engine``   ``NativeEngine``: wires a session to a drain thread and a Profile.

Importing this package never fails because of the native module:
``binding.unavailable_reason()`` says why it cannot be used.
"""

from .engine import NativeEngine

__all__ = ["NativeEngine"]
