"""Starting the FastAPI stages: `servelab serve`, and no silent fallback from a GPU to the CPU."""

import base64
import os
import re
import subprocess
import sys

import httpx
import onnxruntime
import pytest
import requests

from fastapi_service import APPS, running
from servelab.core.paths import DEFAULT_IMAGE, REPO_ROOT
from servelab.core.procs import ServerProcess, cpu_count, free_port, wait_http_ok
from servelab.servers.fastapi.runtimes import INFERENCES_PER_CPU

CPU_ONLY = not any(p in onnxruntime.get_available_providers() for p in ("CUDAExecutionProvider", "TensorrtExecutionProvider"))


def test_servelab_serve_answers_a_plain_requests_client(artifacts, tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "servelab", "serve", "fastapi-onnx", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with ServerProcess(cmd, f"{url}/ready", tmp_path / "serve.log", env={"MODEL_DIR": str(artifacts.manifest.parent)}):
        image = base64.b64encode(DEFAULT_IMAGE.read_bytes()).decode()
        response = requests.post(f"{url}/predict", json={"image": image}, timeout=30)
    assert response.status_code == 200
    assert response.json()["prediction"] == "Dairy product"
    log = (tmp_path / "serve.log").read_text()
    assert "STAND-IN MODEL" in log and "providers active: CPUExecutionProvider" in log
    # With no settings it says why it runs as it does: the machine's cores, and what one image cost it.
    assert "the machine's defaults for" in log and "none waits for a batch (BATCH_TIMEOUT_MS=0)" in log
    # On the CPU, one server process per CPU, each sized for its one CPU (servelab.servers.fastapi.workers).
    assert f"servelab: {cpu_count()} server processes on port {port}, 1 CPU(s) each (WORKERS=auto)" in log
    assert log.count(f"{INFERENCES_PER_CPU} inference(s) at once on 1 intra-op thread(s) each") == cpu_count()
    probe = re.search(r"start-up probe, coffee.jpg: preprocessing ([\d.]+) ms, one image's inference ([\d.]+) ms: "
                      r"the model is (\d+)% of an image's work", log)
    assert probe and float(probe[1]) > 0 and float(probe[2]) > 0, log


@pytest.mark.skipif(not CPU_ONLY, reason="this machine has a GPU execution provider")
@pytest.mark.parametrize("kind", ["pytorch", "onnx"])
def test_require_gpu_refuses_to_start_on_the_cpu(kind, artifacts):
    cmd = [sys.executable, "-m", "uvicorn", APPS[kind], "--host", "127.0.0.1", "--port", str(free_port())]
    env = {**os.environ, "MODEL_DIR": str(artifacts.manifest.parent), "REQUIRE_GPU": "1"}
    run = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "REQUIRE_GPU=1 but the model would run on the CPU" in run.stderr


@pytest.mark.skipif(not CPU_ONLY, reason="this machine has a GPU execution provider")
def test_a_batcher_process_that_cannot_serve_the_model_ends_servelab_serve_with_its_reason(artifacts):
    """SHARED_BATCHER: the model loads in the batcher process before any server process starts; a refusal
    there ends ``servelab serve`` at once, with the reason and nothing left running."""
    cmd = [sys.executable, "-m", "servelab", "serve", "fastapi-onnx", "--port", str(free_port())]
    env = {**os.environ, "MODEL_DIR": str(artifacts.manifest.parent), "REQUIRE_GPU": "1", "WORKERS": "2",
           "SHARED_BATCHER": "1"}
    run = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "the batcher process cannot serve the model: REQUIRE_GPU=1 but the model would run on the CPU" in run.stderr
    assert "Started server process" not in run.stderr


@pytest.mark.skipif(not CPU_ONLY, reason="this machine has a GPU execution provider")
def test_a_requested_gpu_provider_that_is_missing_is_reported(artifacts, tmp_path):
    with running("onnx", artifacts, tmp_path, ort_providers="cuda,cpu") as url:
        ready = httpx.get(f"{url}/ready").json()
    assert ready["runtime"]["providers"] == ["CPUExecutionProvider"]
    assert any("CUDAExecutionProvider" in warning for warning in ready["warnings"])


def test_not_ready_until_the_warm_up_inference_succeeded(artifacts, tmp_path):
    # A large MAX_REQUEST_IMAGES makes the warm-up (it runs the largest batch too) last a second or so.
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", APPS["onnx"], "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    env = {"MODEL_DIR": str(artifacts.manifest.parent), "MAX_REQUEST_IMAGES": "256"}
    with ServerProcess(cmd, f"{url}/health", tmp_path / "warm-up.log", env=env, cwd=REPO_ROOT):
        ready = httpx.get(f"{url}/ready")
        refused = httpx.post(f"{url}/predict", json={"image": "irrelevant"})
        for response in (ready, refused):
            assert response.status_code == 503
            assert "warming up" in response.json()["detail"] and response.headers["retry-after"]
        wait_http_ok(f"{url}/ready", 60)
