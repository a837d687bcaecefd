"""The Ray Serve stages of the catalogue (``servelab.core.catalogue``) as deployment options.

Every stage serves the ONNX Runtime service (``fastapi_onnx/app.py``'s ``build_app``) behind
Ray Serve's HTTP proxy, with the FastAPI stages' API. Replicas are spread over the nodes
(``max_replicas_per_node``), so a stage with two or more replicas uses two nodes.
"""

from servelab.core.catalogue import NO_BATCHING, RAY, Stage, of_family
from servelab.core.settings import RaySettings

APP_NAME = "food11"  # the Serve application every stage deploys (a redeploy replaces it)
DEPLOYMENT_NAME = "Food11"


def deployment_options(stage: Stage, settings: RaySettings) -> dict:
    """Keyword arguments for ``serve.deployment(...).options``."""
    ray = stage.ray
    # One logical CPU per replica: the scheduler's unit; ONNX Runtime gets one intra-op thread. A
    # replica that asks for no GPU sees every GPU of its node (Ray leaves CUDA_VISIBLE_DEVICES unset),
    # so all of a node's replicas would share its first GPU: on GPU nodes each asks for its own.
    actor = {"num_cpus": 1, **({"num_gpus": settings.ray_replica_gpus} if settings.ray_replica_gpus else {})}
    options: dict = {"ray_actor_options": actor, "max_ongoing_requests": 32}
    if ray.max_replicas_per_node:
        options["max_replicas_per_node"] = ray.max_replicas_per_node
    if ray.autoscaling:
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
        options["num_replicas"] = ray.replicas
    return options


def serve_env(stage: Stage, settings: RaySettings) -> dict[str, str]:
    """The serving settings (ServeSettings) each replica runs with."""
    # One CPU per replica (num_cpus): Ray scales by replicas, so one inference at a time on one thread and
    # no preprocessing processes inside one.
    env = {"MODEL_INSTANCES": "1", "INTRA_OP_THREADS": "1", "PREPROCESS_PROCESSES": "0", "WORKER_THREADS": "1",
           "ACCESS_LOG": "0"}
    if stage.ray.batching:
        env |= {"MAX_BATCH_SIZE": str(settings.ray_batch_max_size), "BATCH_TIMEOUT_MS": str(settings.ray_batch_wait_ms)}
    else:
        env |= NO_BATCHING
    return env


STAGES: dict[str, Stage] = of_family(RAY.name)
