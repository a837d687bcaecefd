"""The load generator against the real FastAPI ONNX service: its Server-Timing header split into
queue and service time, and the batch sizes its dynamic batcher formed."""

from collections.abc import Iterator

import pytest

from fastapi_service import running
from servelab.core.paths import DEFAULT_IMAGE
from servelab.measure.loadgen import Labels, run_bench
from servelab.measure.records import Load
from servelab.measure.targets import FastAPITarget

PHOTO = DEFAULT_IMAGE.read_bytes()


@pytest.fixture(scope="module")
def batching(artifacts, tmp_path_factory) -> Iterator[str]:
    with running("onnx", artifacts, tmp_path_factory.mktemp("logs"), max_batch_size=8, batch_timeout_ms=10) as url:
        yield url


def test_server_timing_splits_latency(batching: str) -> None:
    r = run_bench(FastAPITarget(batching, PHOTO), Load.sequential(10, warmup=2), Labels("fastapi-onnx-dyn"))
    assert r.stats.successes == 10 and r.stats.errors == {}
    b = r.breakdown
    assert b.source == "server-timing" and b.server_requests == 10
    assert {"queue", "preprocess", "infer", "total"} <= set(b.parts_ms)
    assert b.service_ms == pytest.approx(b.parts_ms["preprocess"] + b.parts_ms["infer"])
    # The client waits for everything the server does, and more (network, JSON, base64).
    assert r.stats.latency.mean_ms > b.parts_ms["total"] > b.service_ms > 0
    assert b.batch_sizes == {1: 10}  # alone, each request is its own inference


def test_dynamic_batches_form_under_concurrency(batching: str) -> None:
    r = run_bench(FastAPITarget(batching, PHOTO), Load.closed(8, requests=48, warmup=8), Labels("fastapi-onnx-dyn"))
    assert r.stats.successes == 48
    b = r.breakdown
    assert max(b.batch_sizes) > 1 and b.mean_batch_size > 1
    assert b.queue_ms > 0


def test_batch_endpoint(batching: str) -> None:
    r = run_bench(FastAPITarget(batching, PHOTO, batch=4), Load.sequential(5, warmup=1), Labels("fastapi-onnx-dyn"))
    assert r.stats.successes == 5 and r.stats.errors == {}
    assert r.stats.items_per_s == pytest.approx(4 * r.stats.throughput_rps)
