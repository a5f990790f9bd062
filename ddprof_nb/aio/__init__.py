"""Asyncio-aware profiling, one job per module (public names: ``ddprof_nb.asyncio_support``).

- ``stepper``: labels follow the running task (the task steppers, the create_task patch);
- ``tasks``: samples of suspended tasks (``TaskSampler``, a ``sources.Source``), with
  ``loops`` (what it keeps per loop and per task) and ``chains`` (what a task awaits);
- ``fold``: folding the event loop's frames (``fold_loop_frames``); imports no asyncio.

Nothing is imported here, so ``ddprof_nb.aio.fold`` loads without asyncio.
"""
