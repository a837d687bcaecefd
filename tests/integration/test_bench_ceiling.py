"""The model's own ceiling, measured for real with ONNX Runtime on the built models (this machine's CPU)."""

from servelab.measure.ceiling import (
                                      BATCHES,
                                      Ceiling,
                                      Point,
                                      ceiling_markdown,
                                      measure_ceiling,
                                      )
from servelab.servers.fastapi.runtimes import CPU, CUDA


def quiet(*_):
    pass


def test_every_batch_size_is_measured_on_the_cpu_and_named_so(artifacts):
    result = measure_ceiling(artifacts.manifest.parent, repeats=1, max_seconds=0.1, log=quiet)
    assert result.provider == CPU and not result.on_gpu and result.gpu is None
    # A CPU measures fp32 and INT8: fp16 has no fast path there.
    assert [(p.precision, p.batch) for p in result.points] == [(q, b) for q in ("fp32", "int8") for b in BATCHES]
    for p in result.points:
        assert p.failed is None and p.provider == CPU and p.runs == 1
        assert p.ms > 0 and abs(p.images_per_s - p.batch / p.ms * 1e3) < 1e-6
    for precision in ("fp32", "int8"):
        assert result.best(precision).images_per_s == max(p.images_per_s for p in result.points
                                                          if p.precision == precision)
    md = ceiling_markdown(result)
    assert "CPUExecutionProvider (CPU figures)" in md and "Failed" not in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [int(r.split("|")[1]) for r in rows] == list(BATCHES)
    assert f"fp32 {result.best('fp32').images_per_s:.0f} img/s at batch {result.best('fp32').batch}" in md
    # Saved next to a run's records and read back whole.
    assert Ceiling.model_validate_json(result.model_dump_json()) == result


def test_a_time_cap_bounds_the_timed_runs(artifacts):
    result = measure_ceiling(artifacts.manifest.parent, batches=(16,), precisions=("fp32",), repeats=10_000,
                             max_seconds=0.2, log=quiet)
    [point] = result.points
    assert 1 <= point.runs < 10_000 and point.images_per_s > 0


def test_a_failing_measurement_is_recorded_with_its_reason_and_the_rest_go_on(artifacts, tmp_path):
    result = measure_ceiling(artifacts.manifest.parent, batches=(0, 1), precisions=("fp32",), repeats=2, log=quiet)
    impossible, one = result.points
    assert impossible.failed.startswith("ValueError: batch 0") and impossible.images_per_s is None
    assert one.failed is None and one.images_per_s > 0
    assert result.best("fp32") == one

    missing = measure_ceiling(tmp_path, batches=(1, 8), repeats=2, log=quiet)  # no model in this folder
    assert len(missing.points) == 4 and all(p.failed.startswith("FileNotFoundError") for p in missing.points)
    assert missing.best("fp32") is None and not missing.on_gpu
    md = ceiling_markdown(missing)
    assert "fp32 not measured" in md and "- int8 batch 8: FileNotFoundError" in md


def test_the_table_names_the_provider_each_point_really_ran_on():
    asked = {"provider": CUDA, "machine": "test", "gpu": "NVIDIA H100 80GB HBM3", "onnxruntime": "test",
             "repeats": 1, "max_seconds": 1.0}
    on_gpu = Ceiling(**asked, points=[Point(precision="fp32", batch=1, provider=CUDA, runs=1, ms=2.0, images_per_s=500.0)])
    assert on_gpu.on_gpu and "CUDAExecutionProvider (GPU NVIDIA H100 80GB HBM3 figures)" in ceiling_markdown(on_gpu)
    # ONNX Runtime fell back to the CPU: CPU figures, whatever was asked for.
    fell_back = Ceiling(**asked, points=[Point(precision="fp32", batch=1, provider=CPU, runs=1, ms=9.0,
                                               images_per_s=111.0)])
    assert not fell_back.on_gpu and "CPUExecutionProvider (CPU figures)" in ceiling_markdown(fell_back)
