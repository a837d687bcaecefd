"""The Ray Serve stages as data: replicas, ``@serve.batch`` and autoscaling.

Every stage serves the ONNX Runtime service (``servelab.serving``, ``create_app("onnx")``) behind
Ray Serve's HTTP proxy, with the FastAPI stages' API. Replicas are spread over the nodes
(``max_replicas_per_node``), so a stage with two or more replicas uses two nodes.
"""

from dataclasses import dataclass

from servelab.settings import RaySettings

APP_NAME = "food11"  # the Serve application every stage deploys (a redeploy replaces it)
DEPLOYMENT_NAME = "Food11"


@dataclass(frozen=True)
class RayStage:
    name: str
    about: str
    replicas: int = 1  # fixed replicas; for autoscaling, the most
    batching: bool = False  # @serve.batch (RAY_BATCH_MAX_SIZE, RAY_BATCH_WAIT_MS)
    autoscaling: bool = False  # RAY_AUTOSCALE_* settings
    max_replicas_per_node: int | None = None  # None: as many as the node's CPUs allow

    def deployment_options(self, settings: RaySettings) -> dict:
        """Keyword arguments for ``serve.deployment(...).options``."""
        # One logical CPU per replica: the scheduler's unit; ONNX Runtime gets one intra-op thread. A
        # replica that asks for no GPU sees every GPU of its node (Ray leaves CUDA_VISIBLE_DEVICES unset),
        # so all of a node's replicas would share its first GPU: on GPU nodes each asks for its own.
        actor = {"num_cpus": 1, **({"num_gpus": settings.ray_replica_gpus} if settings.ray_replica_gpus else {})}
        options: dict = {"ray_actor_options": actor, "max_ongoing_requests": 32}
        if self.max_replicas_per_node:
            options["max_replicas_per_node"] = self.max_replicas_per_node
        if self.autoscaling:
            options["autoscaling_config"] = {
                "min_replicas": settings.ray_autoscale_min_replicas,
                "max_replicas": settings.ray_autoscale_max_replicas,
                "target_ongoing_requests": settings.ray_autoscale_target_ongoing,
                "upscale_delay_s": settings.ray_autoscale_upscale_delay_s,
                "downscale_delay_s": settings.ray_autoscale_downscale_delay_s,
                # Decide on the last few seconds, not Serve's default 30 s window: a lab step is short.
                "look_back_period_s": 2.0,
                "metrics_interval_s": 0.5,
            }
        else:
            options["num_replicas"] = self.replicas
        return options

    def serve_env(self, settings: RaySettings) -> dict[str, str]:
        """The serving settings (ServeSettings) each replica runs with."""
        # One CPU per replica (num_cpus): Ray scales by replicas, so no preprocessing processes inside one.
        env = {"INTRA_OP_THREADS": "1", "PREPROCESS_PROCESSES": "0", "WORKER_THREADS": "1", "ACCESS_LOG": "0"}
        if self.batching:
            env |= {"MAX_BATCH_SIZE": str(settings.ray_batch_max_size), "BATCH_TIMEOUT_MS": str(settings.ray_batch_wait_ms)}
        return env


STAGES: dict[str, RayStage] = {s.name: s for s in (
    RayStage("ray-1", "Ray Serve, 1 replica", replicas=1),
    RayStage("ray-2", "Ray Serve, 2 replicas (one per node)", replicas=2, max_replicas_per_node=1),
    RayStage("ray-4", "Ray Serve, 4 replicas (two per node)", replicas=4, max_replicas_per_node=2),
    RayStage("ray-dyn", "Ray Serve, 2 replicas (one per node) + @serve.batch", replicas=2, batching=True,
             max_replicas_per_node=1),
    RayStage("ray-auto", "Ray Serve, autoscaling replicas (RAY_AUTOSCALE_*)", autoscaling=True,
             max_replicas_per_node=2),
)}
