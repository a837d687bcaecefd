"""One adapter per family, between a runner and ``measure_stage``: how a stage of that family is served (``start``,
``switch``, ``roll_out``: all it started is stopped by PID), where a load goes (``target``), where the stage really runs
(``runs_on``), and what the lab does differently for its stages. A new family is its record in
``servelab.core.catalogue.FAMILIES`` and one ``Adapter`` in ``ADAPTERS``. ``pid`` is the server measured (its CPU time
goes into the records), ``scraped`` its series in Prometheus. The notebooks' walkthroughs wait for a student's switch
instead, then call the same ``measure_stage``."""

import asyncio
import importlib.util
import secrets
import shutil
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from servelab.core.artifacts import Manifest
from servelab.core.catalogue import FASTAPI, MODELS, PT, RAY, TRITON, Stage
from servelab.core.family import Family
from servelab.core.hardware import Device, instances_say, runs_on_triton, stage_env
from servelab.core.installers.perf_analyzer_install import PerfAnalyzerNotFound, locate
from servelab.core.procs import free_port
from servelab.core.settings import get_settings
from servelab.measure.measure_stage import served_runtime
from servelab.measure.targets import FastAPITarget, TritonTarget
from servelab.run.lab_metrics import LabPrometheus, Scraped
from servelab.run.lab_ray import Measurer, RayRuns
from servelab.servers.fastapi.admin import reload
from servelab.servers.fastapi.child import fastapi_process
from servelab.servers.rayserve.cluster import LocalCluster, ray_binary
from servelab.servers.rayserve.control import deploy_in_child, roll_out_in_child
from servelab.servers.rayserve.serve_state import placement
from servelab.servers.triton.python_backend import instance_count


class Runs:
    """What a family runs beside its stages' loads (here nothing; Ray Serve's: ``lab_ray.RayRuns``)."""

    def started(self) -> None:
        """Its server (cluster) is up."""

    def after(self, stage: Stage, capacity: float | None) -> None:
        """A stage's loads ran."""

    def finish(self) -> None:
        """Every stage ran, the server still up."""


class Adapter:
    """An adapter's defaults (a family with none of the extras); each family writes the serving parts and ``in_lab``."""

    family: ClassVar[Family]  # the record of the family it runs
    redis: ClassVar[bool] = False  # the cache case puts the lab's Redis in front (else: the server's own cache)
    STAND_IN: ClassVar[str] = ""  # what stands in here for the node's set-up, named in each of its records
    url: str = ""
    pid: int | None = None
    scraped: Scraped | None = None

    @staticmethod
    def missing() -> dict[str, str]:  # what this environment lacks to run it, part -> why (the family's name: all)
        return {}

    @staticmethod
    def settings(stage: Stage) -> Mapping[str, str]:  # in each of its records' config
        return {}

    @staticmethod
    def batches(stage: Stage) -> bool:  # the lab also sends it requests of ``plan.BATCH`` images
        return False

    @staticmethod
    def both_arrivals(stage: Stage) -> bool:  # constant as well as Poisson arrivals, perf_analyzer beside
        return False

    @staticmethod
    def fed(stage: Stage) -> tuple | None:  # how perf_analyzer feeds it (fed alike: one command); None: it does not
        return None

    @classmethod
    def stand_in(cls, stage: Stage) -> str:
        return cls.STAND_IN

    def runs(self, lab: Measurer, manifest: Manifest) -> Runs:
        return Runs()

    def target(self, stage: Stage, image: bytes, image_name: str = "") -> FastAPITarget | TritonTarget:
        return FastAPITarget(self.url, image, image_name=image_name)  # the HTTP API FastAPI and Ray Serve share

    def runs_on(self, stage: Stage) -> tuple[str, dict[str, Any]]:
        return served_runtime(self.url)


def _scrape(prometheus: LabPrometheus | None, address: str, family: Family, **labels: str):
    return prometheus.scrape(address, family.name, **labels) if prometheus else nullcontext(None)


