"""Every figure in the prose comes from somewhere: a number with a unit of measurement (a latency, a rate,
a duration, a ratio, a percentage, a size; in a table, a number in a column whose header names the unit)
written in a notebook or doc, outside code and outside the parts generated from the project
(``<!-- generated: ... -->``, on lines of their own or inline in a sentence; docs/testing.md's durations), is held by

(a) a generated part of the same file (the prose repeats a figure the project wrote there), or
(b) a record committed in the repository (``docs/records/...``, ``servelab/data/original_lab.toml``) that
    the same paragraph cites by its path, the figure (number and unit) appearing in that record, or
(c) ``SETTINGS``: the short, reviewed list of figures that are not measurements but what the lab sets
    (a timeout, a queue delay, a lease, a limit), each with its file and what it is.

A measured figure never goes on that list: generate it from its record, cite the record, or leave it out.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from servelab.core.paths import REPO_ROOT
from servelab.tools.notebook_blocks import BLOCK

# A number (not part of a name such as pt-2x2, v1.2 or a hash) and its unit. Ranges (3–5 s) give their last
# number; a number written in words is no figure.
NUMBER = r"(?<![\w.\-:#])(?P<value>\d+(?:,\d{3})*(?:\.\d+)?)"
UNIT = (r"(?P<unit>ms|µs|us|ns|s|sec|seconds?|min|minutes?|h|hours?|days?"
        r"|req/s|requests/s|requests per second|infer/s|inferences/s|inferences per second|img/s|images/s|photos/s"
        r"|%|per ?cent|[KMGT]i?B|[KMGT]b/s"
        r"|×|x|times (?:faster|slower|more|less|higher|lower|as (?:fast|slow|many|much))|-?fold)")
FIGURE = re.compile(NUMBER + r"\s?" + UNIT + r"(?![\w²])")
NOT_A_RATIO = re.compile(r"\s?(?:(?:NVIDIA |Tesla )?P100|\d)")  # after ×: a count of GPUs (2× P100), a dimension (3 × 224)
CANONICAL = {"us": "µs", "sec": "s", "second": "s", "seconds": "s", "minute": "min", "minutes": "min", "hour": "h",
             "hours": "h", "day": "days", "requests/s": "req/s", "requests per second": "req/s",
             "inferences/s": "infer/s", "inferences per second": "infer/s", "images/s": "img/s", "photos/s": "img/s", "x": "×",
             "percent": "%", "per cent": "%", "fold": "×", "-fold": "×"}

# Records: committed files that hold measured figures with what produced them (machine, date, versions,
# command). A paragraph that cites one by its path may quote its numbers. `servelab gpu-check`'s record of a
# GPU, docs/gpu/<gpu-name>.md, is one too.
RECORD = re.compile(r"(?:docs/records/[\w./-]+|servelab/data/original_lab\.toml|docs/gpu/(?!README\.md)[\w.-]+\.md)")

# (c) The reviewed list: figures that are settings, parameters or limits of the lab or of the machines it
# runs on, not measurements. Key: (file, figure as the test reads it); value: what it is.
SETTINGS: dict[tuple[str, str], str] = {
    # what the lab sets: batching, timeouts, intervals, loads
    ("docs/local-lab.md", "5 ms"): "BATCH_TIMEOUT_MS / RAY_BATCH_WAIT_MS, the batching window's default",
    ("fastapi_onnx/README.md", "5 ms"): "BATCH_TIMEOUT_MS, the batching window's default",
    ("notebooks/7_triton_onnx.md", "100 µs"): "onnx-dyn's max_queue_delay_microseconds: 100 in its config",
    ("notebooks/6_triton_python.md", "5 s"): "perf_analyzer's --measurement-interval 5000 shown in the cell",
    ("docs/instructors.md", "5 s"): "PA_WINDOW_S = 5: the windows of the step's perf_analyzer runs, in 6's answer",
    ("notebooks/7_triton_onnx.md", "5 s"): "perf_analyzer's --measurement-interval 5000, the helper's PA_WINDOW_S",
    ("notebooks/6_triton_python.md", "120 req/s"): "--request-rate-range 120, an example option of perf_analyzer",
    ("notebooks/6_triton_python.md", "100 %"): "full utilisation, a bound (the GPU busy all the time)",
    ("notebooks/7_triton_onnx.md", "40 req/s"): "RATES[0], an open-loop rate the notebook sets",
    ("notebooks/README.md", "120 req/s"): "7_triton_onnx's RATES = [40, 120]",
    ("docs/instructors.md", "120 req/s"): "7_triton_onnx's RATES, the rate the notebook's question names",
    ("docs/instructors.md", "10 %"): "--stability-percentage 10 in the perf_analyzer lines students type (Windows.stability_pct)",
    ("docker/README.md", "2 GB"): "shm_size: 2gb in docker-compose-triton.yaml",
    ("docker/README.md", "3 s"): "HEALTH_INTERVAL = '3s' in servelab/tools/containers/compose_stages.py",
    ("docs/monitoring.md", "0.5 s"): "PROMETHEUS_SCRAPE_INTERVAL_S and RAY_metrics_report_interval_ms",
    ("docs/ray.md", "0.5 s"): "how often the step load samples the running replicas",
    ("docs/ray.md", "100 MB"): "OBJECT_STORE_BYTES in servelab/servers/rayserve/cluster.py",
    ("docs/ray.md", "2 s"): "look_back_period_s in servelab/servers/rayserve/options.py",
    ("docs/ray.md", "30 s"): "Ray Serve's default upscale delay",
    ("docs/ray.md", "600 s"): "Ray Serve's default downscale delay",
    ("docs/configuration.md", "30 s"): "Ray Serve's default upscale delay",
    ("docs/configuration.md", "600 s"): "Ray Serve's default downscale delay",
    ("docs/production.md", "1.5 ×"): "the overload case's offered rate over capacity (loadgen.OVERLOAD_MULTIPLE), a setting",
    ("docs/production.md", "3 ×"): "the rollout's aim for p99 during the swap (lessons.ROLLOUT_P99_AIM)",
    ("docs/configuration.md", "7 MiB"): "MAX_UPLOAD_BYTES's own default (7 × 1024 × 1024 bytes), in its description",
    ("docs/ray.md", "15 %"): "the step load's low phase (servelab/run/lab_ray.py: 0.15 of capacity)",
    ("docs/ray.md", "90 %"): "the step load's high phase (servelab/run/lab_ray.py: 0.9 of capacity)",
    ("docs/ray.md", "25 s"): "Plan.steps_s = (10, 20, 25), the step load's phases",
    ("docs/ray.md", "20 s"): "Plan.failure_s, the node-failure run's length",
    ("docs/ray.md", "5 s"): "FAILURE_TIMEOUT_S in servelab/run/lab_ray.py, the node-failure run's per-request timeout",
    ("docs/benchmarks.md", "20 %"): "Plan.full's windows: stability_pct 20, the windows' agreement",
    ("docs/perf-analyzer.md", "20 %"): "Plan.full's windows: stability_pct 20, the windows' agreement",
    ("docs/benchmarks.md", "5 %"): "Sweep.growth = 0.05 in servelab/measure/measure_stage.py: the knee",
    ("docs/benchmarks.md", "8 ×"): "CAP_PER_CORE = 8 in servelab/measure/measure_stage.py: the sweep's cap per core",
    ("docs/security.md", "10 MiB"): "MAX_BODY_BYTES's default (10 × 1024 × 1024 bytes)",
    ("docs/security.md", "7 MiB"): "MAX_UPLOAD_BYTES's default (7 × 1024 × 1024 bytes)",
    # tolerances and aims the tests and checks apply
    ("docs/security.md", "30 s"): "TIMEOUT_S in tests/integration/test_fuzz.py: a longer answer is a hung worker",
    ("docs/security.md", "10 %"): "MAX_GROWTH in tests/integration/test_fuzz.py: the RSS growth the fuzz set allows",
    ("docs/containers.md", "10 %"): "the tolerance of the queueing-theory tests",
    ("docs/monitoring.md", "5 %"): "RATE_TOLERANCE in servelab/measure/monitoring/run_series.py: client and server rates must agree within it",
    ("docs/testing.md", "2 min"): "the time make check must stay under, an aim (Makefile)",
    ("docs/gpu/README.md", "2 ×"): "gpu_check's aim: dynamic batching at least twice no batching",
    ("docs/gpu/README.md", "40 %"): "gpu_check's aim for the best image-in stage, of the fp32 ceiling",
    ("docs/gpu/README.md", "60 %"): "gpu_check's aim for the best tensor-in stage, of the fp32 ceiling",
    ("docs/gpu/README.md", "3 ×"): "gpu_check's aim for the first request after ready, of the steady median",
    ("docs/gpu/README.md", "285 s"): "DEFAULT_BUDGET_S in servelab/tools/gpu_check.py",
    ("docs/gpu/README.md", "45 s"): "CEILING_S in servelab/tools/gpu_check.py, kept back for the ceiling",
    ("docs/gpu/README.md", "6 min"): "make gpu-check's aim on one H100, install included (not measured, it says so)",
    # the machines' limits: the lease, the lent GPU machine
    ("notebooks/0_intro.md", "3 h"): "the lease's length (1_create_lease: 2 hours 55 minutes)",
    ("notebooks/1_create_lease.md", "2 h"): "the lease's length, 2 hours 55 minutes",
    ("notebooks/1_create_lease.md", "55 min"): "the lease's length, 2 hours 55 minutes",
    ("docs/gpu/README.md", "64 MiB"): "what one call to the lent GPU machine may carry",
    ("docs/gpu/README.md", "50 MiB"): "CARRY_SIZE ?= 50M in the Makefile",
    ("docs/local-lab.md", "50 MiB"): "CARRY_SIZE ?= 50M in the Makefile",
    ("docs/gpu/README.md", "14 MiB"): "64 MiB a call less CARRY_SIZE's 50 MiB",
    ("docs/gpu/README.md", "30 s"): "how long the lent GPU machine stays warm after a call (its tool's limit)",
    ("docs/gpu/README.md", "15 min"): "the lent GPU machine's device time per session",
    # queueing theory: the load's concurrency as a bound (Little's law), not a measurement
    ("docs/instructors.md", "16 ×"): "16 senders: latency grows to about 16 × the service time",
    ("docs/instructors.md", "8 ×"): "concurrency 8: latency about 8 × the latency alone",
}


@dataclass(frozen=True)
class Figure:
    line: int
    text: str  # as written
    value: float
    unit: str  # canonical

    @property
    def key(self) -> str:
        return f"{self.value:g} {self.unit}"  # 2 hours -> "2 h", 16-fold -> "16 ×"


def canonical(unit: str) -> str:
    unit = unit.strip()
    if unit.startswith("times"):
        return "×"
    return CANONICAL.get(unit, unit)


def figures(text: str) -> list[Figure]:
    """Every figure in ``text`` with its line number (1-based): numbers with their unit, and the numbers of a
    Markdown table's columns whose header names a unit (``| p50 ms |``, ``| throughput (req/s) |``)."""
    found = []
    for m in FIGURE.finditer(text):
        if m["unit"] in ("×", "x") and NOT_A_RATIO.match(text, m.end()):
            continue
        found.append(Figure(text.count("\n", 0, m.start()) + 1, m[0], float(m["value"].replace(",", "")), canonical(m["unit"])))
    return sorted(found + table_figures(text), key=lambda f: f.line)


