"""What both FastAPI apps (``fastapi_pt/app.py``, ``fastapi_onnx/app.py``) share around their own code.

Each app loads its model in its lifespan, defines ``POST /predict`` and then calls
``add_service_routes(app, service)`` for the rest of one API:

* ``POST /predict`` ``{"image": "<base64>"}`` -> ``{"prediction", "probability", "class_index", "model"}`` (the app's)
* ``POST /predict/batch`` ``{"images": [...]}`` -> ``{"predictions": [...], "model"}``, in order
* ``GET /health`` (the process is up), ``GET /ready`` (503 until the model is loaded *and* a warm-up
  inference succeeded, at every batch size its ONNX Runtime sessions take; then what runs where),
  ``GET /metrics`` (Prometheus), ``GET /docs``

Startup: the model loads before the port opens, so a fatal problem (no artifacts, ``REQUIRE_GPU=1``
without an active GPU) ends the process with an error; the warm-up then runs while ``/health``
answers and ``/ready`` says 503. Handlers only parse, await and answer: the work runs in
``servelab.servers.fastapi.pipeline``'s workers (threads, or processes: ``PREPROCESS_PROCESSES``) and its
batcher's thread. Every prediction response carries ``Server-Timing``.

With ``CACHE_URL`` set, ``POST /predict`` looks the photo up in Redis first (``servelab.servers.fastapi.cache``)
and answers a hit from there, saying so (``X-Cache``); ``/predict/batch`` always asks the model.
"""

import asyncio
import base64
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from time import perf_counter

from fastapi import FastAPI, HTTPException, Request, Response

from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.preprocess import ImageError
from servelab.core.procs import cpu_count
from servelab.core.settings import ServeSettings
from servelab.servers.fastapi.batcher import MicroBatcher
from servelab.servers.fastapi.cache import RESULTS as CACHE_RESULTS, ResponseCache
from servelab.servers.fastapi.errors import ERROR_RESPONSES, install_error_handlers
from servelab.servers.fastapi.metrics import START_KEY, Metrics, MetricsMiddleware
from servelab.servers.fastapi.pipeline import Pipeline
from servelab.servers.fastapi.runtimes import Backend, max_infer_batch, why_threads
from servelab.servers.fastapi.schemas import Batching, BatchRequest, BatchResponse, Health, Prediction, Ready
from servelab.servers.fastapi.timing import Timing

log = logging.getLogger("servelab.servers.fastapi")


def _configure_logging() -> None:
    """Our INFO lines next to uvicorn's (uvicorn configures only its own loggers)."""
    logger = logging.getLogger("servelab")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


