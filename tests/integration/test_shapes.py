"""Stable shapes for ONNX Runtime (ORT_SHAPE_POLICY), forced on this CPU: every session only ever sees
one shape, every bucket runs before the server is ready, and padded rows never reach a response.

On a GPU a run whose input shape differs from the session's previous run costs 0.4-2.2 s (an H100,
onnxruntime-gpu's CUDA provider); on the CPU it costs nothing, so the policy is forced here and the
counts the servers report themselves (FastAPI's /metrics and /ready, Triton's metrics port) are
what is checked. ``off`` must show shape changes, or these tests could not fail.
"""

import asyncio
import os
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from fastapi_service import b64, metric_samples, predict, predict_concurrently, running
from photos import variants
from servelab.core.artifacts import load_manifest
from servelab.core.hardware import instances_say
from servelab.core.inference import OnnxClassifier, batch_buckets
from servelab.core.postprocess import top1
from servelab.core.preprocess import preprocess_batch
from servelab.core.settings import get_settings
from servelab.servers.fastapi.pipeline import PROBE_RUNS
from servelab.servers.triton import client, server
from servelab.servers.triton.configs import effective_config, get_stage, render
from triton_repo import make_repository

PHOTOS = variants()
NAMES = list(PHOTOS)
BUCKETS = [1, 2, 4, 8, 16]  # MAX_REQUEST_IMAGES 16 is the largest batch the service can see


# --- the classifier itself, in process ---

def test_buckets_are_powers_of_two_up_to_the_largest_batch():
    assert batch_buckets(16) == BUCKETS
    assert batch_buckets(12) == [1, 2, 4, 8, 12]
    assert batch_buckets(1) == [1]


@pytest.fixture(scope="module")
def photos_batch(artifacts) -> np.ndarray:
    return preprocess_batch(list(PHOTOS.values()), **load_manifest(artifacts.manifest).preprocess_kwargs())


@pytest.mark.parametrize("policy", ["buckets", "pad"])
def test_padding_changes_no_answer_and_no_row_count(artifacts, photos_batch, policy):
    plain = OnnxClassifier(artifacts.onnx)
    fixed = OnnxClassifier(artifacts.onnx, shape_policy=policy, max_batch=16)
    assert fixed.batch_sizes == (BUCKETS if policy == "buckets" else [16])
    for n in (1, 3, 5, 7, len(photos_batch)):
        got = fixed.infer(photos_batch[:n])
        assert got.shape == (n, 11)
        np.testing.assert_allclose(got, plain.infer(photos_batch[:n]), atol=1e-4)
    counts = fixed.session_counts()
    assert sum(c["runs"] for c in counts) == 5 and all(c["shape_changes"] == 0 for c in counts), counts


def test_auto_is_off_on_the_cpu_and_a_too_large_batch_is_a_clear_error(artifacts, photos_batch):
    assert OnnxClassifier(artifacts.onnx, shape_policy="auto", max_batch=16).shape_policy == "off"
    with pytest.raises(ValueError, match="larger than the largest"):
        OnnxClassifier(artifacts.onnx, shape_policy="buckets", max_batch=4).infer(photos_batch[:5])


# --- FastAPI: the same service the fastapi-onnx(-dyn) and Ray stages run ---

def session_metrics(text: str) -> tuple[dict[str, float], dict[str, float]]:
    """(runs, shape changes) per session, by its session_batch label, from /metrics."""
    def by_session(name: str) -> dict[str, float]:
        return {k.split('"')[1]: v for k, v in metric_samples(text, name).items()}
    return by_session("servelab_onnx_session_runs_total"), by_session("servelab_onnx_session_shape_changes_total")


@pytest.fixture(scope="module", params=["buckets", "pad", "off"])
def service(request, artifacts, tmp_path_factory) -> Iterator[dict]:
    """An ONNX service with dynamic batching under one policy; ``at_ready``: /ready and /metrics read
    the moment /ready first answered 200, before any request."""
    logs = tmp_path_factory.mktemp(f"shapes-{request.param}")
    with running("onnx", artifacts, logs, ort_shape_policy=request.param, max_batch_size=8,
                 batch_timeout_ms=20) as url, httpx.Client(timeout=60) as http:
        ready = http.get(f"{url}/ready").json()
        yield {"policy": request.param, "url": url, "ready": ready, "metrics": http.get(f"{url}/metrics").text}


