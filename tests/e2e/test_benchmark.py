"""`servelab benchmark`: the variants against fp32, preprocessing in threads against processes, Ray Serve against
FastAPI, each in one run, for real (short windows)."""

import subprocess
import sys

import pytest

from servelab.cli import main
from servelab.core.paths import DEFAULT_IMAGE, REPO_ROOT
from servelab.core.procs import cpu_count
from servelab.core.variants.build import machine
from servelab.measure.limit import Limit, machine_limit
from servelab.run import lab, reference
from servelab.run.reference import device_here

pytestmark = pytest.mark.slow  # `servelab benchmark` for real: a Ray cluster, the ceiling, the variants


def test_variants_are_measured_against_fp32(artifacts):
    run = subprocess.run([sys.executable, "-m", "servelab", "benchmark", "--measure", "variants", "--variants", "u8",
                          "int8", "--duration", "1", "--rounds", "1"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split("|")[1].strip(): line for line in run.stdout.splitlines() if line.startswith("| ")}
    assert {"fp32", "u8", "int8"} <= set(rows)
    assert rows["fp32"].split("|")[4].strip() == "1.00" and rows["fp32"].split("|")[6].strip() == "1.00"
    assert "≥ 1.15" in rows["u8"] and "best INT8" in rows["int8"]


def test_ray_serve_is_measured_against_fastapi_onnx_dyn(artifacts):
    run = subprocess.run([sys.executable, "-m", "servelab", "benchmark", "--measure", "ray", "--duration", "2",
                          "--rounds", "1"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split("|")[1].strip().split(":")[0]: line.split("|") for line in run.stdout.splitlines()
            if line.startswith("| fastapi") or line.startswith("| ray")}
    assert set(rows) == {"fastapi-onnx-dyn", "ray-dyn"}
    assert rows["fastapi-onnx-dyn"][3].strip() == "1.00" and float(rows["ray-dyn"][3]) > 0
    # Time inside the app (Server-Timing) plus outside it is the client's mean latency: both measured.
    assert all(float(row[9]) > 0 and float(row[10]) > 0 for row in rows.values())


def test_preprocessing_threads_are_measured_against_worker_processes(artifacts):
    run = subprocess.run([sys.executable, "-m", "servelab", "benchmark", "--measure", "preprocess", "--duration", "1.5",
                          "--rounds", "1", "--concurrency", "4"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split("|")[1].split(",")[0].strip(): line.split("|") for line in run.stdout.splitlines()
            if line.startswith("| ") and "callers" in line}
    n = cpu_count()
    assert set(rows) == {"1 thread", f"{n} threads", f"{n} worker processes"}
    assert rows[f"{n} threads"][5].strip() == "1.00" and float(rows[f"{n} worker processes"][5]) > 0
    assert machine() in run.stdout  # the CPU is named
    assert f"Of {n} x one thread's images/s" in run.stdout


def test_the_ceiling_is_measured_and_a_labs_records_set_against_it(artifacts, tmp_path):
    """`servelab benchmark --measure ceiling --records ...` on this CPU: the table, the fractions, the saved result."""
    from servelab.measure.ceiling import BATCHES, Ceiling
    from servelab.measure.records import Latency, Load, Record, Stats, append_record

    records = tmp_path / "records.jsonl"
    for stage, rps in (("fastapi-onnx", 100.0), ("fastapi-onnx-dyn", 150.0)):
        append_record(records, Record(stage=stage, load=Load.closed(16), config={"device": "cpu"},
                                      stats=Stats(throughput_rps=rps, items_per_s=rps, latency=Latency(p50_ms=90.0))))
    run = subprocess.run([sys.executable, "-m", "servelab", "benchmark", "--measure", "ceiling", "--ceiling-repeats", "1",
                          "--ceiling-seconds", "0.1", "--records", str(records), "--ceiling-json",
                          str(tmp_path / "ceiling.json")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    result = Ceiling.model_validate_json((tmp_path / "ceiling.json").read_text())
    assert {(p.precision, p.batch) for p in result.points if p.images_per_s} == {
        (q, b) for q in ("fp32", "int8") for b in BATCHES}
    assert "CPUExecutionProvider (CPU figures)" in run.stdout
    fp32 = result.best("fp32").images_per_s
    row = next(line for line in run.stdout.splitlines() if line.startswith("| fastapi-onnx-dyn | image |"))
    assert row.split(" | ")[4] == f"{150 / fp32 * 100:.1f}"  # % of the fp32 ceiling this run measured
    assert ("| fastapi-onnx-dyn ÷ fastapi-onnx ≥ 2× at saturation (capacity ÷ capacity) | information only (GPU aims; "
            "this ran on the CPU) |") in run.stdout


def test_the_benchmark_and_the_lab_take_their_limit_from_one_function(model, tmp_path, monkeypatch, capsys):
    # `servelab benchmark --measure limit` in this process, then the lab's limit: the real function runs, and this
    # only records who called it, with what, and what it returned.
    made: list[tuple[tuple, dict, Limit]] = []

    def recorded(*args, **kwargs) -> Limit:
        limit = machine_limit(*args, **kwargs)
        made.append((args, kwargs, limit))
        return limit

    monkeypatch.setattr(reference, "machine_limit", recorded)
    assert main(["benchmark", "--measure", "limit", "--duration", "1", "--rounds", "2", "--concurrency", "4",
                 "--cost-seconds", "0.2", "--limit-json", str(tmp_path / "limit.json")]) == 0
    out = capsys.readouterr().out
    lab_limit = lab.measure_limit(model, DEFAULT_IMAGE, tmp_path / "lab", device_here())
    assert len(made) == 2 and lab_limit is not None
    (bench_args, bench_kwargs, bench), (lab_args, lab_kwargs, ours) = made
    # The same inputs but the time each part is measured and the senders: the same model, photo and device.
    assert (bench_args[0], bench_args[1], bench_args[3]) == (lab_args[0], lab_args[1], lab_args[3]) == (
        model.onnx.parent, DEFAULT_IMAGE, device_here())
    assert (bench_kwargs["seconds"], lab_kwargs["seconds"]) == (0.2, lab.LIMIT_SECONDS)
    # Each in rounds that alternate with the servers set against it.
    assert bench_kwargs["rounds"] == 2 and lab_kwargs["rounds"] >= 1 and callable(bench_kwargs["between"])
    # What each shows is what the one function returned, and both measured the same parts.
    assert Limit.model_validate_json((tmp_path / "limit.json").read_text()) == bench
    assert f"**{bench.rps:.1f} req/s**, bound by the CPUs" in out and "← best" in out and machine() in out
    assert lab_limit.model_copy(update={"simple_app": {}}) == ours
    assert set(lab_limit.simple_app) == {"simple app", "fastapi-onnx, no settings"}
    assert (bench.cores, bench.device, [(p.batch, p.threads) for p in bench.model], list(bench.parts)) == (
        ours.cores, ours.device, [(p.batch, p.threads) for p in ours.model], list(ours.parts))
    # The side-by-side table: every server, its ratio to the simple app, its share of the limit, its processes' CPU.
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith(("| simple app", "| fastapi-onnx"))}
    assert set(rows) == {"simple app", "fastapi-onnx, no settings", "fastapi-onnx, one inference per CPU", "fastapi-onnx",
                         "fastapi-onnx-dyn"}
    assert rows["simple app"][2] == "1.00"
    for what, (_, rps, _, share, cpu_ms, processes, _) in rows.items():
        assert float(rps) > 0 and abs(float(share.rstrip("%")) - float(rps) / bench.rps * 100) <= 1, what
        assert float(cpu_ms) > 0 and int(processes) >= 1, what
    assert rows["simple app"][5] == "1"  # uvicorn with its defaults: one process
    assert "≥ 1.0 × simple app" in rows["fastapi-onnx, no settings"][6] and not rows["fastapi-onnx"][6]
