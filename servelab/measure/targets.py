"""What the load generator sends requests to.

A target is a small, reusable description (URL, model, image, batch); ``await target.connect()``
opens one client per run (one aiohttp session, or one tritonclient asyncio client, so every request
reuses persistent connections) whose ``send()`` performs one request and returns an ``Outcome``.
A response counts as a success only if it has the expected status *and* content: an HTTP 200
carrying an error body is an error (``bad_response``), as are error statuses (``http_500``),
refused connections (``connection_refused``, ``grpc_unavailable``) and timeouts (``timeout``).
A request the server *shed* under load is neither: ``Outcome.shed`` is set and its kind is the reason
(``queue_full``, ``queue_timeout``): the FastAPI service's 503 (or 429) with a ``shed`` body, or Triton's
rejection by a queue policy (``servelab.servers.triton.client.shed_reason``).

* ``FastAPITarget(url, image, batch)``: ``POST {url}/predict`` with ``{"image": "<base64>"}``, or
  ``POST {url}/predict/batch`` with ``{"images": [...]}`` when ``batch > 1``; reads ``Server-Timing``.
* ``TritonTarget(url, model, image, protocol="http"|"grpc", input="bytes"|"tensor", batch)``:
  ``bytes`` sends the base64 text of the image as ``INPUT_IMAGE`` (BYTES, shape [batch, 1]) and
  reads ``FOOD_LABEL`` and ``PROBABILITY`` (model ``food_classifier``); ``tensor`` sends the
  preprocessed float32 ``input`` [batch, 3, 224, 224] and reads the ``output`` logits
  (``food_classifier_onnx``); ``uint8`` sends the photo's uint8 center crop as ``image``
  [batch, 224, 224, 3] (the variants with preprocessing in the graph, ``food_classifier_onnx_u8``...). ``server_stats()`` returns Triton's statistics for the model.
"""

import asyncio
import base64
import errno
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import aiohttp
import numpy as np
import yarl

from servelab.core.artifacts import load_manifest
from servelab.measure.server_timing import ServerTiming, parse_server_timing
from servelab.core.preprocess import crop_pixels, preprocess
from servelab.servers.fastapi.schemas import VERSION_HEADER
from servelab.servers.triton import client as triton_io

_JSON = {"content-type": "application/json"}


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    error: str | None = None  # the error kind when not ok (a shed request: why it was shed)
    timing: ServerTiming | None = None
    shed: bool = False  # refused by the server under load, by design: not an error
    version: str | None = None  # the model version that answered, where the response says (rollouts)


class Client(Protocol):
    batch: int  # images per request
    has_server_stats: bool  # whether server_stats() returns Triton-style statistics

    async def send(self) -> Outcome: ...

    async def server_stats(self) -> dict[str, Any] | None: ...

    async def close(self) -> None: ...


class Target(Protocol):
    kind: ClassVar[str]
    batch: int

    def describe(self) -> dict[str, Any]: ...

    async def connect(self, connections: int, timeout_s: float) -> Client: ...


def classify(exc: BaseException) -> str:
    """A short, stable name for why a request failed."""
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connection_refused" if exc.os_error.errno == errno.ECONNREFUSED else "connect_error"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "disconnected"
    if isinstance(exc, InferenceServerException):
        status = str(exc.status() or "")
        if status.isdigit():
            return f"http_{status}"
        if status.startswith("StatusCode."):
            return "grpc_" + status.removeprefix("StatusCode.").lower()
        return "triton_error"
    return type(exc).__name__


def _errors() -> tuple[type[BaseException], ...]:
    """Exceptions a request may legitimately end with (anything else is a bug and propagates)."""
    from tritonclient.utils import InferenceServerException

    return (aiohttp.ClientError, asyncio.TimeoutError, OSError, InferenceServerException)


def _refused(status: int, content: bytes) -> Outcome:
    """A FastAPI error response: shed (503/429 with the ``shed`` body of servelab.servers.fastapi.errors) or an error."""
    if status in (429, 503):
        try:
            reason = json.loads(content).get("shed")
        except (ValueError, AttributeError):
            reason = None
        if isinstance(reason, str):
            return Outcome(False, reason, shed=True)
    return Outcome(False, f"http_{status}")


def _result_count(body: Any) -> int:
    """How many predictions a FastAPI response holds (0 when it is not a prediction)."""
    if isinstance(body, list):
        return len(body)
    if isinstance(body, dict):
        if isinstance(body.get("prediction"), str):
            return 1
        lists = [v for v in body.values() if isinstance(v, list)]
        return len(lists[0]) if len(lists) == 1 else 0
    return 0


@dataclass(frozen=True)
class FastAPITarget:
    url: str  # base URL, e.g. http://127.0.0.1:8000
    image: bytes = field(repr=False)
    batch: int = 1
    image_name: str = ""
    kind: ClassVar[str] = "fastapi"

    @property
    def endpoint(self) -> str:
        return self.url.rstrip("/") + ("/predict" if self.batch == 1 else "/predict/batch")

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.endpoint, "batch": self.batch,
                "image": self.image_name, "image_bytes": len(self.image)}

    async def connect(self, connections: int, timeout_s: float) -> Client:
        return _FastAPIClient(self, connections, timeout_s)


