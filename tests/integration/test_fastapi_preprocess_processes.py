"""Preprocessing in worker processes (PREPROCESS_PROCESSES) on real servers: the same answers as the
threads of today's path on real photos, the same 4xx for bad images, a killed worker replaced while
the service keeps answering, the pool ended with the server, and the setting visible in /ready."""

import asyncio
import dataclasses
import io
import os
import signal
from pathlib import Path

import httpx
import pytest
from test_fastapi_services import CASES

from fastapi_onnx.app import load
from fastapi_service import b64, metric_samples, predict, predict_concurrently, serving
from photos import coffee, variants
from servelab.core.photos import evaluation_set
from servelab.core.postprocess import top1
from servelab.core.procs import cpu_count, session_members, wait_until
from servelab.core.settings import get_settings
from servelab.servers.fastapi.pipeline import Pipeline
from servelab.servers.fastapi.runtimes import preprocess_workers

# Real photographs (Debian's, see servelab.core.photos) and the awkward encodings of the bundled one.
PHOTOS = {p.file: p.read_bytes() for p in evaluation_set()[:40]} | variants()


@pytest.fixture(scope="module")
def servers(artifacts, tmp_path_factory):
    logs = tmp_path_factory.mktemp("preprocess-processes-logs")
    with serving("onnx", artifacts, logs, preprocess_processes=0) as threads, \
            serving("onnx", artifacts, logs, preprocess_processes=2) as processes:
        yield {"threads": threads, "processes": processes}


@pytest.fixture(scope="module")
def reference(servers) -> dict[str, dict]:
    """Today's path (threads): each photo's answer."""
    _, url = servers["threads"]
    responses = asyncio.run(predict_concurrently(url, list(PHOTOS.values()), 4))
    assert all(r.status_code == 200 for r in responses)
    return {name: r.json() for name, r in zip(PHOTOS, responses)}


def pool_workers(server_pid: int) -> set[int]:
    """The server's live preprocessing processes: what multiprocessing spawned in its session, not its
    resource tracker (a zombie's cmdline is empty)."""
    pids = set()
    for pid in session_members(server_pid):
        try:
            if b"--multiprocessing-fork" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.add(pid)
        except OSError:  # gone meanwhile
            pass
    return pids


def assert_same(got: dict, want: dict, name: str) -> None:
    assert (got["prediction"], got["class_index"]) == (want["prediction"], want["class_index"]), name
    assert abs(got["probability"] - want["probability"]) <= 1e-6, (name, got, want)


def test_ready_says_how_images_are_preprocessed(servers, client):
    threads, processes = (client.get(f"{url}/ready").json() for _, url in servers.values())
    assert threads["preprocess_mode"] == "threads" and threads["preprocess_workers"] >= 1
    assert processes["preprocess_mode"] == "processes" and processes["preprocess_workers"] == 2
    assert len(pool_workers(servers["processes"][0].pid)) == 2
    assert not pool_workers(servers["threads"][0].pid)


def test_processes_answer_as_threads_do_on_real_photos(servers, reference):
    _, url = servers["processes"]
    responses = asyncio.run(predict_concurrently(url, list(PHOTOS.values()), 4))
    for name, response in zip(PHOTOS, responses):
        assert response.status_code == 200, (name, response.text)
        assert_same(response.json(), reference[name], name)
    assert len({r["prediction"] for r in reference.values()}) > 1  # real variety, not one class throughout


def test_a_batched_request_is_spread_over_the_workers_and_answered_in_order(servers, client, reference):
    _, url = servers["processes"]
    names = list(PHOTOS)[:16]
    response = client.post(f"{url}/predict/batch", json={"images": [b64(PHOTOS[n]) for n in names]})
    assert response.status_code == 200, response.text
    for name, got in zip(names, response.json()["predictions"]):
        assert_same(got, reference[name], name)


@pytest.mark.parametrize("case", [c for c in CASES if 400 <= c[4] < 500], ids=lambda c: c[0])
def test_bad_input_gets_the_same_4xx_from_the_workers(case, servers, client):
    name, method, path, kwargs, status, words = case
    answers = {mode: client.request(method, url + path, **kwargs) for mode, (_, url) in servers.items()}
    assert {mode: r.status_code for mode, r in answers.items()} == {"threads": status, "processes": status}, name
    assert answers["processes"].json()["detail"] == answers["threads"].json()["detail"]
    assert predict(client, servers["processes"][1], PHOTOS["jpeg"])["prediction"] == "Dairy product"


def test_a_worker_killed_while_idle_costs_no_request(servers, client, reference):
    server, url = servers["processes"]
    victim = min(pool_workers(server.pid))
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: victim not in pool_workers(server.pid), "the killed worker gone", 10)
    for name in list(PHOTOS)[:6]:
        assert_same(predict(client, url, PHOTOS[name]), reference[name], name)
    wait_until(lambda: len(pool_workers(server.pid)) == 2, "two workers again", 30)


