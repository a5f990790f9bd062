"""Exceptions raised by ddprof_nb (one module, so every layer raises the same types)."""


class ProfilerError(RuntimeError):
    """A profiler could not start, stop or read its samples; the message says why."""


class ProfilerBusyError(ProfilerError):
    """A profile is already being taken in this process."""


class NotRunningError(ProfilerError):
    """stop() (or a read) was asked of a profiler that is not running."""


class EngineUnavailableError(ProfilerError):
    """The requested engine cannot run here (platform, Python version, build)."""
