"""`servelab serve fastapi-onnx` as several server processes on one port (servelab.servers.fastapi.workers),
each with its model or all in front of one batcher process (SHARED_BATCHER, servelab.servers.fastapi.shared):
one service to its clients, whatever happens to one of its processes."""

import ast
import asyncio
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from checkout_guard import in_dev_shm, named_shm
from fastapi_service import b64, metric_samples
from load_cases import rollout
from servelab.core.catalogue import SERVICES
from servelab.core.photos import evaluation_set
from servelab.core.procs import ServerProcess, free_port, wait_until
from servelab.core.settings import ServeSettings, Settings
from servelab.measure.targets import FastAPITarget
from servelab.servers.fastapi.admin import reload
from servelab.servers.fastapi.child import fastapi_process
from servelab.servers.fastapi.shared import BATCHER_MODULE, SharedBatcher
from servelab.servers.fastapi.siblings import WANTED, WIRING_ENV
from servelab.servers.fastapi.workers import START_S, shares_batcher, worker_count

ONNX = next(name for name, runtime in SERVICES.items() if runtime == "onnx")
WORKERS = 2
PHOTO = evaluation_set()[0].read_bytes()  # a real photo


def fresh(url: str, photo: bytes, n: int) -> list[httpx.Response]:
    """``n`` predictions, each on a new connection, so the kernel hands them to any of the processes."""
    return [httpx.post(f"{url}/predict", json={"image": b64(photo)}, timeout=60) for _ in range(n)]


def children(server: ServerProcess) -> list[tuple[psutil.Process, str]]:
    """The supervisor's living children and their command lines; one exiting or exited (a replaced server process
    that the supervisor has not reaped yet: a zombie) is none of them."""
    found = []
    for p in psutil.Process(server.pid).children():
        try:
            cmd = " ".join(p.cmdline())
        except psutil.NoSuchProcess:  # ZombieProcess too
            continue
        if cmd:  # an exiting process has none left
            found.append((p, cmd))
    return found


def workers_of(server: ServerProcess) -> list[psutil.Process]:
    """The supervisor's server processes (uvicorn's spawn also starts a resource tracker, which serves nothing;
    a shared batcher is ``batcher_of``'s)."""
    return [p for p, cmd in children(server) if not re.search(f"resource_tracker|{BATCHER_MODULE}", cmd)]


def batcher_of(server: ServerProcess) -> psutil.Process:
    (batcher,) = [p for p, cmd in children(server) if BATCHER_MODULE in cmd]
    return batcher


def arenas(process: psutil.Process) -> int:
    """Arenas (shared.Arena) the process holds open: nameless files (memfd), in no folder; by inode, as a
    mapping holds a descriptor of its own."""
    held = set()
    for fd in Path(f"/proc/{process.pid}/fd").iterdir():
        try:
            if os.readlink(fd).startswith("/memfd:servelab-arena"):
                held.add(os.stat(fd).st_ino)
        except FileNotFoundError:  # closed meanwhile
            continue
    return len(held)


def frameworks(process: psutil.Process) -> set[str]:
    """The model frameworks the process has loaded (their native libraries are mapped)."""
    names = {"onnxruntime": "onnxruntime_pybind11_state", "torch": "libtorch_cpu"}
    return {name for name, lib in names.items() if any(lib in m.path for m in process.memory_maps())}


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
    # A process in front of the batcher holds no model, so no framework either: the batcher alone loads it.
    shared = "batcher" in ready["runtime"]
    assert [frameworks(p) for p in processes] == [set() if shared else {"onnxruntime"}] * WORKERS
    assert not shared or frameworks(batcher_of(server)) == {"onnxruntime"}
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
    shared = "batcher" in httpx.get(f"{url}/ready").json()["runtime"]
    assert arenas(victim) == shared and (not shared or arenas(batcher_of(server)) == WORKERS)
    named = named_shm([victim])
    victim.kill()
    victim.wait(START_S + 10)  # uvicorn's supervisor reaps it, unless it is waiting on a health check it sent it
    # The other process takes every connection until the replacement is warm: none is refused, none 503.
    assert [a.status_code for a in fresh(url, photo, 20)] == [200] * 20
    wait_until(lambda: victim.pid not in [p.pid for p in workers_of(server)] and whole(server, url), "a replacement",
               120)
    assert not named & in_dev_shm()  # nothing of the victim's stays in /dev/shm
    assert httpx.get(f"{url}/ready").json()["workers"]["ready"] == WORKERS
    # The dead process's counts stay in the service's totals.
    assert predictions(url) == counted + 30


