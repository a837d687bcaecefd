"""`servelab serve fastapi-onnx` as several server processes on one port (servelab.servers.fastapi.workers),
each with its model or all in front of one batcher process (SHARED_BATCHER, servelab.servers.fastapi.shared):
one service to its clients, whatever happens to one of its processes."""

import asyncio
import os
import re
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import psutil
import pytest

from fastapi_service import admin, b64, metric_samples
from servelab.core.catalogue import SERVICES
from servelab.core.photos import evaluation_set
from servelab.core.procs import ServerProcess, free_port, wait_until
from servelab.core.settings import ServeSettings, Settings
from servelab.servers.fastapi.child import fastapi_process
from servelab.servers.fastapi.shared import BATCHER_MODULE, SharedBatcher
from servelab.servers.fastapi.workers import shares_batcher, worker_count

ONNX = next(name for name, runtime in SERVICES.items() if runtime == "onnx")
WORKERS = 2
PHOTO = evaluation_set()[0].read_bytes()  # a real photo


def fresh(url: str, photo: bytes, n: int) -> list[httpx.Response]:
    """``n`` predictions, each on a new connection, so the kernel hands them to any of the processes."""
    return [httpx.post(f"{url}/predict", json={"image": b64(photo)}, timeout=60) for _ in range(n)]


def workers_of(server: ServerProcess) -> list[psutil.Process]:
    """The supervisor's server processes (uvicorn's spawn also starts a resource tracker, which serves nothing;
    a shared batcher is ``batcher_of``'s)."""
    return [p for p in psutil.Process(server.pid).children() if not
            re.search(f"resource_tracker|{BATCHER_MODULE}", " ".join(p.cmdline()))]


def batcher_of(server: ServerProcess) -> psutil.Process:
    (batcher,) = [p for p in psutil.Process(server.pid).children() if BATCHER_MODULE in p.cmdline()]
    return batcher


def whole(server: ServerProcess, url: str) -> bool:
    """Every server process up and the service ready (a replaced process has come back)."""
    return len(workers_of(server)) == WORKERS and httpx.get(f"{url}/ready").status_code == 200


def predictions(url: str) -> float:
    return metric_samples(httpx.get(f"{url}/metrics").text, "servelab_http_requests_total").get(
        '{method="POST",route="/predict",status="200"}', 0.0)


def env_of(artifacts, shared: bool, **more: str) -> dict[str, str]:
    return {"MODEL_DIR": str(artifacts.manifest.parent), "WORKERS": str(WORKERS), "ORT_PROVIDERS": "cpu",
            "SHARED_BATCHER": str(int(shared)), **more}


# Each process with its own model (the CPU's default), and all in front of one batcher (the GPU's).
SHARED = pytest.mark.parametrize("shared", [False, True], ids=["own-models", "shared-batcher"])


@pytest.fixture(scope="module", params=[False, True], ids=["own-models", "shared-batcher"])
def one_service(artifacts, tmp_path_factory, request):
    # One service per mode for the module (a start costs seconds of CPU): each test below leaves it whole, if
    # changed (a process replaced, the model reloaded), and counts only what it sent itself.
    port = free_port()
    log = tmp_path_factory.mktemp("workers") / "serve.log"
    with fastapi_process(ONNX, port, log, env_of(artifacts, request.param), ready_timeout=120) as server:
        yield server, f"http://127.0.0.1:{port}"


@pytest.fixture
def service(one_service):
    """The module's service, whole: every server process up and ready (after an earlier test replaced one)."""
    server, url = one_service
    wait_until(lambda: whole(server, url), "every server process ready", 120)
    return one_service


def test_the_processes_answer_as_one_service(service):
    server, url = service
    ready = httpx.get(f"{url}/ready").json()
    assert ready["workers"] == {"processes": WORKERS, "ready": WORKERS, "versions": [ready["model_version"]]}
    processes = workers_of(server)
    assert len(processes) == WORKERS
    cpu_before = [sum(p.cpu_times()[:2]) for p in processes]
    counted = predictions(url)
    answers = fresh(url, PHOTO, 40)
    assert [a.status_code for a in answers] == [200] * 40
    # Every process did part of the work, and the metrics add up over them.
    used = [sum(p.cpu_times()[:2]) - before for p, before in zip(processes, cpu_before)]
    assert all(u > 0.02 for u in used), used  # a few requests each at least (ms of preprocessing each)
    assert predictions(url) == counted + 40


