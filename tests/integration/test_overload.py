"""Overload and load shedding on real servers on 127.0.0.1: the FastAPI service's bounded queue
(MAX_QUEUE_IMAGES, MAX_QUEUE_DELAY_MS), Triton's queue policy, the load generator's count of shed
requests, and GourmetGram's "busy" page."""

import asyncio

import httpx
import pytest

from fastapi_service import metric_samples, predict, predict_concurrently, running
from servelab.core.paths import DEFAULT_IMAGE

BURST = 48  # requests sent at once: far more than two CPUs serve before the next arrives
PHOTO = DEFAULT_IMAGE.read_bytes()


@pytest.fixture(scope="module")
def services(model, tmp_path_factory):
    """The ONNX service three ways: at most 2 requests held, a 50 ms queue delay, and unbounded; each with one
    preprocessing thread and one inference at a time, so a burst queues there, not in the client."""
    logs = tmp_path_factory.mktemp("overload-logs")
    one = {"preprocess_processes": 0, "worker_threads": 1, "model_instances": 1, "intra_op_threads": 1}
    with (running("onnx", model, logs, max_queue_requests=2, **one) as bounded,
          running("onnx", model, logs, max_queue_delay_ms=50, **one) as delayed,
          running("onnx", model, logs, **one) as unbounded):
        yield {"bounded": bounded, "delayed": delayed, "unbounded": unbounded}


def shed_counts(client: httpx.Client, url: str) -> dict[str, float]:
    return metric_samples(client.get(f"{url}/metrics").text, "servelab_shed_requests_total")


def burst(url: str) -> list[httpx.Response]:
    return asyncio.run(predict_concurrently(url, [PHOTO] * BURST, BURST))


@pytest.mark.parametrize("which, reason", [("bounded", "queue_full"), ("delayed", "queue_timeout")])
def test_a_bounded_queue_sheds_part_of_a_burst_with_503_and_retry_after(services, client, which, reason):
    url = services[which]
    before = shed_counts(client, url)
    responses = burst(url)
    statuses = [r.status_code for r in responses]
    shed = [r for r in responses if r.status_code == 503]
    assert set(statuses) == {200, 503}, statuses  # some shed, some served, nothing else
    for r in shed:
        assert r.headers["retry-after"] == "1"
        body = r.json()
        assert body["shed"] == reason and body["retry_after_s"] == 1 and "overloaded" in body["detail"], body
    for r in responses:
        if r.status_code == 200:
            assert r.json()["prediction"] == "Dairy product"
    # The server counted exactly the 503s this client saw, under their reason.
    after = shed_counts(client, url)
    assert after[f'{{reason="{reason}"}}'] - before[f'{{reason="{reason}"}}'] == len(shed)
    assert sum(after.values()) - sum(before.values()) == len(shed)
    # Right after the burst the service is ready and serves a normal request.
    assert client.get(f"{url}/ready").status_code == 200
    assert predict(client, url, PHOTO)["prediction"] == "Dairy product"


def test_ready_says_the_bound(services, client):
    batching = client.get(f"{services['bounded']}/ready").json()["batching"]
    assert batching["max_queue_requests"] == 2 and batching["max_queue_delay_ms"] == 0


def test_unbounded_serves_the_whole_burst(services, client):
    url = services["unbounded"]
    responses = burst(url)
    assert [r.status_code for r in responses] == [200] * BURST
    assert set(shed_counts(client, url).values()) == {0.0}
