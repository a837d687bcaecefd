"""The limit's arithmetic: costs in CPU ms add up; on a GPU the smaller of its ceiling and the CPU side binds."""

from pathlib import Path

import pytest

from servelab.measure.limit import Limit, ModelPoint, limit_markdown, simple_app_line, thread_counts

POINTS = [ModelPoint(batch=1, threads=1, images_per_s=100, cpu_ms_per_image=10.0),
          ModelPoint(batch=16, threads=2, images_per_s=150, cpu_ms_per_image=12.0)]


def test_the_cheapest_model_point_and_the_costs_add_up():
    limit = Limit(cores=2, photo="coffee.jpg", model=POINTS, preprocess_cpu_ms=5.0, http_cpu_ms=1.0)
    assert limit.cheapest is POINTS[0]  # fewest CPU ms per image, not the most images/s
    assert limit.cpu_ms_per_request == 16.0
    assert limit.rps == pytest.approx(2000 / 16) and limit.binds == "the CPUs"
    text = limit_markdown(limit)
    assert "10.00 ← cheapest" in text and "**125.0 req/s**, bound by the CPUs" in text


def test_on_a_gpu_the_model_leaves_the_cpus_and_the_smaller_side_binds():
    cpu_side = Limit(cores=2, photo="p", model=POINTS, preprocess_cpu_ms=5.0, http_cpu_ms=1.0, gpu_images_per_s=900)
    assert cpu_side.cpu_ms_per_request == 6.0 and cpu_side.rps == pytest.approx(2000 / 6)
    assert cpu_side.binds == "the CPUs"
    gpu = cpu_side.model_copy(update={"gpu_images_per_s": 200})
    assert gpu.rps == 200 and gpu.binds.startswith("the GPU")


def test_an_unmeasured_http_cost_counts_nothing_and_shows_a_dash():
    limit = Limit(cores=1, photo="p", model=POINTS, preprocess_cpu_ms=5.0)
    assert limit.cpu_ms_per_request == 15.0 and "| - |" in limit_markdown(limit)
    assert simple_app_line(limit) == ""  # the simple app not measured: no line


@pytest.mark.parametrize(("cores", "counts"), [(1, (1,)), (2, (1, 2)), (16, (1, 8, 16))])
def test_thread_counts(cores, counts):
    assert thread_counts(cores) == counts


def test_every_stages_best_run_is_set_against_the_limit_in_the_report(tmp_path):
    from servelab.measure.fractions import best_runs
    from servelab.measure.records import read_records
    from servelab.report.render import render_report

    records = read_records([Path(__file__).parents[1] / "data" / "quick_lab_records.jsonl"])
    limit = Limit(cores=2, photo="coffee.jpg", model=POINTS, preprocess_cpu_ms=5.0, http_cpu_ms=1.0,
                  simple_app={"simple app": 100.0, "fastapi-onnx, no settings": 112.5})
    report = render_report(records, tmp_path, limit=limit).read_text()
    section = report.split("## This machine's limit", 1)[1].split("\n## ", 1)[0]
    best = best_runs(records)
    assert best and "**125.0 req/s**" in section
    for stage, run in best.items():
        assert f"| {stage} | {run.load.label()} | {run.stats.items_per_s:.1f} | " \
               f"{run.stats.items_per_s / 125:.0%} |" in section
    assert ("the simple app (`benchmarks/simple_app.py`) 100.0 req/s, fastapi-onnx, no settings 112.5 req/s: "
            "**1.12×** the simple app, 90% of the limit.") in section
    assert "## This machine's limit" not in render_report(records, tmp_path / "none").read_text()