def test_a_process_that_dies_loses_no_later_request_and_is_replaced(service):
    server, url = service
    photo = PHOTO
    counted = predictions(url)
    assert [a.status_code for a in fresh(url, photo, 10)] == [200] * 10
    victim = workers_of(server)[0]
    victim.kill()
    victim.wait(10)
    # The other process takes every connection until the replacement is warm: none is refused, none 503.
    assert [a.status_code for a in fresh(url, photo, 20)] == [200] * 20
    wait_until(lambda: victim.pid not in [p.pid for p in workers_of(server)] and whole(server, url), "a replacement",
               120)
    assert httpx.get(f"{url}/ready").json()["workers"]["ready"] == WORKERS
    # The dead process's counts stay in the service's totals.
    assert predictions(url) == counted + 30


def test_a_reload_reaches_every_process_before_it_answers(service):
    server, url = service
    before = httpx.get(f"{url}/ready").json()["model_version"]
    answer = httpx.post(f"{url}/admin/reload", json={"variant": "u8"}, headers=admin(), timeout=300)
    assert answer.status_code == 200, answer.text
    reloaded = answer.json()
    assert reloaded["previous_version"] == before != reloaded["model_version"]
    assert reloaded["processes"] == WORKERS
    versions = {a.headers["X-Model-Version"] for a in fresh(url, PHOTO, 12)}
    assert versions == {reloaded["model_version"]}
    assert httpx.get(f"{url}/ready").json()["workers"]["versions"] == [reloaded["model_version"]]
    # A process started after the reload serves the reloaded model, not the one the service started with.
    victim = workers_of(server)[0]
    victim.kill()
    victim.wait(10)
    wait_until(lambda: whole(server, url), "a replacement", 120)
    assert httpx.get(f"{url}/ready").json()["workers"]["versions"] == [reloaded["model_version"]]


@SHARED
def test_a_stop_lets_requests_in_flight_finish_and_frees_the_port(artifacts, tmp_path, shared):
    port = free_port()
    server = fastapi_process(ONNX, port, tmp_path / "serve.log", env_of(artifacts, shared), ready_timeout=120).start()
    try:
        url, photo = f"http://127.0.0.1:{port}", PHOTO
        body = {"images": [b64(photo)] * 16}  # the most a request may carry: hundreds of ms each on 2 CPUs
        processes = workers_of(server) + ([batcher_of(server)] if shared else [])
        # A request still in the listen backlog at the signal is reset, as it should be: the signal waits until
        # all four reached a handler (being handled, or done), summed over the processes; the scrape counts itself.
        def reached() -> float:
            text = httpx.get(f"{url}/metrics").text
            done = sum(v for k, v in metric_samples(text, "servelab_http_requests_total").items() if "/predict/batch" in k)
            return sum(metric_samples(text, "servelab_http_requests_in_progress").values()) - 1 + done

        with ThreadPoolExecutor(4) as pool:
            pending = [pool.submit(httpx.post, f"{url}/predict/batch", json=body, timeout=60) for _ in range(4)]
            wait_until(lambda: reached() >= 4, "the four requests at a handler", 30)
            os.kill(server.pid, signal.SIGTERM)
            assert [f.result().status_code for f in pending] == [200] * 4
        server.proc.wait(30)
        psutil.wait_procs(processes, timeout=10)
        assert not [p.pid for p in processes if p.is_running()]
        with socket.socket() as s:  # nothing of the service listens on the port (its closed connections may linger)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
    finally:
        server.stop()


