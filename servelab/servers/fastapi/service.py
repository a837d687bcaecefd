"""What both FastAPI apps (``fastapi_pt/app.py``, ``fastapi_onnx/app.py``) share: each loads its model in its
lifespan, defines ``POST /predict`` and calls ``add_service_routes(app, service)`` for the rest of the API.

The model loads before the port opens, so a fatal problem (no artifacts, ``REQUIRE_GPU=1`` without a GPU)
ends the process; the warm-up (every batch size its ONNX Runtime sessions take) runs while ``/health``
answers and ``/ready`` says 503. Handlers only parse, await and answer: the work runs in ``pipeline``'s
workers and batcher. ``CACHE_URL`` puts Redis before ``POST /predict`` (``cache``), not before the batch route.

``POST /admin/reload`` swaps the model without stopping (docs/production.md): requests that arrived before
finish on the old one (``Generations``); 404 for a missing model, 422 for one that fails to load or warm
up, 409 for a reload while another runs, and the old model keeps serving each time. Admin routes exist only
with ``ADMIN_TOKEN`` set and check it before the body is read (``AdminGuardMiddleware``); a reload loads
only a ``model_dir`` inside ``MODEL_ROOT`` (403 otherwise).
"""

import asyncio
import hmac
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from time import perf_counter

from fastapi import FastAPI, HTTPException, Request, Response
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.preprocess import ImageError
from servelab.core.settings import ServeSettings
from servelab.core.wire import VERSION_HEADER
from servelab.servers.fastapi.batcher import MicroBatcher
from servelab.servers.fastapi.cache import ResponseCache
from servelab.servers.fastapi.errors import ERROR_RESPONSES, RELOAD_RESPONSES, install_error_handlers
from servelab.servers.fastapi.metrics import START_KEY, Metrics, MetricsMiddleware
from servelab.servers.fastapi.pipeline import Pipeline, Timing, warm
from servelab.servers.fastapi.runtimes import Backend, max_infer_batch, why_threads
from servelab.servers.fastapi.schemas import (
    SERVING,
    Batching,
    BatchRequest,
    BatchResponse,
    Health,
    PredictionOut,
    Ready,
    Reloaded,
    ReloadRequest,
    Workers,
)
from servelab.servers.fastapi.siblings import Siblings, cpus

log = logging.getLogger("servelab.servers.fastapi")

# A replaced model closes once the requests that may use it have answered, or after this long regardless
# (above any client's timeout: a request still open by then has been given up on).
DRAIN_TIMEOUT_S, DRAIN_POLL_S = 120.0, 0.01


