"""``servelab load``: one load generator for every stage (``loadgen.run_bench``), perf_analyzer beside it, and
one ``Record`` per run (records.py); the report of the records is ``servelab.report.render.render_report``."""
