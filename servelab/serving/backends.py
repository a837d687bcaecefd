"""The model behind a service: PyTorch or ONNX Runtime, built from the manifest and the settings.

Both are ``servelab.inference`` classifiers; this module decides where they run and with how many
threads, and reports what is *actually* active. ONNX Runtime silently falls back to the CPU when a
GPU execution provider cannot start (missing CUDA/cuDNN/TensorRT libraries), so the active
providers are read back from the session, a requested-but-inactive GPU provider is a loud
warning, and ``REQUIRE_GPU=1`` turns it into a refusal to start.
"""

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from servelab.artifacts import ArtifactPaths, Manifest, load_manifest
from servelab.inference import OnnxClassifier, TorchClassifier
from servelab.procs import cpu_count
from servelab.settings import ServeSettings, get_settings

log = logging.getLogger("servelab.serving")

BackendKind = Literal["pytorch", "onnx"]
TENSORRT, CUDA, CPU = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"
GPU_PROVIDERS = (TENSORRT, CUDA)
PROVIDER_ALIASES = {"tensorrt": TENSORRT, "trt": TENSORRT, "cuda": CUDA, "cpu": CPU}


class GPUUnavailable(RuntimeError):
    """REQUIRE_GPU=1, but the model would run on the CPU."""


@dataclass
class Backend:
    """A loaded classifier and what /ready and the startup log say about it."""

    kind: BackendKind
    classifier: TorchClassifier | OnnxClassifier
    manifest: Manifest
    on_gpu: bool
    intra_op_threads: int
    details: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    def infer(self, batch: np.ndarray) -> np.ndarray:
        return self.classifier.infer(batch)

    def where(self) -> str:
        """Where the model runs, in a few words, for logs and errors."""
        d = self.details
        if self.kind == "onnx":
            return (f"onnxruntime {d['onnxruntime']}, providers active: {', '.join(d['providers'])} "
                    f"(requested: {', '.join(d['requested_providers'])})")
        return f"pytorch {d['torch']}, device {d['device']} ({d['dtype']})"


