"""``servelab load``: one load generator for every stage, perf_analyzer-grade metrics.

Public API (details in each module's docstring): ``Load.sequential``/``closed``/``open`` and the ``Record``, one
JSON line (``append_record``, ``read_records``) in records.py; ``FastAPITarget``, ``TritonTarget`` (targets.py);
``run_bench(target, load, Labels(...), ClientOptions(...)) -> Record`` (loadgen.py); perf_analyzer's input data,
runs and CSV (perf_analyzer.py); ``measure_stage.sweep_capacity`` (a stage's capacity by saturation) and
``measure_stage.windowed`` (windows of seconds, as perf_analyzer measures); ``fractions.capacity``. The report
of the records is ``servelab.report.render.render_report``."""