class FastAPIAdapter(Adapter):
    """Each stage its own ``servelab serve`` process on 127.0.0.1 (a switch stops the last one), with
    the stage's settings over ``env`` (the device's, or a benchmark's)."""

    family, redis = FASTAPI, True

    def __init__(self, logs: Path, env: dict[str, str] | None = None, prometheus: LabPrometheus | None = None,
                 ready_timeout: float = 180):
        self.logs, self.env, self.prometheus, self.ready_timeout = logs, env or {}, prometheus, ready_timeout
        # Its servers' admin routes answer this token only (a new one per run: nothing else can reload them).
        self.admin_token = secrets.token_urlsafe(24)
        self._serving: ExitStack | None = None
        self.serving: Stage | None = None  # the stage its server runs as started (None after a rollout)

    @classmethod
    def in_lab(cls, logs: Path, device: Device, prometheus: LabPrometheus, manifest: Path) -> "FastAPIAdapter":
        # A GPU stage may build a TensorRT engine before it is ready: minutes on a first run.
        return cls(logs, stage_env(device), prometheus, ready_timeout=900 if device == "gpu" else 180)

    @staticmethod
    def settings(stage: Stage) -> Mapping[str, str]:
        return stage.fastapi.env

    @contextmanager
    def start(self, first: Stage) -> Iterator["FastAPIAdapter"]:
        try:
            self.switch(first)
            yield self
        finally:
            self._stop()

    def _stop(self) -> None:
        if self._serving is not None:
            self._serving.close()
        self._serving, self.url, self.pid, self.scraped, self.serving = None, "", None, None, None

    def switch(self, stage: Stage) -> None:
        if stage == self.serving:  # already served as it starts: a second start would only cost time
            return
        self._stop()
        port, self._serving = free_port(), ExitStack()
        try:
            # Registered before the server starts: Prometheus takes up to 5 s to pick up a new target,
            # time the server spends loading its model anyway.
            self.scraped = self._serving.enter_context(
                _scrape(self.prometheus, f"127.0.0.1:{port}", FASTAPI, stage=stage.name))
            server = self._serving.enter_context(fastapi_process(
                stage.fastapi.service, port, self.logs / f"{stage.name}-{port}.log",
                {**self.env, **stage.fastapi.env, "ADMIN_TOKEN": self.admin_token}, ready_timeout=self.ready_timeout))
        except BaseException:
            self._stop()
            raise
        self.url, self.pid, self.serving = f"http://127.0.0.1:{port}", server.pid, stage

    async def roll_out(self, stage: Stage, variant: str) -> dict[str, Any]:
        """``POST /admin/reload``: the service loads and warms up ``variant`` beside its model, then swaps."""
        self.serving = None  # no longer as the stage starts it: the next switch starts it afresh
        return await reload(self.url, variant=variant, token=self.admin_token)


def serve_fastapi(stack: ExitStack, stage: Stage, logs: Path, env: dict[str, str]) -> "FastAPIAdapter":
    """``stage``'s service in a process of its own until ``stack`` closes, with ``env`` over the stage's
    settings (a benchmark's batching or model variant, beside the same stage with others); its ``url``, ``pid``."""
    as_run = replace(stage, part=replace(stage.fastapi, env={**stage.fastapi.env, **env}))
    return stack.enter_context(FastAPIAdapter(logs).start(as_run))