def test_a_reload_under_16_senders_replaces_every_process_and_fails_nothing(service):
    """uvicorn's SIGHUP restart: each server process replaced by one that starts on the reloaded model, while
    16 senders keep their connections busy; the batcher process stays and serves the new model to them all."""
    server, url = service
    before = httpx.get(f"{url}/ready").json()["model_version"]
    pids = {p.pid for p in workers_of(server)}
    batcher = batcher_of(server).pid if "batcher" in httpx.get(f"{url}/ready").json()["runtime"] else None
    record = rollout(FastAPITarget(url, PHOTO), lambda: reload(url, variant="u8"), stage="fastapi-onnx",
                     at_s=1.0, seconds=2.0, after_s=1.0)
    o, reloaded = record.rollout, record.rollout.result
    assert o.error is None and o.failed == 0 and record.stats.errors == {} and o.shed == 0, o
    assert o.old_versions == [before] and o.new_version == reloaded["model_version"] != before, o
    assert o.old_sent_after_ready == 0, o  # none sent once the reload returned got the old model
    assert reloaded["previous_version"] == before and reloaded["processes"] == WORKERS
    # The one that answered serves the new model already; uvicorn replaces it too, in its turn.
    wait_until(lambda: not pids & {p.pid for p in workers_of(server)} and whole(server, url), "all replaced", 120)
    assert batcher is None or batcher_of(server).pid == batcher
    versions = {a.headers["X-Model-Version"] for a in fresh(url, PHOTO, 12)}
    assert versions == {reloaded["model_version"]}
    assert httpx.get(f"{url}/ready").json()["workers"]["versions"] == [reloaded["model_version"]]
    # A process started after the reload serves the reloaded model, not the one the service started with.
    victim = workers_of(server)[0]
    victim.kill()
    victim.wait(START_S + 10)
    wait_until(lambda: whole(server, url), "a replacement", 120)
    assert httpx.get(f"{url}/ready").json()["workers"]["versions"] == [reloaded["model_version"]]
    # Back to the model the service started with, for the tests after this one; they start once uvicorn has
    # replaced every process (one still starting would read the wanted model under the next test).
    pids = {p.pid for p in workers_of(server)}
    assert asyncio.run(reload(url, variant="fp32"))["model_version"] == before
    wait_until(lambda: not pids & {p.pid for p in workers_of(server)} and whole(server, url), "all replaced", 120)


def test_no_process_follows_the_wanted_model_until_uvicorn_restarts_them(service, artifacts):
    """Nothing polls the folder: a process reads the model a reload wrote there as it starts, and only then.
    The file's access time, set before its change, stays while the processes serve; a SIGHUP to the
    supervisor starts processes that read it."""
    server, url = service
    wanted = Path(json.loads(workers_of(server)[0].environ()[WIRING_ENV])["folder"]) / WANTED
    version = httpx.get(f"{url}/ready").json()["model_version"]
    wanted.write_text(json.dumps({"model_dir": str(artifacts.manifest.parent), "variant": "fp32"}))  # served now
    unread = wanted.stat().st_mtime_ns - 10**9
    os.utime(wanted, ns=(unread, wanted.stat().st_mtime_ns))  # before the change: a read moves it (relatime)
    assert [a.status_code for a in fresh(url, PHOTO, 10)] == [200] * 10
    time.sleep(1)  # 20 periods of the 50 ms poll that SIGHUP replaced
    assert wanted.stat().st_atime_ns == unread, "a running server process read the wanted model"
    pids = {p.pid for p in workers_of(server)}
    os.kill(server.pid, signal.SIGHUP)
    wait_until(lambda: not pids & {p.pid for p in workers_of(server)} and whole(server, url), "replacements", 120)
    assert wanted.stat().st_atime_ns > unread  # the replacements read it as they started
    assert httpx.get(f"{url}/ready").json()["workers"]["versions"] == [version]


