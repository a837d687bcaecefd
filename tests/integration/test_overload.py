"""Overload and load shedding on real servers on 127.0.0.1: the FastAPI service's bounded queue
(MAX_QUEUE_IMAGES, MAX_QUEUE_DELAY_MS), Triton's queue policy, the load generator's count of shed
requests, and GourmetGram's "busy" page."""

import asyncio
import io
import re
import socket
import statistics
import time

import httpx
import pytest

from fastapi_service import metric_samples, predict, predict_concurrently, running
from load_cases import overload
from servelab.core.catalogue import bounded
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.settings import ServeSettings
from servelab.measure.loadgen import Labels, run_bench
from servelab.measure.records import Load
from servelab.measure.targets import FastAPITarget, TritonTarget
from servelab.servers.triton import server
from servelab.servers.triton.configs import get_stage
from triton_repo import make_repository

BURST = 48  # requests sent at once: far more than two CPUs serve before the next arrives
PHOTO = DEFAULT_IMAGE.read_bytes()


@pytest.fixture(scope="module")
def services(model, tmp_path_factory):
    """The ONNX service three ways: at most 2 requests held, a 50 ms queue delay, and unbounded; each with one
    preprocessing thread and one inference of one request at a time, so a burst queues there, not in the client
    (batches would raise the capacity under the overload itself)."""
    logs = tmp_path_factory.mktemp("overload-logs")
    one = {"preprocess_processes": 0, "worker_threads": 1, "model_instances": 1, "intra_op_threads": 1,
           "max_batch_size": 1}
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
        # A refusal for a full queue is held (SHED_HOLD_MS) before it is answered: a retry storm slows down.
        assert reason != "queue_full" or r.elapsed.total_seconds() >= ServeSettings().shed_hold_ms / 1000
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


def test_the_load_generator_counts_shed_requests_apart_from_errors(services, client):
    """A closed loop of 16 senders on the bounded service: the record's shed count is the server's, no errors."""
    url = services["bounded"]
    before = sum(shed_counts(client, url).values())
    record = run_bench(FastAPITarget(url, PHOTO), Load.closed(16, requests=160, warmup=0), Labels("fastapi-onnx"))
    served = sum(shed_counts(client, url).values()) - before
    assert record.stats.errors == {} and record.stats.shed.get("queue_full", 0) > 0, record.stats
    assert sum(record.stats.shed.values()) == served
    assert record.stats.successes + served == record.stats.requests == 160


def test_senders_that_ignore_retry_after_are_refused_at_most_once_per_hold(services, client):
    """A closed loop sends again the moment a refusal arrives: held refusals cap how fast it can (at most one per
    sender per SHED_HOLD_MS), where immediate ones would come as fast as the service answers them."""
    url, senders, seconds = services["bounded"], 32, 3.0
    record = run_bench(FastAPITarget(url, PHOTO), Load.closed(senders, requests=None, duration_s=seconds, warmup=0),
                       Labels("fastapi-onnx"))
    hold_s = ServeSettings().shed_hold_ms / 1000
    assert record.stats.errors == {} and record.stats.successes > 0, record.stats
    assert 0 < sum(record.stats.shed.values()) <= senders * (record.stats.wall_s / hold_s + 1), record.stats


@pytest.fixture(scope="module")
def overloads(services):
    """The capacity of the unbounded service (closed loop, 8 senders), then 1.5x that for a few seconds on it
    and on the bounded one; and the service time (the sequential median)."""
    target = FastAPITarget(services["unbounded"], PHOTO)
    service_ms = run_bench(target, Load.sequential(30), Labels("fastapi-onnx")).stats.latency.p50_ms
    capacity = run_bench(target, Load.closed(8, requests=None, duration_s=2),
                         Labels("fastapi-onnx")).stats.throughput_rps
    runs = {which: overload(FastAPITarget(services[which], PHOTO), capacity, stage="fastapi-onnx", seconds=OVERLOAD_S,
                            config={"bound": which})
            for which in ("unbounded", "bounded")}
    return service_ms, capacity, runs


OVERLOAD_S = 4.0


def test_without_a_bound_latency_grows_with_time(overloads):
    service_ms, capacity, runs = overloads
    r = runs["unbounded"]
    t = r.timeline
    assert r.config["run"] == "overload" and r.config["multiple"] == 1.5
    assert r.load.rate == pytest.approx(1.5 * capacity)
    assert r.stats.shed == {} and sum(t.shed) == 0
    p99 = [v for v in t.p99_ms if v is not None]
    assert len(p99) >= 3 and max(p99[1:]) > p99[0], p99  # the timeline shows the growth
    # Every request is kept, with when it was sent: the queue grows, so later sends wait longer. By sends, not
    # by the timeline's p99: a bin's p99 is the wait at its end, so the first bin's already holds a second of
    # queue, and a capacity read low on a busy machine leaves the overload mild (CI once saw 340 then 560 ms).
    per = r.per_request
    assert len(per.sent_s) == len(per.latency_ms) == len(per.outcome) == r.stats.requests
    first = [ms for s, ms in zip(per.sent_s, per.latency_ms) if s < 0.5]
    last = [ms for s, ms in zip(per.sent_s, per.latency_ms) if s >= max(per.sent_s) - 1.0]
    assert first and statistics.median(last) > 2 * statistics.median(first), (first, last)
    assert per.latency_ms[per.sent_s.index(max(per.sent_s))] > 3 * service_ms