class TritonAdapter(Adapter):
    """One local tritonserver for every stage: a switch reloads the stage's models (explicit model
    control), as students switch stages on the lab node without restarting the server."""

    family = TRITON
    # Triton's Python-backend stand-in for the ONNX Runtime backend (the wheel's tritonserver has no other).
    STAND_IN = "Triton ONNX Runtime backend replaced by a Python-backend model calling ONNX Runtime (local stand-in)"

    @classmethod
    def stand_in(cls, stage: Stage) -> str:
        return cls.STAND_IN if stage.triton.model != PT else ""

    def __init__(self, logs: Path, repository: Path, kind: str = "auto", prometheus: LabPrometheus | None = None,
                 manifest: Path | None = None):
        self.logs, self.repository, self.kind, self.prometheus = logs, repository, kind, prometheus
        self.manifest = manifest  # preprocessing parameters, for a client that sends crops
        self.server: Any = None  # servelab.servers.triton.server.LocalTriton, while started
        self.config: dict[str, Any] = {}
        self._scraped: Scraped | None = None
        self._staged: list[Path] = []  # the version folders ``roll_out`` wrote, removed at the next switch

    @classmethod
    def in_lab(cls, logs: Path, device: Device, prometheus: LabPrometheus, manifest: Path) -> "TritonAdapter":
        # The lab's device decides the instance kind (TRITON_INSTANCE_KIND is for `servelab triton`).
        return cls(logs, get_settings().triton_model_repository, device, prometheus, manifest)

    @staticmethod
    def missing() -> dict[str, str]:
        try:
            locate()
        except PerfAnalyzerNotFound as exc:
            return {"perf_analyzer": f"perf_analyzer cannot run here ({exc}): only servelab's client measures Triton"}
        return {}

    @staticmethod
    def batches(stage: Stage) -> bool:
        return stage.triton.batches

    @staticmethod
    def both_arrivals(stage: Stage) -> bool:
        return stage.triton.both_arrivals

    @staticmethod
    def fed(stage: Stage) -> tuple:
        # What the client sends (a photo, a tensor, a uint8 crop); one image or the stage's own batches; an ensemble.
        return stage.input, stage.triton.images, bool(stage.triton.needs)

    @property
    def log(self) -> Path:
        return self.logs / "tritonserver.log"

    @contextmanager
    def start(self, first: Stage) -> Iterator["TritonAdapter"]:
        # Deferred, not a circle: importing it loads tritonclient (an optional extra) only when this runs.
        from servelab.servers.triton.server import Ports, start_local

        ports = Ports.pick()  # the metrics port registered before the server starts, as for FastAPI
        with _scrape(self.prometheus, f"127.0.0.1:{ports.metrics}", TRITON) as self._scraped, \
                start_local(first, kind=self.kind, repository=self.repository, log=self.log, ports=ports) as server:
            self.server, self.pid = server, server.process.pid
            try:
                yield self
            finally:
                self._unstage()
                self.server, self.pid, self.scraped = None, None, None

    async def roll_out(self, stage: Stage, variant: str) -> dict[str, Any]:
        """The stage's model staged again as the next version, from the same model folder, and loaded over gRPC:
        Triton's default version policy (the latest one) serves it and retires the old. ``variant`` must be the
        one serving: a version's inputs are its clients', and every other variant takes uint8 images."""
        # Deferred, as in start: tritonclient (an optional extra).
        from servelab.servers.triton.server import model_versions, roll_out_version, stage_version

        called = time.monotonic()  # the trigger's moment: the record counts the new version's readiness from it
        model = MODELS[stage.triton.model]
        if variant != model.variant:
            raise ValueError(f"{model.name} serves {model.variant or 'no ONNX variant'}, and a new version keeps "
                             f"its inputs: it cannot roll out to {variant}")
        version = max(model_versions(self.server.url, model.name)) + 1
        self._staged.append(stage_version(self.repository, model.name, version, self.manifest.parent))
        return await asyncio.to_thread(roll_out_version, self.server.url, self.server.grpc_url, model.name, version,
                                       since=called)

    def _unstage(self) -> set[str]:
        """Remove the version folders ``roll_out`` staged; the models they were of."""
        models = {folder.parent.name for folder in self._staged}
        while self._staged:
            shutil.rmtree(self._staged.pop(), ignore_errors=True)
        return models

    def switch(self, stage: Stage) -> None:
        rolled = self._unstage()  # a version a rollout staged: the stage's load serves version 1 again
        self.config = self.server.apply_stage(stage)
        if rolled:  # and the rolled version is gone, with its counters, before the stage is measured
            from servelab.servers.triton.server import LOAD_TIMEOUT_S, only_version  # deferred, as in start

            for model in rolled:
                only_version(self.server.url, model, 1, time.monotonic() + LOAD_TIMEOUT_S)
        # The same server, one model's series.
        self.scraped = (replace(self._scraped, labels={**self._scraped.labels, "model": stage.triton.model})
                        if self._scraped else None)
        if self.prometheus:
            self.prometheus.switched(self.scraped)  # the model's load ran Triton's warm-up requests

    def target(self, stage: Stage, image: bytes, image_name: str = "") -> TritonTarget:
        return TritonTarget(self.server.url, stage.triton.model, image, input=stage.input, batch=stage.triton.images,
                            image_name=image_name, manifest=self.manifest)

    def runs_on(self, stage: Stage) -> tuple[str, dict[str, Any]]:
        said = instances_say(self.log.read_text(errors="replace"), stage.triton.model,
                             instance_count(self.config.get("instance_group", [])))
        # What Triton reported running after the switch (``check_running`` found it the stage's): every record says it.
        return runs_on_triton(self.config, said), {"triton_config": self.server.running}


