"""The report: run records -> ``results/report.md`` (lessons, plots) and ``report-tables.md`` (the long tables)."""

import jinja2

from servelab.core.paths import DATA_DIR

# The report's Markdown (servelab/data/*.md.j2): its prose and the order of its sections; the tables come from here.
TEMPLATES = jinja2.Environment(loader=jinja2.FileSystemLoader(DATA_DIR), trim_blocks=True, lstrip_blocks=True,
                               keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
