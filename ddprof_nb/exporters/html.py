"""HTML report: ``write(profile, dest, **options)``.

With no options, the interactive report (plotly charts, plotly.js inlined: opens
offline).  With ``static=True`` or any option, the static report: flame graphs in plain
SVG (no script, no network: it survives sanitisers such as GitHub's notebook view) and
top tables.  Both are built by ``ddprof_nb.render``; this module only writes them, through
the package's atomic 0600 writer.
"""

from __future__ import annotations

from ..model import Profile
from ..render import figures, static_html
from .files import write_atomic

__all__ = ["write"]


def write(profile: Profile, dest, *, static: bool = False, **options) -> None:
    """Write an HTML report of ``profile`` to ``dest`` (a path or a binary file object).

    Options of the static report (``render.static_html.report``): ``event``, ``events``,
    ``title``, ``top``, ``max_nodes``, ``min_fraction``, ``value_index``.
    """
    if static or options:
        text = static_html.report(profile, full_document=True, **options)
    else:
        text = figures.report(profile)
    write_atomic(dest, text)
