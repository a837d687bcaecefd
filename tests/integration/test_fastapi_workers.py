"""`servelab serve fastapi-onnx` as several server processes on one port (servelab.servers.fastapi.workers):
one service to its clients, whatever happens to one of its processes."""

import os
import signal
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from fastapi_service import admin, b64, metric_samples
from servelab.core.catalogue import SERVICES
from servelab.core.photos import evaluation_set
from servelab.core.procs import ServerProcess, free_port, wait_until
from servelab.core.settings import ServeSettings
from servelab.servers.fastapi.child import fastapi_process
from servelab.servers.fastapi.workers import worker_count

ONNX = next(name for name, runtime in SERVICES.items() if runtime == "onnx")
WORKERS = 2
PHOTO = evaluation_set()[0].read_bytes()  # a real photo


def fresh(url: str, photo: bytes, n: int) -> list[httpx.Response]:
    """``n`` predictions, each on a new connection, so the kernel hands them to any of the processes."""
    return [httpx.post(f"{url}/predict", json={"image": b64(photo)}, timeout=60) for _ in range(n)]


def workers_of(server: ServerProcess) -> list[psutil.Process]:
    """The supervisor's server processes (uvicorn's spawn also starts a resource tracker, which serves nothing)."""
    return [p for p in psutil.Process(server.pid).children() if "resource_tracker" not in " ".join(p.cmdline())]


def predictions(url: str) -> float:
    return metric_samples(httpx.get(f"{url}/metrics").text, "servelab_http_requests_total").get(
        '{method="POST",route="/predict",status="200"}', 0.0)


@pytest.fixture
def service(artifacts, tmp_path):
    port = free_port()
    env = {"MODEL_DIR": str(artifacts.manifest.parent), "WORKERS": str(WORKERS), "ORT_PROVIDERS": "cpu"}
    with fastapi_process(ONNX, port, tmp_path / "serve.log", env, ready_timeout=120) as server:
        yield server, f"http://127.0.0.1:{port}"


def test_the_processes_answer_as_one_service(service):
    server, url = service
    ready = httpx.get(f"{url}/ready").json()
    assert ready["workers"] == {"processes": WORKERS, "ready": WORKERS, "versions": [ready["model_version"]]}
    processes = workers_of(server)
    assert len(processes) == WORKERS
    cpu_before = [sum(p.cpu_times()[:2]) for p in processes]
    answers = fresh(url, PHOTO, 40)
    assert [a.status_code for a in answers] == [200] * 40
    # Every process did part of the work, and the metrics add up over them.
    assert all(sum(p.cpu_times()[:2]) - before > 0.05 for p, before in zip(processes, cpu_before))
    assert predictions(url) == 40


def test_a_process_that_dies_loses_no_later_request_and_is_replaced(service):
    server, url = service
    photo = PHOTO
    assert [a.status_code for a in fresh(url, photo, 10)] == [200] * 10
    victim = workers_of(server)[0]
    victim.kill()
    victim.wait(10)
    # The other process takes every connection until the replacement is warm: none is refused, none 503.
    assert [a.status_code for a in fresh(url, photo, 20)] == [200] * 20
    wait_until(lambda: httpx.get(f"{url}/ready").status_code == 200 and victim.pid not in
               [p.pid for p in workers_of(server)] and len(workers_of(server)) == WORKERS, "a replacement", 120)
    assert httpx.get(f"{url}/ready").json()["workers"]["ready"] == WORKERS
    # The dead process's counts stay in the service's totals.
    assert predictions(url) == 30


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
    wait_until(lambda: len(workers_of(server)) == WORKERS and httpx.get(f"{url}/ready").status_code == 200,
               "a replacement", 120)
    assert httpx.get(f"{url}/ready").json()["workers"]["versions"] == [reloaded["model_version"]]


def test_a_stop_lets_requests_in_flight_finish_and_frees_the_port(artifacts, tmp_path):
    port = free_port()
    env = {"MODEL_DIR": str(artifacts.manifest.parent), "WORKERS": str(WORKERS), "ORT_PROVIDERS": "cpu"}
    server = fastapi_process(ONNX, port, tmp_path / "serve.log", env, ready_timeout=120).start()
    try:
        url, photo = f"http://127.0.0.1:{port}", PHOTO
        body = {"images": [b64(photo)] * 16}  # the most a request may carry: hundreds of ms each on 2 CPUs
        processes = workers_of(server)
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
