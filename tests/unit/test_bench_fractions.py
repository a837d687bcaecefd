"""The stages against the model's ceiling, the ratios and the aims: computed from a small record set
made with the lab's own record classes, against figures worked out by hand."""

from servelab.measure.ceiling import Ceiling, Point
from servelab.measure.fractions import (
                                        CAPACITY,
                                        MET,
                                        MISSED,
                                        NOT_MEASURED,
                                        ON_CPU,
                                        aims,
                                        capacity,
                                        curve,
                                        curve_point,
                                        first_requests,
                                        fractions_markdown,
                                        ratio_runs,
                                        ratios,
                                        senders,
                                        stage_fractions,
                                        )
from servelab.measure.records import GpuSeries, Latency, Load, Monitors, Record, Stats
from servelab.run.side_by_side import stage_inputs
from servelab.servers.fastapi.runtimes import CPU, CUDA

INPUTS = stage_inputs()  # the lab's stage catalogue


def run(stage: str, concurrency: int, rps: float, batch: int = 1, tool: str = "servelab", device: str = "cpu",
        failed: str | None = None, first_ms: float | None = None) -> Record:
    load = Load.sequential() if concurrency == 1 else Load.closed(concurrency)
    gpus = [GpuSeries(index=0, name="GPU", util_pct=[20.0, 40.0], mem_total_mib=80.0)] if device == "gpu" else []
    return Record(stage=stage, tool=tool, load=load, batch=batch, config={"device": device}, failed=failed,
                  first_request_ms=first_ms,
                  stats=Stats(throughput_rps=rps, items_per_s=rps * batch, latency=Latency(p50_ms=1e3 / rps)),
                  monitors=Monitors(interval_s=0.5, cpu_pct=[[90.0, 100.0]], gpus=gpus))


def lab(device: str = "cpu") -> list[Record]:
    # The first runs after ready: fastapi-onnx's first request 25 ms against a 10 ms median, onnx-1's 20 ms
    # against 1000/150 = 6.67 ms (2.85×), the worst; fastapi-onnx-dyn has no sequential median.
    firsts = [run("fastapi-onnx", 1, 100.0, device=device, first_ms=25.0),
              run("fastapi-onnx-dyn", 16, 500.0, device=device, first_ms=900.0),
              run("onnx-1", 1, 150.0, device=device, first_ms=19.0)]
    return firsts + [run(*r, device=device) for r in (
        ("fastapi-onnx", 16, 200.0),
        ("onnx-1", 8, 250.0), ("onnx-1", 16, 300.0), ("onnx-2", 16, 450.0),
        ("onnx-dyn", 8, 400.0),  # not at 16 senders
        ("onnx-u8", 16, 700.0))] + [
        run("onnx-dyn", 1, 30.0, batch=16, device=device),  # requests of 16 images: not a stage's serving rate
        run("onnx-1", 16, 900.0, tool="perf_analyzer", device=device),  # the other client
        run("fastapi-onnx", 8, 999.0, failed="connection refused", device=device)]


def ceiling(provider: str, best_ms: float = 16.0) -> Ceiling:
    points = [Point(precision="fp32", batch=1, provider=provider, runs=3, ms=2.0, images_per_s=500.0),
              Point(precision="fp32", batch=16, provider=provider, runs=3, ms=best_ms, images_per_s=16e3 / best_ms),
              Point(precision="fp32", batch=128, failed="RuntimeError: out of memory")]
    return Ceiling(provider=provider, machine="test", onnxruntime="test", repeats=3, max_seconds=1.0, points=points)


def test_the_catalogue_says_which_stages_take_an_image():
    assert {INPUTS[s] for s in ("fastapi-onnx", "fastapi-onnx-dyn", "pt-1", "ensemble", "ray-dyn")} == {"bytes"}
    assert (INPUTS["onnx-1"], INPUTS["onnx-dyn"], INPUTS["onnx-u8"]) == ("tensor", "tensor", "uint8")


