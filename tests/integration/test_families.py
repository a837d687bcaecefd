"""servelab.run.families: the FastAPI adapter as the lab and the benchmark use it, on real
``servelab serve`` processes (the Triton and Ray adapters run in the lab's own tests, tests/e2e/test_lab.py)."""

from contextlib import ExitStack

import psutil

from servelab.core.catalogue import of_family
from servelab.core.paths import DEFAULT_IMAGE
from servelab.measure.measure_stage import Labels, measure_stage
from servelab.measure.records import Load
from servelab.run.families import FastAPIAdapter, serve_fastapi

FASTAPI = of_family("fastapi")


def test_a_switch_serves_the_next_stage_and_stops_the_last_by_pid(model, tmp_path):
    family = FastAPIAdapter(tmp_path, {"ORT_PROVIDERS": "cpu"})
    with family.start(FASTAPI["fastapi-pt"]):
        first, pt = family.pid, family.runs_on(FASTAPI["fastapi-pt"])
        family.switch(FASTAPI["fastapi-pt"])  # the lab switches to the stage its adapter started with: no restart
        assert family.pid == first and len(list(tmp_path.glob("fastapi-pt-*.log"))) == 1
        family.switch(FASTAPI["fastapi-onnx"])
        second, onnx = family.pid, family.runs_on(FASTAPI["fastapi-onnx"])
        assert not psutil.pid_exists(first)
        [record] = measure_stage(family.target(FASTAPI["fastapi-onnx"], DEFAULT_IMAGE.read_bytes()),
                                 [Load.sequential(3, warmup=1)], Labels("fastapi-onnx", server_pid=second))
    assert pt[0].startswith("torch cpu") and onnx[0] == "onnxruntime CPUExecutionProvider"
    assert record.stats.successes == 3 and record.monitors.server_pid == second
    assert not psutil.pid_exists(second) and family.url == ""


def test_after_a_rollout_a_switch_to_the_same_stage_starts_it_afresh(artifacts, tmp_path):
    import asyncio

    import requests

    onnx = FASTAPI["fastapi-onnx"]
    family = FastAPIAdapter(tmp_path, {"ORT_PROVIDERS": "cpu"})
    with family.start(onnx):
        first, version = family.pid, requests.get(f"{family.url}/ready", timeout=10).json()["model_version"]
        rolled = asyncio.run(family.roll_out(onnx, "u8"))
        family.switch(onnx)
        assert family.pid != first and not psutil.pid_exists(first)
        assert requests.get(f"{family.url}/ready", timeout=10).json()["model_version"] == version
    assert rolled["model_version"] != version


def test_a_benchmarks_settings_go_over_the_stages(model, tmp_path):
    """fastapi-onnx-dyn batches ≤ 16 by its catalogue entry; the benchmark's setting wins over it."""
    import requests

    with ExitStack() as stack:
        url = serve_fastapi(stack, FASTAPI["fastapi-onnx-dyn"], tmp_path, {"MAX_BATCH_SIZE": "4"}).url
        batching = requests.get(f"{url}/ready", timeout=10).json()["batching"]
    assert batching["max_batch_size"] == 4
