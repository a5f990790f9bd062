"""Rendering: Profile -> what a person reads.  One call-tree core, one module per output.

- ``format``   the one number formatter (three significant digits) and the one ``esc``
- ``colors``   the one colour scheme (module -> hue; pseudo-frames by kind)
- ``tree``     the call-tree core: build, diff (numpy, cached per stacks table)
- ``flame``    a call tree pruned to ``FlameData``: what every flame chart draws
- ``timeline`` samples over time per thread (or "no time axis")
- ``source``   per-line values of one function
- ``notes``    a profile's notes, warnings first
- ``pseudo``   what each pseudo-frame ([idle], [GC]...) means
- ``text``     text tables: top table, summary line, notes, history, diff
- ``static_html`` static HTML: SVG flame, top table, source view, the static report
- ``figures``  plotly figures and the interactive HTML report

Pure: these modules read Profiles and return data and strings; they never read files,
write files or touch IPython.  They import the layers below (``events``, ``model``) and
each other, nothing above.  The names below are the public API.
"""

from .colors import (HIT_LINE, LINE, OTHER_COLOR, ROOT_COLOR, TEXT_COLOR, color_for, diff_color, faded,
                     frame_color, is_library, module_of, state_color)
from .figures import (MAX_LEVELS, NO_TIME_AXIS, flame_figure, flame_layout, flame_trace_props, timeline_figure,
                      timeline_layout, timeline_traces)
from .format import (esc, format_bytes, format_change, format_duration, format_signed, format_value, value_label,
                     value_unit)
from .static_html import notes_html, source_html, static_flame_html, top_table_html
from .source import SourceLine, SourceView, source_view
from .pseudo import KIND_MEANINGS, PSEUDO_FRAMES, explain, explain_kind
from .notes import is_warning, sorted_notes, warning_count
from .text import (count_text, diff_table, event_samples, event_summary, history_table, notes_text, status_line,
                   summary_parts, text_summary, top_table)
from .timeline import TimelineData, has_time_axis, timeline_data
from .flame import (DEFAULT_MAX_NODES, DEFAULT_MIN_PCT, OTHER, FlameData, color_legend, flame_data, heaviest_match,
                    legend_html, search_regex)
from .tree import CallTree, call_tree, diff_tree, pick_event, shared_csr

__all__ = [
    "HIT_LINE", "LINE", "OTHER_COLOR", "ROOT_COLOR", "TEXT_COLOR", "color_for", "diff_color", "faded",
    "frame_color", "is_library", "module_of", "state_color",
    "MAX_LEVELS", "NO_TIME_AXIS", "flame_figure", "flame_layout", "flame_trace_props", "timeline_figure",
    "timeline_layout", "timeline_traces",
    "esc", "format_bytes", "format_change", "format_duration", "format_signed", "format_value", "value_label",
    "value_unit",
    "notes_html", "source_html", "static_flame_html", "top_table_html",
    "SourceLine", "SourceView", "source_view",
    "KIND_MEANINGS", "PSEUDO_FRAMES", "explain", "explain_kind",
    "is_warning", "sorted_notes", "warning_count",
    "count_text", "diff_table", "event_samples", "event_summary", "history_table", "notes_text", "status_line",
    "summary_parts", "text_summary", "top_table",
    "TimelineData", "has_time_axis", "timeline_data",
    "DEFAULT_MAX_NODES", "DEFAULT_MIN_PCT", "OTHER", "CallTree", "FlameData", "call_tree", "diff_tree",
    "color_legend", "flame_data", "heaviest_match", "legend_html", "pick_event", "search_regex", "shared_csr",
]