def test_a_stopping_process_answers_the_next_request_on_an_idle_connection_and_closes_it(service):
    """uvicorn's own stop closes an idle keep-alive connection at once (its issue #2757), so a request a client
    sends on it gets no answer, though the other processes serve on: what lost requests in a rolling restart. A
    stopping process answers it with ``Connection: close`` (``workers.Draining``), and the next goes elsewhere."""
    server, url = service
    body, headers = json.dumps({"image": b64(PHOTO)}), {"Content-Type": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=60)
    try:
        conn.request("POST", "/predict", body, headers)
        first = conn.getresponse()
        assert first.status == 200 and not first.will_close, first.getheaders()
        first.read()
        mine = conn.sock.getsockname()[1]
        (holder,) = [p for p in workers_of(server) if any(c.raddr and c.raddr.port == mine for c in p.net_connections())]
        holder.send_signal(signal.SIGTERM)  # what uvicorn's restart sends a process it has replaced
        # Stopping: it no longer listens. Well within the 5 s after which an idle connection closes anyway.
        wait_until(lambda: not [c for c in holder.net_connections() if c.status == psutil.CONN_LISTEN], "a stop", 4)
        conn.request("POST", "/predict", body, headers)
        second = conn.getresponse()  # uvicorn alone: the connection closed, unanswered
        assert second.status == 200 and second.getheader("Connection") == "close", second.getheaders()
        second.read()
    finally:
        conn.close()
    holder.wait(START_S + 10)  # it had nothing left to drain
    wait_until(lambda: whole(server, url), "a replacement", 120)


@SHARED
def test_a_stop_of_the_group_lets_requests_in_flight_finish_and_leaves_nothing(artifacts, tmp_path, shared):
    """SIGTERM to the whole process group (what ``ServerProcess.stop`` sends): the server processes finish their
    requests, the batcher serves them until they have gone and nothing starts another; the port is free and
    nothing of the service stays in /dev/shm."""
    port, log = free_port(), tmp_path / "serve.log"
    server = fastapi_process(ONNX, port, log, env_of(artifacts, shared), ready_timeout=120).start()
    try:
        url, photo = f"http://127.0.0.1:{port}", PHOTO
        body = {"images": [b64(photo)] * 16}  # the most a request may carry: hundreds of ms each on 2 CPUs
        processes = workers_of(server) + ([batcher_of(server)] if shared else [])
        named = named_shm(processes)
        # A request still in the listen backlog at the signal is reset, as it should be: the signal waits until
        # all four reached a handler (being handled, or done), summed over the processes; the scrape counts itself.
        def reached() -> float:
            text = httpx.get(f"{url}/metrics").text
            done = sum(v for k, v in metric_samples(text, "servelab_http_requests_total").items() if "/predict/batch" in k)
            return sum(metric_samples(text, "servelab_http_requests_in_progress").values()) - 1 + done

        with ThreadPoolExecutor(4) as pool:
            pending = [pool.submit(httpx.post, f"{url}/predict/batch", json=body, timeout=60) for _ in range(4)]
            wait_until(lambda: reached() >= 4, "the four requests at a handler", 30)
            os.killpg(server.pid, signal.SIGTERM)
            assert [f.result().status_code for f in pending] == [200] * 4
        server.proc.wait(30)
        psutil.wait_procs(processes, timeout=10)
        assert not [p.pid for p in processes if p.is_running()]
        assert "starting another" not in log.read_text()  # no batcher was started during the stop
        with socket.socket() as s:  # nothing of the service listens on the port (its closed connections may linger)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
        assert not named & in_dev_shm()
    finally:
        server.stop()


