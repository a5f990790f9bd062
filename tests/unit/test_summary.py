"""What a reader meets first: one summary line (engine, duration, each event's total and
samples, a count of warnings) and the notes behind it, warnings first, in text and HTML."""

from __future__ import annotations

from ddprof_nb import render as F
from ddprof_nb.events import EventType
from ddprof_nb.magics.display import fallback_bundle
from ddprof_nb.model import Frame, Metadata, ProfileBuilder
from ddprof_nb.render.static_html import report
from ddprof_nb.render.text import sample_counts

MS = 1_000_000
MAIN = Frame("main", "/home/user/app.py", 3, 1)
RATE = "cpu: 48 samples (96/s across all threads; target 100/s per busy thread)"
AGG = "native aggregation: 1382 records merged into 1382 before the drain (fixed size 65.0 MiB)"
HOOK = "alloc: degraded: another tool unlinked our PyMem allocator hook during the session"
LOST = "alloc: 12 sample(s) lost (sample buffer full)"


def profile(notes=(), extra=None, dropped=None):
    """cpu 48 samples / 480 ms, wall 889 samples / 8.89 s, alloc 6,030,333 objects / 512 MiB."""
    b = ProfileBuilder(Metadata(start_ns=0, end_ns=2_000 * MS, engine="native", notes=tuple(notes),
                                extra=extra or {}, dropped=dropped or {}))
    s, t = b.stack_of([MAIN]), b.thread_id(1, "MainThread")
    b.add(EventType.CPU, s, t, 0, 0, 48, 480 * MS)
    b.add(EventType.WALL, s, t, 0, 0, 889, 8_890 * MS)
    b.add(EventType.ALLOC, s, t, 0, 0, 6_030_333, 512 << 20)
    return b.build()


def test_the_summary_is_one_line_of_totals_and_samples_with_no_note_in_it():
    p = profile(notes=[RATE, AGG, HOOK, LOST], extra={"samples_alloc": "437"})
    line = F.status_line(p, "3")
    assert "\n" not in line and len(line) < 200
    assert line == ("ddprof [3]: native engine · 2.00 s · cpu 480 ms / 48 samples · wall 8.89 s / 889 samples"
                    " · alloc 512 MiB / 437 samples · 2 warnings")
    for note in (RATE, AGG, HOOK, LOST):
        assert note not in line


def test_objects_are_never_counted_as_samples():
    # without the engine's sample count, alloc's count is named for what it counts
    p = profile()
    line = F.status_line(p)
    assert "alloc 512 MiB / 6,030,333 objects" in line
    assert "6,030,333 samples" not in line and "6,031,270" not in line  # no sum of samples and objects
    assert "(total 512 MiB, 6,030,333 objects)" in F.top_table(p, EventType.ALLOC)
    assert sample_counts(p) == {EventType.CPU: 48, EventType.WALL: 889}


def test_warnings_are_counted_and_come_first():
    torn = "3 sample(s) dropped as torn/inconsistent reads (their time carried to the next sample)"
    p = profile(notes=[RATE, LOST, AGG, HOOK, torn], dropped={EventType.WALL: 3})
    warnings, others = F.sorted_notes(p)
    assert warnings == [LOST, HOOK, torn] and others == [RATE, AGG]  # the engine said "dropped" already
    text = F.notes_text(p).splitlines()
    assert text == [f"warning: {LOST}", f"warning: {HOOK}", f"warning: {torn}", f"note: {RATE}", f"note: {AGG}"]
    assert F.status_line(p).endswith(" · 3 warnings")
    # dropped samples no note mentions are a warning of their own
    quiet = profile(notes=[RATE], dropped={EventType.WALL: 3})
    assert F.sorted_notes(quiet)[0][0].startswith("samples dropped while recording (wall 3)")
    assert F.status_line(quiet).endswith(" · 1 warning")
    assert F.status_line(profile(notes=[RATE])).endswith(" · no warnings")


def test_what_makes_a_warning():
    for note in ("degraded: 3 thread(s) beyond the 4096-thread table were not sampled",
                 "fell back to the python engine: no native module",
                 "alloc: another allocator was installed over ours while profiling",
                 "stopped early: process 12 exited", "ignored pprof sample types: foo"):
        assert F.is_warning(note), note
    for note in (RATE, AGG, "alloc type leaf: known for 99.5% of samples",
                 "lock/park: 3 wait(s) thinned out by the records-per-second limit"):
        assert not F.is_warning(note), note


def test_the_html_report_has_the_line_and_the_notes_behind_a_disclosure():
    p = profile(notes=[RATE, AGG, HOOK], extra={"samples_alloc": "437"})
    for html in (report(p, full_document=True), report(p, full_document=False), fallback_bundle(p)["text/html"]):
        status = html.split("class='ddp-status'")[1].split("</div>")[0]
        assert "2.00 s · cpu 480 ms / 48 samples" in status and "1 warning" in status
        assert RATE not in status and "degraded" not in status
        notes = html.split("<details class='ddp-notes'")[1].split("</details>")[0]
        assert ">1 warning, " in notes
        assert notes.index("warning: alloc: degraded") < notes.index("cpu: 48 samples") < notes.index("native aggreg")
        assert html.index("ddp-notes") < html.index("ddp-flame")  # the chart follows the closed disclosure


def test_the_text_summary_ends_with_the_warnings():
    text = fallback_bundle(profile(notes=[RATE, HOOK]), html=False)["text/plain"]
    first, *_, last = text.split("\n\n")
    assert "\n" not in first and RATE not in text
    assert last == f"warning: {HOOK}"


def test_merged_profiles_add_up_their_sample_counts():
    from ddprof_nb.model import selection

    a, b = profile(extra={"samples_alloc": "437"}), profile(extra={"samples_alloc": "63"})
    assert F.event_samples(selection.merge(a, b), EventType.ALLOC) == 500
    # a part that does not say its count: unknown, not short
    merged = selection.merge(a, profile())
    assert F.event_samples(merged, EventType.ALLOC) is None
    assert "alloc 1.00 GiB / 12,060,666 objects" in F.status_line(merged)


def test_notes_from_a_file_are_escaped():
    evil = "degraded: <script>alert(1)</script>"
    p = profile(notes=[evil, "<img src=x onerror=alert(2)>"])
    for html in (report(p), F.notes_html(p, ["<b>extra</b>"])):
        assert "<script>" not in html and "<img" not in html and "<b>extra" not in html
        assert "&lt;script&gt;" in html


def test_the_terminal_view_lists_the_warnings_the_line_counted(capsys):
    from ddprof_nb.magics.display import show_as

    show_as("text", profile(notes=[RATE, HOOK]))
    out = capsys.readouterr().out
    assert out.rstrip().endswith(f"warning: {HOOK}") and RATE not in out
