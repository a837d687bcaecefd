"""The Serve deployment: the ``fastapi-onnx`` stage's FastAPI app in every replica, deployed by stage.

Each replica builds ``fastapi_onnx/app.py``'s app (``replica_app``: the same routes, error contract, Server-Timing and
metrics) behind ``@serve.ingress``; Ray runs its lifespan, so the model loads and warms up in the replica. What differs:

* ``ServeBatcher`` replaces the micro-batcher by Ray Serve's own ``@serve.batch`` (the ``ray-dyn`` stage);
* ``/ready`` names the stage and the replica's Ray node and replica ids (``placement``);
* a new model rolls out through the deployment's ``user_config`` (``reconfigure``): the service's
  ``POST /admin/reload`` would reach one replica only.

The proxy runs on the head node only (``proxy_location="HeadOnly"``): locally every node shares
127.0.0.1, and two proxies would want the same port.
"""

import hashlib
import json
import logging
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from ray import serve

from servelab.core.catalogue import Stage
from servelab.core.settings import RaySettings, Settings
from servelab.servers.fastapi.batcher import BatchResult, MicroBatcher, infer_batch
from servelab.servers.rayserve.options import APP_NAME, DEPLOYMENT_NAME, deployment_options, serve_env

log = logging.getLogger("servelab.servers.rayserve")


class ServeBatcher(MicroBatcher):
    """``MicroBatcher`` over ``@serve.batch``: the batch forms in Ray Serve's queue, counted in
    images (``batch_size_fn``), and runs in ``instances`` inference threads (``max_concurrent_batches``).
    MAX_QUEUE_REQUESTS holds in a replica as in the service, but ``max_queue_delay_s`` is taken and not
    used: the batch waits in Serve's own queue, where this class cannot refuse a request."""

    def __init__(self, infer, max_batch_size: int = 1, timeout_s: float = 0.0, on_batch=None, instances: int = 1,
                 max_queue_delay_s: float = 0.0):
        super().__init__(infer, max_batch_size, timeout_s, on_batch, instances)  # its threads, warm-up and close
        self._batched = serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=timeout_s,
                                    max_concurrent_batches=instances,
                                    batch_size_fn=lambda items: sum(len(x) for x, _ in items))(self._infer_batch)

    def start(self) -> None:
        pass  # Serve starts its batching task on the first request

    async def submit(self, x: np.ndarray) -> BatchResult:
        if len(x) > self.max_batch_size:
            # A request's images stay together (as in MicroBatcher); @serve.batch refuses an item larger
            # than its batch, so such a request runs alone, in the same inference thread.
            (result,) = await self._infer_batch([(x, time.perf_counter())])
            return result
        return await self._batched((x, time.perf_counter()))

    async def _infer_batch(self, items: list[tuple[np.ndarray, float]]) -> list[BatchResult]:
        return await infer_batch(self._executor, self.infer, items, self.on_batch)


def _placement(stage: str) -> dict[str, Any]:
    import ray  # deferred: an optional extra (ray), loaded only when this runs

    context = serve.get_replica_context()
    return {"stage": stage, "ray_node_id": ray.get_runtime_context().get_node_id(),
            "replica": context.replica_id.unique_id, "deployment": context.deployment, "app": context.app_name}


def replica_app(stage: str, overrides: dict[str, str]):
    """In the replica: the ONNX service's app, with this stage's serving settings on top of the
    replica's environment (MODEL_DIR and the rest come from where the replica runs)."""
    # Deferred, not a circle: importing it loads FastAPI, ONNX Runtime, prometheus-client only in the replica.
    from fastapi_onnx.app import build_app

    settings = Settings(**{k.lower(): v for k, v in overrides.items()})
    return build_app(settings, batcher=ServeBatcher, placement=partial(_placement, stage), warm_up_first=True)


def application(stage: Stage, settings: RaySettings, model: dict[str, str] | None = None):
    """``model``: the ``user_config``, the model to serve instead of the replica's MODEL_DIR (``reconfigure``)."""
    overrides = serve_env(stage, settings)

    @serve.deployment(name=DEPLOYMENT_NAME)
    @serve.ingress()  # the app comes from __serve_build_asgi_app__, which keeps it for reconfigure
    class Food11:
        def __serve_build_asgi_app__(self):
            self.fastapi = replica_app(stage.name, overrides)
            return self.fastapi

        async def reconfigure(self, model: dict[str, str]) -> None:
            """Ray calls it with the ``user_config`` after startup and on each change of it (``Service.reload`` swaps
            the model in one step). A model there that cannot load or warm up raises: Ray then replaces the replica,
            whose replacement fails the same way, so the driver refuses a missing one first (``control.roll_out``)."""
            reloaded = await self.fastapi.state.service.reload(Path(model["model_dir"]), model["variant"])
            log.info("reconfigured: version %s (was %s)", reloaded.model_version, reloaded.previous_version)

    # Serve's imperative API gives every serve.run a random code version, which restarts every replica;
    # only a change confined to user_config is applied in place. So the code version is the stage and its
    # serving settings: the same again -> in place (``reconfigure``); else restarted. (Serve took `version`
    # out of its public options; `_internal=True` is how its own code still sets it.)
    code_version = hashlib.sha256(json.dumps([stage.name, overrides], sort_keys=True).encode()).hexdigest()[:16]
    options = deployment_options(stage, settings) | ({"user_config": model} if model else {})
    return Food11.options(**options).options(version=code_version, _internal=True).bind()


def deploy(stage: Stage, settings: RaySettings, timeout_s: float = 300.0) -> None:
    """Deploy a stage onto the cluster this driver is connected to, replacing the one running; returns once
    every replica is ready. The old replicas go first: Serve would start the new ones beside them, and on a
    small cluster (ray-2 -> ray-4 on two 2-CPU nodes) they never fit (the deploy waited out its 300 s)."""
    serve.start(http_options={"host": settings.ray_serve_host, "port": settings.ray_serve_port},
                proxy_location="HeadOnly")
    if APP_NAME in serve.status().applications:
        serve.delete(APP_NAME)
    serve.run(application(stage, settings), name=APP_NAME, route_prefix="/", blocking=False)
    wait_running(timeout_s)


def reconfigure(stage: Stage, settings: RaySettings, model: dict[str, str], timeout_s: float = 300.0) -> None:
    """Serve ``model`` on the running ``stage`` in place, as its ``user_config`` (Ray calls each replica's
    ``reconfigure``), rather than by Ray's rolling replacement of replicas: no spare CPUs for new replicas (a
    small cluster has none, see ``deploy``), no cold start, and requests keep reaching a replica while it loads."""
    if APP_NAME not in serve.status().applications:
        raise RuntimeError(f"no Serve application {APP_NAME} to roll out: deploy a stage first")
    serve.run(application(stage, settings, model), name=APP_NAME, route_prefix="/", blocking=False)
    wait_running(timeout_s)


def wait_running(timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        status = serve.status().applications.get(APP_NAME)
        state = str(status.status) if status else "absent"
        if state.endswith("RUNNING"):
            return
        if state.endswith("DEPLOY_FAILED") or time.monotonic() > deadline:
            message = status.message if status else ""
            raise RuntimeError(f"Serve application {APP_NAME}: {state} after {timeout_s:.0f} s or less: {message}")
        time.sleep(0.5)
