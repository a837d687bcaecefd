"""The load generator against a real local tritonserver: both protocols, tensor and bytes input,
and Triton's statistics diffed across each run (queue vs compute, the batch sizes formed)."""


import pytest

from servelab.core.catalogue import get_stage
from servelab.core.paths import DEFAULT_IMAGE
from servelab.measure.loadgen import Labels, run_bench
from servelab.measure.records import Load
from servelab.measure.targets import TritonTarget
from servelab.servers.triton import server

PHOTO = DEFAULT_IMAGE.read_bytes()


@pytest.fixture
def triton(local_triton) -> server.LocalTriton:
    """The tier's tritonserver (tests/integration/conftest.py); each test switches it to the stage it needs."""
    return local_triton


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_dynamic_batching_shows_in_the_statistics_delta(triton, artifacts, protocol: str) -> None:
    triton.apply_stage(get_stage("onnx-dyn"))
    url = triton.url if protocol == "http" else triton.grpc_url
    target = TritonTarget(url, "food_classifier_onnx", PHOTO, protocol=protocol, input="tensor",
                          manifest=artifacts.manifest)
    r = run_bench(target, Load.closed(8, requests=48, warmup=8), Labels("onnx-dyn", server_pid=triton.process.pid))
    assert r.stats.successes == 48 and r.stats.errors == {}
    b = r.breakdown
    assert b.source == "triton-stats"
    assert b.server_requests == 48  # the warm-up is not in the delta
    assert sum(size * n for size, n in b.batch_sizes.items()) == 48
    assert max(b.batch_sizes) > 1 and b.mean_batch_size > 1  # eight senders, one instance: batches form
    assert b.queue_ms > 0 and b.service_ms > 0
    assert r.monitors.rss_mib and min(r.monitors.rss_mib) > 50  # tritonserver and its backend stubs


def test_sequential_bytes_requests(triton, artifacts) -> None:
    triton.apply_stage(get_stage("ensemble"))  # takes the encoded image, like food_classifier
    target = TritonTarget(triton.url, "food_classifier_ensemble", PHOTO, input="bytes")
    r = run_bench(target, Load.sequential(10, warmup=2), Labels("ensemble"))
    assert r.stats.successes == 10 and r.stats.errors == {}
    assert r.breakdown.server_requests == 10 and r.breakdown.batch_sizes == {1: 10}
    # With 6 senders, requests wait in the steps' queues; the ensemble's breakdown must show it.
    busy = run_bench(target, Load.closed(6, 60, warmup=2), Labels("ensemble"))
    assert busy.breakdown.queue_ms > busy.breakdown.service_ms
    assert busy.stats.latency.p50_ms > busy.breakdown.queue_ms