class _FastAPIClient:
    has_server_stats = False

    def __init__(self, target: FastAPITarget, connections: int, timeout_s: float) -> None:
        text = base64.b64encode(target.image).decode()
        payload = {"image": text} if target.batch == 1 else {"images": [text] * target.batch}
        self.body = json.dumps(payload).encode()  # encoded once, not per request
        # The URL parsed once and no cookie jar: per-request client work is part of every latency.
        self.endpoint, self.batch, self.errors = yarl.URL(target.endpoint), target.batch, _errors()
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def send(self) -> Outcome:
        try:
            async with self.session.post(self.endpoint, data=self.body, headers=_JSON) as resp:
                content = await resp.read()
                if resp.status != 200:
                    return _refused(resp.status, content)
                timing, version = resp.headers.get("Server-Timing"), resp.headers.get(VERSION_HEADER)
        except self.errors as exc:
            return Outcome(False, classify(exc))
        try:
            if _result_count(json.loads(content)) != self.batch:
                return Outcome(False, "bad_response")
        except ValueError:
            return Outcome(False, "bad_response")
        return Outcome(True, None, parse_server_timing(timing) if timing else None, version=version)

    async def server_stats(self) -> None:
        return None

    async def close(self) -> None:
        await self.session.close()


def model_input_tensor(image: bytes, manifest: Path | None = None, input: str = "tensor") -> np.ndarray:
    """The image as an ONNX model's input, with the manifest's sizes: float32 [3, crop, crop]
    preprocessed, or (``input="uint8"``) the uint8 crop [crop, crop, 3]."""
    m = load_manifest(manifest) if manifest else None
    if input == "uint8":
        return crop_pixels(image, **(m.crop_kwargs() if m else {}))
    return preprocess(image, **(m.preprocess_kwargs() if m else {}))


@dataclass(frozen=True)
class TritonTarget:
    url: str  # host:port, without a scheme (tritonclient's convention)
    model: str
    image: bytes = field(repr=False)
    protocol: Literal["http", "grpc"] = "http"
    input: triton_io.InputKind = "bytes"
    batch: int = 1
    image_name: str = ""
    manifest: Path | None = None  # preprocessing parameters for input="tensor" or "uint8"
    kind: ClassVar[str] = "triton"

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "model": self.model, "protocol": self.protocol,
                "input": self.input, "batch": self.batch, "image": self.image_name,
                "image_bytes": len(self.image)}

    async def connect(self, connections: int, timeout_s: float) -> Client:
        return _TritonClient(self, connections, timeout_s)


class _TritonClient:
    has_server_stats = True

    def __init__(self, target: TritonTarget, connections: int, timeout_s: float) -> None:
        if target.protocol == "grpc":
            import tritonclient.grpc.aio as tc

            self.client = tc.InferenceServerClient(target.url)
            self.infer_kwargs: dict[str, Any] = {"client_timeout": timeout_s}
        else:
            import tritonclient.http.aio as tc

            self.client = tc.InferenceServerClient(target.url, conn_limit=connections, conn_timeout=timeout_s)
            self.infer_kwargs = {}
        self.model, self.batch, self.protocol, self.errors = target.model, target.batch, target.protocol, _errors()
        if target.input == "bytes":
            # Base64 text, as the lab's own clients send it; the model accepts raw bytes too.
            self.inputs = triton_io.image_inputs(target.protocol, [target.image] * target.batch)
            self.outputs = triton_io.label_outputs(target.protocol)
        else:
            data = np.stack([model_input_tensor(target.image, target.manifest, target.input)] * target.batch)
            self.inputs = triton_io.tensor_inputs(target.protocol, data)
            self.outputs = triton_io.tensor_outputs(target.protocol)
        self.check = self.outputs[-1].name()
        self.steps: list[str] | None = None  # an ensemble's composing models, read on first use

    async def send(self) -> Outcome:
        try:
            result = await self.client.infer(self.model, self.inputs, outputs=self.outputs, **self.infer_kwargs)
        except self.errors as exc:
            reason = triton_io.shed_reason(str(exc))
            return Outcome(False, reason, shed=True) if reason else Outcome(False, classify(exc))
        out = result.as_numpy(self.check)
        if out is None or out.shape[0] != self.batch:
            return Outcome(False, "bad_response")
        return Outcome(True, version=triton_io.answered_version(result))

    async def server_stats(self) -> dict[str, Any]:
        # An ensemble's own statistics leave out the time its requests wait in the queues of its
        # steps, so those models' statistics come along (all models: one call).
        grpc = {"as_json": True} if self.protocol == "grpc" else {}
        if self.steps is None:
            config = await self.client.get_model_config(self.model, **grpc)
            config = config.get("config", config)  # gRPC wraps it
            steps = config.get("ensemble_scheduling", {}).get("step", [])
            self.steps = [step["model_name"] for step in steps]
        stats = await self.client.get_inference_statistics(model_name="" if self.steps else self.model, **grpc)
        return {**stats, "ensemble_steps": {self.model: self.steps}} if self.steps else stats

    async def close(self) -> None:
        await self.client.close()
