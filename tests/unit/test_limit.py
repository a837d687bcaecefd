"""The limit's arithmetic: what each part delivers with every core busy adds up as machine time per request;
on a GPU the model leaves the CPUs and the smaller of its ceiling and the CPU side binds."""

from pathlib import Path

import pytest

from servelab.measure.limit import Limit, ModelPoint, Part, limit_markdown, simple_app_line, thread_counts

# The most images/s is not the fewest CPU ms per image: the limit takes the most images/s.
POINTS = [ModelPoint(batch=1, threads=1, sessions=2, images_per_s=100, cpu_ms_per_image=10.0),
          ModelPoint(batch=16, threads=2, images_per_s=125, cpu_ms_per_image=12.0)]
PRE, HTTP = Part(per_s=500, cpu_ms=3.0, processes=2), Part(per_s=2000, cpu_ms=1.0, processes=2)


def test_the_parts_add_up_as_machine_time_per_request_from_the_models_best_point():
    limit = Limit(cores=2, photo="coffee.jpg", model=POINTS, preprocess=PRE, http=HTTP)
    assert limit.best is POINTS[1]  # the most images/s, though not the fewest CPU ms per image
    assert limit.parts == {"the model": 125, "preprocessing": 500, "HTTP + JSON": 2000}
    assert limit.ms_per_request == pytest.approx(8.0 + 2.0 + 0.5)
    assert limit.rps == pytest.approx(1000 / 10.5) and limit.binds == "the CPUs"
    # CPU time, information only: 2 cores ÷ (12 + 3 + 1) CPU ms would say 125 req/s, more than the machine gives.
    assert limit.cpu_ms_per_request == 16.0 and limit.cpu_time_rps == pytest.approx(125.0) and 125.0 > limit.rps
    text = limit_markdown(limit)
    assert "| 125 img/s ← best | 12.00 |" in text and "| 100 img/s | 10.00 |" in text
    assert "| preprocessing (coffee.jpg), 2 processes at once | 500 img/s | 3.00 |" in text
    assert "2 server processes and the client) | 2000 req/s | 1.00 |" in text
    assert ("8.00 ms (the model) + 2.00 ms (preprocessing) + 0.50 ms (HTTP + JSON) = 10.50 ms of the machine per "
            "request = 95.2 req/s from the CPUs: **95.2 req/s**, bound by the CPUs.") in text
    assert "CPU time alone would say 2 cores ÷ 16.00 CPU ms per request = 125.0 req/s" in text


def test_on_a_gpu_the_model_leaves_the_cpus_and_the_smaller_side_binds():
    cpu_side = Limit(cores=2, photo="p", device="gpu", preprocess=PRE, http=HTTP, gpu_images_per_s=900)
    assert cpu_side.best is None and "the model" not in cpu_side.parts
    assert cpu_side.rps == pytest.approx(1000 / 2.5) and cpu_side.binds == "the CPUs"
    assert cpu_side.cpu_ms_per_request == 4.0  # the model's CPU time is not the CPUs'
    gpu = cpu_side.model_copy(update={"gpu_images_per_s": 200})
    assert gpu.rps == 200 and gpu.binds.startswith("the GPU")
    assert "model alone on the GPU (its fp32 ceiling) | 200 img/s" in limit_markdown(gpu)
    # CPU points measured beside a GPU never count: the model runs there.
    assert gpu.model_copy(update={"model": POINTS}).rps == 200


def test_an_unmeasured_http_part_counts_nothing_and_shows_a_dash():
    limit = Limit(cores=1, photo="p", model=POINTS, preprocess=PRE)
    assert limit.parts == {"the model": 125, "preprocessing": 500}
    assert limit.rps == pytest.approx(100.0) and "| - | - |" in limit_markdown(limit)
    assert simple_app_line(limit) == ""  # the simple app not measured: no line


def test_a_limit_survives_its_file():
    limit = Limit(cores=2, photo="coffee.jpg", model=POINTS, preprocess=PRE, http=HTTP, simple_app={"simple app": 1.0})
    again = Limit.model_validate_json(limit.model_dump_json())
    assert again == limit and again.rps == limit.rps


@pytest.mark.parametrize(("cores", "counts"), [(1, (1,)), (2, (1, 2)), (16, (1, 8, 16))])
def test_thread_counts(cores, counts):
    assert thread_counts(cores) == counts


def test_every_stages_best_run_is_set_against_the_limit_in_the_report(tmp_path):
    from servelab.measure.fractions import best_runs
    from servelab.measure.records import read_records
    from servelab.report.render import render_report

    records = read_records([Path(__file__).parents[1] / "data" / "quick_lab_records.jsonl"])
    # 1 / (1/125 + 1/500 + 1/2000) s = 95.24 req/s
    limit = Limit(cores=2, photo="coffee.jpg", model=POINTS, preprocess=PRE, http=HTTP,
                  simple_app={"simple app": 80.0, "fastapi-onnx, no settings": 90.0})
    report = render_report(records, tmp_path, limit=limit).read_text()
    section = report.split("## This machine's limit", 1)[1].split("\n## ", 1)[0]
    best = best_runs(records)
    assert best and "**95.2 req/s**" in section and "every core on it" in section
    for stage, run in best.items():
        assert f"| {stage} | {run.load.label()} | {run.stats.items_per_s:.1f} | " \
               f"{run.stats.items_per_s / limit.rps:.0%} |" in section
    assert ("the simple app (`benchmarks/simple_app.py`) 80.0 req/s, fastapi-onnx, no settings 90.0 req/s: "
            "**1.12×** the simple app, 94% of the limit.") in section
    assert "## This machine's limit" not in render_report(records, tmp_path / "none").read_text()