def test_with_a_bound_accepted_requests_stay_fast_and_the_rest_are_shed(overloads):
    service_ms, capacity, runs = overloads
    r = runs["bounded"]
    assert r.stats.errors == {} and r.stats.shed.get("queue_full", 0) > 0, r.stats
    assert sum(r.timeline.shed) == sum(r.stats.shed.values())
    assert r.per_request.outcome.count("shed:queue_full") == r.stats.shed["queue_full"]
    # At most 2 requests held at once: an accepted request waits for at most one other, where the unbounded
    # queue keeps growing. Side by side in one run, not against a fixed time (a shared machine's speed varies).
    assert r.stats.latency.p99_ms < runs["unbounded"].stats.latency.p99_ms / 2


@pytest.fixture(scope="module")
def triton(model, tmp_path_factory):
    """A tritonserver of this module's own, started at pt-dyn with a queue policy of 2 requests: the tier's
    ``local_triton`` needs every model variant built (minutes on a busy 2-CPU machine), this only the model."""
    root = tmp_path_factory.mktemp("overload-triton")
    stage = bounded(get_stage("pt-dyn"), max_queue_size=2)
    with server.start_local(stage, kind="cpu", repository=make_repository(root / "repository"),
                            log=root / "tritonserver.log") as local:
        yield local


@pytest.mark.parametrize("policy, reason", [({"max_queue_size": 2}, "queue_full"),
                                            ({"max_queue_size": 1000, "timeout_us": 20_000}, "queue_timeout")])
def test_triton_with_a_queue_policy_sheds_and_the_record_counts_it_as_shed(triton, policy, reason):
    stage = bounded(get_stage("pt-dyn"), **policy)
    config = triton.apply_stage(stage)
    said = config["dynamic_batching"]["default_queue_policy"]
    assert int(said["max_queue_size"]) == policy["max_queue_size"] and said["timeout_action"] == "REJECT"
    assert int(said.get("default_timeout_microseconds", 0)) == policy.get("timeout_us", 0)
    target = TritonTarget(triton.url, stage.triton.model, PHOTO)
    record = run_bench(target, Load.closed(32, requests=128, warmup=0), Labels(stage.name))
    assert record.stats.errors == {}, record.stats.errors  # Triton's 503s are shed, not errors
    assert record.stats.shed.get(reason, 0) > 0 and record.stats.successes > 0, record.stats
    assert record.stats.successes + sum(record.stats.shed.values()) == 128
    # Right after, requests one at a time are served: all of them with a free queue slot; with a 20 ms timeout
    # a lone request can still expire while a busy 2-CPU machine keeps Triton's scheduler waiting, so most.
    after = run_bench(target, Load.sequential(5, warmup=0), Labels(stage.name)).stats
    assert after.errors == {} and after.successes >= (5 if reason == "queue_full" else 3), after


def hold_requests(url: str, n: int) -> list[socket.socket]:
    """``n`` prediction requests that the service holds: headers sent, body not yet (the bound counts a request
    from its arrival), so the service is full for as long as the sockets stay open."""
    host, port = url.removeprefix("http://").split(":")
    held = []
    for _ in range(n):
        sock = socket.create_connection((host, int(port)))
        sock.sendall(f"POST /predict HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     "Content-Length: 1000\r\n\r\n{".encode())
        held.append(sock)
    return held


def test_gourmetgram_says_busy_while_the_service_sheds_and_recovers_by_itself(services, client):
    """GourmetGram on the bounded service (2 requests) while two other clients hold it full: a photo gets the
    friendly "busy, try again in 1 s" page (503 + Retry-After, no error card); once they are gone, the same
    upload is classified, with nothing restarted."""
    from servelab.core.settings import Settings
    from servelab.servers.gourmetgram.web import create_app

    url = services["bounded"]
    gourmetgram = create_app(Settings(backend="fastapi", fastapi_server_url=url, backend_timeout=30)).test_client()

    def upload():
        return gourmetgram.post("/classify", data={"photo": (io.BytesIO(PHOTO), "coffee.jpg")},
                                content_type="multipart/form-data")

    held = hold_requests(url, 2)
    try:
        time.sleep(0.5)  # both have reached the service
        page = upload()
    finally:
        for sock in held:
            sock.close()
    assert page.status_code == 503 and page.headers["Retry-After"] == "1"
    assert 'id="busy"' in page.text and 'id="error"' not in page.text and "Traceback" not in page.text
    message = " ".join(re.search(r'id="busy".*?<p>(.*?)</p>', page.text, re.S).group(1).split())
    assert message == ("GourmetGram is busy right now: too many photos are being classified at once. "
                       "Try again in 1 s.")
    time.sleep(1)  # as the page says
    recovered = upload()
    assert recovered.status_code == 200 and 'id="label"' in recovered.text and 'id="busy"' not in recovered.text
