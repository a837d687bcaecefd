"""Code shared by the Python-backend models in models_staging (it runs inside Triton's Python stub).

Each ``model.py`` stays a thin adapter: Triton hands ``execute`` a list of requests, each with a
batch of elements; these helpers turn all elements of all requests into one array (so the model
runs one forward pass per call), remember which rows belong to which request, and give a failed
request its own error response while the others succeed.

``triton_python_backend_utils`` exists only inside the stub, so it is imported where it is used.
"""

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from servelab.postprocess import top1
from servelab.preprocess import ImageError, decode_base64, preprocess
from servelab.procs import cpu_count
from servelab.settings import get_settings

# Base64 text (optionally a data: URL). An encoded image is binary and always contains bytes
# outside this alphabet (JPEG and PNG in their very first byte), so it is never taken for text.
_BASE64_TEXT = re.compile(rb"(data:[^,]*,)?[A-Za-z0-9+/=\s]+")


def image_bytes(element: bytes | str) -> bytes:
    """One INPUT_IMAGE element -> encoded image bytes; base64 text is decoded, raw bytes pass as is."""
    if isinstance(element, str):
        element = element.encode()
    if _BASE64_TEXT.fullmatch(element):
        return decode_base64(element.decode("ascii"))
    return element


def split_rows(counts: Sequence[int]) -> list[slice]:
    """Rows of a concatenated batch that belong to each request, given each request's row count."""
    ends = np.cumsum(counts).tolist()
    return [slice(end - n, end) for n, end in zip(counts, ends)]


def _request_images(request: np.ndarray, **preprocess_kwargs) -> list[np.ndarray]:
    """The preprocessed images of one request; the ImageError names the first bad element."""
    flat = request.reshape(-1)
    images = []
    for i, element in enumerate(flat):
        try:
            images.append(preprocess(image_bytes(element), **preprocess_kwargs))
        except ImageError as exc:
            raise ImageError(f"INPUT_IMAGE element {i} of {len(flat)}: {exc}") from None
    return images


def preprocess_requests(
    elements: Sequence[np.ndarray], **preprocess_kwargs
) -> tuple[np.ndarray, list[slice], list[str | None]]:
    """Every element of every request -> (images [N,3,H,W], rows per request, error per request).

    A request with an element that is not a usable image gets an error message (naming the
    element) and no rows: one response carries all outputs of a request, so such a request
    fails as a whole, while every other request in the call is still answered.
    """
    tensors: list[np.ndarray] = []
    counts: list[int] = []
    errors: list[str | None] = []
    for request in elements:
        try:
            images, error = _request_images(request, **preprocess_kwargs), None
        except ImageError as exc:
            images, error = [], str(exc)
        tensors.extend(images)
        counts.append(len(images))
        errors.append(error)
    crop = preprocess_kwargs.get("crop", 224)
    images = np.stack(tensors) if tensors else np.zeros((0, 3, crop, crop), np.float32)
    return images, split_rows(counts), errors


def prediction_outputs(logits: np.ndarray, classes: Sequence[str]) -> dict[str, np.ndarray]:
    """Logits [N, classes] -> FOOD_LABEL (BYTES [N,1]) and PROBABILITY (softmax, FP32 [N,1])."""
    predictions = top1(logits, classes) if len(logits) else []
    labels = np.array([p.label.encode() for p in predictions], dtype=np.object_).reshape(-1, 1)
    probabilities = np.array([p.probability for p in predictions], dtype=np.float32).reshape(-1, 1)
    return {"FOOD_LABEL": labels, "PROBABILITY": probabilities}


def instance_device(args: dict) -> str:
    """The device Triton assigned to this instance: ``cuda:<id>`` for KIND_GPU, else ``cpu``.

    KIND_GPU alone does not move a Python model anywhere; the model has to use the device id.
    """
    return f"cuda:{args['model_instance_device_id']}" if args["model_instance_kind"] == "GPU" else "cpu"


