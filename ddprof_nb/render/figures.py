"""Plotly figures: the flame/icicle chart, the timeline, and the interactive HTML report.

Properties are plain dicts (the explorer sends them to its FigureWidgets unvalidated;
the unit tests validate them); ``flame_figure``/``timeline_figure`` wrap them in plotly
Figures.  plotly is imported only by the functions that make Figures or HTML.
"""

from __future__ import annotations

from ..model import top as _top
from ..model import Profile
from .colors import TEXT_COLOR, state_color
from .flame import FlameData, flame_data
from .format import esc, format_value
from .static_html import document, notes_html, top_table_html
from .text import status_line
from .timeline import TimelineData, timeline_data
from .tree import call_tree, pick_event

__all__ = [
    "flame_trace_props", "flame_layout", "flame_figure", "timeline_traces", "timeline_layout",
    "timeline_figure", "report", "MAX_LEVELS", "NO_TIME_AXIS",
]

MAX_LEVELS = 40  # levels drawn at once (~19 px each); deeper stacks show after a click-zoom
NO_TIME_AXIS = "no time axis: this profile has no sample timestamps (the time-range filter is off)"


def flame_trace_props(fd: FlameData) -> dict:
    """Properties of the plotly icicle trace for ``fd`` (used to build or update it)."""
    tiling = dict(orientation="v", flip="y" if fd.orientation == "flame" else None)  # None: plotly default
    return dict(
        ids=fd.ids,
        labels=fd.labels,
        parents=fd.parents,
        values=fd.values,
        branchvalues="total",
        customdata=fd.customdata,
        hovertemplate=fd.hovertemplate,
        marker=dict(colors=fd.colors, line=dict(color=fd.line_colors, width=fd.line_width)),
        insidetextfont=dict(color=TEXT_COLOR, size=11),
        # plotly writes the root's label in outsidetextfont (default: the layout's
        # mid-grey font, grey on the grey root)
        outsidetextfont=dict(color=TEXT_COLOR, size=11),
        textinfo="label",
        tiling=tiling,
        pathbar=dict(visible=True),
        sort=True,
        # deeper trees show MAX_LEVELS levels at a time; a click zooms further down
        maxdepth=MAX_LEVELS if fd.levels > MAX_LEVELS else -1,
    )


def flame_layout(fd: FlameData) -> dict:
    """Layout for the flame figure: height follows the depth; transparent background
    and a mid-grey font so it reads in light and dark themes."""
    height = int(min(900, max(300, 60 + 19 * min(fd.levels, MAX_LEVELS))))
    return dict(
        height=height,
        margin=dict(l=4, r=4, t=44, b=4),
        title=dict(text=fd.title, font=dict(size=13), x=0.01, y=0.98, yanchor="top"),
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
        font=dict(color="#8a8a8a"),
        uirevision="flame",
    )


def flame_figure(fd: FlameData):
    """A plotly ``Figure`` holding one icicle trace for ``fd``."""
    import plotly.graph_objects as go

    return go.Figure(data=[go.Icicle(**flame_trace_props(fd))], layout=flame_layout(fd))


def timeline_traces(td: TimelineData) -> list[dict]:
    """One horizontal bar trace per state (the legend names the states)."""
    traces = []
    for s, name in enumerate(td.states):
        sel = td.state == s
        if not sel.any():
            continue
        vals = td.value[sel]
        spans = [f"{b:,.0f}–{b + n:,.0f} ms" for b, n in zip(td.base[sel].tolist(), td.length[sel].tolist())]
        traces.append(
            dict(
                type="bar",
                orientation="h",
                name=name,
                y=[td.lanes[i] for i in td.lane[sel].tolist()],
                x=td.length[sel].tolist(),
                base=td.base[sel].tolist(),
                marker=dict(color=state_color(name), line=dict(width=0),
                            opacity=(0.3 + 0.7 * td.density[sel]).round(2).tolist()),
                customdata=[[format_value(v, td.unit), sp] for v, sp in zip(vals.tolist(), spans)],
                hovertemplate=f"{name}<br>%{{customdata[1]}}<br>%{{customdata[0]}}<extra>%{{y}}</extra>",
                width=0.8,
            )
        )
    return traces


