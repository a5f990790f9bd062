"""The explorer: ``widget`` (the ipywidgets ``Explorer``, a shell over a ``view_state.ViewState``
that ``view.Views`` turns into a view; its parts ``controls``, ``drawing`` and ``static_view``)
and ``sources`` (source text).  ``Explorer`` is imported lazily: ipywidgets and plotly
load only when one is made."""

__all__ = ["Explorer"]


def __getattr__(name):
    if name == "Explorer":
        from .widget import Explorer

        return Explorer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