def test_a_sigkill_of_the_group_leaves_nothing_in_dev_shm(artifacts, tmp_path):
    port = free_port()
    server = fastapi_process(ONNX, port, tmp_path / "serve.log", env_of(artifacts, True), ready_timeout=120).start()
    try:
        assert [a.status_code for a in fresh(f"http://127.0.0.1:{port}", PHOTO, 6)] == [200] * 6
        processes = workers_of(server) + [batcher_of(server)]
        assert [arenas(p) for p in processes] == [1] * WORKERS + [WORKERS]
        named = named_shm(processes)
        os.killpg(server.pid, signal.SIGKILL)
        psutil.wait_procs(processes, timeout=10)
        assert not named & in_dev_shm(), named
    finally:
        server.stop()


def test_workers_default_to_one_per_cpu_on_the_cpu_and_follow_the_setting(monkeypatch):
    assert worker_count(ServeSettings(workers=3), "onnx") == 3
    assert worker_count(ServeSettings(ort_providers="cpu"), "onnx") == min(len(os.sched_getaffinity(0)), 8)
    assert worker_count(ServeSettings(torch_device="cpu"), "pytorch") == min(len(os.sched_getaffinity(0)), 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(48)))  # 48 CPUs: auto stops at 8, a setting does not
    assert worker_count(ServeSettings(ort_providers="cpu"), "onnx") == 8
    assert worker_count(ServeSettings(ort_providers="cpu", workers=12), "onnx") == 12
    # On the CPU each process keeps its model unless asked; one process never needs a batcher of its own.
    assert not shares_batcher(ServeSettings(ort_providers="cpu"), "onnx", 2)
    assert shares_batcher(ServeSettings(ort_providers="cpu", shared_batcher=True), "onnx", 2)
    assert not shares_batcher(ServeSettings(shared_batcher=True), "onnx", 1)


def test_no_process_is_started_with_preexec_fn_from_a_thread():
    """Python documents preexec_fn as unsafe where threads run: ServerProcess alone passes one, from the main
    thread only (``_preexec``); the batcher process, started from a thread, calls die_with_parent itself."""
    repo = Path(__file__).resolve().parents[2]
    passing = {str(path.relative_to(repo)) for path in (repo / "servelab").rglob("*.py")
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.keyword)
               and node.arg == "preexec_fn"}
    assert passing == {"servelab/core/procs.py"}


def test_two_batchers_each_hold_the_model_for_half_of_the_server_processes(artifacts, tmp_path):
    """BATCHERS=2, what two visible GPUs give (each batcher its own GPU): the server processes spread evenly."""
    port = free_port()
    with fastapi_process(ONNX, port, tmp_path / "serve.log", env_of(artifacts, True, BATCHERS="2"),
                         ready_timeout=120) as server:
        assert [a.status_code for a in fresh(f"http://127.0.0.1:{port}", PHOTO, 8)] == [200] * 8
        batchers = [p for p, cmd in children(server) if BATCHER_MODULE in cmd]
        assert [arenas(b) for b in batchers] == [1, 1]  # one server process's arena each
        assert [frameworks(b) for b in batchers] == [{"onnxruntime"}] * 2


def test_the_apps_import_no_model_framework_until_they_load_a_model():
    """uvicorn imports the app in every server process; beside a batcher process none loads a model."""
    check = "import sys, fastapi_pt.app, fastapi_onnx.app; print(sorted({'torch', 'onnxruntime'} & set(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def batching(artifacts, tmp_path_factory):
    """Two server processes before one batcher that waits up to 3 s for a batch of 8: requests stay there. The
    service holds 3 at most. One for the module: the batcher's tests count batches and restarts from what they
    did themselves."""
    port, log = free_port(), tmp_path_factory.mktemp("batching") / "serve.log"
    env = env_of(artifacts, True, MAX_BATCH_SIZE="8", BATCH_TIMEOUT_MS="3000", MAX_QUEUE_REQUESTS="3")
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


def test_the_queue_bound_is_the_services_not_each_processs(batching):
    """MAX_QUEUE_REQUESTS=3 over two server processes: three requests wait at the batcher, whichever process took
    them; every other is shed."""
    server, url, _ = batching
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: fresh(url, PHOTO, 1)[0], range(8)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [200] * 3 + [503] * 5, codes
    assert {a.json()["shed"] for a in answers if a.status_code == 503} == {"queue_full"}


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