def timeline_layout(td: TimelineData) -> dict:
    """The timeline's layout.  Without timestamps the title says so and the axis cannot be
    dragged (no range to select); every key is set either way, so an update never leaves
    one from the other state behind."""
    what = f"Timeline ({esc(td.event.display_name)})"
    if not td.has_time:
        text = f"{what}: {NO_TIME_AXIS}"
    elif not td.lanes:
        text = f"{what}: no samples in this view"
    else:
        text = f"{what}: drag to select a time range, double-click to reset"
    return dict(
        height=int(min(446, 136 + 26 * max(1, len(td.lanes)))),
        barmode="overlay",
        # the legend sits right above the plot, under plotly's toolbar (which takes the
        # top right corner of the figure on hover and covered it)
        margin=dict(l=4, r=4, t=60, b=30),
        title=dict(text=text, font=dict(size=12), x=0.01),
        # autorange stays False so a double-click (autorange -> True) is a change Python hears
        xaxis=dict(title=dict(text="ms since start"), range=list(td.extent_ms), autorange=False,
                   fixedrange=not td.has_time, gridcolor="rgba(128,128,128,0.25)",
                   zeroline=False),
        yaxis=dict(fixedrange=True, automargin=True, autorange="reversed", categoryorder="array",
                   categoryarray=td.lanes, gridcolor="rgba(0,0,0,0)"),
        dragmode="zoom" if td.has_time else False,
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
        font=dict(color="#8a8a8a"),
        legend=dict(orientation="h", y=1.0, x=1.0, xanchor="right", yanchor="bottom"),
        showlegend=True,
    )


def timeline_figure(profile: Profile, event=None, value_index: int = 0, state_key: str = "state"):
    """A plotly Figure: samples over time, a lane per thread, coloured by state."""
    import plotly.graph_objects as go

    td = timeline_data(profile, event, value_index, state_key)
    return go.Figure(data=[go.Bar(**t) for t in timeline_traces(td)], layout=timeline_layout(td))




_REPORT_CSS = """<style>
table.ddprof-top td, table.ddprof-top th { border-bottom: 1px solid rgba(128,128,128,.3); }
table.ddprof-top td.n { font-variant-numeric: tabular-nums; }
table.ddprof-top td.loc { opacity: .7; }
</style>"""


def report(view: Profile, event=None, value_index: int = 1, *, fd: FlameData | None = None,
           status: str = "", top: int = 50) -> str:
    """A self-contained interactive HTML report (plotly.js inlined: opens offline) of one
    event: flame chart, timeline and top table.  ``fd`` is the flame chart to show (the
    explorer passes its current one); ``status`` a line under the title."""
    import plotly.graph_objects as go
    import plotly.io as pio

    e = pick_event(view, event)
    if fd is None:
        fd = flame_data(call_tree(view, e, value_index))
    config = {"displaylogo": False, "responsive": True}
    flame = pio.to_html(flame_figure(fd), include_plotlyjs=True, full_html=False, config=config)
    td = timeline_data(view, e, 0)
    timeline = pio.to_html(go.Figure(data=[go.Bar(**t) for t in timeline_traces(td)], layout=timeline_layout(td)),
                           include_plotlyjs=False, full_html=False, config=config)
    rows = _top.top(view, e, n=top, sort=_top.SELF[value_index])
    meta = view.metadata
    title = f"ddprof_nb report — {e.display_name}"
    body = (
        f"<h2>{esc(title)}</h2><p>{esc(status or status_line(view))}</p>"
        + notes_html(view, [f"python {meta.python_version} · pid {meta.pid} · host {meta.host}"])
        + f"{flame}\n{timeline}\n<h3>Top functions</h3>"
        + top_table_html(rows, e, value_index, view.total(e, value_index))
    )
    return document(title, body, head=_REPORT_CSS)
