"""Run the classifier on a preprocessed batch: the same call for PyTorch and ONNX Runtime.

Both classes take float32 [N, 3, 224, 224] (an ONNX model with preprocessing in its graph: uint8
[N, 224, 224, 3]) and return float32 [N, 11] logits; softmax and labels are
``servelab.postprocess``'s job, so every stage reports probabilities the same way.
"""

import logging
from pathlib import Path

import numpy as np

from servelab.artifacts import Manifest, load_manifest

log = logging.getLogger(__name__)


class TorchClassifier:
    """The manifest's architecture with its state_dict (loaded with weights_only=True)."""

    def __init__(self, manifest_path: Path, device: str = "cpu", fp16: bool = False, threads: int | None = None):
        import torch

        from servelab.models import build_model

        if threads:
            torch.set_num_threads(threads)
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


class OnnxClassifier:
    """An ONNX Runtime session over the exported model."""

    def __init__(self, onnx_path: Path, providers: list | None = None, session_options=None):
        import onnxruntime as ort

        names = [p[0] if isinstance(p, tuple) else p for p in providers or ()]
        if any(name != "CPUExecutionProvider" for name in names):
            preload_cuda_libraries()
        self.session = ort.InferenceSession(
            str(onnx_path), sess_options=session_options, providers=providers or ["CPUExecutionProvider"]
        )
        model_input = self.session.get_inputs()[0]
        self.input_name, self.input_shape = model_input.name, model_input.shape
        self.input_dtype = np.dtype(ONNX_DTYPES[model_input.type])
        self.output_name = self.session.get_outputs()[0].name

    @property
    def active_providers(self) -> list[str]:
        return self.session.get_providers()

    def infer(self, batch: np.ndarray) -> np.ndarray:
        return self.session.run([self.output_name], {self.input_name: np.ascontiguousarray(batch, self.input_dtype)})[0]

    def describe(self) -> dict:
        return {"runtime": "onnxruntime", "providers": self.active_providers}
