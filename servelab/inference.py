"""Run the classifier on a preprocessed batch: the same call for PyTorch and ONNX Runtime.

Both classes take float32 [N, 3, 224, 224] (an ONNX model with preprocessing in its graph: uint8
[N, 224, 224, 3]) and return float32 [N, 11] logits; softmax and labels are
``servelab.postprocess``'s job, so every stage reports probabilities the same way.

On a GPU, ONNX Runtime's CUDA provider chooses cuDNN algorithms again whenever a session's input
shape differs from its previous run's (0.4-2.2 s per change on an H100, so a dynamic batcher's
varying batch sizes collapsed it to 4 req/s); ``OnnxClassifier``'s shape policy gives every session
one fixed shape.
"""

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from servelab.artifacts import Manifest, load_manifest
from servelab.models import build_model

log = logging.getLogger(__name__)


class TorchClassifier:
    """The manifest's architecture with its state_dict (loaded with weights_only=True)."""

    def __init__(self, manifest_path: Path, device: str = "cpu", fp16: bool = False, threads: int | None = None):
        import torch

        if threads:
            torch.set_num_threads(threads)
        # Benchmark mode would time cuDNN algorithms again for every new input shape, which a dynamic
        # batcher's sizes keep producing; off, PyTorch's heuristics pick at once (pt-dyn/pt-1: 0.97 on an H100).
        torch.backends.cudnn.benchmark = False
        self.manifest: Manifest = load_manifest(manifest_path)
        self.device = torch.device(device)
        # fp16 halves memory traffic on a GPU; CPUs have no fast fp16 path, so it stays fp32 there.
        self.dtype = torch.float16 if fp16 and self.device.type == "cuda" else torch.float32
        weights = Path(manifest_path).parent / self.manifest.state_dict_file
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model = build_model(self.manifest.architecture)
        model.load_state_dict(state, strict=True)
        self.model = model.to(self.device, self.dtype).eval()
        self._torch = torch

    def infer(self, batch: np.ndarray) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(batch)).to(self.device, self.dtype)
            return self.model(x).float().cpu().numpy()

    def describe(self) -> dict:
        return {"runtime": "pytorch", "device": str(self.device), "dtype": str(self.dtype).removeprefix("torch.")}


def preload_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries of the ``nvidia-*`` wheels (PyTorch's CUDA build brings them)
    before a GPU session, so onnxruntime-gpu finds them without ``LD_LIBRARY_PATH`` (ONNX Runtime
    >= 1.21; a library it cannot find still leaves the provider inactive, which the caller reads back)."""
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        try:
            ort.preload_dlls()
        except Exception as exc:  # noqa: BLE001 - a missing library shows as an inactive provider
            log.warning("onnxruntime.preload_dlls() failed: %s", exc)


# ONNX Runtime's names for the input types our models take.
ONNX_DTYPES = {"tensor(float)": "float32", "tensor(uint8)": "uint8", "tensor(float16)": "float16"}


GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
ShapePolicy = Literal["auto", "off", "buckets", "pad"]


def batch_buckets(max_batch: int) -> list[int]:
    """Powers of two below ``max_batch``, then ``max_batch`` itself: 16 -> [1, 2, 4, 8, 16], 12 -> [1, 2, 4, 8, 12]."""
    return [1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch] + [max_batch]


@dataclass
class SessionCount:
    """One session's runs and shape changes: runs whose input shape differs from its previous run's
    (on a GPU each costs a new cuDNN algorithm choice, 0.4-2.2 s on an H100)."""

    batch: int | None  # the batch size this session always sees; None: any (policy off)
    runs: int = 0
    shape_changes: int = 0
    last_shape: tuple[int, ...] | None = None

    def note(self, shape: tuple[int, ...]) -> None:
        self.runs += 1
        self.shape_changes += self.last_shape is not None and shape != self.last_shape
        self.last_shape = shape


class OnnxClassifier:
    """ONNX Runtime session(s) over the exported model, under a shape policy.

    ``off``: one session takes every batch as it is. ``buckets``: one session per batch size of
    ``batch_buckets(max_batch)``; a batch is zero-padded up to its bucket. ``pad``: one session, every
    batch zero-padded to ``max_batch``. Under both, each session only ever sees one shape, and the
    padded rows are dropped before ``infer`` returns. ``auto``: buckets where a GPU provider is
    active (cuDNN picks algorithms again whenever a session's shape changes), off on the CPU.
    """

    def __init__(self, onnx_path: Path, providers: list | None = None, session_options=None,
                 shape_policy: ShapePolicy = "off", max_batch: int = 1):
        import onnxruntime as ort

        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        names = [p[0] if isinstance(p, tuple) else p for p in providers or ()]
        if any(name != "CPUExecutionProvider" for name in names):
            preload_cuda_libraries()

        def new_session():
            return ort.InferenceSession(str(onnx_path), sess_options=session_options,
                                        providers=providers or ["CPUExecutionProvider"])

        first = new_session()
        if shape_policy == "auto":
            shape_policy = "buckets" if any(p in GPU_PROVIDERS for p in first.get_providers()) else "off"
        self.shape_policy, self.max_batch = shape_policy, max_batch
        sizes = {"off": [None], "pad": [max_batch], "buckets": batch_buckets(max_batch)}[shape_policy]
        # Largest bucket first: it is the one ``first`` serves.
        self.sessions = {size: first if i == 0 else new_session() for i, size in enumerate(reversed(sizes))}
        self.counts = {size: SessionCount(size) for size in sizes}
        self._lock = threading.Lock()
        model_input = first.get_inputs()[0]
        self.input_name, self.input_shape = model_input.name, model_input.shape
        self.input_dtype = np.dtype(ONNX_DTYPES[model_input.type])
        self.output_name = first.get_outputs()[0].name

    @property
    def active_providers(self) -> list[str]:
        return next(iter(self.sessions.values())).get_providers()

    @property
    def batch_sizes(self) -> list[int]:
        """The batch sizes the sessions run (warm each once before serving); empty under policy off."""
        return sorted(size for size in self.sessions if size is not None)

    def _bucket(self, n: int) -> int | None:
        if self.shape_policy == "off":
            return None
        if n > self.max_batch:
            raise ValueError(f"a batch of {n} images is larger than the largest this model was set up for "
                             f"({self.max_batch}, ORT_SHAPE_POLICY={self.shape_policy})")
        return min(size for size in self.sessions if size >= n)

    def infer(self, batch: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(batch, self.input_dtype)
        n = len(x)
        size = self._bucket(n)
        if size is not None and size > n:
            x = np.concatenate([x, np.zeros((size - n, *x.shape[1:]), x.dtype)])
        with self._lock:
            self.counts[size].note(x.shape)
        return self.sessions[size].run([self.output_name], {self.input_name: x})[0][:n]  # padded rows dropped

    def session_counts(self) -> list[dict]:
        """Per session: the batch size it takes (``any`` under policy off), its runs and its shape changes."""
        with self._lock:
            return [{"session_batch": "any" if c.batch is None else str(c.batch), "runs": c.runs,
                     "shape_changes": c.shape_changes} for c in self.counts.values()]

    def describe(self) -> dict:
        return {"runtime": "onnxruntime", "providers": self.active_providers, "shape_policy": self.shape_policy,
                "sessions": len(self.sessions), "session_batch_sizes": self.batch_sizes}
