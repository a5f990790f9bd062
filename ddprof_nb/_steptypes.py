"""The C types of the asyncio task stepper (``native/aiostep.c``), when the native module loads.

``SLOT_BASE`` is the base of ``labeling._Slot``, ``STEP_BASE`` that of
``aio.stepper._TaskCoro`` and ``STEP_STATE`` the state its steps read; all are None without the native module (another platform,
a build for another interpreter), and the pure-Python stepper then runs.  Imported by
``labeling`` before anything else of ddprof_nb, so it imports ``_native`` itself rather
than through ``engines/native/decode.py`` (which imports ``labeling``).
"""

from __future__ import annotations

SLOT_BASE = None
STEP_BASE = None
STEP_STATE = None
try:
    from . import _native
except (ImportError, OSError):
    _native = None
if _native is not None and hasattr(_native.lib, "ddp_aio_types") and _native.lib.ddp_aio_types() == 0:
    SLOT_BASE = _native.SlotBase
    STEP_BASE = _native.StepBase
    STEP_STATE = _native.StepState