def test_each_stage_is_its_best_run_as_a_fraction_of_the_fp32_ceiling():
    found = {f.stage: f for f in stage_fractions(lab(), ceiling(CPU), INPUTS)}  # ceiling 1,000 img/s (batch 16)
    assert list(found) == ["fastapi-onnx", "fastapi-onnx-dyn", "onnx-1", "onnx-2", "onnx-dyn", "onnx-u8"]
    assert {s: (f.input, f.load, f.images_per_s, round(f.fraction, 6)) for s, f in found.items()} == {
        "fastapi-onnx": ("image", "concurrency 16", 200.0, 0.2),  # not the failed run's 999
        "fastapi-onnx-dyn": ("image", "concurrency 16", 500.0, 0.5),
        "onnx-1": ("tensor", "concurrency 16", 300.0, 0.3),  # servelab's 300, not perf_analyzer's 900
        "onnx-2": ("tensor", "concurrency 16", 450.0, 0.45),
        "onnx-dyn": ("tensor", "concurrency 8", 400.0, 0.4),  # not the 480 img/s of its 16-image requests
        "onnx-u8": ("tensor", "concurrency 16", 700.0, 0.7)}
    assert found["onnx-1"].cpu_pct == 95.0 and found["onnx-1"].gpu_pct is None


def test_ratios_are_capacity_over_capacity():
    """Records made before the sweep: a stage's capacity is its run at the most senders, wherever that was."""
    assert ratios(lab()) == [
        ("dynamic batching ÷ no batching", "onnx-dyn ÷ onnx-1, capacity at 8 senders and 16 senders", 400 / 300),
        ("dynamic batching ÷ no batching", "fastapi-onnx-dyn ÷ fastapi-onnx, capacity both at 16 senders", 2.5),
        ("two instances per GPU ÷ one instance", "onnx-2 ÷ onnx-1, capacity both at 16 senders", 1.5)]


def swept(stage: str, points: list[tuple[int, float]]) -> list[Record]:
    """A stage's concurrency sweep as the lab records it: one run per level, the last holding the curve."""
    runs = [run(stage, c, rps) for c, rps in points]
    best = max(runs, key=lambda r: r.stats.throughput_rps)
    runs[-1].config = {**runs[-1].config, CAPACITY: {
        "throughput_rps": best.stats.throughput_rps, "concurrency": best.load.concurrency, "stopped": "the knee",
        "curve": [curve_point(r) for r in runs]}}
    return runs


def test_a_swept_stage_s_capacity_is_the_top_of_its_curve_wherever_its_knee_was():
    """onnx-1 peaks at 4 senders and falls at 8 (the sweep stopped there); onnx-dyn goes on to 32: their ratio is
    the two peaks, not the two runs at one number of senders; latency compares at the most senders both have."""
    records = swept("onnx-1", [(1, 100.0), (2, 180.0), (4, 200.0), (8, 195.0)]) + \
        swept("onnx-dyn", [(1, 90.0), (2, 170.0), (4, 260.0), (8, 400.0), (16, 600.0), (32, 610.0)])
    top = capacity(records, "onnx-1")
    assert (top.load.concurrency, top.stats.throughput_rps) == (4, 200.0) and CAPACITY not in top.config
    assert [p["concurrency"] for p in curve(records, "onnx-1")] == [1, 2, 4, 8] and curve(records, "pt-1") == []
    assert ratios(records) == [("dynamic batching ÷ no batching",
                                "onnx-dyn ÷ onnx-1, capacity at 32 senders and 4 senders", 610.0 / 200.0)]
    level, a, b = ratio_runs(records, "onnx-dyn", "onnx-1")
    assert (level, a.stats.throughput_rps, b.stats.throughput_rps) == (8, 400.0, 195.0)
    # A capacity of one request at a time (a stage that does not scale at all) is said as such.
    flat = swept("onnx-2", [(1, 100.0), (2, 101.0)])
    assert ratios(records + flat)[-1] == ("two instances per GPU ÷ one instance",
                                          "onnx-2 ÷ onnx-1, capacity at 2 senders and 4 senders", 101.0 / 200.0)
    assert senders(capacity(swept("onnx-2", [(1, 100.0), (2, 99.0)]), "onnx-2")) == "one at a time"