class Service:
    """What the handlers share: the backend and pipeline once loaded, and whether they are ready.

    ``batcher``: the micro-batcher class (Ray Serve's stages pass their ``@serve.batch`` one);
    ``placement``: where this replica runs, for ``/ready`` (Ray Serve's stages)."""

    def __init__(self, name: str, settings: ServeSettings, batcher: type[MicroBatcher] = MicroBatcher,
                 placement: Callable[[], dict] | None = None):
        _configure_logging()
        self.name, self.settings, self.metrics = name, settings, Metrics(max_infer_batch(settings))
        self.cache = ResponseCache(settings.cache_url, settings.cache_ttl_s, self.metrics.count_cache)
        if self.cache.enabled:  # the counters exist from the start, so a reader's first delta counts them all
            for result in CACHE_RESULTS:
                self.metrics.cache.labels(result)
        self.batcher, self.placement = batcher, placement
        self.backend: Backend | None = None
        self.pipeline: Pipeline | None = None
        self.ready = False
        self.not_ready_reason = "the model is loading"

    @property
    def model_name(self) -> str:
        return self.backend.manifest.name

    @asynccontextmanager
    async def serving(self, backend: Backend, warm_up_first: bool = False) -> AsyncIterator[None]:
        """Serve ``backend`` (its workers and batcher started), warming it up in the background, or first
        (``warm_up_first``: Ray Serve routes requests to a replica as soon as its startup returns, with
        no /ready check, so it would otherwise get 503s); stopped on the way out."""
        self.backend = backend
        self.pipeline = Pipeline(backend, self.settings, self.metrics, self.batcher)
        self.pipeline.start()
        self.cache.start(backend)
        self.metrics.watch_sessions(backend.session_counts)
        self.not_ready_reason = "the model is warming up"
        self._log_startup()
        warm_up = None
        try:
            if warm_up_first:
                await self.warm_up()
                if not self.ready:
                    raise RuntimeError(f"{self.name} is not ready: {self.not_ready_reason}")
            else:
                warm_up = asyncio.create_task(self.warm_up())
            yield
        finally:
            if warm_up is not None:
                warm_up.cancel()
                await asyncio.gather(warm_up, return_exceptions=True)
            self.ready = False
            await self.pipeline.close()
            await self.cache.close()

    def _log_startup(self) -> None:
        backend, settings, m = self.backend, self.settings, self.backend.manifest
        log.info("%s: model %s (manifest sha256 %s), source %s", self.name, m.name, m.sha256()[:16], m.source["kind"])
        if m.stand_in:
            log.warning("%s: STAND-IN MODEL: %s", self.name, m.description)
        log.info("%s: %s; %d inference(s) at once on %d intra-op thread(s) each, preprocessing: %d %s (%s)",
                 self.name, backend.where(), self.pipeline.batcher.instances, backend.intra_op_threads,
                 self.pipeline.workers, self.pipeline.mode, why_threads(settings, backend))
        if v := backend.variant:
            log.info("%s: variant %s: %s, %.1f MB, precision %s, input %s", self.name, v["name"], v["file"],
                     v["size_bytes"] / 1e6, v["precision"], v["input"])
        if settings.max_batch_size > 1 and settings.batch_timeout_ms == 0:
            log.info("%s: dynamic batching on: up to %d images per inference, of the requests that queued while every "
                     "instance was busy; none waits for a batch (BATCH_TIMEOUT_MS=0)", self.name, settings.max_batch_size)
        elif settings.max_batch_size > 1:
            log.info("%s: dynamic batching on: up to %d images per inference, the oldest waiting at most %g ms",
                     self.name, settings.max_batch_size, settings.batch_timeout_ms)
        else:
            log.info("%s: dynamic batching off (one request per inference)", self.name)
        if settings.max_queue_requests or settings.max_queue_delay_ms:
            log.info("%s: load shedding on: 503 + Retry-After past %s requests held or %s ms waited for a batch",
                     self.name, settings.max_queue_requests or "unbounded", settings.max_queue_delay_ms or "unbounded")

    async def warm_up(self) -> None:
        started = perf_counter()
        sizes = self.backend.warm_up_sizes(self.settings)
        try:
            probe = await self.pipeline.warm_up(base64.b64encode(DEFAULT_IMAGE.read_bytes()).decode(), sizes)
        except Exception as exc:
            self.not_ready_reason = f"the warm-up inference failed ({type(exc).__name__}: {exc})"
            log.exception("%s: %s", self.name, self.not_ready_reason)
            return
        self.ready = True
        log.info("%s: ready (warm-up at batch sizes %s took %.0f ms)", self.name, sizes, (perf_counter() - started) * 1000)
        log.info("%s: start-up probe, %s: %s", self.name, DEFAULT_IMAGE.name, probe.describe(cpu_count(), self.backend.on_gpu))

    def ready_pipeline(self) -> Pipeline:
        """The pipeline, or HTTP 503 (``Retry-After``) until the model is loaded and warmed up."""
        if not self.ready:
            raise HTTPException(503, f"not ready: {self.not_ready_reason}", headers={"Retry-After": "5"})
        return self.pipeline

    def readiness(self) -> Ready:
        self.ready_pipeline()
        backend, m, s = self.backend, self.backend.manifest, self.settings
        return Ready(
            service=self.name, model=m.name, stand_in=m.stand_in, description=m.description, source=m.source,
            manifest_sha256=m.sha256(), variant=backend.variant,
            runtime={**backend.details, "on_gpu": backend.on_gpu, "session_counts": backend.session_counts()},
            batching=Batching(enabled=s.max_batch_size > 1, max_batch_size=s.max_batch_size,
                              batch_timeout_ms=s.batch_timeout_ms, max_request_images=s.max_request_images,
                              max_queue_requests=s.max_queue_requests, max_queue_delay_ms=s.max_queue_delay_ms),
            preprocess_mode=self.pipeline.mode, preprocess_workers=self.pipeline.workers, warnings=backend.warnings,
            **({"placement": (where := self.placement()), "stage": where.get("stage")} if self.placement else {}),
        )


def server_timing(request: Request, response: Response, timing: Timing) -> None:
    """Where the request's time went, as the ``Server-Timing`` header (its total from the metrics middleware)."""
    response.headers["Server-Timing"] = timing.header(perf_counter() - request.scope[START_KEY])


def cache_hit_timing(request: Request, response: Response) -> None:
    """A cache hit's ``Server-Timing``: its total only, and that it was a hit (no queue, no inference)."""
    total_s = perf_counter() - request.scope[START_KEY]
    response.headers["Server-Timing"] = f"cache;desc=hit, total;dur={total_s * 1000:.3f}"


def add_service_routes(app: FastAPI, service: Service) -> None:
    """Everything but ``POST /predict``: ``/predict/batch``, ``/health``, ``/ready``, ``/metrics``, the error
    contract (``errors``) and the metrics middleware. Called last, so the middleware knows every route."""
    settings = service.settings
    install_error_handlers(app, settings.max_body_bytes, settings.max_queue_requests)

    @app.post("/predict/batch", response_model=BatchResponse, responses=ERROR_RESPONSES,
              summary="Classify several images in one request (one inference)")
    async def predict_batch(body: BatchRequest, request: Request, response: Response) -> BatchResponse:
        if not body.images:
            raise ImageError("no images given")
        if len(body.images) > settings.max_request_images:
            raise HTTPException(413, f"{len(body.images)} images in one request; at most {settings.max_request_images} "
                                     "(MAX_REQUEST_IMAGES)")
        tops, timing = await service.ready_pipeline().predict(body.images)
        server_timing(request, response, timing)
        return BatchResponse(predictions=[Prediction(prediction=t.label, probability=t.probability, class_index=t.index)
                                          for t in tops], model=service.model_name)

    @app.get("/health", response_model=Health, summary="Liveness: the process answers")
    async def health() -> Health:
        return Health()

    @app.get("/ready", response_model=Ready, responses={503: ERROR_RESPONSES[503]},
             summary="Readiness: the model is loaded and warmed up; what runs where")
    async def ready() -> Ready:
        return service.readiness()

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    async def prometheus() -> Response:
        body, content_type = service.metrics.render()
        return Response(body, media_type=content_type)

    # Added last, so it is outermost and also counts what the body limit refuses.
    app.add_middleware(MetricsMiddleware, metrics=service.metrics, routes={route.path for route in app.routes})