HEADER_UNIT = re.compile(r"(?<![\w/])" + UNIT + r"(?![\w²])")
CELL_NUMBER = re.compile(r"\**(?P<value>\d+(?:,\d{3})*(?:\.\d+)?)\**")
TABLE_RULE = re.compile(r"^\s*\|[\s:|-]+\|\s*$")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_figures(text: str) -> list[Figure]:
    lines, found = text.split("\n"), []
    for i, line in enumerate(lines[:-1]):
        if not (line.lstrip().startswith("|") and TABLE_RULE.match(lines[i + 1])):
            continue
        units = [m["unit"] if (m := HEADER_UNIT.search(head)) else None for head in _cells(line)]
        for j in range(i + 2, len(lines)):
            if not lines[j].lstrip().startswith("|"):
                break
            for unit, cell in zip(units, _cells(lines[j])):
                if unit and (m := CELL_NUMBER.fullmatch(cell)):
                    found.append(Figure(j + 1, f"{cell} ({unit})", float(m["value"].replace(",", "")), canonical(unit)))
    return found


def _blank(m: re.Match) -> str:
    """What a removed span leaves: its line breaks, so that line numbers stay."""
    return re.sub(r"[^\n]", " ", m[0])


# docs/testing.md's durations, written by a run of the whole suite (tests/tier_durations.py): generated too.
DURATIONS = re.compile(r"<!-- durations: written by .*? -->\n(?P<body>.*?)<!-- durations: end -->", re.DOTALL)


