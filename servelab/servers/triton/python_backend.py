"""Code shared by the Python-backend models in models_staging (it runs inside Triton's Python stub).

``food_classifier`` and ``food_preprocess`` write their request/response loop out with
``triton_python_backend_utils`` and call ``request_images`` here for one request's images (servelab's
preprocessing, with an error naming the bad element); ``food_postprocess`` and the ONNX stand-in,
which take tensors, use ``inputs``/``split_rows``/``responses`` to run all requests as one batch.

``triton_python_backend_utils`` exists only inside the stub, so it is imported where it is used.
"""

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from servelab.core.postprocess import top1
from servelab.core.preprocess import ImageError, decode_base64, preprocess
from servelab.core.procs import cpu_count
from servelab.core.settings import get_settings

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
    """Each request's rows in the batch its images were stacked into, in order: [2, 1] -> [0:2, 2:3]."""
    return [slice(end - n, end) for n, end in zip(counts, np.cumsum(counts).tolist())]


def request_images(request: np.ndarray, **preprocess_kwargs) -> list[np.ndarray]:
    """The preprocessed images of one request's INPUT_IMAGE elements ([n, 1]); the ImageError names
    the first bad element. One response carries all outputs of a request, so one bad element fails it."""
    flat = request.reshape(-1)
    images = []
    for i, element in enumerate(flat):
        try:
            images.append(preprocess(image_bytes(element), **preprocess_kwargs))
        except ImageError as exc:
            raise ImageError(f"INPUT_IMAGE element {i} of {len(flat)}: {exc}") from None
    return images


def prediction_outputs(logits: np.ndarray, classes: Sequence[str]) -> dict[str, np.ndarray]:
    """Logits [N, classes] -> FOOD_LABEL (BYTES) and PROBABILITY (float32), each [N, 1]; N may be 0."""
    predictions = top1(logits, classes) if len(logits) else []
    return {"FOOD_LABEL": np.array([p.label.encode() for p in predictions], dtype=np.object_).reshape(-1, 1),
            "PROBABILITY": np.array([p.probability for p in predictions], dtype=np.float32).reshape(-1, 1)}


def threads_per_instance(model_config: dict) -> int:
    """CPU threads for one instance: TRITON_THREADS_PER_INSTANCE, or all cores but one shared out. Each
    Python-backend instance is its own process that would start one thread per core, oversubscribing the
    CPU N times. One core stays free for the server's own threads (HTTP/gRPC, scheduling, tensor copies):
    on a 2-core machine two PyTorch threads competing with them made p95 latency 20x the median."""
    if configured := get_settings().triton_threads_per_instance:
        return configured
    return max(1, (cpu_count() - 1) // max(1, instance_count(model_config.get("instance_group", []))))


def instance_count(groups: Sequence[dict]) -> int:  # ``count`` per GPU listed (or once, without GPUs)
    return sum(int(g.get("count", 1)) * max(1, len(g.get("gpus", []))) for g in groups)


def manifest_path(args: dict, model_config: dict) -> Path:
    value = model_config.get("parameters", {}).get("manifest")
    relative = value["string_value"] if value else f"{args['model_version']}/food11.json"
    return (Path(args["model_repository"]) / relative).resolve()


class SessionMetrics:
    """ONNX Runtime sessions' runs and shape changes (``OnnxClassifier.session_counts``) as Triton
    metrics, labelled by model, instance and the batch size each session takes (``any``: every size)."""

    def __init__(self, model: str, instance: str):
        import triton_python_backend_utils as pb_utils  # deferred: exists only inside Triton's Python-backend stub

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
                if (slot := (key, count["session_batch"])) not in self._metrics:
                    self._metrics[slot] = family.Metric(labels={**self._labels, "session_batch": slot[1]})
                if gained := count[key] - self._exported.get(slot, 0):
                    self._metrics[slot].increment(gained)
                    self._exported[slot] = count[key]


def responses(outputs: dict[str, np.ndarray], rows: list[slice]) -> list:
    import triton_python_backend_utils as pb_utils  # deferred: exists only inside Triton's Python-backend stub

    return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v[r]) for k, v in outputs.items()])
            for r in rows]


def inputs(requests, name: str) -> list[np.ndarray]:
    import triton_python_backend_utils as pb_utils  # deferred: exists only inside Triton's Python-backend stub

    return [pb_utils.get_input_tensor_by_name(request, name).as_numpy() for request in requests]


def log(message: str, warn: bool = False) -> None:
    """Through Triton's log, tagged with the model by the caller (no per-batch logging)."""
    import triton_python_backend_utils as pb_utils  # deferred: exists only inside Triton's Python-backend stub

    (pb_utils.Logger.log_warn if warn else pb_utils.Logger.log_info)(message)
