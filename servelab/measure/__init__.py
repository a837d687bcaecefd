"""``servelab load``: one load generator for every stage, perf_analyzer-grade metrics.

Public API (details in each module's docstring):

* ``Load.sequential(requests)``, ``Load.closed(concurrency, requests)``,
  ``Load.open(rate, arrivals="constant"|"poisson", requests=None, duration_s=None)`` (records.py)
* ``FastAPITarget(url, image, batch=1)``, ``TritonTarget(url, model, image, protocol, input, batch)``
  (targets.py)
* ``run_bench(target, load, Labels(stage, config=None, stand_in=None, server_pid=None),
  ClientOptions(timeout_s=30, monitor_interval_s=0.5, out=None, ...)) -> Record``; ``await run_bench_async(...)``
  (loadgen.py)
* ``Record`` (one JSON line: ``record.to_json()``), ``append_record(path, record)``,
  ``read_records(paths)`` (records.py)
* ``perf_analyzer.write_input_data(...)``, ``perf_analyzer.run_perf_analyzer(...)``,
  ``perf_analyzer.records_from_csv(...)``; ``Windows`` (windows of seconds, both clients) (perf_analyzer.py)
* ``measure_stage.sweep_capacity(target, loads, labels, Sweep(...))``: a stage's capacity by saturation, doubling
  the senders to the knee, its curve in the last record; ``measure_stage.windowed(windows)``: servelab's client
  over windows of seconds (measure_stage.py); ``fractions.capacity(records, stage)``, ``fractions.curve(...)``
* ``servelab.report.render_report(records, out_dir)`` renders results/report.md and its plots."""