def prose(markdown: str) -> str:
    """``markdown`` with generated parts, fenced code, inline code and HTML comments blanked out, line for line."""
    text = DURATIONS.sub(_blank, BLOCK.sub(_blank, markdown))
    text = re.sub(r"^(?P<fence>```+|~~~+).*?^(?P=fence)[ \t]*$", _blank, text, flags=re.DOTALL | re.MULTILINE)
    text = re.sub(r"<!--.*?-->", _blank, text, flags=re.DOTALL)
    text = re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", _blank, text, flags=re.DOTALL)
    text = re.sub(r"\]\([^)\s]*\)", _blank, text)  # a link's target
    return text


def generated_figures(markdown: str) -> set[str]:
    return {f.key for block in (BLOCK, DURATIONS) for m in block.finditer(markdown) for f in figures(m["body"])}


def _toml_figures(node) -> set[str]:
    """``value unit`` of every ``{ value = ..., unit = "..." }`` in a parsed TOML record."""
    if isinstance(node, dict):
        own = {f"{float(node['value']):g} {canonical(node['unit'])}"} if {"value", "unit"} <= node.keys() else set()
        return own.union(*(_toml_figures(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_toml_figures(v) for v in node))
    return set()


def record_figures(path: str) -> set[str]:
    """The figures a committed record holds, with their units: those its text writes (``9.60 ms/img``) and,
    in a TOML record, its ``{ value, unit }`` entries."""
    target = REPO_ROOT / path.rstrip(".")
    if not target.is_file():
        return set()
    text = target.read_text(encoding="utf-8", errors="replace")
    found = {f.key for f in figures(text)}
    if target.suffix == ".toml":
        found |= _toml_figures(tomllib.loads(text))
    return found


def paragraphs(markdown: str) -> list[tuple[int, int, str]]:
    """(first line, last line, text) of each paragraph: lines between blank lines."""
    out, start = [], 1
    for chunk in re.split(r"(\n[ \t]*\n)", markdown):
        lines = chunk.count("\n")
        if chunk.strip() and not re.fullmatch(r"\n[ \t]*\n", chunk):
            out.append((start, start + lines, chunk))
        start += lines
    return out


def unheld(name: str, markdown: str) -> list[Figure]:
    """Each figure in the prose of ``markdown`` (the file ``name``, relative to the repository) that
    nothing holds."""
    generated = generated_figures(markdown)
    cited: dict[int, set[str]] = {}  # line -> the figures of the records its paragraph cites
    for first, last, paragraph in paragraphs(markdown):
        held = set().union(*(record_figures(p) for p in RECORD.findall(paragraph)))
        for line in range(first, last + 1):
            cited[line] = held
    return [f for f in figures(prose(markdown))
            if f.key not in generated and f.key not in cited.get(f.line, ()) and (name, f.key) not in SETTINGS]


IGNORED = {"results", "models", "build", "dist", "carry", "wheelhouse", "node_modules"}  # git-ignored outputs


def is_record(path: Path) -> bool:
    """A committed record, not prose: what a run wrote (docs/records/..., and `servelab gpu-check`'s
    docs/gpu/<gpu-name>.md). Its figures are the measurements the prose cites."""
    name = path.relative_to(REPO_ROOT).as_posix()
    return name.startswith("docs/records/") or bool(re.fullmatch(r"docs/gpu/(?!README\.md)[\w.-]+\.md", name))


def pages() -> list[Path]:
    """Every Markdown file of the checkout, hidden folders (.git, .venv), git-ignored outputs and records left out."""
    found = []
    for folder, subfolders, files in os.walk(REPO_ROOT):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith(".") and d not in IGNORED and d != "__pycache__")
        found += [Path(folder) / f for f in files if f.endswith(".md")]
    return sorted(p for p in found if not is_record(p))


