"""Build Triton requests and read their results, for every tritonclient flavour (``"http"`` or ``"grpc"``; the asyncio
clients use the same input and output classes): one place for the tests, the web front end and the load generator.

Which input a model takes is the catalogue's to say (``servelab.core.catalogue.MODELS``, ``input_kind``):

* Image models (``food_classifier``, ``food_classifier_ensemble``): ``INPUT_IMAGE`` BYTES [N, 1],
  each element one encoded image as base64 text (what the lab's client sends) or raw bytes
  -> ``FOOD_LABEL`` BYTES [N, 1] and ``PROBABILITY`` FP32 [N, 1].
* Tensor model (``food_classifier_onnx``): ``input`` FP32 [N, 3, 224, 224], preprocessed with
  ``servelab.core.preprocess`` -> ``output`` FP32 [N, 11] logits (softmax is the client's job).
* Its variants with preprocessing in the graph (``food_classifier_onnx_u8``, ``_int8``, ``_fp16``):
  ``image`` UINT8 [N, 224, 224, 3], the center crop from ``servelab.core.preprocess.crop_pixels`` -> the
  same ``output``.
"""

import base64
import importlib
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from servelab.core.catalogue import MODELS
from servelab.core.labels import CLASSES
from servelab.core.postprocess import Prediction, top1

Protocol = Literal["http", "grpc"]
InputKind = Literal["bytes", "tensor", "uint8"]
IMAGE_INPUT, LABEL_OUTPUT, PROBABILITY_OUTPUT = "INPUT_IMAGE", "FOOD_LABEL", "PROBABILITY"
TENSOR_INPUT, PIXELS_INPUT, TENSOR_OUTPUT = "input", "image", "output"


# What Triton 2.51 answers (HTTP 503) when a model's queue policy rejects a request (``timeout_action:
# REJECT``), as read from the local server: queue full on arrival, or waited past the timeout.
SHED_MESSAGES = {"Exceeds maximum queue size": "queue_full", "Request timeout expired": "queue_timeout"}


def shed_reason(message: str) -> str | None:
    return next((reason for text, reason in SHED_MESSAGES.items() if text in message), None)


def input_kind(model: str) -> InputKind:
    try:
        return MODELS[model].input
    except KeyError:
        raise ValueError(f"unknown model {model!r}: say what it takes (--input bytes|tensor|uint8); "
                         f"models: {', '.join(MODELS)}") from None


def server_address(url: str) -> str:
    """``host:port``, with no scheme, as tritonclient takes it."""
    return url.split("://", 1)[-1].rstrip("/")


def _module(protocol: Protocol):
    return importlib.import_module(f"tritonclient.{protocol}")


def image_inputs(protocol: Protocol, images: Sequence[bytes],
                 encoding: Literal["base64", "raw"] = "base64") -> list[Any]:
    """INPUT_IMAGE as BYTES [N, 1], one photo a row (base64 text, or the raw bytes), for the Python backend."""
    array = np.empty((len(images), 1), dtype=np.object_)  # BYTES [N, 1]
    array[:, 0] = [base64.b64encode(im).decode("ascii") if encoding == "base64" else im for im in images]
    infer_input = _module(protocol).InferInput(IMAGE_INPUT, list(array.shape), "BYTES")
    infer_input.set_data_from_numpy(array)
    return [infer_input]


def tensor_inputs(protocol: Protocol, batch: np.ndarray) -> list[Any]:
    """uint8 [N, H, W, 3] pixels -> the uint8 model's input; any other dtype, [N, 3, H, W] -> FP32 ``input``."""
    name, datatype, dtype = (PIXELS_INPUT, "UINT8", np.uint8) if batch.dtype == np.uint8 else (TENSOR_INPUT, "FP32", np.float32)
    batch = np.ascontiguousarray(batch, dtype=dtype)
    infer_input = _module(protocol).InferInput(name, list(batch.shape), datatype)
    infer_input.set_data_from_numpy(batch)
    return [infer_input]


def label_outputs(protocol: Protocol) -> list[Any]:
    return [_module(protocol).InferRequestedOutput(name) for name in (LABEL_OUTPUT, PROBABILITY_OUTPUT)]


def tensor_outputs(protocol: Protocol) -> list[Any]:
    return [_module(protocol).InferRequestedOutput(TENSOR_OUTPUT)]


def predictions(result) -> list[Prediction]:
    """FOOD_LABEL and PROBABILITY ([N, 1] each) -> N Predictions. ValueError: a label not among the classes."""
    names = [label.decode() if isinstance(label, bytes) else str(label)
             for label in result.as_numpy(LABEL_OUTPUT).reshape(-1)]
    probabilities = result.as_numpy(PROBABILITY_OUTPUT).reshape(-1)
    return [Prediction(name, float(p), CLASSES.index(name)) for name, p in zip(names, probabilities)]


def tensor_predictions(result, classes: Sequence[str] = CLASSES) -> list[Prediction]:
    """The logits output [N, classes] -> N top-1 Predictions (softmax on this side)."""
    return top1(result.as_numpy(TENSOR_OUTPUT), classes)


def answered_version(result) -> str | None:
    response = result.get_response()
    version = response.get("model_version") if isinstance(response, dict) else getattr(response, "model_version", None)
    return str(version) if version else None