class Service:
    """What the handlers share. Ray Serve's stages pass their ``@serve.batch`` ``batcher`` and ``placement``,
    where the replica runs, for ``/ready``."""

    def __init__(self, name: str, settings: ServeSettings, batcher: type[MicroBatcher] = MicroBatcher,
                 placement: Callable[[], dict] | None = None, load: Callable[[ServeSettings], Backend] | None = None):
        logger = logging.getLogger("servelab")  # our INFO lines next to uvicorn's, which configures only its own
        if not logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False
        self.name, self.settings, self.metrics = name, settings, Metrics(max_infer_batch(settings))
        self.cache = ResponseCache(settings.cache_url, settings.cache_ttl_s, self.metrics.cache)
        self.batcher, self.placement, self.load = batcher, placement, load  # load: the app's, for reloads
        # One of several server processes on a port (servelab.servers.fastapi.workers): a process started after
        # a reload serves the model the reload asked for.
        self.siblings = Siblings.here()
        if self.siblings and (wanted := self.siblings.wanted()):
            self.settings = self._settings_for(wanted["model_dir"], wanted["variant"])
        self.backend: Backend | None = None
        self.pipeline: Pipeline | None = None
        self.ready = False
        self.not_ready_reason = "the model is loading"
        self.generations = Generations()
        self._reloading = asyncio.Lock()
        self._background: set[asyncio.Task] = set()  # the warm-up, replaced models draining: they end with serving

    @property
    def model_name(self) -> str:
        return SERVING.get(self.backend).manifest.name

    @asynccontextmanager
    async def serving(self, backend: Backend, warm_up_first: bool = False) -> AsyncIterator[None]:
        """Serve ``backend``, warming it up in the background, or first (``warm_up_first``: Ray Serve routes
        requests to a replica as soon as its startup returns, with no /ready check)."""
        self.backend = backend
        self.pipeline = Pipeline(backend, self.settings, self.metrics, self.batcher)
        self.pipeline.start()
        self.cache.start(backend)
        self.metrics.watch_sessions(lambda: self.backend.session_counts())  # the one serving now, after reloads too
        self.metrics.serving.labels(backend.version, backend.manifest.name).set(1)
        self.not_ready_reason = "the model is warming up"
        self._log_startup()
        # Beside other processes, one takes connections only once warm: the others answer meanwhile.
        warm_up_first = warm_up_first or self.siblings is not None
        try:
            if warm_up_first:
                await self.warm_up()
                if not self.ready:
                    raise RuntimeError(f"{self.name} is not ready: {self.not_ready_reason}")
                if self.siblings:
                    self.siblings.announce(backend.version)
            else:
                self._background.add(asyncio.create_task(self.warm_up()))
            yield
        finally:
            if self.siblings:
                self.siblings.leave()
            self.ready = False
            for task in self._background:  # a warm-up still running, replaced models still draining: end now
                task.cancel()
            await asyncio.gather(*self._background, return_exceptions=True)
            await self.pipeline.close()
            await self.cache.close()

    def _log_startup(self) -> None:
        backend, settings, m = self.backend, self.settings, self.backend.manifest
        log.info("%s: model %s version %s (manifest sha256 %s), source %s", self.name, m.name, backend.version,
                 m.sha256()[:16], m.source["kind"])
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
        try:
            sizes, probe = await warm(self.pipeline, self.settings)
        except Exception as exc:
            self.not_ready_reason = f"the warm-up inference failed ({type(exc).__name__}: {exc})"
            log.exception("%s: %s", self.name, self.not_ready_reason)
            return
        self.ready = True
        log.info("%s: ready (warm-up at batch sizes %s took %.0f ms)", self.name, sizes, (perf_counter() - started) * 1000)
        log.info("%s: start-up probe, %s: %s", self.name, DEFAULT_IMAGE.name, probe.describe(cpus(), self.backend.on_gpu))

    def ready_pipeline(self) -> Pipeline:
        if not self.ready:
            raise HTTPException(503, f"not ready: {self.not_ready_reason}", headers={"Retry-After": "5"})
        SERVING.set(self.backend)  # this request's model, whatever a reload swaps in meanwhile
        return self.pipeline

    async def reload(self, model_dir: Path | None, variant: str | None) -> Reloaded:
        """See the module's docstring. Beside other server processes, uvicorn then replaces each with one that
        starts on the new model (``Siblings.restart``)."""
        if self.load is None:
            raise HTTPException(501, f"{self.name} cannot reload its model")
        if variant is not None and self.backend.kind != "onnx":
            raise HTTPException(422, f"{self.name} serves PyTorch weights; `variant` applies to fastapi_onnx")
        if self._reloading.locked():
            raise HTTPException(409, "a reload is already in progress; the model it replaces is still serving")
        if not self.ready:
            raise HTTPException(409, f"not ready yet ({self.not_ready_reason}); reload once it is")
        try:
            confined = None if model_dir is None else self._confined(model_dir)
            reloaded = await self._swap(self._settings_for(confined, variant))
        except HTTPException:  # the model is missing, broken or not allowed: the old one still serves
            self.metrics.reloads.labels("refused").inc()
            raise
        if self.siblings:  # this process proved the model serves; the others start on it
            self.siblings.announce(reloaded.model_version)
            self.siblings.want(self.settings.model_dir, self.settings.onnx_variant)
            self.siblings.restart()
            reloaded.processes = self.siblings.expected
        return reloaded

    def _confined(self, model_dir: Path) -> Path:
        """``model_dir`` resolved (symlinks, ``..``); 403 outside MODEL_ROOT, where the operator puts models."""
        root = (self.settings.model_root or Path(self.settings.model_dir).resolve().parent).resolve()
        resolved = Path(model_dir).resolve()
        if not resolved.is_relative_to(root):
            raise HTTPException(403, f"model_dir {model_dir} resolves to {resolved}, outside MODEL_ROOT ({root}); "
                                     f"nothing was loaded, version {self.backend.version} still serves")
        return resolved

    def _settings_for(self, model_dir: Path | str | None, variant: str | None) -> ServeSettings:
        update = {"model_dir": Path(model_dir) if model_dir else None, "onnx_variant": variant}
        return self.settings.model_copy(update={k: v for k, v in update.items() if v is not None})

    async def _swap(self, settings: ServeSettings) -> Reloaded:
        """Load and warm up the new model beside the old, then swap; an HTTP error where it is missing or broken."""
        async with self._reloading:
            started = perf_counter()
            try:
                backend = await asyncio.to_thread(self.load, settings)
            except FileNotFoundError as exc:
                raise HTTPException(404, f"cannot reload: {exc}; still serving version {self.backend.version}") \
                    from None
            except Exception as exc:  # a broken file or manifest, a GPU-only variant here: all the caller's to fix
                log.warning("%s: reload refused: %s: %s", self.name, type(exc).__name__, exc)
                raise HTTPException(422, f"cannot load the model in {settings.model_dir} ({type(exc).__name__}: "
                                         f"{exc}); still serving version {self.backend.version}") from None
            load_s = perf_counter() - started
            pipeline = Pipeline(backend, settings, self.metrics, self.batcher)
            pipeline.start()
            try:
                await warm(pipeline, settings)
            except Exception as exc:
                await pipeline.close()
                raise HTTPException(422, f"the model in {settings.model_dir} loaded but its warm-up failed ("
                                         f"{type(exc).__name__}: {exc}); still serving version "
                                         f"{self.backend.version}") from None
            warm_up_s = perf_counter() - started - load_s
            old, previous = self.pipeline, self.backend
            # The swap: one step of the event loop, so every request sees either model, whole.
            self.backend, self.pipeline, self.settings = backend, pipeline, settings
            self.generations.current += 1
            self._retire(old, self.generations.current)
            self.metrics.serving.labels(previous.version, previous.manifest.name).set(0)
            self.metrics.serving.labels(backend.version, backend.manifest.name).set(1)
            self.metrics.reloads.labels("swapped").inc()
            log.info("%s: reloaded: version %s answers new requests (was %s)", self.name, backend.version,
                     previous.version)
            self._log_startup()
            return Reloaded(model=backend.manifest.name, model_version=backend.version,
                            previous_version=previous.version, model_dir=str(settings.model_dir),
                            variant=settings.onnx_variant if backend.kind == "onnx" else None,
                            load_s=round(load_s, 3), warm_up_s=round(warm_up_s, 3))

    def _retire(self, old: Pipeline, generation: int) -> None:
        async def drain_then_close() -> None:
            try:
                if not await self.generations.drained(generation, DRAIN_TIMEOUT_S):
                    log.warning("%s: requests still open on the replaced model after %g s; closing it", self.name,
                                DRAIN_TIMEOUT_S)
            finally:
                await old.close()

        task = asyncio.create_task(drain_then_close())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def readiness(self) -> Ready:
        self.ready_pipeline()
        if (shared := self.backend.remote) is not None and not shared.connected:
            raise HTTPException(503, "not ready: the batcher process is starting again", headers={"Retry-After": "1"})
        workers = None
        if self.siblings:
            serving = self.siblings.serving()
            workers = Workers(processes=self.siblings.expected, ready=len(serving),
                              versions=sorted(set(serving.values())))
            if workers.ready < workers.processes:
                raise HTTPException(503, f"not ready: {workers.ready} of {workers.processes} server processes are warm",
                                    headers={"Retry-After": "1"})
        backend, m, s = self.backend, self.backend.manifest, self.settings
        return Ready(
            service=self.name, model=m.name, stand_in=m.stand_in, description=m.description, source=m.source,
            manifest_sha256=m.sha256(), model_version=backend.version, variant=backend.variant,
            runtime={**backend.details, "on_gpu": backend.on_gpu, "session_counts": backend.session_counts()},
            batching=Batching(enabled=s.max_batch_size > 1, **s.model_dump(include=Batching.model_fields.keys())),
            preprocess_mode=self.pipeline.mode, preprocess_workers=self.pipeline.workers, warnings=backend.warnings,
            workers=workers,
            **({"placement": (where := self.placement()), "stage": where.get("stage")} if self.placement else {}),
        )