PAGES = pages()


def _name(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


@pytest.mark.parametrize("path", PAGES, ids=_name)
def test_every_figure_in_the_prose_is_held(path: Path) -> None:
    bad = [f"{_name(path)}:{f.line}: {f.text.strip()}" for f in unheld(_name(path), path.read_text(encoding="utf-8"))]
    assert bad == [], ("figures that no generated part, cited record or reviewed setting holds "
                       "(generate them from their record, cite the record, or leave them out):\n" + "\n".join(bad))


def test_the_pages_include_notebooks_docs_and_readmes() -> None:
    names = set(map(_name, PAGES))
    assert {"README.md", "notebooks/0_intro.md", "docs/benchmarks.md", "docs/gpu/README.md",
            "fastapi_onnx/README.md"} <= names
    assert not any(n.startswith((".venv", "results/", "docs/records/")) for n in names)
    assert is_record(REPO_ROOT / "docs/gpu/nvidia-h200.md") and not is_record(REPO_ROOT / "docs/gpu/README.md")


def test_figures_are_found_with_their_units() -> None:
    text = ("It took 7 min 40 s, 1.5× faster; 12.3 ms and 52.4 inferences/s, 3 times faster, 98.6 % and 431 MiB\n"
            "at 104 photos/s, 2 hours, a 16-fold rise.\n")
    assert [f.key for f in figures(text)] == ["7 min", "40 s", "1.5 ×", "12.3 ms", "52.4 infer/s", "3 ×", "98.6 %",
                                              "431 MiB", "104 img/s", "2 h", "16 ×"]
    assert [f.line for f in figures(text)][-1] == 2


def test_a_tables_columns_take_their_unit_from_the_header() -> None:
    table = "| stage | p50 ms | req/s | mean batch |\n|---|---:|---:|---:|\n| pt-1 | 19.5 | **51.0** | 1.00 |\n"
    assert [(f.line, f.key) for f in figures(table)] == [(3, "19.5 ms"), (3, "51 req/s")]


def test_names_counts_and_dimensions_are_no_figures() -> None:
    assert figures("pt-2x2 and onnx-b16 on 2× P100 (2x Tesla P100), float32 3 × 224 × 224, v1.2s, 16 senders") == []


def test_code_comments_and_links_are_not_prose() -> None:
    text = "`12 ms` here\n```\n5 ms\n```\n<!-- 3 s -->\n[a](x-9ms.md)\nbut 4 ms here\n"
    assert [(f.line, f.key) for f in figures(prose(text))] == [(7, "4 ms")]


def test_a_figure_is_held_by_a_generated_part_or_a_cited_record_and_nothing_else() -> None:
    block = "<!-- generated: lab-time -->\ntook 7 min 52 s\n<!-- end generated -->\n"
    assert unheld("x.md", block + "\nAs above, 52 s.\n") == []
    assert [f.key for f in unheld("x.md", block + "\nBut 53 s.\n")] == ["53 s"]
    cited = "In the original lab (`servelab/data/original_lab.toml`), 18.7 ms alone"
    assert unheld("x.md", cited + ".\n") == []
    assert [f.key for f in unheld("x.md", cited + " and 18.8 ms.\n")] == ["18.8 ms"]
    assert [f.key for f in unheld("x.md", cited + " and 18.7 req/s.\n")] == ["18.7 req/s"]  # the number, not the figure
    log = "`docs/records/gpu-h100-2026-11-24/ort-batch-probe.log`"  # a log writes its figures as text
    assert unheld("x.md", f"Pillow: 9.6 ms a photo, 104 img/s ({log}).\n") == []
    assert [f.key for f in unheld("x.md", cited + ".\n\nAnother paragraph: 18.7 ms.\n")] == ["18.7 ms"]
    assert [f.key for f in unheld("x.md", "Cites `docs/records/none.toml`: 18.7 ms.\n")] == ["18.7 ms"]
    gpu = "`docs/gpu/nvidia-h200.md`"  # gpu-check's record of a GPU holds what it measured
    assert unheld("x.md", f"There fp32 took 10.19 ms at batch 64 ({gpu}).\n") == []
    assert [f.key for f in unheld("x.md", f"There fp32 took 10.2 ms ({gpu}).\n")] == ["10.2 ms"]


def test_every_reviewed_setting_is_still_in_its_file() -> None:
    """An entry whose figure left its file goes: the list holds only what the prose still says."""
    used = {(_name(p), f.key) for p in PAGES for f in figures(prose(p.read_text(encoding="utf-8")))}
    assert set(SETTINGS) - used == set()
    assert all(what.strip() for what in SETTINGS.values())
