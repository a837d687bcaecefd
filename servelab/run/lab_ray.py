"""The Ray Serve stages in ``servelab lab``: one local cluster, a redeploy per stage, two extra runs.

One head and one worker node for every Ray stage; each stage is deployed by ``servelab ray deploy``
(a child process, the command the lab node's notebooks call) and measured by ``Lab.measure``
through ``FastAPITarget`` (the same API as the FastAPI stages), with its replicas' placement by Ray
node id in each record's config. Then:

* step load (the autoscaling stage): Poisson arrivals at a low, a high and again the low rate
  (15 % and 90 % of the capacity measured at the highest concurrency), with the running replicas
  sampled over time;
* node failure (last, on the stage that has one replica per node): closed loop at concurrency 8,
  the worker node SIGKILLed a third of the way in; every failed request is counted by its kind
  (``http_500``, ``timeout``, ...) and no request waits past ``FAILURE_TIMEOUT_S``.

``servelab.run.lab`` hands its ``Lab`` over; what is used of it is the ``LabRun`` protocol below (this module
does not import the lab, which imports it).
"""

import threading
from contextlib import ExitStack
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servelab.core.artifacts import Manifest
from servelab.measure.targets import FastAPITarget
from servelab.measure.records import Load, Record
from servelab.core.hardware import stage_env
from servelab.measure.measure_stage import Labels, measure_stage, served_runtime, servelab_client
from servelab.measure.monitoring.lab_metrics import LabPrometheus, Scraped
from servelab.core.procs import free_port
from servelab.servers.rayserve.control import deploy_in_child
from servelab.servers.rayserve.cluster import LocalCluster
from servelab.servers.rayserve.serve_state import ReplicaSampler, placement
from servelab.core.settings import get_settings

FAILURE_TIMEOUT_S = 5.0  # per request in the node-failure run
STEP_TIMEOUT_S = 10.0  # per request in the step load
FAILURE_CONCURRENCY = 8


class LabRun(Protocol):
    """What the Ray runs use of ``servelab.run.lab.Lab``: its plan, photo, logs and Prometheus, and its way of
    labelling a stage's records, measuring a stage, keeping one load's record, and going on past a
    failing stage."""

    plan: Any  # servelab.run.lab.Plan: steps_s, failure_s
    device: str
    image: bytes
    image_name: str
    logs: Path
    prometheus: LabPrometheus
    scraped: Scraped | None  # the server being measured now

    def log(self, line: str) -> None: ...

    def labels(self, stage, manifest: Manifest, pid: int | None, runs_on: str, extra: dict | None = None) -> Labels: ...

    def measure(self, stage, target: FastAPITarget, pid: int, manifest: Manifest, runs_on: str,
                extra: dict | None = None) -> float | None: ...

    def keep(self, measure: Callable[[], Record], load: Load) -> Record: ...

    def guard(self, stage, work: Callable[[], None], family: str = "triton") -> None: ...


