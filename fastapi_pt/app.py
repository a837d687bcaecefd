"""The PyTorch stage (``uvicorn fastapi_pt.app:app``, ``servelab serve fastapi-pt``), top to bottom: the
model loaded in PyTorch, the app that loads it, its route. servelab keeps what both stages share
(``servelab.servers.fastapi``): settings, preprocessing workers, the micro-batcher, the device checks,
errors, metrics, /health, /ready."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from fastapi import FastAPI, Request, Response

from servelab import __version__
from servelab.core.models import build_model
from servelab.core.settings import ServeSettings, get_settings
from servelab.servers.fastapi.errors import ERROR_RESPONSES
from servelab.servers.fastapi.runtimes import Backend, torch_backend
from servelab.servers.fastapi.schemas import PredictRequest, PredictResponse
from servelab.servers.fastapi.service import Service, add_service_routes, cache_hit_timing, server_timing

if TYPE_CHECKING:  # only a process that loads the model imports torch (load_model)
    import torch


def load_model(weights: Path, architecture: str, device: torch.device, dtype: torch.dtype):
    """The manifest's architecture with its weights. servelab chose ``device`` (TORCH_DEVICE: auto is CUDA
    where there is one) and ``dtype`` (TORCH_FP16, on a GPU only), and set PyTorch's threads."""
    import torch  # here: a server process in front of a batcher process (SHARED_BATCHER) holds no model

    model = build_model(architecture)
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))  # tensors only, no pickled code
    model = model.to(device, dtype).eval()  # eval: batch norm uses its running statistics, dropout is off

    def infer(batch: np.ndarray) -> np.ndarray:  # float32 [N, 3, 224, 224] -> logits [N, 11], in the batcher's thread
        with torch.inference_mode():  # no autograd bookkeeping
            return model(torch.from_numpy(np.ascontiguousarray(batch)).to(device, dtype)).float().cpu().numpy()

    return infer


def load(settings: ServeSettings) -> Backend:
    return torch_backend(settings, load_model)


def build_app(settings: ServeSettings | None = None) -> FastAPI:
    """Cheap to build: the model loads when the server starts the app."""
    settings = settings or get_settings()
    service = Service("fastapi_pt", settings, load=load)  # load: again on POST /admin/reload

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # Before the port opens, off the event loop: a missing model or REQUIRE_GPU=1 without a GPU ends it here.
        backend = await asyncio.to_thread(load, service.settings)
        async with service.serving(backend):  # workers, batcher, warm-up, then /ready says 200
            yield

    app = FastAPI(title="servelab fastapi_pt", version=__version__, lifespan=lifespan,
                  description="Food-11 image classifier (PyTorch).",
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
    return app


app = build_app()
