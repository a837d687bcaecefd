"""What the load generator sends requests to: a reusable description (URL, model, image or ``PhotoMix``, batch)
whose ``connect()`` opens one client per run (one aiohttp session, or one tritonclient asyncio client) whose
``send()`` performs one request and returns an ``Outcome``. A success needs the expected status *and* content (an
HTTP 200 with an error body is ``bad_response``); a request the server *shed* under load (the FastAPI service's
503 or 429 with a ``shed`` body, Triton's queue policy) is neither success nor error: ``Outcome.shed``, its kind
the reason. ``TritonTarget``'s ``input`` is ``"bytes"`` (the photo's base64 text), ``"tensor"`` (the preprocessed
float32 tensor) or ``"uint8"`` (the center crop, for variants that preprocess in the graph).
"""

import asyncio
import base64
import errno
import itertools
import json
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import aiohttp
import numpy as np
import yarl

from servelab.core.artifacts import load_manifest
from servelab.core.photos import all_photos, zipf_draws
from servelab.core.preprocess import crop_pixels, preprocess
from servelab.core.wire import VERSION_HEADER
from servelab.measure.server_timing import ServerTiming, parse_server_timing
from servelab.measure.triton_stats import cache_counts
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

    async def cache_counts(self) -> dict[str, int] | None: ...  # hits, misses (errors); None: no cache

    async def close(self) -> None: ...


class Target(Protocol):
    kind: ClassVar[str]
    batch: int

    def describe(self) -> dict[str, Any]: ...

    async def connect(self, connections: int, timeout_s: float) -> Client: ...


def classify(exc: BaseException) -> str:
    """A short, stable name for why a request failed."""
    from tritonclient.utils import InferenceServerException  # deferred: an optional extra (bench)

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
    from tritonclient.utils import InferenceServerException  # deferred: an optional extra (bench)

    return (aiohttp.ClientError, asyncio.TimeoutError, OSError, InferenceServerException)


def _refused(status: int, content: bytes) -> Outcome:
    """A FastAPI error response: shed (503/429 with the ``shed`` body of servelab.servers.fastapi.errors) or an error."""
    if status in (429, 503):
        with suppress(ValueError, AttributeError):  # not JSON, or not the shed body: an error
            if isinstance(reason := json.loads(content).get("shed"), str):
                return Outcome(False, reason, shed=True)
    return Outcome(False, f"http_{status}")


@dataclass(frozen=True)
class PhotoMix:
    """Which photo each request sends: request i sends ``images[order[i % len(order)]]``."""

    images: tuple[bytes, ...] = field(repr=False)
    order: tuple[int, ...] = field(repr=False)
    about: dict[str, Any] = field(default_factory=dict)  # how it was drawn, for the record

    @classmethod
    def zipf(cls, s: float = 1.0, seed: int = 0, draws: int = 100_000) -> "PhotoMix":
        """The bundled photos (``servelab.core.photos``) drawn with Zipf-like popularity (exponent ``s``), seeded:
        the same arguments send the same photos in the same order."""
        photos = all_photos()
        order = zipf_draws(len(photos), draws, s, seed)
        return cls(tuple(p.read_bytes() for p in photos), tuple(int(i) for i in order),
                   {"photos": len(photos), "popularity": "zipf", "s": s, "seed": seed, "draws": draws})

    def describe(self) -> dict[str, Any]:
        return {**self.about, "distinct_photos": len(set(self.order))}


def _sequence(items: list[Any], mix: PhotoMix | None, batch: int) -> Callable[[], Any]:
    """What a client sends next at each call (its requests, warm-up first): ``items[0]`` (made of the target's one
    image), or made of the mix's photos, in its order."""
    if mix is None:
        return itertools.repeat(items[0]).__next__
    if batch != 1:
        raise ValueError("a PhotoMix sends one photo per request: use batch=1")
    return itertools.cycle([items[i] for i in mix.order]).__next__


def _photos(image: bytes, mix: PhotoMix | None) -> list[bytes]:
    return [image] if mix is None else list(mix.images)


def _sent(target: "FastAPITarget | TritonTarget") -> dict[str, Any]:
    """What a target's requests carry, for its record."""
    return {"mix": target.mix.describe()} if target.mix else {"image": target.image_name, "image_bytes": len(target.image)}


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
    mix: PhotoMix | None = None  # send these photos in its order instead of ``image``
    kind: ClassVar[str] = "fastapi"

    @property
    def endpoint(self) -> str:
        return self.url.rstrip("/") + ("/predict" if self.batch == 1 else "/predict/batch")

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.endpoint, "batch": self.batch, **_sent(self)}

    async def connect(self, connections: int, timeout_s: float) -> Client:
        return _FastAPIClient(self, connections, timeout_s)