@dataclass
class RayRuns:
    lab: LabRun
    manifest: Manifest

    def run(self, stages: list) -> None:
        settings = get_settings()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        lab = self.lab
        # The nodes' environment reaches every replica: RAY_SERVE_PORT for the deploy, MODEL_DIR etc. as set here.
        with ExitStack() as stack:
            cluster = stack.enter_context(LocalCluster(
                workers=1, cpus_per_node=settings.ray_node_cpus, log_dir=lab.logs,
                env={**stage_env(lab.device), "RAY_SERVE_PORT": str(self.port), "RAY_SERVE_HOST": "127.0.0.1"}))
            stack.callback(setattr, lab, "scraped", None)
            self.cluster = cluster
            # Prometheus scrapes every node's metrics agent; the head's (the HTTP proxy's) counts the requests.
            lab.scraped = stack.enter_context(lab.prometheus.scrape(cluster.metrics["head"], "ray"))
            for name, address in cluster.metrics.items():
                if name != "head":
                    stack.enter_context(lab.prometheus.scrape(address, "ray", node=name))
            lab.log(f"[ray] local cluster: head {cluster.address} (PID {cluster.head.pid}) + 1 worker node "
                    f"(PID {cluster.nodes[0].pid}), {settings.ray_node_cpus} logical CPUs each; "
                    f"dashboard {cluster.dashboard_url}")
            for stage in stages:
                lab.log(f"[{stage.name}] {stage.about}")
                lab.guard(stage, lambda stage=stage: self.stage(stage))
            for stage in (s for s in stages if s.ray.node_failure):
                lab.log(f"[{stage.name}] node failure: a worker node killed mid-load")
                lab.guard(stage, lambda stage=stage: self.node_failure(stage))

    def deploy(self, stage) -> dict:
        deploy_in_child(stage.name, self.cluster, self.port, self.lab.logs / f"ray-deploy-{stage.name}.log")
        where = placement(self.cluster.dashboard_url, self.cluster.token)
        nodes = ", ".join(f"{node[:8]}: {n}" for node, n in where["replicas_per_node"].items())
        self.lab.log(f"    deployed; running replicas per Ray node id: {nodes}")
        return where

    def target(self) -> FastAPITarget:
        return FastAPITarget(self.url, self.lab.image, image_name=self.lab.image_name)

    def served(self) -> tuple[str, dict]:
        return served_runtime(self.url)  # one replica's

    def stage(self, stage) -> None:
        where = self.deploy(stage)
        runs_on, options = self.served()
        capacity = self.lab.measure(stage, self.target(), self.cluster.head.pid, self.manifest, runs_on,
                                    extra={**where, **options})
        if stage.ray.step_load and capacity:
            self.step_load(stage, capacity, where)

    def _record(self, stage, load: Load, sampler: ReplicaSampler, config: dict, timeout_s: float) -> Record:
        runs_on, options = self.served()
        labels = self.lab.labels(stage, self.manifest, self.cluster.head.pid, runs_on, {**options, **config})
        [record] = measure_stage(self.target(), [load], labels, [servelab_client(timeout_s=timeout_s, sampler=sampler)],
                                 self.lab.keep)
        return record

    def step_load(self, stage, capacity: float, where: dict) -> None:
        low, high = max(1.0, round(0.15 * capacity, 1)), max(2.0, round(0.9 * capacity, 1))
        s1, s2, s3 = self.lab.plan.steps_s
        load = Load.steps([(low, s1), (high, s2), (low, s3)], warmup=0, max_inflight=64)
        with ReplicaSampler(self.cluster.dashboard_url, token=self.cluster.token) as sampler:
            self._record(stage, load, sampler, {"run": "step load", **where}, STEP_TIMEOUT_S)

    def node_failure(self, stage) -> None:
        where = self.deploy(stage)
        seconds = self.lab.plan.failure_s
        load = Load.closed(FAILURE_CONCURRENCY, requests=None, duration_s=seconds, warmup=2)
        with ReplicaSampler(self.cluster.dashboard_url, token=self.cluster.token) as sampler:
            killed: list[int] = []

            def kill() -> None:
                sampler.mark("worker node killed")
                killed.append(self.cluster.kill_worker())

            timer = threading.Timer(seconds / 3, kill)
            timer.start()
            try:
                record = self._record(stage, load, sampler,
                                      {"run": "node failure", "request_timeout_s": FAILURE_TIMEOUT_S, **where},
                                      FAILURE_TIMEOUT_S)
            finally:
                timer.cancel()
        t = record.timeline
        self.lab.log(f"    worker node (PID {killed[0] if killed else '?'}) killed at {t.events.get('worker node killed', 0):.1f} s; "
                     f"errors {record.stats.errors or 'none'}; recovered {t.recovery_s} s after the kill; "
                     f"slowest success {record.stats.latency.max_ms or 0:.0f} ms")
