"""The services GourmetGram asks for a prediction: one class per ``BACKEND``.

Every call goes through ``_Http``: one ``requests.Session`` per process (urllib3's pool is thread-safe, so gunicorn's
threads share its keep-alive connections, and a restarted backend is picked up by itself), a timeout on every call, and
failures turned into a ``BackendError`` carrying the status the page answers with. A request the backend *shed* under
load is no failure of the app: the page says "busy, try again in N s".

Triton is spoken to over HTTP/REST with ``servelab.servers.triton.client`` and tritonclient's own body
codecs (``generate_request_body`` / ``parse_response_body``): tritonclient's HTTP client itself is not
thread-safe and would need one connection pool per thread.

A canary (``CANARY_URL``, ``CANARY_SHARE``; docs/production.md): ``CanaryBackend`` sends that share of the
predictions to a second backend of the same kind; every answer says which route served it and the model
version that answered, which the app's ``GET /metrics`` counts.
"""

import base64
import hashlib
import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Protocol
from urllib.parse import quote

import requests
import tritonclient.http as triton_http
from PIL import Image
from requests.adapters import HTTPAdapter
from urllib3.exceptions import ReadTimeoutError

from servelab.core.artifacts import ArtifactPaths, Manifest, load_manifest
from servelab.core.catalogue import ENSEMBLE, ONNX, PT
from servelab.core.labels import CLASSES
from servelab.core.postprocess import Prediction
from servelab.core.preprocess import preprocess_image
from servelab.core.settings import Settings
from servelab.core.wire import VERSION_HEADER
from servelab.servers.triton import client as triton

DEFAULT_MODELS = {"triton": PT, "triton_onnx": ONNX, "triton_ensemble": ENSEMBLE}
TRITON_DESCRIPTIONS = {
    "triton": "Triton, Python backend",
    "triton_onnx": "Triton, ONNX model (pre- and post-processing in this app)",
    "triton_ensemble": "Triton ensemble (preprocessing on the server)",
}
# Enough of a backend's error text to say what went wrong, never a whole page of it.
MAX_DETAIL = 300
# Asking a backend about itself is a courtesy for the page: it must not hold the answer up long.
ABOUT_TIMEOUT_S = 1.0


STABLE, CANARY = "stable", "canary"  # the routes a prediction takes (CanaryBackend)


@dataclass(frozen=True)
class Answer:
    label: str
    probability: float
    model: str  # what answered, as the backend names it
    version: str = ""  # the model version that answered, where the backend says
    route: str = STABLE  # with a canary: which backend answered


@dataclass(frozen=True)
class About:
    """What a backend says about itself; any part may be unknown."""

    stage: str | None = None
    stand_in: bool | None = None  # the zero-shot stand-in model, not the lab's trained one
    notes: tuple[str, ...] = ()


class BackendError(Exception):
    """A failed backend call, with the HTTP status the page answers with and plain words for users;
    ``retry_after``: set (seconds) where the backend shed the request because it is busy."""

    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after
        self.route = STABLE  # with a canary: which backend failed


class ModelService(Protocol):
    name: str  # the BACKEND value
    description: str  # the kind of stage, in words
    endpoint: str  # where predictions are asked for

    def classify(self, data: bytes, image: Image.Image) -> Answer: ...  # ``image``: ``data`` decoded and checked

    def about(self) -> About: ...


