"""`servelab report` renders a stored set of records.

tests/data/bench_records.jsonl holds 14 real records: `servelab load` runs against
tests/tinyserver.py (20 ms per request, one slot; one stage with every 10th request failing) and
against a local tritonserver 2.51 serving a Python-backend test model that sleeps 10 ms per
execution with dynamic batching (marked as a stand-in), plus the perf_analyzer sample CSV
(tests/data/perf_analyzer_concurrency.csv) converted to records.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from servelab.measure.records import read_records
from servelab.report import compare
from servelab.report.render import markdown_table, render_report, summary_table

DATA = Path(__file__).parents[1] / "data"
RECORDS = DATA / "bench_records.jsonl"
PNG = b"\x89PNG\r\n\x1a\n"


def test_renders_the_comparison_and_every_plot(tmp_path: Path) -> None:
    records = read_records(RECORDS)
    assert len(records) == 14
    report = render_report(records, tmp_path, sources=[RECORDS])
    text = report.read_text()
    assert report == tmp_path / "report.md"
    # The lessons first; stages outside the catalogue teach none, and each lesson says so in one line.
    assert text.index("## What this run shows") < text.index("## Plots")
    assert "- *Not measured in this run* (`servelab lab --full` measures every stage): PyTorch → ONNX Runtime, Dynamic batching" in text
    # The comparison table, in report-tables.md (linked): one row per run, with units in the headers.
    tables = (tmp_path / "report-tables.md").read_text()
    assert "](report-tables.md)" in text and "## Comparison" not in text
    assert "| stage | tool | load | offered req/s | batch | ok | errors | p50 ms | p95 ms | p99 ms | req/s |" in tables
    assert tables.count("| tiny-20ms |") == 6 and tables.count("| triton-sleep-dyn |") == 4
    assert "| pa-sample | perf_analyzer | concurrency 16 |" in tables
    assert "3 (http_500 3)" in tables  # errors shown, never folded into successes
    # The stand-in is said above the table, with its note.
    assert "Stand-in models" in text and "sleeps 10 ms per execution" in text
    for name in ("latency_throughput_vs_concurrency.png", "latency_throughput_vs_rate.png", "latency_cdf.png",
                 "batch_sizes.png", "utilization.png"):
        assert f"]({name})" in text
        assert (tmp_path / name).read_bytes().startswith(PNG)
    assert "## Machines" in text and "logical CPUs" in text


def test_tables_show_queue_share_and_mean_batch() -> None:
    records = read_records(RECORDS)
    table = summary_table(records)
    header, *rows = table.splitlines()
    assert len(rows) == 14 and "queue share" in header and "mean batch" in header
    triton_c8 = next(row for row in rows if "triton-sleep-dyn" in row and "concurrency 8" in row)
    assert "4.62" in triton_c8 and "yes" in triton_c8
    assert markdown_table(records).count("\n") == 15


def test_only_plots_with_data_are_made(tmp_path: Path) -> None:
    [one] = [r for r in read_records(RECORDS) if r.stage == "tiny-20ms-faulty"]
    text = render_report([one], tmp_path).read_text()
    assert "batch_sizes.png" not in text and not (tmp_path / "batch_sizes.png").exists()
    assert "latency_cdf.png" in text and "utilization.png" in text


def test_command_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "servelab", "report", str(RECORDS), "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "p50 ms" in done.stdout and f"wrote {tmp_path / 'report.md'}" in done.stdout
    done = subprocess.run([sys.executable, "-m", "servelab", "report", "--records", str(tmp_path / "none.jsonl")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"no records at {tmp_path / 'none.jsonl'}" in done.stdout


def test_both_clients_side_by_side_and_disagreement_flagged(tmp_path: Path) -> None:
    """pa-sample's perf_analyzer rows paired with servelab runs of the same stage and load."""
    records = read_records(RECORDS)
    pa = {r.load.label(): r for r in records if r.tool == "perf_analyzer"}
    ours = [r.model_copy(update={"tool": "servelab", "stats": r.stats.model_copy(update={"successes": 100})})
            for r in pa.values()]
    near = ours[0].model_copy(update={"stats": ours[0].stats.model_copy(update={
        "throughput_rps": pa["sequential"].stats.throughput_rps * 1.05})})
    far = ours[1].model_copy(update={"stats": ours[1].stats.model_copy(update={
        "throughput_rps": pa["concurrency 8"].stats.throughput_rps * 1.25})})
    failed = pa["concurrency 16"].model_copy(update={"failed": "error: failed to get model metadata"})
    found = compare.pairs([near, far, ours[2], pa["sequential"], pa["concurrency 8"], failed])
    assert [(p.load, p.verdict) for p in found] == [
        ("sequential", "agree"), ("concurrency 8", "DISAGREE (> 10%)"), ("concurrency 16", "perf_analyzer failed")]
    assert found[1].throughput_ratio == pytest.approx(1 / 1.25)
    text = render_report([near, far, ours[2], pa["sequential"], pa["concurrency 8"], failed], tmp_path).read_text()
    tables = (tmp_path / "report-tables.md").read_text()
    assert "## Two clients, one server" in tables and "| pa-sample | concurrency 8 | 1 |" in tables
    assert "DISAGREE" in tables and "## Failed runs" in text and "failed to get model metadata" in text
    assert "agree within 10% on 1 of 3 runs measured by both. Where they do not, the lessons' ratios use servelab's" in text


def test_the_lessons_open_the_report_of_a_real_quick_lab(tmp_path: Path) -> None:
    """tests/data/quick_lab_records.jsonl (21 real records of `servelab lab --quick`, see
    tests/unit/test_report_summary.py): the lessons on the first screen, the long tables beside it."""
    records = read_records(DATA / "quick_lab_records.jsonl")
    text = render_report(records, tmp_path).read_text()
    first_screen = text.split("## Plots")[0]
    assert first_screen.startswith("# servelab results") and "## Comparison" not in first_screen
    assert ("- onnx-1 ÷ pt-1, capacity both at 8 senders: 32.6 vs 8.6 req/s = **3.78×** (no windows recorded: spread "
            "unknown); p50 at 8 senders ") in first_screen
    assert "⚠ **contradicts 10_ray, which expects ≥ 1×**" in first_screen
    for name in ("latency_throughput_vs_concurrency.png", "latency_throughput_vs_rate.png", "latency_cdf.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG)
    comparison = (tmp_path / "report-tables.md").read_text().split("## Comparison")[1].split("\n## ")[0]
    assert comparison.count("| servelab |") == 20 and comparison.count("| perf_analyzer |") == 1