def intra_op_threads(settings: ServeSettings) -> int:
    return settings.intra_op_threads or max(1, cpu_count() // 2)


def worker_threads(settings: ServeSettings, backend: Backend) -> int:
    """Preprocessing threads: what inference leaves free, so the two never oversubscribe the CPU."""
    if settings.worker_threads:
        return settings.worker_threads
    if backend.on_gpu:
        return cpu_count()
    return max(1, cpu_count() - backend.intra_op_threads)


def max_infer_batch(settings: ServeSettings) -> int:
    """The largest batch one inference may see: a batched request, or a dynamic batch."""
    return max(settings.max_batch_size, settings.max_request_images)


def load_backend(kind: BackendKind, settings: ServeSettings | None = None) -> Backend:
    settings = settings or get_settings()
    paths = ArtifactPaths.in_dir(settings.model_dir)
    if not paths.manifest.exists():
        raise FileNotFoundError(f"no model manifest at {paths.manifest}; run `servelab models build` first")
    manifest = load_manifest(paths.manifest)
    backend = _load_torch(settings, paths, manifest) if kind == "pytorch" else _load_onnx(settings, paths, manifest)
    for text in backend.warnings:
        log.warning("%s", text)
    if settings.require_gpu and not backend.on_gpu:
        raise GPUUnavailable(f"REQUIRE_GPU=1 but the model would run on the CPU ({backend.where()}); refusing to start")
    return backend


def _load_torch(settings: ServeSettings, paths: ArtifactPaths, manifest: Manifest) -> Backend:
    import torch

    threads = intra_op_threads(settings)
    try:
        torch.set_num_interop_threads(settings.inter_op_threads)
    except RuntimeError:  # already set in this process (only possible once)
        pass
    device = settings.torch_device
    warnings = []
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device.startswith("cuda") and not torch.cuda.is_available():
        raise GPUUnavailable(f"TORCH_DEVICE={device} but this PyTorch has no usable CUDA device "
                             f"(torch {torch.__version__}, CUDA build {torch.version.cuda})")
    on_gpu = device.startswith("cuda")
    if settings.torch_fp16 and not on_gpu:
        warnings.append("TORCH_FP16=1 is ignored on the CPU (no fast float16 path there); running float32")
    classifier = TorchClassifier(paths.manifest, device=device, fp16=settings.torch_fp16, threads=threads)
    details = {**classifier.describe(), "torch": torch.__version__, "intra_op_threads": threads,
               "inter_op_threads": torch.get_num_interop_threads()}
    if on_gpu:
        details["gpu"] = torch.cuda.get_device_name(classifier.device)
    return Backend("pytorch", classifier, manifest, on_gpu, threads, details, warnings)


def requested_providers(spec: str, available: list[str]) -> tuple[list[str], list[str]]:
    """(providers to ask ONNX Runtime for, warnings) from ORT_PROVIDERS."""
    if spec.strip().lower() == "auto":
        return [p for p in (TENSORRT, CUDA, CPU) if p in available], []
    wanted, warnings = [], []
    for name in (part.strip() for part in spec.split(",") if part.strip()):
        full = PROVIDER_ALIASES.get(name.lower(), name)
        if full not in available:
            warnings.append(f"ORT_PROVIDERS asks for {full}, which this onnxruntime build does not have "
                            f"(available: {', '.join(available)})")
        elif full not in wanted:
            wanted.append(full)
    if CPU not in wanted:
        wanted.append(CPU)  # always the last resort for operators a GPU provider does not take
    return wanted, warnings


def tensorrt_options(settings: ServeSettings, manifest: Manifest, input_name: str) -> dict[str, Any]:
    """The optimization guide's TensorRT options; the profile covers every batch we may send."""
    cache = settings.trt_cache_path.expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    shape = f"3x{manifest.crop}x{manifest.crop}"
    return {
        "trt_fp16_enable": settings.trt_fp16,
        "trt_engine_cache_enable": settings.trt_engine_cache,
        "trt_engine_cache_path": str(cache),
        "trt_timing_cache_enable": settings.trt_timing_cache,
        "trt_timing_cache_path": str(cache),
        "trt_max_workspace_size": settings.trt_max_workspace_bytes,
        "trt_builder_optimization_level": settings.trt_builder_optimization_level,
        "trt_profile_min_shapes": f"{input_name}:1x{shape}",
        # The size dynamic batching aims for (1 when it is off) and the largest any inference can be.
        "trt_profile_opt_shapes": f"{input_name}:{settings.max_batch_size}x{shape}",
        "trt_profile_max_shapes": f"{input_name}:{max_infer_batch(settings)}x{shape}",
    }


def session_options(settings: ServeSettings, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = settings.inter_op_threads
    options.execution_mode = {"sequential": ort.ExecutionMode.ORT_SEQUENTIAL,
                              "parallel": ort.ExecutionMode.ORT_PARALLEL}[settings.ort_execution_mode]
    options.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[settings.ort_graph_optimization]
    spin = "1" if settings.ort_allow_spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    return options


def _load_onnx(settings: ServeSettings, paths: ArtifactPaths, manifest: Manifest) -> Backend:
    import onnxruntime as ort

    available = ort.get_available_providers()
    wanted, warnings = requested_providers(settings.ort_providers, available)
    options = {TENSORRT: tensorrt_options(settings, manifest, _onnx_input_name(paths))} if TENSORRT in wanted else {}
    threads = intra_op_threads(settings)
    classifier = OnnxClassifier(paths.onnx, providers=[(p, options.get(p, {})) for p in wanted],
                                session_options=session_options(settings, threads))
    # ONNX Runtime would otherwise switch providers (down to the CPU) after a failed run, unannounced.
    classifier.session.disable_fallback()
    active = classifier.active_providers
    for provider in wanted:
        if provider in GPU_PROVIDERS and provider not in active:
            warnings.append(f"{provider} was requested but is NOT active: ONNX Runtime fell back to "
                            f"{', '.join(active)} (are the CUDA, cuDNN and TensorRT libraries installed?)")
    on_gpu = any(p in GPU_PROVIDERS for p in active)
    if not on_gpu and not any(p in GPU_PROVIDERS for p in available):
        log.info("this onnxruntime build has no GPU execution provider (available: %s); running on the CPU",
                 ", ".join(available))
    details = {
        **classifier.describe(), "requested_providers": wanted, "onnxruntime": ort.__version__,
        "intra_op_threads": threads, "inter_op_threads": settings.inter_op_threads,
        "execution_mode": settings.ort_execution_mode, "graph_optimization": settings.ort_graph_optimization,
    }
    if TENSORRT in active:
        details["tensorrt_options"] = options[TENSORRT]
    return Backend("onnx", classifier, manifest, on_gpu, threads, details, warnings)


def _onnx_input_name(paths: ArtifactPaths) -> str:
    """The graph's input name, for TensorRT's profile shapes (read without building a session)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(paths.onnx), options, providers=[CPU]).get_inputs()[0].name