def server_timing(request: Request, response: Response, timing: Timing) -> None:
    """``Server-Timing`` (its total from the metrics middleware) and the model version that answered."""
    response.headers["Server-Timing"] = timing.header(perf_counter() - request.scope[START_KEY])
    response.headers[VERSION_HEADER] = SERVING.get().version


class Generations:
    """Prediction requests in flight, by the generation (reloads so far) they arrived in. A request picks
    its model after it arrives, so one that arrived after a swap never uses the model it replaced: that
    model may close once no request of an earlier generation is open."""

    def __init__(self) -> None:
        self.current = 0
        self.open: Counter[int] = Counter()

    def enter(self) -> int:
        self.open[self.current] += 1
        return self.current

    def leave(self, generation: int) -> None:
        self.open -= Counter([generation])  # in place; a generation none is open in drops out

    async def drained(self, generation: int, timeout_s: float) -> bool:
        deadline = perf_counter() + timeout_s
        while any(g < generation for g in self.open):
            if perf_counter() > deadline:
                return False
            await asyncio.sleep(DRAIN_POLL_S)
        return True


class AdminGuardMiddleware:
    """What ``/admin/*`` asks of a request, before its body is read: nothing is there without ADMIN_TOKEN (404, as for
    any unknown path), and with it ``Authorization: Bearer <ADMIN_TOKEN>`` (401 without a token, 403 with another)."""

    def __init__(self, app: ASGIApp, token: str):
        self.app, self.expected = app, token.encode()

    def _refusal(self, scope: Scope) -> JSONResponse | None:
        if not self.expected:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        scheme, _, given = Headers(scope=scope).get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return JSONResponse({"detail": "the admin routes need `Authorization: Bearer <ADMIN_TOKEN>`"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(given.strip().encode(), self.expected):  # constant time: no timing hint
            return JSONResponse({"detail": "wrong admin token"}, status_code=403)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # With a token set, a method no admin route takes is the router's 405, not a refusal.
        guarded = scope["type"] == "http" and scope["path"].startswith("/admin") and (
            not self.expected or scope["method"] == "POST")
        if guarded and (refused := self._refusal(scope)):
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)


def cache_hit_timing(request: Request, response: Response) -> None:
    """A cache hit's ``Server-Timing``: its total only (no queue, no inference)."""
    total_s = perf_counter() - request.scope[START_KEY]
    response.headers["Server-Timing"] = f"cache;desc=hit, total;dur={total_s * 1000:.3f}"


def add_service_routes(app: FastAPI, service: Service) -> None:
    """Everything but ``POST /predict``; called last, so the metrics middleware knows every route."""
    settings = service.settings
    # MAX_QUEUE_REQUESTS bounds the service: beside other server processes, through a file they share.
    install_error_handlers(app, service.generations, settings.max_body_bytes, settings.max_queue_requests,
                           settings.shed_hold_ms / 1000, service.siblings.folder / "queue.places" if service.siblings else None)

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
        return BatchResponse(predictions=[PredictionOut(prediction=t.label, probability=t.probability, class_index=t.index)
                                          for t in tops], model=service.model_name)

    @app.post("/admin/reload", response_model=Reloaded, responses=RELOAD_RESPONSES,
              summary="Swap in another model (version) while serving; no request fails",
              include_in_schema=bool(settings.admin_token))  # guarded by AdminGuardMiddleware
    async def reload(body: ReloadRequest, response: Response) -> Reloaded:
        reloaded = await service.reload(body.model_dir, body.variant)
        response.status_code = 202 if reloaded.processes > 1 else 200  # 202: uvicorn still replaces the others
        return reloaded

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

    app.add_middleware(AdminGuardMiddleware, token=settings.admin_token)
    # Added last, so it is outermost and also counts what the body limit refuses.
    app.add_middleware(MetricsMiddleware, metrics=service.metrics, routes={route.path for route in app.routes})