def test_on_a_gpu_the_aims_are_met_or_missed_with_their_figures():
    met = {a.what: a for a in aims(lab("gpu"), ceiling(CUDA), INPUTS)}
    assert [a.verdict for a in met.values()] == [MISSED, MET, MET, MET, MET]
    assert met["onnx-dyn ÷ onnx-1 ≥ 2× at saturation (capacity ÷ capacity)"].figures == \
        "onnx-dyn 400.0 (8 senders) ÷ onnx-1 300.0 (16 senders) req/s = 1.33"
    assert met["fastapi-onnx-dyn ÷ fastapi-onnx ≥ 2× at saturation (capacity ÷ capacity)"].figures == \
        "fastapi-onnx-dyn 500.0 (16 senders) ÷ fastapi-onnx 200.0 (16 senders) req/s = 2.50"
    assert met["best image-in stage ≥ 40% of the fp32 ceiling"].figures == (
        "fastapi-onnx-dyn (concurrency 16) 500.0 img/s = 50.0% of 1000 (batch 16); CPU 95 %, GPU 30 % during that run")
    assert met["best tensor-in stage ≥ 60% of the fp32 ceiling"].figures.startswith("onnx-u8 (concurrency 16) 700.0")
    assert met["first request after ready ≤ 3× the sequential median"].figures == \
        "worst of 2 stages: onnx-1 19.0 ms = 2.85× its sequential median 6.7 ms"
    # A ceiling twice as high: both fractions fall short.
    missed = [a.verdict for a in aims(lab("gpu"), ceiling(CUDA, best_ms=8.0), INPUTS)]
    assert missed == [MISSED, MET, MISSED, MISSED, MET]


def test_on_the_cpu_the_aims_are_information_never_met():
    found = aims(lab(), ceiling(CPU), INPUTS)
    assert [a.verdict for a in found] == [ON_CPU, ON_CPU, ON_CPU, ON_CPU, ON_CPU]
    # GPU figures for the ceiling do not make a CPU lab's stages GPU claims.
    assert MET not in {a.verdict for a in aims(lab("cpu"), ceiling(CUDA), INPUTS)}
    md = fractions_markdown(lab(), ceiling(CPU), INPUTS)
    assert "met |" not in md and "**missed**" not in md and "GPU aims; this ran on the CPU" in md
    assert "| onnx-u8 | tensor | concurrency 16 | 700.0 | 70.0 | 95 | - |" in md
    assert "| dynamic batching ÷ no batching | fastapi-onnx-dyn ÷ fastapi-onnx, capacity both at 16 senders | 2.50 |" in md


def test_a_missing_stage_or_ceiling_is_not_measured():
    image_only = [r for r in lab("gpu") if INPUTS[r.stage] == "bytes"]
    by = {a.what: a for a in aims(image_only, ceiling(CUDA), INPUTS)}
    assert by["best tensor-in stage ≥ 60% of the fp32 ceiling"].verdict == NOT_MEASURED
    assert by["best tensor-in stage ≥ 60% of the fp32 ceiling"].figures == "no tensor-in stage measured"
    assert by["first request after ready ≤ 3× the sequential median"].verdict == MET  # fastapi-onnx's 2.5×
    assert first_requests(image_only) == [("fastapi-onnx", 25.0, 10.0)]
    later = [r.model_copy(update={"first_request_ms": None}) for r in image_only[:1]] + image_only[1:]
    assert first_requests(later) == []  # only a stage's first run counts: the first request after ready
    nothing = Ceiling(provider=CUDA, machine="test", onnxruntime="test", repeats=1, max_seconds=1.0,
                      points=[Point(precision="fp32", batch=1, failed="FileNotFoundError: no model")])
    assert [a.verdict for a in aims(lab("gpu"), nothing, INPUTS)] == [MISSED, MET, NOT_MEASURED, NOT_MEASURED, MET]
    assert aims(image_only, nothing, INPUTS)[0].figures == "no capacity measured for onnx-dyn or onnx-1"
    assert "not measured;" in fractions_markdown([], nothing, INPUTS)