def test_every_session_ran_once_before_ready(service):
    runtime = service["ready"]["runtime"]
    assert runtime["shape_policy"] == service["policy"]
    runs, changes = session_metrics(service["metrics"])
    # Besides the warm-up, the start-up probe's PROBE_RUNS inferences of one image (Pipeline.warm_up).
    if service["policy"] == "off":
        assert runtime["sessions"] == 1 and list(runs) == ["any"]
        # warm-up at 1, 8 and 16 images, then the probe's single images: the shape moved three times
        assert runs["any"] == 3 + PROBE_RUNS and changes["any"] == 3
        return
    sizes = BUCKETS if service["policy"] == "buckets" else [16]
    assert runtime["sessions"] == len(sizes) and runtime["session_batch_sizes"] == sizes
    expected = {str(n): 1 + PROBE_RUNS * (n == sizes[0]) for n in sizes}  # one image goes to the smallest session
    assert runs == expected  # the warm-up and the probe, and nothing else yet
    assert runtime["session_counts"] == [{"session_batch": str(n), "runs": expected[str(n)], "shape_changes": 0}
                                         for n in sizes]


def test_concurrent_load_never_changes_a_sessions_shape(service):
    url = service["url"]
    order = [name for _ in range(4) for name in NAMES]

    async def load() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as http:
            batches = [http.post(f"{url}/predict/batch", json={"images": [b64(PHOTOS[n]) for n in NAMES[:k]]})
                       for k in (3, 5, 7, 2)]
            singles = predict_concurrently(url, [PHOTOS[n] for n in order], 16)
            *batched, single = await asyncio.gather(*batches, singles)
            return [*batched, *single]

    responses = asyncio.run(load())
    assert [r.status_code for r in responses] == [200] * len(responses)
    sizes = {int(r.headers["server-timing"].rsplit("batch;desc=", 1)[1]) for r in responses}
    assert len(sizes) > 1, sizes  # the sessions were handed batches of several sizes
    with httpx.Client(timeout=60) as http:
        runs, changes = session_metrics(http.get(f"{url}/metrics").text)
        counts = http.get(f"{url}/ready").json()["runtime"]["session_counts"]
    assert {c["session_batch"]: c["shape_changes"] for c in counts} == changes
    if service["policy"] == "off":
        assert changes["any"] > 2, changes  # more than the warm-up's two: the counter sees real changes
    else:
        assert set(changes.values()) == {0}, changes
        assert sum(runs.values()) > len(runs), runs


def test_padded_rows_never_reach_a_response(service):
    url = service["url"]
    with httpx.Client(timeout=60) as http:
        singles = [predict(http, url, PHOTOS[n]) for n in NAMES]
        for k in (1, 3, 5, 7, len(NAMES)):
            response = http.post(f"{url}/predict/batch", json={"images": [b64(PHOTOS[n]) for n in NAMES[:k]]})
            assert response.status_code == 200, response.text
            got = response.json()["predictions"]
            assert len(got) == k
            for one, want in zip(got, singles):
                assert one["prediction"] == want["prediction"]
                assert abs(one["probability"] - want["probability"]) <= 1e-4


# --- Triton: the Python-backend stand-in for the ONNX Runtime backend ---

def test_onnx_configs_warm_every_batch_size_and_carry_the_cudnn_search(artifacts, monkeypatch):
    """What the lab node's real ONNX Runtime backend gets from `servelab triton stage`."""
    repository = get_settings().triton_model_repository
    for stage, expected in (("onnx-dyn", "1"), ("onnx-u8", "1")):
        config = effective_config(get_stage(stage), get_stage(stage).triton.model, kind="gpu", onnxruntime=True,
                                  repository=repository)
        warmups = [(w.batch_size, w.name) for w in config.model_warmup]
        assert warmups == [(n, f"batch {n}") for n in range(1, 17)], render(config)
        assert all(i.zero_data for w in config.model_warmup for i in w.inputs.values())
        assert config.parameters["cudnn_conv_algo_search"].string_value == expected
    monkeypatch.setenv("ORT_CUDNN_CONV_ALGO_SEARCH", "EXHAUSTIVE")
    get_settings.cache_clear()
    try:
        config = effective_config(get_stage("onnx-1"), "food_classifier_onnx", kind="gpu", onnxruntime=True,
                                  repository=repository)
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
    assert config.parameters["cudnn_conv_algo_search"].string_value == "0"
    pt = effective_config(get_stage("pt-dyn"), "food_classifier", kind="gpu", onnxruntime=True, repository=repository)
    assert not pt.model_warmup and "cudnn_conv_algo_search" not in pt.parameters


