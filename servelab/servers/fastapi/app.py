"""One API, two services: ``create_app("pytorch")`` (fastapi_pt) and ``create_app("onnx")`` (fastapi_onnx).

* ``POST /predict`` ``{"image": "<base64>"}`` -> ``{"prediction", "probability", "class_index", "model"}``
* ``POST /predict/batch`` ``{"images": [...]}`` -> ``{"predictions": [...], "model"}``, in order
* ``GET /health`` (the process is up), ``GET /ready`` (503 until the model is loaded *and* a warm-up
  inference succeeded, at every batch size its ONNX Runtime sessions take; then what runs where),
  ``GET /metrics`` (Prometheus), ``GET /docs``

Startup: the model loads before the port opens, so a fatal problem (no artifacts, ``REQUIRE_GPU=1``
without an active GPU) ends the process with an error; the warm-up then runs while ``/health``
answers and ``/ready`` says 503. Handlers only parse, await and answer: the work runs in
``servelab.servers.fastapi.pipeline``'s workers (threads, or processes: ``PREPROCESS_PROCESSES``) and its
batcher's thread. Every prediction response carries ``Server-Timing``.
"""

import asyncio
import base64
import logging
from collections.abc import Callable
from contextlib import asynccontextmanager
from time import perf_counter

from fastapi import FastAPI, HTTPException, Request, Response

from servelab import __version__
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.postprocess import Prediction as Top1
from servelab.core.preprocess import ImageError
from servelab.servers.fastapi.runtimes import Backend, BackendKind, load_backend, max_infer_batch
from servelab.servers.fastapi.batcher import MicroBatcher
from servelab.servers.fastapi.errors import ERROR_RESPONSES, install_error_handlers
from servelab.servers.fastapi.metrics import START_KEY, Metrics, MetricsMiddleware
from servelab.servers.fastapi.pipeline import Pipeline
from servelab.servers.fastapi.schemas import (
                                              Batching, BatchRequest, BatchResponse, Health, Prediction, PredictRequest, PredictResponse, Ready,
                                              )
from servelab.servers.fastapi.timing import Timing
from servelab.core.settings import ServeSettings, get_settings

SERVICE_NAMES: dict[BackendKind, str] = {"pytorch": "fastapi_pt", "onnx": "fastapi_onnx"}
log = logging.getLogger("servelab.servers.fastapi")


class Service:
    """What the handlers share: the backend and pipeline once loaded, and whether they are ready."""

    def __init__(self, kind: BackendKind, settings: ServeSettings, metrics: Metrics,
                 batcher: type[MicroBatcher] = MicroBatcher, placement: Callable[[], dict] | None = None):
        self.kind, self.name, self.settings, self.metrics = kind, SERVICE_NAMES[kind], settings, metrics
        self.batcher, self.placement = batcher, placement
        self.backend: Backend | None = None
        self.pipeline: Pipeline | None = None
        self.ready = False
        self.not_ready_reason = "the model is loading"

    async def start(self) -> None:
        try:
            self.backend = await asyncio.to_thread(load_backend, self.kind, self.settings)
        except Exception as exc:
            log.error("%s cannot start: %s", self.name, exc)
            raise
        self.pipeline = Pipeline(self.backend, self.settings, self.metrics, self.batcher)
        self.pipeline.start()
        self.metrics.watch_sessions(self.backend.session_counts)
        self.not_ready_reason = "the model is warming up"
        self._log_startup()

    def _log_startup(self) -> None:
        backend, settings, m = self.backend, self.settings, self.backend.manifest
        log.info("%s: model %s (manifest sha256 %s), source %s", self.name, m.name, m.sha256()[:16], m.source["kind"])
        if m.stand_in:
            log.warning("%s: STAND-IN MODEL: %s", self.name, m.description)
        log.info("%s: %s; intra-op threads %d, preprocessing: %d %s", self.name, backend.where(),
                 backend.intra_op_threads, self.pipeline.workers, self.pipeline.mode)
        if v := backend.variant:
            log.info("%s: variant %s: %s, %.1f MB, precision %s, input %s", self.name, v["name"], v["file"],
                     v["size_bytes"] / 1e6, v["precision"], v["input"])
        if settings.max_batch_size > 1:
            log.info("%s: dynamic batching on: up to %d images per inference, the oldest waiting at most %g ms",
                     self.name, settings.max_batch_size, settings.batch_timeout_ms)
        else:
            log.info("%s: dynamic batching off (one request per inference)", self.name)

    async def warm_up(self) -> None:
        started = perf_counter()
        sizes = self.backend.warm_up_sizes(self.settings)
        try:
            await self.pipeline.warm_up(base64.b64encode(DEFAULT_IMAGE.read_bytes()).decode(), sizes)
        except Exception as exc:
            self.not_ready_reason = f"the warm-up inference failed ({type(exc).__name__}: {exc})"
            log.exception("%s: %s", self.name, self.not_ready_reason)
            return
        self.ready = True
        log.info("%s: ready (warm-up at batch sizes %s took %.0f ms)", self.name, sizes, (perf_counter() - started) * 1000)

    async def close(self) -> None:
        self.ready = False
        if self.pipeline is not None:
            await self.pipeline.close()

    def ready_pipeline(self) -> Pipeline:
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
                              batch_timeout_ms=s.batch_timeout_ms, max_request_images=s.max_request_images),
            preprocess_mode=self.pipeline.mode, preprocess_workers=self.pipeline.workers, warnings=backend.warnings,
            **({"placement": (where := self.placement()), "stage": where.get("stage")} if self.placement else {}),
        )


