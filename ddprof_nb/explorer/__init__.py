"""The explorer: ``figures`` (Profile -> plotly figure data, pure) and ``widget``
(the ipywidgets ``Explorer``).  ``Explorer`` is imported lazily: ipywidgets and plotly
load only when one is made."""

__all__ = ["Explorer"]


def __getattr__(name):
    if name == "Explorer":
        from .widget import Explorer

        return Explorer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