class _FastAPIClient:
    has_server_stats = False

    def __init__(self, target: FastAPITarget, connections: int, timeout_s: float) -> None:
        texts = [base64.b64encode(image).decode() for image in _photos(target.image, target.mix)]  # not per request
        bodies = [json.dumps({"image": t} if target.batch == 1 else {"images": [t] * target.batch}).encode()
                  for t in texts]
        self.next_body = _sequence(bodies, target.mix, target.batch)
        self.metrics_url = target.url.rstrip("/") + "/metrics"
        # The URL parsed once and no cookie jar: per-request client work is part of every latency.
        self.endpoint, self.batch, self.errors = yarl.URL(target.endpoint), target.batch, _errors()
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections),
                                             timeout=aiohttp.ClientTimeout(total=timeout_s),
                                             cookie_jar=aiohttp.DummyCookieJar())

    async def send(self) -> Outcome:
        try:
            async with self.session.post(self.endpoint, data=self.next_body(), headers=_JSON) as resp:
                content = await resp.read()
                if resp.status != 200:
                    return _refused(resp.status, content)
                timing, version = resp.headers.get("Server-Timing"), resp.headers.get(VERSION_HEADER)
        except self.errors as exc:
            return Outcome(False, classify(exc))
        with suppress(ValueError):  # not JSON: a bad response
            if _result_count(json.loads(content)) == self.batch:
                return Outcome(True, None, parse_server_timing(timing) if timing else None, version=version)
        return Outcome(False, "bad_response")

    async def server_stats(self) -> None:
        return None

    async def cache_counts(self) -> dict[str, int] | None:
        """``servelab_response_cache_total`` by result, from the service's /metrics (None: no cache there, or no
        /metrics at all, as on the benchmark's simple app)."""
        async with self.session.get(self.metrics_url) as resp:
            if resp.status == 404:
                return None
            resp.raise_for_status()
            return response_cache_counts(await resp.text())

    async def close(self) -> None:
        await self.session.close()


CACHE_KEYS = {"hit": "hits", "miss": "misses", "error": "errors"}


def response_cache_counts(metrics: str) -> dict[str, int] | None:
    """The FastAPI services' cache counters in Prometheus text (``servelab.servers.fastapi.metrics``)."""
    from prometheus_client.parser import text_string_to_metric_families  # deferred: an optional extra (serve)

    counts = {CACHE_KEYS[s.labels["result"]]: int(s.value) for family in text_string_to_metric_families(metrics)
              for s in family.samples if s.name == "servelab_response_cache_total" and s.labels.get("result") in CACHE_KEYS}
    return counts or None


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
    mix: PhotoMix | None = None  # send these photos in its order instead of ``image``
    kind: ClassVar[str] = "triton"

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "model": self.model, "protocol": self.protocol,
                "input": self.input, "batch": self.batch, **_sent(self)}

    async def connect(self, connections: int, timeout_s: float) -> Client:
        return _TritonClient(self, connections, timeout_s)


class _TritonClient:
    has_server_stats = True

    def __init__(self, target: TritonTarget, connections: int, timeout_s: float) -> None:
        if target.protocol == "grpc":
            import tritonclient.grpc.aio as tc  # deferred: an optional extra (bench), loaded only when this runs

            self.client = tc.InferenceServerClient(target.url)
            self.infer_kwargs: dict[str, Any] = {"client_timeout": timeout_s}
        else:
            import tritonclient.http.aio as tc  # deferred: an optional extra (bench), loaded only when this runs

            self.client = tc.InferenceServerClient(target.url, conn_limit=connections, conn_timeout=timeout_s)
            self.infer_kwargs = {}
        self.model, self.batch, self.errors = target.model, target.batch, _errors()
        self.as_json = {"as_json": True} if target.protocol == "grpc" else {}  # gRPC's answers as HTTP's JSON
        images = _photos(target.image, target.mix)
        if target.input == "bytes":
            # Base64 text, as the lab's own clients send it; the model accepts raw bytes too.
            inputs = [triton_io.image_inputs(target.protocol, [image] * target.batch) for image in images]
            self.outputs = triton_io.label_outputs(target.protocol)
        else:
            inputs = [triton_io.tensor_inputs(target.protocol, np.stack(
                [model_input_tensor(image, target.manifest, target.input)] * target.batch)) for image in images]
            self.outputs = triton_io.tensor_outputs(target.protocol)
        self.next_inputs = _sequence(inputs, target.mix, target.batch)
        self.check = self.outputs[-1].name()
        self.steps: list[str] | None = None  # an ensemble's composing models, read on first use

    async def send(self) -> Outcome:
        try:
            result = await self.client.infer(self.model, self.next_inputs(), outputs=self.outputs, **self.infer_kwargs)
        except self.errors as exc:
            reason = triton_io.shed_reason(str(exc))
            return Outcome(False, reason, shed=True) if reason else Outcome(False, classify(exc))
        if (out := result.as_numpy(self.check)) is None or out.shape[0] != self.batch:
            return Outcome(False, "bad_response")
        return Outcome(True, version=triton_io.answered_version(result))

    async def server_stats(self) -> dict[str, Any]:
        # An ensemble's own statistics leave out the time its requests wait in the queues of its
        # steps, so those models' statistics come along (all models: one call).
        if self.steps is None:
            config = await self.client.get_model_config(self.model, **self.as_json)
            config = config.get("config", config)  # gRPC wraps it
            self.steps = [step["model_name"] for step in config.get("ensemble_scheduling", {}).get("step", [])]
        stats = await self.client.get_inference_statistics(model_name="" if self.steps else self.model, **self.as_json)
        return {**stats, "ensemble_steps": {self.model: self.steps}} if self.steps else stats

    async def cache_counts(self) -> dict[str, int] | None:
        """Triton's response-cache counters of the model (None where it does not use the cache)."""
        return cache_counts(await self.client.get_inference_statistics(model_name=self.model, **self.as_json), self.model)

    async def close(self) -> None:
        await self.client.close()
