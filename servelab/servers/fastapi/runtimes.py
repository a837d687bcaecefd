"""The model behind a service: PyTorch or ONNX Runtime, built from the manifest and the settings.

Both are ``servelab.core.inference`` classifiers; this module decides where they run and with how many
threads, and reports what is *actually* active. ONNX Runtime silently falls back to the CPU when a
GPU execution provider cannot start (missing CUDA/cuDNN/TensorRT libraries), so the active
providers are read back from the session, a requested-but-inactive GPU provider is a loud
warning, and ``REQUIRE_GPU=1`` turns it into a refusal to start. Where a session fails to start,
ONNX Runtime retries it with fallback providers and drops every provider's options: TensorRT is asked
for only where its libraries load, the options each active provider runs with are read back too
(``provider_options`` in the details), and one asked for but not in force is a warning, or under
``REQUIRE_GPU=1`` a refusal to start.

The ONNX service serves one of the model variants (``ONNX_VARIANT``); a variant with preprocessing
in its graph takes uint8 pixels, which the classifier reads from the model's own input type. The
fp16 variant has no fast path on a CPU (ONNX Runtime would insert casts around every operator), so
it refuses to start there unless a caller allows it to check its answers.

ONNX Runtime runs under ``ORT_SHAPE_POLICY`` (``OnnxClassifier``): its sessions are set up for the
largest batch the service can hand them, and the warm-up runs each session's batch size once.
"""

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from servelab.core.artifacts import ArtifactPaths, Manifest, load_manifest
from servelab.core.inference import GPU_PROVIDERS, OnnxClassifier, TorchClassifier, tensorrt_load_error
from servelab.core.variants.build import PRECISION, variant_path
from servelab.core.procs import cpu_count
from servelab.core.settings import ServeSettings, Settings, get_settings

log = logging.getLogger("servelab.servers.fastapi")

BackendKind = Literal["pytorch", "onnx"]
TENSORRT, CUDA = GPU_PROVIDERS
CPU = "CPUExecutionProvider"
PROVIDER_ALIASES = {"tensorrt": TENSORRT, "trt": TENSORRT, "cuda": CUDA, "cpu": CPU}


GPU_ONLY_VARIANTS = ("fp16",)


class GPUUnavailable(RuntimeError):
    """REQUIRE_GPU=1 (or a GPU-only variant), but the model would run on the CPU."""


class OptionsNotInForce(RuntimeError):
    """REQUIRE_GPU=1, but an active provider does not run with the options the settings ask of it."""


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
    variant: dict[str, Any] | None = None  # ONNX: name, file, size, precision, input

    @property
    def takes_uint8(self) -> bool:
        """Whether the model takes the uint8 crop (preprocessing in its graph) instead of float32."""
        return getattr(self.classifier, "input_dtype", None) == np.uint8

    def infer(self, batch: np.ndarray) -> np.ndarray:
        return self.classifier.infer(batch)

    def warm_up_sizes(self, settings: ServeSettings) -> list[int]:
        """Batch sizes to run before the service is ready: every ONNX Runtime session's own (buckets,
        pad), else one image, a full dynamic batch and the largest request."""
        sizes = self.classifier.batch_sizes if self.kind == "onnx" else []
        return sizes or sorted({1, settings.max_batch_size, max_infer_batch(settings)})

    def session_counts(self) -> list[dict[str, Any]]:
        """ONNX Runtime: runs and shape changes of each session (none for PyTorch)."""
        return self.classifier.session_counts() if self.kind == "onnx" else []

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


PreprocessMode = Literal["threads", "processes"]


def preprocess_workers(settings: ServeSettings, backend: Backend) -> tuple[PreprocessMode, int]:
    """How images are decoded and preprocessed, and by how many workers. On a GPU, worker processes
    on every CPU but one (the server's event loop and the thread driving the GPU keep that one); on
    the CPU, threads in what inference leaves free, as before."""
    processes = settings.preprocess_processes
    if processes == "auto":
        processes = max(1, cpu_count() - 1) if backend.on_gpu else 0
    return ("processes", processes) if processes else ("threads", worker_threads(settings, backend))


def max_infer_batch(settings: ServeSettings) -> int:
    """The largest batch one inference may see: a batched request, or a dynamic batch."""
    return max(settings.max_batch_size, settings.max_request_images)