def _body(response: requests.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _detail(response: requests.Response) -> str:
    body = _body(response)
    text = body.get("detail") or body.get("error")  # FastAPI's, Triton's
    if not isinstance(text, str):
        text = response.reason or "no details"
    return text if len(text) <= MAX_DETAIL else text[:MAX_DETAIL] + "…"


def _shed_retry_after(response: requests.Response) -> int | None:
    """Seconds to wait where the backend shed this request (FastAPI's ``shed`` body, Triton's queue-policy
    message): its ``Retry-After``, 1 where it names none (Triton never does)."""
    body = _body(response)
    if not (isinstance(body.get("shed"), str) or triton.shed_reason(str(body.get("error", ""))) is not None):
        return None
    header = response.headers.get("Retry-After", "")
    return max(1, min(int(header), 60)) if header.isdigit() else 1


def _check_probability(value: Any) -> float:
    if not (math.isfinite(probability := float(value)) and 0.0 <= probability <= 1.0):
        raise ValueError(f"probability {probability}")
    return probability


class _Http:
    def __init__(self, service: str, timeout: float, image_errors: tuple[int, ...], pool_size: int = 16) -> None:
        self.service, self.timeout, self.image_errors = service, timeout, image_errors
        self.session = requests.Session()
        # An internal service: never route it through a proxy picked up from the environment.
        self.session.trust_env = False
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=pool_size)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)

    def post(self, url: str, **kwargs) -> requests.Response:
        try:
            response = self.session.post(url, timeout=self.timeout, **kwargs)
        except requests.Timeout:
            raise self._timed_out(url) from None
        except requests.ConnectionError as exc:
            # requests reports a timeout while reading the body as a ConnectionError wrapping urllib3's.
            if any(isinstance(arg, ReadTimeoutError) for arg in exc.args):
                raise self._timed_out(url) from None
            raise BackendError(502, f"The {self.service} at {url} cannot be reached: it may be stopped or "
                                    "still starting. Try again in a moment.") from None
        except requests.RequestException as exc:
            raise BackendError(502, f"The connection to the {self.service} broke ({type(exc).__name__}).") from None
        if response.status_code != 200:
            raise self._refused(response)
        return response

    def get_json(self, url: str) -> dict[str, Any]:  # empty on any failure: for what is nice to have
        try:
            response = self.session.get(url, timeout=min(self.timeout, ABOUT_TIMEOUT_S))
        except requests.RequestException:
            return {}
        return _body(response) if response.status_code == 200 else {}

    def _timed_out(self, url: str) -> BackendError:
        return BackendError(504, f"The {self.service} at {url} did not answer within {self.timeout:g} s.")

    def _refused(self, response: requests.Response) -> BackendError:
        code, detail = response.status_code, _detail(response)
        if code in (429, 503) and (wait := _shed_retry_after(response)) is not None:
            return BackendError(503, f"GourmetGram is busy right now: too many photos are being classified at "
                                     f"once. Try again in {wait} s.", retry_after=wait)
        if code in (429, 503):
            return BackendError(503, f"The {self.service} is not ready or is overloaded ({detail}). "
                                     "Try again in a moment.")
        if code in self.image_errors:
            return BackendError(code, f"The {self.service} could not use this image: {detail}")
        return BackendError(502, f"The {self.service} failed (HTTP {code}: {detail}).")

    def not_a_prediction(self, exc: Exception) -> BackendError:
        return BackendError(502, f"The {self.service} answered with something that is not a prediction "
                                 f"({type(exc).__name__}: {exc}).")


class FastAPIBackend:
    """``POST {url}/predict`` with ``{"image": <base64>}``, reading ``prediction`` and ``probability``."""

    name = "fastapi"
    description = "FastAPI service"

    def __init__(self, url: str, timeout: float) -> None:
        self.base = url.rstrip("/")
        self.endpoint = self.base + "/predict"
        # Its 400 and 413 are about the photo (see servelab/servers/fastapi/errors.py), so the user sees
        # them; a 422 means this app sent a malformed request: our bug, not the user's.
        self.http = _Http("FastAPI service", timeout, image_errors=(400, 413))

    def classify(self, data: bytes, image: Image.Image) -> Answer:
        response = self.http.post(self.endpoint, json={"image": base64.b64encode(data).decode("ascii")})
        try:
            body = response.json()
            label, probability = body["prediction"], _check_probability(body["probability"])
            if not isinstance(label, str):
                raise TypeError("the prediction is not text")
        except (ValueError, KeyError, TypeError) as exc:
            raise self.http.not_a_prediction(exc) from None
        model = body.get("model")
        return Answer(label, probability, model if isinstance(model, str) else "unnamed model",
                      response.headers.get(VERSION_HEADER, ""))

    def about(self) -> About:  # from GET /ready
        ready = self.http.get_json(self.base + "/ready")
        runtime = ready.get("runtime") if isinstance(ready.get("runtime"), dict) else {}
        where = runtime.get("providers") or runtime.get("device")
        if isinstance(stage := ready.get("service"), str) and where:
            stage += f" ({', '.join(where) if isinstance(where, list) else where})"
        stand_in = ready.get("stand_in")
        return About(stage if isinstance(stage, str) else None, stand_in if isinstance(stand_in, bool) else None)


class _TritonBackend:
    def __init__(self, name: str, url: str, model: str, timeout: float, manifest: Manifest | None) -> None:
        self.name, self.model, self.manifest, self.description = name, model, manifest, TRITON_DESCRIPTIONS[name]
        self.base = f"http://{triton.server_address(url)}/v2/models/{quote(model, safe='')}"
        self.endpoint = self.base + "/infer"
        # Triton's 400 means the request does not fit the model's inputs (the app already checked
        # the image): a configuration problem, not the user's.
        self.http = _Http("Triton server", timeout, image_errors=())

    def _infer(self, inputs: list, outputs: list) -> tuple[triton_http.InferResult, str, str]:
        body, json_size = triton_http.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
        headers = {} if json_size is None else {"Inference-Header-Content-Length": str(json_size)}
        response = self.http.post(self.endpoint, data=body, headers=headers)
        header_length = response.headers.get("Inference-Header-Content-Length")
        try:
            result = triton_http.InferenceServerClient.parse_response_body(
                response.content, header_length=int(header_length) if header_length else None)
            meta = result.get_response()
        except Exception as exc:  # tritonclient raises assorted types for a malformed body
            raise self.http.not_a_prediction(exc) from None
        version = str(meta.get("model_version") or "")
        return result, str(meta.get("model_name", self.model)) + (f" (version {version})" if version else ""), version

    def _predict(self, inputs: list, outputs: list, read) -> Answer:
        result, model, version = self._infer(inputs, outputs)
        try:
            (prediction,) = read(result)
            return Answer(prediction.label, _check_probability(prediction.probability), model, version)
        except (AttributeError, TypeError, ValueError) as exc:  # an output missing, malformed or unknown
            raise self.http.not_a_prediction(exc) from None

    def about(self) -> About:
        """The stage from the config (``servelab triton`` wrote it); the stand-in from the manifest here, if any."""
        config = self.http.get_json(self.base + "/config")
        parameters = config.get("parameters") if isinstance(config.get("parameters"), dict) else {}

        def parameter(key: str) -> str | None:
            value = parameters.get(key)
            return value.get("string_value") if isinstance(value, dict) else None

        notes = tuple(note for note in (parameter("servelab_stand_in"),) if note)
        return About(parameter("servelab_stage"), self.manifest.stand_in if self.manifest else None, notes)


