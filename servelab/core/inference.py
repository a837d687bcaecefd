"""Run the classifier on a preprocessed batch: the same call for PyTorch and ONNX Runtime, which return logits;
softmax and labels are ``servelab.core.postprocess``'s job, so every stage reports probabilities the same way.

On a GPU, cuDNN chooses algorithms again whenever a session's input shape changes (0.4-2.2 s per change on an
H100: a dynamic batcher's varying sizes collapsed it to 4 req/s), so ``OnnxClassifier`` gives each session one shape.
"""

import ctypes
import logging
import os
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Literal

import numpy as np

from servelab.core.artifacts import Manifest, load_manifest
from servelab.core.hardware import GPU_PROVIDERS
from servelab.core.models import build_model

log = logging.getLogger(__name__)


class TorchClassifier:
    """The manifest's architecture with its state_dict (loaded with weights_only=True)."""

    def __init__(self, manifest_path: Path, device: str = "cpu", fp16: bool = False, threads: int | None = None):
        import torch  # deferred: an optional extra (torch), loaded only when this runs

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
        """float32 [N, 3, H, W], normalised (``preprocess``) -> float32 logits [N, classes]. Thread-safe: no state."""
        torch = self._torch
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(batch)).to(self.device, self.dtype)
            return self.model(x).float().cpu().numpy()

    def describe(self) -> dict:
        return {"runtime": "pytorch", "device": str(self.device), "dtype": str(self.dtype).removeprefix("torch.")}


# The libraries of the ``nvidia-*`` wheels that ONNX Runtime's CUDA provider and cuDNN need, each after the
# ones it links against (cuBLAS needs cuBLASLt; cuDNN's parts need libcudnn_graph); absent ones are skipped.
# cuDNN opens its parts by name as it needs them: loaded here, they are found whatever its own search path.
CUDA_LIBRARIES = (
    "cudart", "nvJitLink", "nvrtc", "nvrtc-builtins", "cublasLt", "cublas", "curand", "cufft",
    "cudnn_graph", "cudnn_engines_precompiled", "cudnn_engines_runtime_compiled", "cudnn_heuristic",
    "cudnn_ops", "cudnn_cnn", "cudnn_adv", "cudnn",
)
# Those whose file name carries the CUDA major version (libcudart.so.13); cuRAND, cuFFT and cuDNN number their own.
CUDA_VERSIONED = {"cudart", "nvJitLink", "nvrtc", "nvrtc-builtins", "cublasLt", "cublas"}


def load_cuda_libraries(folders: Sequence[Path], cuda_major: str | None = None) -> dict[str, Path]:
    """Load each of ``CUDA_LIBRARIES`` from the first of ``folders`` that has it, in that order, with
    RTLD_GLOBAL; ``cuda_major``: only that CUDA version's runtime, cuBLAS and NVRTC. Returns {file name:
    path} of what loaded. Once loaded, a library is found by its name (``libcudart.so.13``), which is
    how ONNX Runtime's provider library and cuDNN look for them."""
    loaded: dict[str, Path] = {}
    for name in CUDA_LIBRARIES:
        major = cuda_major if cuda_major and name in CUDA_VERSIONED else r"\d+"
        pattern = re.compile(rf"lib{re.escape(name)}\.so\.{major}(\.\d+)*")
        # The shortest name is the one the others link against (libcudart.so.13, not libcudart.so.13.0.96).
        found = next((path for folder in folders for path in sorted(folder.iterdir(), key=lambda p: len(p.name))
                      if pattern.fullmatch(path.name)), None)
        if found is None:
            continue
        try:
            ctypes.CDLL(str(found), mode=os.RTLD_GLOBAL)
            loaded[found.name] = found
        except OSError as exc:  # a provider that needs it stays inactive, which the caller reads back
            log.warning("CUDA for ONNX Runtime: %s did not load: %s", found, exc)
    by_folder: dict[Path, list[str]] = {}
    for path in loaded.values():
        by_folder.setdefault(path.parent, []).append(path.name)
    if by_folder:
        log.info("CUDA for ONNX Runtime: loaded %s", "; ".join(f"{', '.join(names)} from {folder}"
                                                               for folder, names in by_folder.items()))
    else:
        log.warning("CUDA for ONNX Runtime: no CUDA library in any nvidia/*/lib folder of %s",
                    ", ".join(map(str, folders)) or "no folder")
    return loaded


@cache
def preload_cuda_libraries() -> dict[str, Path]:
    """Load the CUDA libraries of the ``nvidia-*`` wheels on ``sys.path`` before a session asks for a GPU provider
    (once per process). ``onnxruntime.preload_dlls()`` alone looks only beside onnxruntime and on the loader path,
    and finds none where the CUDA PyTorch, whose wheels bring them, lives in another environment: its site folders
    reach ``sys.path`` through a ``.pth`` (the Makefile's ``.venv-gpu``), so all of ``sys.path`` is searched."""
    import onnxruntime as ort  # deferred: an optional extra (onnx), loaded only when this runs

    # CUDA 13's wheels share nvidia/cu13/lib, CUDA 12's have one each (nvidia/cublas/lib), cuDNN nvidia/cudnn/lib.
    folders = [lib for folder in dict.fromkeys(filter(None, sys.path))
               for lib in sorted(Path(folder).glob("nvidia/*/lib")) if lib.is_dir()]
    loaded = load_cuda_libraries(folders, ort.cuda_version.split(".")[0] or None)
    # ONNX Runtime's own pass now finds each library already loaded under its name, and in a build whose
    # CUDA provider is a plugin it registers that plugin again (at import, without the libraries, it failed).
    ort.preload_dlls()
    return loaded