class RayAdapter(Adapter):
    """One local Ray cluster (a head and a worker node, ``ray start`` processes) for every
    stage: a switch deploys the stage with ``servelab ray deploy``, the command the node's notebook runs."""

    family = RAY
    STAND_IN = ("Ray nodes are `ray start` processes on one machine sharing its CPUs (logical CPUs per node), "
                "not separate machines (local stand-in)")

    def __init__(self, logs: Path, cpus_per_node: int, env: dict[str, str] | None = None,
                 prometheus: LabPrometheus | None = None):
        self.logs, self.cpus_per_node, self.env, self.prometheus = logs, cpus_per_node, env or {}, prometheus
        self.cluster: Any = None  # servelab.servers.rayserve.cluster.LocalCluster, while started
        self.where: dict[str, Any] = {}  # the running replicas per Ray node id, after a switch
        self.deployed: Stage | None = None  # the stage deployed as it starts (None after a rollout)

    @classmethod
    def in_lab(cls, logs: Path, device: Device, prometheus: LabPrometheus, manifest: Path) -> "RayAdapter":
        return cls(logs, get_settings().ray_node_cpus, stage_env(device), prometheus)

    @staticmethod
    def missing() -> dict[str, str]:
        if importlib.util.find_spec("ray") and Path(ray_binary()).exists():
            return {}
        return {"ray": "Ray Serve is not installed in this environment (the `ray` extra; `make gpu-check`'s "
                       "environment and wheelhouse carry none): the Ray stages are CPU-cluster stages here"}

    def runs(self, lab: Measurer, manifest: Manifest) -> RayRuns:
        """A step load and a node failure besides (``servelab.run.lab_ray``)."""
        return RayRuns(lab, self, manifest)

    @contextmanager
    def start(self, first: Stage) -> Iterator["RayAdapter"]:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # The nodes' environment reaches every replica: RAY_SERVE_PORT for the deploy, MODEL_DIR etc. as set here.
        env = {**self.env, "RAY_SERVE_PORT": str(self.port), "RAY_SERVE_HOST": "127.0.0.1"}
        with ExitStack() as stack:
            self.cluster = stack.enter_context(LocalCluster(workers=1, cpus_per_node=self.cpus_per_node,
                                                            log_dir=self.logs, env=env))
            self.pid = self.cluster.head.pid
            stack.callback(setattr, self, "cluster", None)
            # Prometheus scrapes every node's metrics agent; the head's (the HTTP proxy's) counts the requests.
            self.scraped = stack.enter_context(_scrape(self.prometheus, self.cluster.metrics["head"], RAY))
            for name, address in self.cluster.metrics.items():
                if name != "head":
                    stack.enter_context(_scrape(self.prometheus, address, RAY, node=name))
            self.switch(first)
            yield self

    def switch(self, stage: Stage) -> None:
        if stage == self.deployed:  # already deployed as it starts: a second deploy would only cost time
            return
        deploy_in_child(stage.name, self.cluster, self.port, self.logs / f"ray-deploy-{stage.name}.log")
        self.deployed = stage
        self.where = placement(self.cluster.dashboard_url, self.cluster.token)
        if self.prometheus:
            self.prometheus.switched(self.scraped)  # a deploy's health checks reach the proxy too

    async def roll_out(self, stage: Stage, variant: str) -> dict[str, Any]:
        """``servelab ray rollout``: the running stage's replicas reload ``variant`` in place (``reconfigure``)."""
        self.deployed = None
        return await roll_out_in_child(stage.name, self.cluster, variant=variant)

    def runs_on(self, stage: Stage) -> tuple[str, dict[str, Any]]:
        runs_on, options = super().runs_on(stage)  # one replica's
        return runs_on, {**self.where, **options}


# Each family's adapter, by its name (``servelab lab`` runs them in the order of ``catalogue.FAMILIES``).
ADAPTERS: dict[str, type[Adapter]] = {a.family.name: a for a in (FastAPIAdapter, TritonAdapter, RayAdapter)}


def adapter_of(stage: Stage) -> type[Adapter]:
    if stage.family not in ADAPTERS:
        raise ValueError(f"{stage.name}: no adapter for the {stage.family} family in ADAPTERS ({', '.join(ADAPTERS)})")
    return ADAPTERS[stage.family]