def _configure_logging() -> None:
    """Our INFO lines next to uvicorn's (uvicorn configures only its own loggers)."""
    logger = logging.getLogger("servelab")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _answer(request: Request, response: Response, timing: Timing) -> None:
    response.headers["Server-Timing"] = timing.header(perf_counter() - request.scope[START_KEY])


def _prediction(p: Top1) -> dict:
    return {"prediction": p.label, "probability": p.probability, "class_index": p.index}


def create_app(kind: BackendKind, settings: ServeSettings | None = None, *,
               batcher: type[MicroBatcher] = MicroBatcher, placement: Callable[[], dict] | None = None,
               warm_up_first: bool = False) -> FastAPI:
    """The service app; cheap to create (the model loads when the server starts it).

    The Ray Serve stages serve this same app in each replica (``servelab.servers.rayserve.deployment``):
    ``batcher`` swaps in ``@serve.batch``, ``placement`` names the replica's Ray node in ``/ready``,
    and ``warm_up_first`` finishes the warm-up before startup returns: Serve routes requests to a
    replica as soon as its startup returns, with no /ready check, so it would otherwise get 503s.
    """
    settings = settings or get_settings()
    _configure_logging()
    metrics = Metrics(max_infer_batch(settings))
    service = Service(kind, settings, metrics, batcher, placement)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        warm_up = None
        if warm_up_first:
            await service.warm_up()
            if not service.ready:
                await service.close()
                raise RuntimeError(f"{service.name} is not ready: {service.not_ready_reason}")
        else:
            warm_up = asyncio.create_task(service.warm_up())
        try:
            yield
        finally:
            if warm_up is not None:
                warm_up.cancel()
                await asyncio.gather(warm_up, return_exceptions=True)
            await service.close()

    app = FastAPI(
        title=f"servelab {service.name}", version=__version__, lifespan=lifespan,
        description=f"Food-11 image classifier ({'PyTorch' if kind == 'pytorch' else 'ONNX Runtime'}).",
        strict_content_type=False,  # lab clients may post JSON without a Content-Type
    )
    install_error_handlers(app, settings.max_body_bytes)

    @app.post("/predict", response_model=PredictResponse, responses=ERROR_RESPONSES,
              summary="Classify one image")
    async def predict(body: PredictRequest, request: Request, response: Response) -> PredictResponse:
        (top,), timing = await service.ready_pipeline().predict([body.image])
        _answer(request, response, timing)
        return PredictResponse(**_prediction(top), model=service.backend.manifest.name)

    @app.post("/predict/batch", response_model=BatchResponse, responses=ERROR_RESPONSES,
              summary="Classify several images in one request (one inference)")
    async def predict_batch(body: BatchRequest, request: Request, response: Response) -> BatchResponse:
        if not body.images:
            raise ImageError("no images given")
        if len(body.images) > settings.max_request_images:
            raise HTTPException(413, f"{len(body.images)} images in one request; at most {settings.max_request_images} "
                                     "(MAX_REQUEST_IMAGES)")
        tops, timing = await service.ready_pipeline().predict(body.images)
        _answer(request, response, timing)
        return BatchResponse(predictions=[Prediction(**_prediction(t)) for t in tops], model=service.backend.manifest.name)

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
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    # Added last, so it is outermost and also counts what the body limit refuses.
    app.add_middleware(MetricsMiddleware, metrics=metrics, routes={route.path for route in app.routes})
    return app