def library_load_error(libraries: Sequence[Path]) -> str | None:
    """Why ``libraries``, loaded in this order, do not all load here (the loader's message, which names the
    file it could not find), or None where they do."""
    for library in libraries:
        try:
            ctypes.CDLL(str(library))
        except OSError as exc:
            return str(exc)
    return None


def tensorrt_load_error() -> str | None:
    """Why ONNX Runtime's TensorRT provider cannot start here, or None where it can: its library and what
    it links against (the libnvinfer of the TensorRT major this build was made for) must load. Where they
    do not, ONNX Runtime fails the session, retries with fallback providers and drops every provider's
    options (cuDNN's algorithm search among them)."""
    import onnxruntime as ort  # deferred: an optional extra (onnx), loaded only when this runs

    preload_cuda_libraries()  # TensorRT and its provider link against CUDA's libraries too
    capi = Path(ort.__file__).parent / "capi"
    # As ONNX Runtime does: the bridge shared by its provider libraries first, then the provider.
    return library_load_error([capi / "libonnxruntime_providers_shared.so", capi / "libonnxruntime_providers_tensorrt.so"])


def onnx_session(model: Path | bytes, providers: Sequence, session_options=None):
    """An ONNX Runtime session over ``model`` (a file or its bytes). Every session that may ask for a GPU
    provider is opened here (serving, the Triton stand-in, the ceiling, the doctor), so CUDA's libraries
    are loaded first in whatever process opens it."""
    import onnxruntime as ort  # deferred: an optional extra (onnx), loaded only when this runs

    if any((p[0] if isinstance(p, tuple) else p) != "CPUExecutionProvider" for p in providers):  # (name, options)
        preload_cuda_libraries()
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), sess_options=session_options,
                                providers=list(providers))


def _option_text(value: object) -> str:
    """An option value as ONNX Runtime reports it: text, booleans as 1 and 0."""
    text = str(value)
    return {"true": "1", "false": "0"}.get(text.lower(), text)


def options_not_in_force(requested: Mapping[str, Mapping[str, object]],
                         in_force: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Each option asked of an active provider (``in_force``: ``get_provider_options()``) that its session does not
    run with, in words: ONNX Runtime drops them all, silently, when it retries a session with fallback providers."""
    problems = []
    for provider, options in requested.items():
        if (held := in_force.get(provider)) is None:
            continue
        for key, value in options.items():
            if key not in held:
                problems.append(f"{provider}: {key}={value} was asked for, but the session has no {key}")
            elif _option_text(held[key]) != _option_text(value):
                problems.append(f"{provider}: {key}={value} was asked for, but the session runs with {key}={held[key]}")
    return problems


# ONNX Runtime's names for the input types our models take.
ONNX_DTYPES = {"tensor(float)": "float32", "tensor(uint8)": "uint8", "tensor(float16)": "float16"}
ShapePolicy = Literal["auto", "off", "buckets", "pad"]


def batch_buckets(max_batch: int) -> list[int]:
    """Powers of two below ``max_batch``, then ``max_batch`` itself: 16 -> [1, 2, 4, 8, 16], 12 -> [1, 2, 4, 8, 12]."""
    return [1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch] + [max_batch]


@dataclass
class SessionCount:
    """One session's runs, and those whose input shape differs from its previous run's (each a new cuDNN choice)."""

    batch: int | None  # the batch size this session always sees; None: any (policy off)
    runs: int = 0
    shape_changes: int = 0
    last_shape: tuple[int, ...] | None = None

    def note(self, shape: tuple[int, ...]) -> None:
        self.runs += 1
        self.shape_changes += self.last_shape is not None and shape != self.last_shape
        self.last_shape = shape


class OnnxClassifier:
    """ONNX Runtime session(s) under a shape policy: ``off``, one session, batches as they come; ``buckets``, one
    session per size of ``batch_buckets(max_batch)``, a batch zero-padded up to its bucket; ``pad``, one session,
    every batch padded to ``max_batch`` (padded rows never returned); ``auto``, buckets where a GPU provider is
    active, off on the CPU."""

    def __init__(self, onnx_path: Path, providers: list | None = None, session_options=None,
                 shape_policy: ShapePolicy = "off", max_batch: int = 1, open_session=None):
        """``open_session(path, providers)`` opens each session (fastapi_onnx's app passes its own, with its
        session options); without it, ``onnx_session`` with ``session_options``."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        providers = providers or ["CPUExecutionProvider"]
        self.requested_options = {p[0]: dict(p[1]) for p in providers if isinstance(p, tuple)}
        open_session = open_session or partial(onnx_session, session_options=session_options)
        new_session = partial(open_session, onnx_path, providers)
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
    def provider_options(self) -> dict[str, dict[str, str]]:
        """The options each active provider really runs with, read back from the session (all are made alike)."""
        return next(iter(self.sessions.values())).get_provider_options()

    def options_not_in_force(self) -> list[str]:
        """The options asked of an active provider that it does not run with (``options_not_in_force``)."""
        return options_not_in_force(self.requested_options, self.provider_options)

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
        """[N, 3, H, W] (cast to the model's input dtype) -> float32 logits [N, classes], N padded up to its session's
        size and the padding dropped. ValueError: N above the largest session. Thread-safe (ONNX Runtime's run is)."""
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
        return {"runtime": "onnxruntime", "providers": self.active_providers, "provider_options": self.provider_options,
                "shape_policy": self.shape_policy, "sessions": len(self.sessions),
                "session_batch_sizes": self.batch_sizes}