class TritonImageBackend(_TritonBackend):
    """The encoded image (base64 text, as the lab's clients send it) as ``INPUT_IMAGE`` BYTES [1, 1]
    → ``FOOD_LABEL``, ``PROBABILITY``: the Python-backend model and the ensemble."""

    def classify(self, data: bytes, image: Image.Image) -> Answer:
        return self._predict(triton.image_inputs("http", [data]), triton.label_outputs("http"), triton.predictions)


class TritonTensorBackend(_TritonBackend):
    """Preprocessing and softmax in this app: FP32 ``input`` [1, 3, crop, crop] → ``output`` logits."""

    def __init__(self, url: str, model: str, timeout: float, manifest: Manifest | None) -> None:
        super().__init__("triton_onnx", url, model, timeout, manifest)
        self.prep = manifest.preprocess_kwargs() if manifest else {}
        self.classes = tuple(manifest.classes) if manifest else CLASSES

    def classify(self, data: bytes, image: Image.Image) -> Answer:
        x = preprocess_image(image, **self.prep)[None]

        def read(result) -> list[Prediction]:
            if result.as_numpy(triton.TENSOR_OUTPUT).shape != (1, len(self.classes)):
                raise ValueError(f"logits are not of shape [1, {len(self.classes)}]")
            return triton.tensor_predictions(result, self.classes)

        return self._predict(triton.tensor_inputs("http", x), triton.tensor_outputs("http"), read)


def in_canary(share: float, seed: int, number: int) -> bool:
    """A hash of the seed and the number, read as a fraction in [0, 1), below ``share``: reproducible, and over
    N requests the share is that of N independent draws, whichever threads send them."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{number}".encode()).digest()[:8], "big") / 2**64 < share


class CanaryBackend:
    """``share`` of the predictions to ``canary`` (the new version), the rest to ``stable``; each answer, and
    each failure, says its route."""

    def __init__(self, stable: ModelService, canary: ModelService, share: float, seed: int = 0) -> None:
        self.stable, self.canary, self.share, self.seed = stable, canary, share, seed
        self.name, self.description = stable.name, f"{stable.description}, {share:.0%} to a canary"
        self.endpoint = stable.endpoint
        self._numbers = itertools.count()  # next() on it is atomic under the GIL: each request its own number

    def classify(self, data: bytes, image: Image.Image) -> Answer:
        route, backend = (CANARY, self.canary) if in_canary(self.share, self.seed, next(self._numbers)) \
            else (STABLE, self.stable)
        try:
            return replace(backend.classify(data, image), route=route)
        except BackendError as exc:
            exc.route = route
            raise

    def about(self) -> About:
        return self.stable.about()


def _make(settings: Settings, url: str) -> ModelService:
    if settings.backend == "fastapi":
        return FastAPIBackend(url, settings.backend_timeout)
    model = settings.food11_model_name or DEFAULT_MODELS[settings.backend]
    # The manifest `servelab models build` wrote for the models Triton serves, if this host has it.
    path = ArtifactPaths.in_dir(settings.model_dir).manifest
    manifest = load_manifest(path) if path.is_file() else None
    if settings.backend == "triton_onnx":
        return TritonTensorBackend(url, model, settings.backend_timeout, manifest)
    return TritonImageBackend(settings.backend, url, model, settings.backend_timeout, manifest)


def make_backend(settings: Settings) -> ModelService:
    """The backend ``settings.backend`` names; with ``CANARY_URL`` and a ``CANARY_SHARE`` above 0, a
    ``CanaryBackend`` over it and the same kind of backend at that URL."""
    stable = _make(settings, settings.fastapi_server_url if settings.backend == "fastapi" else settings.triton_server_url)
    if settings.canary_url and settings.canary_share > 0:
        return CanaryBackend(stable, _make(settings, settings.canary_url), settings.canary_share, settings.canary_seed)
    return stable
