"""Every GPU path, for real, on an NVIDIA GPU (`make gpu-check` runs these: `pytest -m gpu`).

Where nvidia-smi lists no GPU each test is skipped with that reason (tests/conftest.py); nothing here
fakes a GPU. The answers are checked against the CPU on real photos (servelab/data/photos).
"""

import re
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from fastapi_onnx.app import load
from fastapi_service import b64, running
from model_batches import infer_in_batches
from servelab.core.catalogue import compared
from servelab.core.hardware import gpu_count, stack
from servelab.core.inference import OnnxClassifier, TorchClassifier
from servelab.core.paths import REPO_ROOT
from servelab.core.photos import evaluation_set, pixels
from servelab.core.preprocess import preprocess
from servelab.core.procs import ServerProcess, cpu_count, free_port
from servelab.core.settings import Settings, get_settings
from servelab.core.variants.build import PRECISION
from servelab.measure.monitor import Monitor
from servelab.servers.fastapi.runtimes import CPU, CUDA, TENSORRT, max_infer_batch

pytestmark = pytest.mark.gpu

PHOTOS = 64  # real photos per agreement check: enough to see a disagreement, quick on any GPU
FP32_AGREEMENT = 0.98  # top-1 with the CPU: fp32 kernels differ only in rounding
FP16_AGREEMENT = 0.95  # top-1 with the CPU's fp32: half precision moves near-ties


@pytest.fixture(scope="module")
def photos(artifacts):
    from servelab.core.artifacts import load_manifest

    chosen = evaluation_set()[:PHOTOS]
    kwargs = load_manifest(artifacts.manifest).preprocess_kwargs()
    floats = np.stack([preprocess(p.read_bytes(), **kwargs) for p in chosen])
    return floats, pixels(chosen)


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(a.argmax(1) == b.argmax(1)))


def settings(**overrides) -> Settings:
    """The process's settings with some changed: the app's load needs the model folder too (ModelSettings)."""
    return get_settings().model_copy(update=overrides)


def test_pytorch_on_cuda_agrees_with_the_cpu_on_real_photos(artifacts, photos):
    floats, _ = photos
    cpu = TorchClassifier(artifacts.manifest, device="cpu").infer(floats)
    gpu = TorchClassifier(artifacts.manifest, device="cuda:0")
    assert gpu.describe()["device"] == "cuda:0"
    assert agreement(gpu.infer(floats), cpu) >= FP32_AGREEMENT
    half = TorchClassifier(artifacts.manifest, device="cuda:0", fp16=True)
    assert half.describe()["dtype"] == "float16"
    assert agreement(half.infer(floats), cpu) >= FP16_AGREEMENT


def test_onnx_runtime_cuda_provider_is_active_and_agrees_with_the_cpu(artifacts, photos):
    floats, _ = photos
    serving = settings(ort_providers="cuda", require_gpu=True)
    backend = load(serving)
    assert backend.on_gpu and backend.classifier.active_providers[0] == CUDA, backend.where()
    # ORT_SHAPE_POLICY=auto is buckets on a GPU: one call takes at most the service's largest batch, so the
    # 64 photos go in batches of that size (tests/unit/test_gpu_check.py holds the batching on the CPU).
    largest = max_infer_batch(serving)
    assert backend.classifier.shape_policy == "buckets" and backend.classifier.max_batch == largest < PHOTOS
    gpu = infer_in_batches(backend.infer, floats, largest)
    cpu = OnnxClassifier(artifacts.onnx, providers=[CPU])
    assert len(gpu) == PHOTOS and agreement(gpu, cpu.infer(floats)) >= FP32_AGREEMENT


@pytest.mark.parametrize("policy", ["buckets", "pad"])
def test_alternating_batch_sizes_keep_stable_shapes(artifacts, photos, policy):
    """A dynamic batcher's alternation (6, 10, 6, ...): on an H100 each change of shape cost 0.4-2.2 s with
    one session; with a session per bucket 2.0-3.4 ms per batch, padded to 16 3.1-6.2 ms. How fast is a
    benchmark's to say (`servelab gpu-check`'s record); this test holds the mechanism: no session ever
    changes shape, so none pays that cost."""
    floats, _ = photos
    serving = settings(ort_providers="cuda", ort_shape_policy=policy, require_gpu=True)
    backend = load(serving)
    assert backend.details["provider_options"][CUDA]["cudnn_conv_algo_search"] == "HEURISTIC"
    for size in backend.warm_up_sizes(serving):
        backend.infer(floats[:size])
    before = sum(c["runs"] for c in backend.session_counts())
    for n in [6, 10] * 10 + [1, 15] * 5:
        assert len(backend.infer(floats[:n])) == n
    assert sum(c["runs"] for c in backend.session_counts()) - before == 30  # one session run per batch
    assert all(c["shape_changes"] == 0 for c in backend.session_counts()), backend.session_counts()


def test_fp16_variant_runs_on_the_cuda_provider_and_agrees_with_fp32_on_the_cpu(artifacts, photos):
    floats, crops = photos
    serving = settings(ort_providers="cuda", onnx_variant="fp16", require_gpu=True)
    backend = load(serving)
    # The variant's precision is the project's name for it (fp32, int8, fp16: servelab.core.variants.build).
    assert backend.on_gpu and backend.takes_uint8 and backend.variant["precision"] == PRECISION["fp16"] == "fp16"
    half = infer_in_batches(backend.infer, crops, max_infer_batch(serving))
    cpu = OnnxClassifier(artifacts.onnx, providers=[CPU])
    assert len(half) == PHOTOS and agreement(half, cpu.infer(floats)) >= FP16_AGREEMENT


