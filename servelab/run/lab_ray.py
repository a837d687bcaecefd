"""The Ray Serve stages' own runs in ``servelab lab``: a step load on the autoscaling stage (Poisson arrivals at 15 %,
90 %, 15 % of its capacity, the replicas sampled), and last a node failure (the worker SIGKILLed a third of the way in;
failed requests counted by kind, none waiting past ``FAILURE_TIMEOUT_S``). The lab comes in as a ``Measurer``: this
module imports neither the lab nor the adapters, which import it."""

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from servelab.core.artifacts import Manifest
from servelab.core.catalogue import Stage
from servelab.measure.measure_stage import Labels, measure_stage, servelab_client
from servelab.measure.records import Load, Record, RunKind
from servelab.measure.targets import Target
from servelab.servers.rayserve.serve_state import ReplicaSampler

FAILURE_TIMEOUT_S = 5.0  # per request in the node-failure run
STEP_TIMEOUT_S = 10.0  # per request in the step load
FAILURE_CONCURRENCY = 8


class Measurer(Protocol):
    """What the Ray runs use of ``servelab.run.lab.Lab``."""

    plan: Any  # servelab.run.plan.Plan: steps_s, failure_s

    def log(self, line: str) -> None: ...

    def on(self, adapter: Any, stage: Stage, manifest: Manifest, extra: dict | None = None,
           switch: bool = True) -> AbstractContextManager[tuple[Target, Labels]]: ...

    def keep(self, measure: Callable[[], Record], load: Load) -> Record: ...


@dataclass
class RayRuns:
    """Ray Serve's ``families.Runs``: its cluster, each stage's placement and step load, the node failures last."""

    lab: Measurer
    ray: Any  # servelab.run.families.RayAdapter
    manifest: Manifest
    measured: list[Stage] = field(default_factory=list)

    def started(self) -> None:
        cluster = self.ray.cluster
        self.lab.log(f"[ray] local cluster: head {cluster.address} (PID {cluster.head.pid}) + 1 worker node "
                     f"(PID {cluster.nodes[0].pid}), {self.ray.cpus_per_node} logical CPUs each; "
                     f"dashboard {cluster.dashboard_url}")

    def after(self, stage: Stage, capacity: float | None) -> None:
        """Once ``stage``'s loads ran: where its replicas run, and its step load if it has one."""
        nodes = ", ".join(f"{node[:8]}: {n}" for node, n in self.ray.where["replicas_per_node"].items())
        self.lab.log(f"    replicas per Ray node id: {nodes}")
        self.measured.append(stage)
        if stage.ray.step_load and capacity:
            self.step_load(stage, capacity)

    def finish(self) -> None:
        """The node-failure runs, last: each kills a worker node."""
        for stage in (s for s in self.measured if s.ray.node_failure):
            self.lab.log(f"[{stage.name}] node failure: a worker node killed mid-load")
            self.node_failure(stage)

    def _record(self, stage: Stage, load: Load, sampler: ReplicaSampler, config: dict, timeout_s: float) -> Record:
        with self.lab.on(self.ray, stage, self.manifest, config, switch=False) as (target, labels):
            [record] = measure_stage(target, [load], labels, [servelab_client(timeout_s=timeout_s, sampler=sampler)],
                                     self.lab.keep)
        return record

    def step_load(self, stage: Stage, capacity: float) -> None:
        low, high = max(1.0, round(0.15 * capacity, 1)), max(2.0, round(0.9 * capacity, 1))
        s1, s2, s3 = self.lab.plan.steps_s
        load = Load.steps([(low, s1), (high, s2), (low, s3)], warmup=0, max_inflight=64)
        with ReplicaSampler(self.ray.cluster.dashboard_url, token=self.ray.cluster.token) as sampler:
            self._record(stage, load, sampler, {"run": RunKind.STEP_LOAD}, STEP_TIMEOUT_S)

    def node_failure(self, stage: Stage) -> None:
        self.ray.switch(stage)
        seconds = self.lab.plan.failure_s
        load = Load.closed(FAILURE_CONCURRENCY, requests=None, duration_s=seconds, warmup=2)
        cluster = self.ray.cluster
        with ReplicaSampler(cluster.dashboard_url, token=cluster.token) as sampler:
            killed: list[int] = []

            def kill() -> None:
                sampler.mark("worker node killed")
                killed.append(cluster.kill_worker())

            timer = threading.Timer(seconds / 3, kill)
            timer.start()
            try:
                record = self._record(stage, load, sampler,
                                      {"run": RunKind.NODE_FAILURE, "request_timeout_s": FAILURE_TIMEOUT_S}, FAILURE_TIMEOUT_S)
            finally:
                timer.cancel()
        t = record.timeline
        self.lab.log(f"    worker node (PID {killed[0] if killed else '?'}) killed at {t.events.get('worker node killed', 0):.1f} s; "
                     f"errors {record.stats.errors or 'none'}; recovered {t.recovery_s} s after the kill; "
                     f"slowest success {record.stats.latency.max_ms or 0:.0f} ms")
