"""The GPU-shaped stand-in (SIMULATED_GPU_MS, servelab.core.simulated_gpu) on real servers: under concurrency
batches form behind its flat wait, in FastAPI and in Triton's local ONNX stand-in, and every answer is still the
model's. Its speed is benchmarks/shared_batcher.py's to measure (--simulated-gpu-ms), not a test's."""

import asyncio

import httpx
import numpy as np
import tritonclient.http as triton_http

from fastapi_service import metric_samples, predict, predict_concurrently, running
from photos import variants
from servelab.core.artifacts import load_manifest
from servelab.core.inference import OnnxClassifier
from servelab.core.preprocess import preprocess_batch
from servelab.servers.triton import server
from servelab.servers.triton.configs import get_stage
from triton_repo import make_repository

PHOTOS = variants()
MS = 20  # long beside a request's CPU time here, so that requests wait for the stand-in and batches form


def test_fastapi_batches_fill_behind_the_stand_in_with_the_models_answers(artifacts, tmp_path):
    with running("onnx", artifacts, tmp_path, max_batch_size=16, batch_timeout_ms=5, simulated_gpu_ms=MS) as url, \
            httpx.Client(timeout=60) as client:
        ready = client.get(f"{url}/ready").json()
        singles = {name: predict(client, url, data) for name, data in PHOTOS.items()}
        before = metric_samples(client.get(f"{url}/metrics").text, "servelab_batch_size_count")[""]
        order = [name for _ in range(8) for name in PHOTOS]
        responses = asyncio.run(predict_concurrently(url, [PHOTOS[n] for n in order], 16))
        sizes = metric_samples(client.get(f"{url}/metrics").text, "servelab_batch_size_count")[""] - before
    assert f"flat {MS} ms per batch up to 16" in ready["runtime"]["stand_in"]
    assert any("GPU-shaped stand-in" in w for w in ready["warnings"])
    assert singles["jpeg"]["prediction"] == "Dairy product"  # the model's answer for this photo, not a stand-in's
    assert [r.status_code for r in responses] == [200] * len(order)
    for name, response in zip(order, responses):
        assert response.json()["prediction"] == singles[name]["prediction"], name
        assert abs(response.json()["probability"] - singles[name]["probability"]) <= 1e-4, name
    assert len(order) / sizes > 1, sizes  # the mean batch: fewer inferences than requests


def test_triton_onnx_dyn_batches_fill_behind_the_stand_in_with_the_models_logits(artifacts, tmp_path, monkeypatch):
    monkeypatch.setenv("SIMULATED_GPU_MS", str(MS))  # the server's environment reaches its Python stubs
    manifest = load_manifest(artifacts.manifest)
    batch = preprocess_batch(list(PHOTOS.values()), **manifest.preprocess_kwargs())
    want = OnnxClassifier(artifacts.onnx).infer(batch)
    stage = get_stage("onnx-dyn")
    with server.start_local(stage, kind="cpu", repository=make_repository(tmp_path / "repository"),
                            log=tmp_path / "tritonserver.log") as triton:
        client = triton_http.InferenceServerClient(triton.url, concurrency=16)  # 16 requests in flight at once
        inputs = [triton_http.InferInput("input", [1, *batch.shape[1:]], "FP32") for _ in range(8 * len(batch))]
        for i, x in enumerate(inputs):
            x.set_data_from_numpy(batch[i % len(batch)][None])
        sent = [client.async_infer(stage.triton.model, [x]) for x in inputs]
        got = [request.get_result().as_numpy("output")[0] for request in sent]
        stats = client.get_inference_statistics(stage.triton.model)["model_stats"][0]
        log = (tmp_path / "tritonserver.log").read_text(errors="replace")
    assert f"GPU-shaped stand-in: flat {MS} ms per batch up to 16" in log
    np.testing.assert_allclose(np.stack(got), want[np.arange(len(got)) % len(batch)], rtol=1e-4, atol=1e-4)
    assert int(stats["inference_count"]) > int(stats["execution_count"]), stats  # a mean batch above 1