def load_backend(kind: BackendKind, settings: Settings | None = None, *,
                 allow_gpu_only_on_cpu: bool = False) -> Backend:
    """``allow_gpu_only_on_cpu``: run a GPU-only variant (fp16) on the CPU anyway, to check its answers."""
    settings = settings or get_settings()
    paths = ArtifactPaths.in_dir(settings.model_dir)
    if not paths.manifest.exists():
        raise FileNotFoundError(f"no model manifest at {paths.manifest}; run `servelab models build` first")
    manifest = load_manifest(paths.manifest)
    backend = _load_torch(settings, paths, manifest) if kind == "pytorch" else _load_onnx(settings, manifest)
    for text in backend.warnings:
        log.warning("%s", text)
    if kind == "onnx" and settings.onnx_variant in GPU_ONLY_VARIANTS and not backend.on_gpu and not allow_gpu_only_on_cpu:
        raise GPUUnavailable(f"ONNX_VARIANT={settings.onnx_variant} runs only on a GPU (a CPU has no fast float16 "
                             f"path), but the model would run on the CPU ({backend.where()}); refusing to start. "
                             "Use ONNX_VARIANT=int8 or u8 on a CPU")
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


def tensorrt_options(settings: ServeSettings, input_name: str, image_shape: list[int]) -> dict[str, Any]:
    """The optimization guide's TensorRT options; the profile covers every batch we may send
    (``image_shape``: one image as the model takes it, CHW float or HWC uint8)."""
    cache = settings.trt_cache_path.expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    shape = "x".join(map(str, image_shape))
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


def _load_onnx(settings: ServeSettings, manifest: Manifest) -> Backend:
    import onnxruntime as ort

    path = variant_path(settings.model_dir, settings.onnx_variant)
    if not path.exists():
        raise FileNotFoundError(f"ONNX_VARIANT={settings.onnx_variant}: no {path.name} in {settings.model_dir}; "
                                "run `servelab models build` first")
    available = ort.get_available_providers()
    wanted, warnings = requested_providers(settings.ort_providers, available)
    if TENSORRT in wanted and (why := tensorrt_load_error()):
        wanted.remove(TENSORRT)
        warnings.append(f"{TENSORRT} is left out: its libraries do not load here ({why}); asked for anyway, ONNX "
                        "Runtime would fail the session and retry it without the options of every provider")
    options = {CUDA: {"cudnn_conv_algo_search": settings.ort_cudnn_conv_algo_search}}
    if TENSORRT in wanted:
        options[TENSORRT] = tensorrt_options(settings, *_onnx_input(path))
    threads = intra_op_threads(settings)
    classifier = OnnxClassifier(path, providers=[(p, options.get(p, {})) for p in wanted],
                                session_options=session_options(settings, threads),
                                shape_policy=settings.ort_shape_policy, max_batch=max_infer_batch(settings))
    for session in classifier.sessions.values():
        # ONNX Runtime would otherwise switch providers (down to the CPU) after a failed run, unannounced.
        session.disable_fallback()
    active = classifier.active_providers
    for provider in wanted:
        if provider in GPU_PROVIDERS and provider not in active:
            warnings.append(f"{provider} was requested but is NOT active: ONNX Runtime fell back to "
                            f"{', '.join(active)} (are the CUDA, cuDNN and TensorRT libraries installed?)")
    if dropped := classifier.options_not_in_force():
        text = ("ONNX Runtime does not run with the provider options asked for (" + "; ".join(dropped) + "): "
                "the figures would not be those of the settings")
        if settings.require_gpu:
            raise OptionsNotInForce(f"REQUIRE_GPU=1 but {text}; refusing to start")
        warnings.append(text)
    on_gpu = any(p in GPU_PROVIDERS for p in active)
    if not on_gpu and not any(p in GPU_PROVIDERS for p in available):
        log.info("this onnxruntime build has no GPU execution provider (available: %s); running on the CPU",
                 ", ".join(available))
    # provider_options (in describe): what each active provider really runs with, read back from the session.
    details = {
        **classifier.describe(), "requested_providers": wanted, "onnxruntime": ort.__version__,
        "intra_op_threads": threads, "inter_op_threads": settings.inter_op_threads,
        "execution_mode": settings.ort_execution_mode, "graph_optimization": settings.ort_graph_optimization,
    }
    variant = {"name": settings.onnx_variant, "file": path.name, "size_bytes": path.stat().st_size,
               "precision": PRECISION[settings.onnx_variant],
               "input": f"{classifier.input_name} {classifier.input_dtype} {classifier.input_shape}"}
    return Backend("onnx", classifier, manifest, on_gpu, threads, details, warnings, variant)


def _onnx_input(path: Path) -> tuple[str, list[int]]:
    """The graph's input name and one image's shape, for TensorRT's profile shapes (read without
    building a session)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model_input = ort.InferenceSession(str(path), options, providers=[CPU]).get_inputs()[0]
    return model_input.name, model_input.shape[1:]