def threads_per_instance(model_config: dict) -> int:
    """CPU threads for one instance: TRITON_THREADS_PER_INSTANCE, or all cores but one shared out.

    Every Python-backend instance is its own process; left alone, each would start one thread
    per core and N instances would oversubscribe the CPU N times. One core stays free for the
    server's own threads (HTTP/gRPC, scheduling, tensor copies): on a 2-core machine two PyTorch
    threads competing with them made p95 latency 20x the median.
    """
    configured = get_settings().triton_threads_per_instance
    if configured:
        return configured
    instances = instance_count(model_config.get("instance_group", []))
    return max(1, (cpu_count() - 1) // max(1, instances))


def instance_count(groups: Sequence[dict]) -> int:
    """Instances an ``instance_group`` list starts: ``count`` per GPU listed (or once, without GPUs)."""
    return sum(int(g.get("count", 1)) * max(1, len(g.get("gpus", []))) for g in groups)


def parameter(model_config: dict, key: str, default: str | None = None) -> str | None:
    """A string from the config's ``parameters`` section."""
    value = model_config.get("parameters", {}).get(key)
    return value["string_value"] if value else default


def manifest_path(args: dict, model_config: dict) -> Path:
    """The manifest named by the ``manifest`` parameter (relative to the model's folder),
    by default ``<version>/food11.json``."""
    relative = parameter(model_config, "manifest", f"{args['model_version']}/food11.json")
    return (Path(args["model_repository"]) / relative).resolve()


class SessionMetrics:
    """ONNX Runtime sessions' runs and shape changes (``OnnxClassifier.session_counts``) as Triton
    metrics, labelled by model, instance and the batch size each session takes (``any``: every size)."""

    def __init__(self, model: str, instance: str):
        import triton_python_backend_utils as pb_utils

        self._families = {
            "runs": pb_utils.MetricFamily("servelab_onnx_session_runs", "Runs of each ONNX Runtime session, "
                                          "warm-up included", pb_utils.MetricFamily.COUNTER),
            "shape_changes": pb_utils.MetricFamily("servelab_onnx_session_shape_changes", "Runs of each ONNX "
                                                   "Runtime session whose input shape differed from its previous run's",
                                                   pb_utils.MetricFamily.COUNTER),
        }
        self._labels = {"model": model, "instance": instance}
        self._metrics: dict[tuple[str, str], object] = {}
        self._exported: dict[tuple[str, str], int] = {}

    def update(self, counts: list[dict]) -> None:
        """Add what each count gained since the last update (Triton's counters only increase)."""
        for count in counts:
            for key, family in self._families.items():
                slot = (key, count["session_batch"])
                if slot not in self._metrics:
                    self._metrics[slot] = family.Metric(labels={**self._labels, "session_batch": slot[1]})
                    self._exported[slot] = 0
                if gained := count[key] - self._exported[slot]:
                    self._metrics[slot].increment(gained)
                    self._exported[slot] = count[key]


def respond(outputs: dict[str, np.ndarray]):
    import triton_python_backend_utils as pb_utils

    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in outputs.items()])


def error_response(message: str):
    """A failed request: HTTP 400 / gRPC INVALID_ARGUMENT for the client that sent it."""
    import triton_python_backend_utils as pb_utils

    return pb_utils.InferenceResponse(
        output_tensors=[], error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
    )


def responses(outputs: dict[str, np.ndarray], rows: list[slice], errors: Sequence[str | None] = ()) -> list:
    """One response per request: its rows of every output, or its error."""
    errors = list(errors) or [None] * len(rows)
    return [error_response(error) if error else respond({k: v[r] for k, v in outputs.items()})
            for r, error in zip(rows, errors)]


def inputs(requests, name: str) -> list[np.ndarray]:
    import triton_python_backend_utils as pb_utils

    return [pb_utils.get_input_tensor_by_name(request, name).as_numpy() for request in requests]


def log(message: str, warn: bool = False) -> None:
    """Through Triton's log, tagged with the model by the caller (no per-batch logging)."""
    import triton_python_backend_utils as pb_utils

    (pb_utils.Logger.log_warn if warn else pb_utils.Logger.log_info)(message)