def triton_sessions(triton: server.LocalTriton) -> dict[str, tuple[float, float]]:
    """(runs, shape changes) per session_batch label, summed over instances, from Triton's metrics port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{triton.ports.metrics}/metrics") as response:
        text = response.read().decode()
    totals: dict[str, list[float]] = {}
    for i, name in enumerate(("servelab_onnx_session_runs", "servelab_onnx_session_shape_changes")):
        for labels, value in metric_samples(text, name).items():
            batch = labels.split('session_batch="')[1].split('"')[0]
            totals.setdefault(batch, [0.0, 0.0])[i] += value
    return {k: (v[0], v[1]) for k, v in totals.items()}


@pytest.fixture(scope="module", params=["buckets", "off"])
def triton(request, artifacts, tmp_path_factory) -> Iterator[tuple[str, server.LocalTriton, dict]]:
    """onnx-dyn (the stand-in, dynamic batching up to 16) with ORT_SHAPE_POLICY forced; the sessions'
    counts as the server reported them when the model first said READY."""
    repository = make_repository(tmp_path_factory.mktemp(f"shapes-repository-{request.param}"))
    log = tmp_path_factory.mktemp(f"shapes-triton-{request.param}") / "tritonserver.log"
    with pytest.MonkeyPatch.context() as env:
        env.setitem(os.environ, "ORT_SHAPE_POLICY", request.param)
        local = server.start_local(get_stage("onnx-dyn"), kind="cpu", repository=repository, log=log)
    with local:
        yield request.param, local, triton_sessions(local)


def test_triton_warms_every_bucket_before_ready(triton):
    policy, _, at_ready = triton
    if policy == "off":
        assert list(at_ready) == ["any"] and at_ready["any"][1] > 0  # Triton's own warm-up: 1 to 16
        return
    # initialize ran each bucket once, then Triton's model_warmup (a batch of each size from 1 to 16) ran
    # each size on the smallest bucket that holds it: 1; 2; 3-4; 5-8; 9-16.
    assert at_ready == {"1": (2, 0), "2": (2, 0), "4": (3, 0), "8": (5, 0), "16": (9, 0)}


def test_triton_batches_keep_each_sessions_shape_and_drop_padded_rows(triton, artifacts):
    policy, local, _ = triton
    manifest = load_manifest(artifacts.manifest)
    tensors = preprocess_batch(list(PHOTOS.values()), **manifest.preprocess_kwargs())
    expected = top1(OnnxClassifier(artifacts.onnx).infer(tensors), manifest.classes)
    connection = grpcclient.InferenceServerClient(local.grpc_url)

    def send(i: int) -> list:
        """A request of 1-3 images; its answer, row by row."""
        rows = [(i + j) % len(tensors) for j in range(i % 3 + 1)]
        result = connection.infer("food_classifier_onnx", client.tensor_inputs("grpc", tensors[rows]),
                                  outputs=client.tensor_outputs("grpc"))
        return rows, client.tensor_predictions(result)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(send, range(64)))
    connection.close()
    for rows, got in answers:
        assert len(got) == len(rows)
        assert [p.label for p in got] == [expected[r].label for r in rows]
        np.testing.assert_allclose([p.probability for p in got], [expected[r].probability for r in rows], atol=1e-4)
    counts = triton_sessions(local)
    if policy == "off":
        assert counts["any"][1] > 0
    else:
        assert {batch: changes for batch, (_, changes) in counts.items()} == {str(n): 0 for n in BUCKETS}
        assert sum(runs for runs, _ in counts.values()) > 2 * len(BUCKETS)  # the load ran on them
    said = {"buckets": "ORT_SHAPE_POLICY=buckets: 5 session(s), batch sizes [1, 2, 4, 8, 16]",
            "off": "ORT_SHAPE_POLICY=off: 1 session(s), batch sizes any"}[policy]
    log = local.process.log.read_text()
    assert log.count(said) == 1  # the settings reached the one instance
    assert instances_say(log, "food_classifier_onnx", 1) == "1x CPUExecutionProvider on cpu"  # one line per instance
