"""Ray Serve stages on a real two-node Ray cluster on 127.0.0.1 (head + worker, `ray start` processes).

One cluster for the module; each test deploys its stage with the real `servelab ray deploy` (a rollout
with the real `servelab ray rollout`). The node-failure test kills the worker node, so it runs last.
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter

import httpx
import pytest
from test_fastapi_services import CASES
from test_rollout import assert_switched_once

from fastapi_service import b64, predict_concurrently
from load_cases import rollout
from photos import variants
from servelab.core.paths import DEFAULT_IMAGE, REPO_ROOT
from servelab.core.procs import free_port, session_members
from servelab.core.variants.build import VARIANTS
from servelab.measure.loadgen import ClientOptions, Labels, run_bench
from servelab.measure.records import Load
from servelab.measure.targets import FastAPITarget
from servelab.servers.fastapi.runtimes import model_version
from servelab.servers.rayserve.cluster import LocalCluster
from servelab.servers.rayserve.control import deploy_in_child, roll_out_in_child
from servelab.servers.rayserve.serve_state import ReplicaSampler, replica_rows, serve_details

pytestmark = pytest.mark.slow  # a two-node Ray cluster started for the module, a stage deployed per test
PHOTO = DEFAULT_IMAGE.read_bytes()
# Quick autoscaling for the test: up after 1 s of load, down after 3 s without.
AUTOSCALE = {"RAY_AUTOSCALE_UPSCALE_DELAY_S": "1", "RAY_AUTOSCALE_DOWNSCALE_DELAY_S": "3",
             "RAY_AUTOSCALE_MAX_REPLICAS": "3", "RAY_AUTOSCALE_TARGET_ONGOING": "1"}


class Deployer:
    def __init__(self, cluster: LocalCluster, port: int):
        self.cluster, self.port, self.url = cluster, port, f"http://127.0.0.1:{port}"

    def __call__(self, stage: str, **env: str) -> None:
        run = subprocess.run([sys.executable, "-m", "servelab", "ray", "deploy", "--stage", stage, "--address",
                              self.cluster.address], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
                             env={**os.environ, **self.cluster.client_env(), "RAY_SERVE_PORT": str(self.port), **env})
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert f"{stage} deployed" in run.stdout

    def replicas(self) -> list[dict]:
        details = serve_details(self.cluster.dashboard_url, token=self.cluster.token)
        return [r for r in replica_rows(details) if r["state"] == "RUNNING"]


@pytest.fixture(scope="module")
def ray_cluster(artifacts, tmp_path_factory):
    port = free_port()
    cluster = LocalCluster(workers=1, log_dir=tmp_path_factory.mktemp("ray-logs"),
                           env={"RAY_SERVE_PORT": str(port)})
    with cluster:
        yield Deployer(cluster, port)
    assert not [session_members(pid) for pid in cluster.pids()], "Ray processes left behind"


def test_two_nodes_and_replicas_on_both_by_node_id(ray_cluster, client):
    ray_cluster("ray-2")
    status = subprocess.run([sys.executable, "-m", "servelab", "ray", "status", "--json", "--address",
                             ray_cluster.cluster.address], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                            env={**os.environ, **ray_cluster.cluster.client_env()})
    assert status.returncode == 0, status.stderr[-3000:]
    info = json.loads(status.stdout)
    nodes = {n["node_id"] for n in info["nodes"]}
    assert len(nodes) == 2 and sum(n["head"] for n in info["nodes"]) == 1
    running = [r for r in info["replicas"] if r["state"] == "RUNNING"]
    assert {r["node_id"] for r in running} == nodes  # one replica on each node
    # The HTTP API names the replica's node: concurrent /ready calls reach both replicas.
    seen = set()
    for _ in range(10):
        answers = asyncio.run(_ready_concurrently(ray_cluster.url, 8))
        assert {a["stage"] for a in answers} == {"ray-2"}
        seen |= {a["placement"]["ray_node_id"] for a in answers}
        if seen == nodes:
            break
    assert seen == nodes


async def _ready_concurrently(url: str, n: int) -> list[dict]:
    async with httpx.AsyncClient(timeout=30) as c:
        responses = await asyncio.gather(*(c.get(f"{url}/ready") for _ in range(n)))
    assert all(r.status_code == 200 for r in responses)
    return [r.json() for r in responses]


def test_same_api_and_error_contract_as_the_fastapi_stages(ray_cluster, client):
    url = ray_cluster.url
    response = client.post(f"{url}/predict", json={"image": b64(PHOTO)})
    assert response.status_code == 200, response.text
    assert response.json()["prediction"] == "Dairy product" and "infer;dur=" in response.headers["server-timing"]
    batch = client.post(f"{url}/predict/batch", json={"images": [b64(PHOTO)] * 3})
    assert batch.status_code == 200 and len(batch.json()["predictions"]) == 3
    assert client.get(f"{url}/health").json() == {"status": "ok"}
    assert "servelab_http_requests" in client.get(f"{url}/metrics").text
    wrong = []
    for name, method, path, kwargs, status, words in CASES:
        r = client.request(method, url + path, **kwargs)
        if r.status_code != status or (words and words not in r.text):
            wrong.append((name, status, r.status_code, r.text[:200]))
    assert not wrong


def test_serve_batch_forms_batches_under_concurrency(ray_cluster):
    ray_cluster("ray-dyn", RAY_BATCH_MAX_SIZE="8", RAY_BATCH_WAIT_MS="20")
    photos = list(variants().values())[:4] * 8
    responses = asyncio.run(predict_concurrently(ray_cluster.url, photos, 16))
    assert all(r.status_code == 200 for r in responses)
    sizes = Counter(int(r.headers["server-timing"].rsplit("batch;desc=", 1)[1]) for r in responses)
    assert max(sizes) > 1 and max(sizes) <= 8, sizes
    answers = {r.json()["prediction"] for r in responses}
    assert "Dairy product" in answers


def test_autoscaling_goes_up_under_load_and_back_down(ray_cluster):
    ray_cluster("ray-auto", **AUTOSCALE)
    assert len(ray_cluster.replicas()) == 1
    target = FastAPITarget(ray_cluster.url, PHOTO)
    with ReplicaSampler(ray_cluster.cluster.dashboard_url, 0.5, ray_cluster.cluster.token) as sampler:
        record = run_bench(target, Load.closed(8, requests=None, duration_s=12, warmup=0), Labels("ray-auto"),
                           ClientOptions(sampler=sampler))
    assert record.stats.error_count == 0 and max(record.timeline.replicas) > 1, record.timeline.replicas
    deadline = time.monotonic() + 60
    while len(ray_cluster.replicas()) > 1 and time.monotonic() < deadline:
        time.sleep(1)
    assert len(ray_cluster.replicas()) == 1


def test_a_rollout_in_place_under_16_senders_fails_nothing_and_switches_version_once(ray_cluster, artifacts, client,
                                                                                     tmp_path):
    # One replica: Ray reconfigures replicas a few at a time, so with several both versions answer a while.
    ray_cluster("ray-1")
    v1 = client.get(f"{ray_cluster.url}/ready").json()["model_version"]
    v2 = model_version(artifacts.manifest.parent / VARIANTS["u8"])  # fp32 with its preprocessing in the graph
    assert v1 == model_version(artifacts.manifest.parent / VARIANTS["fp32"]) != v2
    replicas = sorted(r["replica"] for r in ray_cluster.replicas())
    record = rollout(FastAPITarget(ray_cluster.url, PHOTO),
                     lambda: roll_out_in_child("ray-1", ray_cluster.cluster, variant="u8"),
                     stage="ray-1", at_s=1.5, seconds=3.0, after_s=1.5)
    assert_switched_once(record, v1, v2)  # no failure, every answer versioned, v1 then v2 and never back
    r = record.rollout
    assert r.result["replicas_before"] == r.result["replicas_after"] == replicas, r.result  # in place: no restart
    assert 0 < r.first_new_s and r.switch_after_ready_s is not None and all(n > 0 for n in r.requests), r
    assert 0 < r.result["ready_s"] < r.done_s - r.trigger_s, r  # every replica served v2 before the call returned
    assert client.get(f"{ray_cluster.url}/ready").json()["model_version"] == v2
    # A model folder without the variant asked for is refused before Ray changes anything.
    shutil.copy(artifacts.manifest, tmp_path)
    with pytest.raises(RuntimeError, match="no food11_u8_int8.onnx there"):
        asyncio.run(roll_out_in_child("ray-1", ray_cluster.cluster, tmp_path, variant="int8"))
    assert client.get(f"{ray_cluster.url}/ready").json()["model_version"] == v2
    assert sorted(r["replica"] for r in ray_cluster.replicas()) == replicas


def test_worker_node_killed_mid_load_errors_are_counted_and_service_recovers(ray_cluster, client):
    ray_cluster("ray-2")
    cluster = ray_cluster.cluster
    target = FastAPITarget(ray_cluster.url, PHOTO)
    with ReplicaSampler(cluster.dashboard_url, 0.5, cluster.token) as sampler:
        killed = []

        def kill():
            sampler.mark("worker node killed")
            killed.append(cluster.kill_worker())

        timer = threading.Timer(2.0, kill)
        timer.start()
        record = run_bench(target, Load.closed(4, requests=None, duration_s=8, warmup=0), Labels("ray-2"),
                           ClientOptions(sampler=sampler, timeout_s=5.0))
        timer.join()
    t = record.timeline
    assert killed and not session_members(killed[0])  # the whole node is gone
    # Failures are counted by kind, never as successes (one that waited past the 5 s timeout is a "timeout").
    assert all(kind.startswith(("http_5", "disconnected", "timeout")) for kind in record.stats.errors), record.stats.errors
    # The timeline counts the same failures, and the service recovered after the kill (how fast is a speed).
    # How many requests the kill catches in flight depends on where the proxy sent them: none is possible.
    assert sum(t.errors) == record.stats.error_count and t.recovery_s is not None
    # Requests completed after the kill on the surviving head replica, and still do.
    kill_at = t.events["worker node killed"]
    assert sum(n for start, n in zip(t.t_s, t.throughput_rps) if start > kill_at + t.recovery_s + 1) > 0
    assert client.post(f"{ray_cluster.url}/predict", json={"image": b64(PHOTO)}).status_code == 200


def test_a_failed_deploy_raises_with_the_childs_own_words(ray_cluster, tmp_path):
    # The lab and the benchmark deploy in a child whose log may be in a folder deleted afterwards.
    log = tmp_path / "deploy.log"
    log.write_text("an earlier deploy's lines\n")
    with pytest.raises(RuntimeError, match="invalid choice: 'no-such-stage'") as failed:
        deploy_in_child("no-such-stage", ray_cluster.cluster, ray_cluster.port, log)
    assert "an earlier deploy" not in str(failed.value)


def test_replicas_ask_for_a_gpu_of_their_own_only_where_told():
    """Without `num_gpus` Ray leaves CUDA_VISIBLE_DEVICES unset and every replica of a GPU node would share
    its first GPU; the local lab (CPU nodes) must ask for none, or nothing could be placed."""
    from servelab.core.settings import RaySettings
    from servelab.servers.rayserve.options import STAGES, deployment_options

    for stage in STAGES.values():
        assert deployment_options(stage, RaySettings(ray_replica_gpus=0))["ray_actor_options"] == {"num_cpus": 1}
        on_gpus = deployment_options(stage, RaySettings(ray_replica_gpus=1))["ray_actor_options"]
        assert on_gpus == {"num_cpus": 1, "num_gpus": 1}
