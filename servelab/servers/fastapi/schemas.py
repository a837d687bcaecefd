"""Request and response bodies: the lab's ``{"image": "<base64>"}`` ->
``{"prediction": "<class>", "probability": p}`` contract, plus batch, readiness and error shapes."""

import base64
import io
import os
from contextvars import ContextVar
from functools import cache
from pathlib import Path
from typing import Any, Literal

from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, field_validator

from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.settings import OnnxVariant


@cache
def example_image() -> str:
    """A small real photo in base64, so "Try it out" in /docs works as is."""
    im = Image.open(DEFAULT_IMAGE).convert("RGB")
    im.thumbnail((96, 96))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=85)
    return base64.b64encode(buf.getvalue()).decode()


def _examples(key: str, value):
    def add(schema: dict, cls) -> None:
        schema["examples"] = [{key: value()}]
    return add


class PredictRequest(BaseModel):
    model_config = ConfigDict(json_schema_extra=_examples("image", example_image))

    image: str = Field(description="An encoded image (JPEG, PNG, WebP, GIF, BMP, TIFF) in base64; a `data:image/...;"
                                   "base64,` prefix and line breaks are accepted.")


class BatchRequest(BaseModel):
    model_config = ConfigDict(json_schema_extra=_examples("images", lambda: [example_image()] * 2))

    images: list[str] = Field(description="Encoded images in base64, as in `POST /predict`; one result each, in order.")


class PredictionOut(BaseModel):
    prediction: str = Field(description="The most likely Food-11 class.")
    probability: float = Field(ge=0, le=1, description="Its softmax probability.")
    class_index: int = Field(ge=0, description="Its index in the model's class list.")


# The backend (``runtimes.Backend``) serving the current request: set where its handler picks the pipeline
# (``Service.ready_pipeline``), read where the response says which version answered. Per request
# (each runs in its own task), so a request that began before a reload reports the model that served it.
SERVING: ContextVar[Any] = ContextVar("servelab_serving")


def _serving_version() -> str:
    return SERVING.get().version


_VERSION = ("The version of the model that answered (also the X-Model-Version header): the start of the sha256 "
            "of the file it was loaded from. During a reload a request that arrived before the swap may still "
            "answer with the old one.")


class PredictResponse(PredictionOut):
    model: str = Field(description="The model's name from its manifest.")
    # A default read from the request's context: the notebooks show the handler that builds this word for word.
    model_version: str = Field(default_factory=_serving_version, description=_VERSION)


class BatchResponse(BaseModel):
    predictions: list[PredictionOut]
    model: str
    model_version: str = Field(default_factory=_serving_version, description=_VERSION)


class ReloadRequest(BaseModel):
    """``POST /admin/reload``: the model to serve next. Either may be left out: the one served now's
    (``{}`` loads MODEL_DIR again, e.g. after rebuilding it in place)."""

    model_config = ConfigDict(extra="forbid")

    model_dir: Path | None = Field(None, description="A folder laid out as MODEL_DIR (manifest, weights, ONNX files).")
    variant: OnnxVariant | None = Field(
        None, description="fastapi_onnx: the ONNX variant to serve from it (as ONNX_VARIANT).")

    @field_validator("model_dir")
    @classmethod
    def _a_file_system_path(cls, value: Path | None) -> Path | None:
        # What no file system path can hold (a NUL, a lone surrogate) would make resolving it raise, a 500:
        # refused here instead, a 422 that says why.
        if value is not None:
            try:
                encoded = os.fsencode(value)
            except UnicodeError:
                raise ValueError("a path must be text the file system can encode") from None
            if b"\x00" in encoded:
                raise ValueError("a path cannot contain a NUL character")
        return value


class Reloaded(BaseModel):
    model: str
    model_version: str = Field(description="The version now answering every new request.")
    previous_version: str = Field(description="The version it replaced; it answers the requests that arrived "
                                              "before the swap and is closed once they have.")
    model_dir: str
    variant: str | None
    load_s: float = Field(description="Loading the new model, beside the old one serving.")
    warm_up_s: float = Field(description="Its warm-up inferences, before the swap.")
    processes: int = Field(1, description="Server processes that will serve it (`WORKERS`). Beside others the answer is "
                                          "202: uvicorn replaces each by one started on it, one at a time (`/ready`'s "
                                          "`workers.versions` says when none serves the old one).")


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Batching(BaseModel):
    enabled: bool
    max_batch_size: int
    batch_timeout_ms: float
    max_request_images: int
    max_queue_requests: int = Field(0, description="Load shedding: most prediction requests held at once "
                                    "(MAX_QUEUE_REQUESTS); 0 = unbounded.")
    max_queue_delay_ms: float = Field(0, description="Load shedding: longest wait for a batch (MAX_QUEUE_DELAY_MS); 0 = none.")


class Workers(BaseModel):
    processes: int = Field(description="Server processes sharing the port (`WORKERS`).")
    ready: int = Field(description="Those warm now; `/ready` says 503 until all are.")
    versions: list[str] = Field(description="The model versions they serve (one, but during a reload).")


class Ready(BaseModel):
    status: Literal["ready"] = "ready"
    service: str
    model: str
    stand_in: bool = Field(description="True for the offline zero-shot stand-in, not the lab's trained model.")
    description: str
    source: dict[str, str]
    manifest_sha256: str
    model_version: str = Field(description="The version answering new requests (see `POST /predict`).")
    runtime: dict[str, Any] = Field(description="Device or the execution providers actually active, threads, options.")
    variant: dict[str, Any] | None = Field(None, description="fastapi_onnx: the model variant served (ONNX_VARIANT): "
                                                 "name, file, size_bytes, precision, input.")
    batching: Batching
    preprocess_mode: Literal["threads", "processes"] = Field(description="Where images are decoded and preprocessed: "
                                                             "threads of the server process, or worker processes "
                                                             "(PREPROCESS_PROCESSES).")
    preprocess_workers: int = Field(description="How many threads or worker processes.")
    warnings: list[str]
    # Left out, not null, off Ray: clients (10_ray) read the absence of `stage` as "not a Ray stage".
    stage: str | None = Field(None, exclude_if=lambda v: v is None, description="Ray Serve stages: the stage this "
                              "replica serves (ray-2, ...), so a client can tell a finished redeploy.")
    placement: dict[str, Any] | None = Field(None, exclude_if=lambda v: v is None, description="Ray Serve stages: "
                                             "where this replica runs (Ray node id, replica id, deployment).")
    workers: Workers | None = Field(None, description="`servelab serve` with several server processes (`WORKERS`): "
                                   "how many, how many are warm, what they serve. None: one process.")


class ErrorResponse(BaseModel):
    detail: str = Field(description="What was wrong, in words.")


# Why a request was shed (servelab.servers.fastapi.errors.Overloaded): the service was full on arrival
# (MAX_QUEUE_REQUESTS), or it had waited past MAX_QUEUE_DELAY_MS for its batch.
ShedReason = Literal["queue_full", "queue_timeout"]


class ShedResponse(ErrorResponse):
    shed: ShedReason | None = Field(
        None, description="Set only when the request was shed under load: the service held MAX_QUEUE_REQUESTS "
                          "already or it waited past MAX_QUEUE_DELAY_MS. Retry after `retry_after_s` (the Retry-After header).")
    retry_after_s: int | None = Field(None, description="With `shed`: seconds to wait before retrying.")


class FieldError(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ValidationErrorResponse(ErrorResponse):
    errors: list[FieldError]
