"""The ONNX Runtime stage (``uvicorn fastapi_onnx.app:app``, ``servelab serve fastapi-onnx``), top to bottom:
the model opened in ONNX Runtime, the app that loads it, its route. servelab keeps what both stages share
(``servelab.servers.fastapi``): settings, preprocessing workers, the micro-batcher, the checks of what
really runs where, errors, metrics, /health, /ready."""

import asyncio
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request, Response

from servelab import __version__
from servelab.core.settings import ServeSettings, get_settings
from servelab.servers.fastapi.batcher import MicroBatcher
from servelab.servers.fastapi.errors import ERROR_RESPONSES
from servelab.servers.fastapi.runtimes import Backend, intra_op_threads, onnx_backend
from servelab.servers.fastapi.schemas import PredictRequest, PredictResponse
from servelab.servers.fastapi.service import Service, add_service_routes, cache_hit_timing, server_timing

GRAPH_OPTIMIZATION = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
                      "all": "ORT_ENABLE_ALL"}  # ORT_GRAPH_OPTIMIZATION -> ONNX Runtime's GraphOptimizationLevel


def open_session(path: Path, providers: list, settings: ServeSettings):
    """One session over the model file. ``providers``, from ORT_PROVIDERS, in order of preference: e.g.
    ``[("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"}), "CPUExecutionProvider"]``."""
    import onnxruntime as ort  # here: a server process in front of a batcher process (SHARED_BATCHER) holds no model

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads(settings)  # INTRA_OP_THREADS, else half the CPUs
    options.inter_op_num_threads = settings.inter_op_threads
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if settings.ort_execution_mode == "parallel" \
        else ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                               GRAPH_OPTIMIZATION[settings.ort_graph_optimization])
    # Idle threads sleep rather than spin, leaving the CPU to the preprocessing workers (ORT_ALLOW_SPINNING).
    spin = "1" if settings.ort_allow_spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    return ort.InferenceSession(str(path), options, providers=providers)


def load(settings: ServeSettings, **checks) -> Backend:
    """servelab picks the file (ONNX_VARIANT) and providers, opens a session per batch size (ORT_SHAPE_POLICY)
    with ``open_session`` and reads back the active providers: with REQUIRE_GPU=1, a silent CPU fallback fails."""
    return onnx_backend(settings, lambda path, providers: open_session(path, providers, settings), **checks)


def build_app(settings: ServeSettings | None = None, *, batcher: type[MicroBatcher] = MicroBatcher,
              placement: Callable[[], dict] | None = None, warm_up_first: bool = False) -> FastAPI:
    """Cheap to build: the model loads when the server starts the app. Ray Serve's replicas pass their
    batcher, placement and ``warm_up_first`` (servelab.servers.rayserve.deployment)."""
    settings = settings or get_settings()
    service = Service("fastapi_onnx", settings, batcher, placement, load)  # load: again on POST /admin/reload

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # Before the port opens, off the event loop: a missing model or REQUIRE_GPU=1 without a GPU ends it here.
        backend = await asyncio.to_thread(load, service.settings)
        async with service.serving(backend, warm_up_first):  # workers, batcher, warm-up, then /ready says 200
            yield

    app = FastAPI(title="servelab fastapi_onnx", version=__version__, lifespan=lifespan,
                  description="Food-11 image classifier (ONNX Runtime).",
                  strict_content_type=False)  # lab clients may post JSON without a Content-Type

    @app.post("/predict", response_model=PredictResponse, responses=ERROR_RESPONSES, summary="Classify one image")
    async def predict(body: PredictRequest, request: Request, response: Response) -> PredictResponse:
        pipeline = service.ready_pipeline()  # 503 until the model is loaded and warm
        cached = await service.cache.lookup(body.image, response)  # CACHE_URL: this photo answered before?
        if cached.answer is not None:
            cache_hit_timing(request, response)
            return cached.answer
        images = await pipeline.preprocess([body.image])  # decode, resize, normalize: in a worker
        done = await pipeline.batcher.submit(images.x)  # one inference with other requests' images
        (top,), timing = pipeline.postprocess(images, done)  # softmax, top-1 label
        server_timing(request, response, timing)
        answer = PredictResponse(prediction=top.label, probability=top.probability, class_index=top.index,
                                 model=service.model_name)
        await service.cache.keep(cached, answer)  # for the next request of this photo
        return answer

    add_service_routes(app, service)  # /predict/batch, /health, /ready, /metrics, errors, metrics
    app.state.service = service  # Ray Serve's replicas reload through it (their `reconfigure`)
    return app


app = build_app()
