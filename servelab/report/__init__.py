"""The report: run records -> ``results/report.md`` (lessons, plots), ``report-tables.md`` (the long tables), every section in one place.

* ``render`` — the report itself: ``render_report(records, out_dir)``, ``summary_table(records)`` (what
  ``servelab load`` prints), ``markdown_table(records)``, the hardware header, the plots;
* ``lessons`` — the first screen: each change the notebooks teach, its measured ratio, contradictions flagged;
* ``plots`` — small multiples per stage family, one colour per stage;
* ``compare`` — the two clients side by side: perf_analyzer against servelab's load generator;
* ``precision`` — the model variants side by side;
* ``timelines`` — the Ray Serve section: replica placement, step load and node failure over time;
* ``server_view`` — the servers' own view from Prometheus beside the load generator's.

The command front is ``servelab.cli.report``."""


import jinja2

from servelab.core.paths import DATA_DIR

# The report's Markdown (servelab/data/*.md.j2): its prose and the order of its sections; the tables come from here.
TEMPLATES = jinja2.Environment(loader=jinja2.FileSystemLoader(DATA_DIR), trim_blocks=True, lstrip_blocks=True,
                               keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