def test_a_worker_killed_mid_run_is_replaced_and_the_service_keeps_answering(servers, client, reference):
    server, url = servers["processes"]
    restarts = lambda: sum(metric_samples(client.get(f"{url}/metrics").text,  # noqa: E731
                                          "servelab_preprocess_pool_restarts_total").values())
    before, workers = restarts(), pool_workers(server.pid)
    # 19 megapixels take ~0.12 s of CPU each to decode and resize here: with 8 in flight the 2 workers are busy
    # throughout. An odd side keeps the decode at full size (a scaled one takes a sixth of that: _draft_scale).
    buf = io.BytesIO()
    coffee().resize((5001, 3751)).save(buf, "JPEG", quality=90)
    big = buf.getvalue()
    want = predict(client, servers["threads"][1], big)

    async def load_with_a_kill() -> list[httpx.Response]:
        load = asyncio.create_task(predict_concurrently(url, [big] * 24, 8))
        await asyncio.sleep(0.5)
        assert not load.done(), "the load ended before the kill; make it longer"
        os.kill(min(workers), signal.SIGKILL)
        return await load

    # The requests in flight when it died run again on the new pool (preprocessing is pure): none is lost.
    for response in asyncio.run(load_with_a_kill()):
        assert response.status_code == 200, response.text
        assert_same(response.json(), want, "19 MP photo")
    assert restarts() == before + 1  # one new pool, however many requests noticed
    assert client.get(f"{url}/ready").status_code == 200
    for name in list(PHOTOS)[:6]:
        assert_same(predict(client, url, PHOTOS[name]), reference[name], name)
    now = pool_workers(server.pid)
    assert len(now) == 2 and not now & workers


def test_shutdown_ends_the_workers(artifacts, tmp_path, client):
    with serving("onnx", artifacts, tmp_path, preprocess_processes=1) as (server, url):
        workers = pool_workers(server.pid)
        assert len(workers) == 1
        os.kill(server.pid, signal.SIGTERM)  # the server alone, not its process group
        server.proc.wait(30)  # uvicorn shuts down, then re-raises the signal: it exits with -15
        assert "Application shutdown complete" in server.log.read_text()
        wait_until(lambda: not pool_workers(server.pid) and not any(Path(f"/proc/{p}").exists() for p in workers),
                   "the worker gone", 10)


def test_auto_is_threads_on_the_cpu_and_processes_on_a_gpu(artifacts):
    settings = get_settings().model_copy(update={"preprocess_processes": "auto"})
    backend = load(settings)
    assert preprocess_workers(settings, backend)[0] == "threads"
    on_gpu = dataclasses.replace(backend, on_gpu=True)
    assert preprocess_workers(settings, on_gpu) == ("processes", max(1, cpu_count() - 1))


def test_a_model_taking_uint8_crops_gets_them_from_a_worker_process(artifacts):
    """The u8 variant's step (crop_pixels) pickles to a worker and comes back as in-thread."""
    settings = get_settings().model_copy(update={"onnx_variant": "u8", "preprocess_processes": 1})
    pipeline = Pipeline(load(settings), settings)

    async def both() -> tuple:
        pipeline.start()
        try:
            return await pipeline.predict([b64(PHOTOS["jpeg"])])
        finally:
            await pipeline.close()

    (top,), _ = asyncio.run(both())
    x = pipeline.prepare(b64(PHOTOS["jpeg"]))  # in this thread
    assert x.dtype == "uint8" and pipeline.mode == "processes"
    assert top == top1(pipeline.backend.infer(x[None]), pipeline.backend.manifest.classes)[0]


def test_requests_queued_on_a_pool_replaced_before_it_noticed_its_dead_worker_run_again(artifacts):
    """The race the kill under load can hit: a request notices the dead worker (``_lost_a_worker``) and
    replaces the pool before the pool's own thread has failed the requests still queued on it. They must
    run again on the new pool, not be cancelled (a cancelled request never got an answer)."""
    settings = get_settings().model_copy(update={"preprocess_processes": 2})
    pipeline = Pipeline(load(settings), settings)
    buf = io.BytesIO()
    coffee().resize((5001, 3751)).save(buf, "JPEG", quality=90)
    big = b64(buf.getvalue())

    async def race() -> list:
        old = pipeline._pool
        load = asyncio.gather(*(pipeline.prepare_in_worker(big) for _ in range(8)), return_exceptions=True)
        await asyncio.sleep(0.05)  # all 8 on the old pool: 3 in its call queue, 5 waiting behind them
        os.kill(min(old._processes), signal.SIGKILL)
        pipeline._replace(old)  # what the next request does on seeing the dead worker, before the pool does
        return await load

    try:
        results = asyncio.run(race())
    finally:
        asyncio.run(pipeline.close())
    assert [type(r).__name__ for r in results if not isinstance(r, tuple)] == []
    assert all(r[0].shape == results[0][0].shape for r in results)