def test_tensorrt_provider_where_the_gpu_and_libraries_support_it(artifacts, photos, tmp_path):
    found = stack()
    if TENSORRT not in found.get("onnxruntime_providers", []) or not found.get("tensorrt"):
        pytest.skip(f"TensorRT not usable here: onnxruntime providers {found.get('onnxruntime_providers')}, "
                    f"tensorrt package {found.get('tensorrt')}")
    floats, _ = photos
    serving = settings(ort_providers="tensorrt", trt_cache_path=tmp_path, require_gpu=True)
    backend = load(serving)
    assert backend.classifier.active_providers[0] == TENSORRT, backend.where()
    assert "trt_fp16_enable" in backend.details["provider_options"][TENSORRT]
    assert not backend.classifier.options_not_in_force()  # fp16 and the rest, as the settings ask
    trt = infer_in_batches(backend.infer, floats, max_infer_batch(serving))  # buckets here too
    cpu = OnnxClassifier(artifacts.onnx, providers=[CPU])
    assert len(trt) == PHOTOS and agreement(trt, cpu.infer(floats)) >= FP16_AGREEMENT
    assert any(tmp_path.iterdir())  # the engine cache the guide asks for was written


@pytest.mark.parametrize("kind", ["pytorch", "onnx"])
def test_require_gpu_service_starts_on_the_gpu_and_ready_says_where(kind, artifacts, tmp_path):
    with running(kind, artifacts, tmp_path, require_gpu=1, ort_providers="cuda", torch_device="cuda") as url:
        ready = httpx.get(f"{url}/ready", timeout=30).json()
        answer = httpx.post(f"{url}/predict", json={"image": b64(evaluation_set()[0].read_bytes())}, timeout=30)
    runtime = ready["runtime"]
    assert runtime["on_gpu"] is True
    # PREPROCESS_PROCESSES=auto: on a GPU the CPUs but one decode, in worker processes.
    assert (ready["preprocess_mode"], ready["preprocess_workers"]) == ("processes", max(1, cpu_count() - 1))
    assert runtime.get("device", "").startswith("cuda") or runtime["providers"][0] == CUDA
    assert answer.status_code == 200 and answer.json()["prediction"]


def test_servelab_serve_fastapi_onnx_finds_cuda_without_torch_and_runs_with_heuristic(artifacts, tmp_path):
    """The ONNX service never imports torch: CUDA's libraries come from the nvidia-* wheels on sys.path
    (preload_cuda_libraries), and the options asked of the CUDA provider are the ones its session holds."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "servelab", "serve", "fastapi-onnx", "--port", str(port)]
    env = {"MODEL_DIR": str(artifacts.manifest.parent), "REQUIRE_GPU": "1", "ORT_PROVIDERS": "cuda,cpu",
           "ORT_CUDNN_CONV_ALGO_SEARCH": "HEURISTIC"}
    with ServerProcess(cmd, f"{url}/ready", tmp_path / "serve.log", env=env, cwd=REPO_ROOT) as server:
        runtime = httpx.get(f"{url}/ready", timeout=30).json()["runtime"]
        # On a GPU the model is in the batcher process (SHARED_BATCHER=auto): read every process's libraries.
        processes = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
        maps = "".join(Path(f"/proc/{p.pid}/maps").read_text() for p in processes)
    assert runtime["on_gpu"] is True and runtime["providers"][0] == CUDA, runtime
    assert runtime["batcher"] == "a process shared by every server process", runtime  # the GPU's default
    assert runtime["provider_options"][CUDA]["cudnn_conv_algo_search"] == "HEURISTIC", runtime["provider_options"]
    cudart = {line.split()[-1] for line in maps.splitlines() if "/libcudart.so" in line}
    assert cudart and all(re.search(r"/nvidia/[^/]+/lib/libcudart\.so", path) for path in cudart), cudart
    assert "libtorch" not in maps


@pytest.mark.parametrize("stage", [top for top, _ in compared("instances")])
def test_triton_kind_gpu_instances_are_on_gpu_device_ids(stage, artifacts, tmp_path):
    from servelab.servers.triton.configs import STAGES
    from servelab.servers.triton.server import model_config, start_local

    log = tmp_path / "tritonserver.log"
    with start_local(STAGES[stage], kind="gpu", repository=get_settings().triton_model_repository, log=log) as server:
        config = model_config(server.url, STAGES[stage].triton.model)
    groups = config["instance_group"]
    assert {g["kind"] for g in groups} == {"KIND_GPU"}
    assert {int(i) for g in groups for i in g["gpus"]} <= set(range(gpu_count()))
    assert sum(int(g["count"]) * len(g["gpus"]) for g in groups) == 4  # as many instances as on the P100 node
    if gpu_count() == 1:
        assert "this machine has 1" in config["parameters"]["servelab_gpu_placement"]["string_value"]
    text = log.read_text()
    # Each instance said where it really runs (the models log it after loading on that device).
    assert "on cuda:0" in text or "CUDAExecutionProvider" in text, text[-2000:]


def test_nvml_samples_utilization_and_memory_under_load():
    import torch

    x = torch.randn(4096, 4096, device="cuda:0")
    with Monitor(interval_s=0.1) as monitor:
        ends = time.monotonic() + 2.0
        while time.monotonic() < ends:  # bounded: two seconds of matrix products
            x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()
    series = monitor.result().gpus
    assert series and monitor.gpu_note is None
    assert max(series[0].util_pct) > 0 and max(series[0].mem_used_mib) > 0


def test_the_stack_names_the_gpu_driver_and_cuda():
    found = stack()
    assert found["gpus"] and found["driver"]
    assert found.get("torch_cuda") and found.get("torch_sees_gpus", 0) >= 1, found
    assert found["onnxruntime"].startswith("onnxruntime-gpu") and CUDA in found["onnxruntime_providers"], found
