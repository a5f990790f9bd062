"""Readers of profile formats ddprof_nb reads but does not write (``gecko``: the Firefox
Profiler's JSON).  The formats ddprof_nb also writes are read by their module in
``exporters``; ``loading.load`` picks the reader from a file's content.
"""