def test_workers_default_to_one_per_cpu_on_the_cpu_and_follow_the_setting(monkeypatch):
    assert worker_count(ServeSettings(workers=3), "onnx") == 3
    assert worker_count(ServeSettings(ort_providers="cpu"), "onnx") == len(os.sched_getaffinity(0))
    assert worker_count(ServeSettings(torch_device="cpu"), "pytorch") == len(os.sched_getaffinity(0))
    # On the CPU each process keeps its model unless asked; one process never needs a batcher of its own.
    assert not shares_batcher(ServeSettings(ort_providers="cpu"), "onnx", 2)
    assert shares_batcher(ServeSettings(ort_providers="cpu", shared_batcher=True), "onnx", 2)
    assert not shares_batcher(ServeSettings(shared_batcher=True), "onnx", 1)


@pytest.fixture(scope="module")
def batching(artifacts, tmp_path_factory):
    """Two server processes before one batcher that waits up to 3 s for a batch of 8: requests stay there. One
    for the module: the batcher's tests count batches and restarts from what they did themselves."""
    port, log = free_port(), tmp_path_factory.mktemp("batching") / "serve.log"
    env = env_of(artifacts, True, MAX_BATCH_SIZE="8", BATCH_TIMEOUT_MS="3000")
    with fastapi_process(ONNX, port, log, env, ready_timeout=120) as server:
        yield server, f"http://127.0.0.1:{port}", log


def test_the_batcher_forms_one_batch_from_every_processs_requests(batching, artifacts):
    """Two connections to the batcher, as two server processes make: 3 + 5 images, one inference of 8."""
    server, url, log = batching
    path = re.findall(r"batcher: serving the server processes at (\S+)", log.read_text())[-1]  # the batcher now
    settings = Settings(model_dir=artifacts.manifest.parent)
    x = np.stack([np.zeros((3, 224, 224), np.float32)] * 5)

    async def two_processes() -> list:
        first, second = await asyncio.gather(*(asyncio.to_thread(SharedBatcher, path, settings, 8) for _ in range(2)))
        for batcher in (first, second):
            batcher.start()
        try:
            return await asyncio.gather(first.submit(x[:3]), second.submit(x))
        finally:
            await asyncio.gather(first.close(), second.close())

    def batches_of_8() -> float:  # counted in the batcher process, scraped from a server process
        buckets = metric_samples(httpx.get(f"{url}/metrics").text, "servelab_batch_size_bucket")
        return buckets['{le="8.0"}'] - buckets['{le="6.0"}']

    before = batches_of_8()
    three, five = asyncio.run(two_processes())
    assert batches_of_8() == before + 1
    assert (len(three.logits), len(five.logits)) == (3, 5)
    assert three.batch_size == five.batch_size == 8 and three.infer_s == five.infer_s  # one inference
    np.testing.assert_array_equal(three.logits, five.logits[:3])  # the same images, the same answers


def test_a_batcher_that_dies_loses_no_request_and_comes_back(batching):
    """Requests waiting at the batcher when it is killed: each server process sends them again to the batcher
    started in its place; /ready says 503 until it is back."""
    server, url, log = batching
    victim = batcher_of(server)
    logged = len(log.read_text())
    in_progress = lambda: sum(metric_samples(httpx.get(f"{url}/metrics").text,  # noqa: E731
                                             "servelab_http_requests_in_progress").values()) - 1  # the scrape
    with ThreadPoolExecutor(3) as pool:
        pending = [pool.submit(httpx.post, f"{url}/predict", json={"image": b64(PHOTO)}, timeout=120)
                   for _ in range(3)]
        wait_until(lambda: in_progress() >= 3, "three requests at a handler", 30)
        time.sleep(0.5)  # preprocessed (ms): they wait at the batcher for a batch of 8
        victim.kill()
        victim.wait(10)
        wait_until(lambda: httpx.get(f"{url}/ready").status_code == 503, "not ready while the batcher restarts", 5)
        answers = [f.result() for f in pending]
    assert [a.status_code for a in answers] == [200] * 3, [a.text for a in answers]
    assert len({a.json()["prediction"] for a in answers}) == 1
    waited = sum(int(n) for n in re.findall(r"batcher process went away with (\d+) request", log.read_text()[logged:]))
    assert waited == 3, log.read_text()[-3000:]
    wait_until(lambda: httpx.get(f"{url}/ready").status_code == 200, "ready again", 60)
    assert batcher_of(server).pid != victim.pid
