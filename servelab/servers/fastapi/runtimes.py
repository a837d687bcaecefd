"""The model behind a service: where each app's own loading (``fastapi_pt/app.py``, ``fastapi_onnx/app.py``)
runs, with how many threads, and what is *actually* active.

ONNX Runtime silently falls back to the CPU when a GPU execution provider cannot start (missing
CUDA/cuDNN/TensorRT libraries), and where a session fails to start it retries with fallback providers and
drops every provider's options. So TensorRT is asked for only where its libraries load, the active providers
and their options are read back from the session (``provider_options``), and one asked for but not in force
is a loud warning, or under ``REQUIRE_GPU=1`` a refusal to start. The fp16 variant has no fast path on a CPU
(ONNX Runtime would insert casts around every operator), so it refuses to start there.
"""

import logging
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from servelab.core.artifacts import ArtifactPaths, Manifest, load_manifest
from servelab.core.fetch import sha256_file
from servelab.core.inference import GPU_PROVIDERS, OnnxClassifier, preload_cuda_libraries, tensorrt_load_error
from servelab.core.settings import ServeSettings
from servelab.core.simulated_gpu import SimulatedGPU
from servelab.core.variants.build import PRECISION, variant_path
from servelab.servers.fastapi.shared import SharedBatcher
from servelab.servers.fastapi.siblings import Siblings, cpus

log = logging.getLogger("servelab.servers.fastapi")

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
    kind: Literal["pytorch", "onnx"]
    infer: Callable[[np.ndarray], np.ndarray]  # a batch of model inputs -> logits, in the calling thread
    manifest: Manifest
    on_gpu: bool
    intra_op_threads: int
    details: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    variant: dict[str, Any] | None = None  # ONNX: name, file, size, precision, input
    classifier: OnnxClassifier | None = None  # ONNX: its sessions (providers, shape policy, counts)
    version: str = ""  # the model version every response carries (``model_version``)
    takes_uint8: bool = False  # the model takes the uint8 crop (preprocessing in its graph), not float32
    remote: Any = None  # beside a batcher process: ``shared.SharedBatcher``, which infers there

    def warm_up_sizes(self, settings: ServeSettings) -> list[int]:
        """Every ONNX Runtime session's own batch size, else one image, a full dynamic batch, the largest request."""
        sizes = self.classifier.batch_sizes if self.classifier else []
        return sizes or sorted({1, settings.max_batch_size, max_infer_batch(settings)})

    def session_counts(self) -> list[dict[str, Any]]:
        return self.classifier.session_counts() if self.classifier else []

    def where(self) -> str:
        d = self.details
        if self.kind == "onnx":
            return (f"onnxruntime {d['onnxruntime']}, providers active: {', '.join(d['providers'])} "
                    f"(requested: {', '.join(d['requested_providers'])})")
        return f"pytorch {d['torch']}, device {d['device']} ({d['dtype']})"


VERSION_CHARS = 12


def model_version(weights: Path) -> str:
    """The start of the loaded file's sha256: the same bytes are the same version, any other bytes (another
    variant, a re-export, new weights) a new one, with no version number to keep in step by hand."""
    return sha256_file(weights)[:VERSION_CHARS]


def intra_op_threads(settings: ServeSettings) -> int:
    """INTRA_OP_THREADS, else the CPUs shared out among the instances that may infer at once (with
    MODEL_INSTANCES left to the machine: one thread each, where one inference per core costs the least
    CPU per image; on a GPU the CPU threads only run what the GPU does not)."""
    return settings.intra_op_threads or max(1, cpus() // (settings.model_instances or cpus()))


def preprocess_workers(settings: ServeSettings, backend: Backend) -> tuple[Literal["threads", "processes"], int]:
    """How images are decoded and preprocessed, and by how many workers. On a GPU, worker processes
    on every CPU but one (the server's event loop and the thread driving the GPU keep that one); on
    the CPU, WORKER_THREADS threads, else one per CPU, sharing the cores with the inferences: the scheduler
    gives each what the other leaves (keeping the two apart left cores idle whenever one side waited)."""
    processes = settings.preprocess_processes
    if processes == "auto":  # a server process beside a batcher process has one core of its own: threads
        processes = max(1, cpus() - 1) if backend.on_gpu and backend.remote is None else 0
    return ("processes", processes) if processes else ("threads", settings.worker_threads or cpus())


# Inferences in flight per CPU where the model runs on the CPU, each on one intra-op thread (the least CPU per
# image). Two, not one: a core whose inference thread waits (for the GIL, for a batch) runs the other; on the
# lab's 2-CPU VM two per CPU beat one in every side-by-side round, more than two did no better
# (docs/records/benchmark-limit-2cpu.log; `servelab benchmark --measure limit` measures it on a machine).
INFERENCES_PER_CPU = 2


def model_instances(settings: ServeSettings, backend: Backend) -> int:
    """How many inferences may run at once (threads sharing the one session): MODEL_INSTANCES, else
    ``INFERENCES_PER_CPU`` per CPU's worth of intra-op threads where the model runs on the CPU, one on a
    GPU or its stand-in (one inference already fills it; more would only interleave)."""
    if settings.model_instances:
        return settings.model_instances
    return 1 if backend.on_gpu or "stand_in" in backend.details else max(1, INFERENCES_PER_CPU * cpus() // backend.intra_op_threads)


def why_threads(settings: ServeSettings, backend: Backend) -> str:
    """Why the service runs its inferences and preprocessing as it does, for its start-up log."""
    chosen = [name for name in ("model_instances", "intra_op_threads", "worker_threads", "preprocess_processes")
              if name in settings.model_fields_set]
    if chosen:
        return "set: " + ", ".join(name.upper() for name in chosen)
    if backend.on_gpu:
        return "the machine's defaults: one inference fills the GPU, every CPU preprocesses"
    return (f"the machine's defaults for {cpus()} CPUs: single-threaded inferences, where an image costs the "
            f"least CPU, {INFERENCES_PER_CPU} per CPU so that no core waits for one, and preprocessing threads "
            "take the cores in between")


def max_infer_batch(settings: ServeSettings) -> int:  # a batched request, or a dynamic batch
    return max(settings.max_batch_size, settings.max_request_images)


def model_manifest(settings: ServeSettings) -> tuple[ArtifactPaths, Manifest]:
    paths = ArtifactPaths.in_dir(settings.model_dir)
    if not paths.manifest.exists():
        raise FileNotFoundError(f"no model manifest at {paths.manifest}; run `servelab models build` first")
    return paths, load_manifest(paths.manifest)


def _checked(backend: Backend, settings: ServeSettings, allow_gpu_only_on_cpu: bool = False) -> Backend:
    """The backend, its warnings logged, unless it would run on the CPU where it must not; behind the
    GPU-shaped stand-in where SIMULATED_GPU_MS asks for it."""
    if settings.simulated_gpu_ms:
        backend.infer = SimulatedGPU(backend.infer, settings.simulated_gpu_ms, max_infer_batch(settings))
        backend.details["stand_in"] = backend.infer.label
        backend.warnings.append(f"{backend.infer.label}: not the model's own timings")
    for text in backend.warnings:
        log.warning("%s", text)
    if backend.kind == "onnx" and settings.onnx_variant in GPU_ONLY_VARIANTS and not backend.on_gpu \
            and not allow_gpu_only_on_cpu:
        raise GPUUnavailable(f"ONNX_VARIANT={settings.onnx_variant} runs only on a GPU (a CPU has no fast float16 "
                             f"path), but the model would run on the CPU ({backend.where()}); refusing to start. "
                             "Use ONNX_VARIANT=int8 or u8 on a CPU")
    if settings.require_gpu and not backend.on_gpu:
        raise GPUUnavailable(f"REQUIRE_GPU=1 but the model would run on the CPU ({backend.where()}); refusing to start")
    return backend


def _batchers_model(settings: ServeSettings) -> Backend | None:
    """Beside a batcher process (SHARED_BATCHER): the model it serves, which this process never loads, with
    inference there (``shared.SharedBatcher``, the pipeline's batcher); else None."""
    if not (siblings := Siblings.here()) or not siblings.batchers:
        return None
    remote = SharedBatcher(siblings.batcher(), settings, max_infer_batch(settings))
    d = remote.described
    return Backend(d["kind"], remote.infer, model_manifest(settings)[1], d["on_gpu"], d["intra_op_threads"],
                   {**d["details"], "batcher": "a process shared by every server process"}, d["warnings"],
                   d["variant"], version=d["version"], takes_uint8=d["takes_uint8"], remote=remote)


# What fastapi_pt's app builds from the weights: float32 [N, 3, H, W] -> logits [N, classes].
TorchLoader = Callable[[Path, str, Any, Any], Callable[[np.ndarray], np.ndarray]]


def torch_backend(settings: ServeSettings, load_model: TorchLoader) -> Backend:
    """fastapi_pt's model: ``load_model(weights, architecture, device, dtype)`` is the app's."""
    if remote := _batchers_model(settings):
        return remote
    import torch  # deferred: an optional extra (torch), loaded only when this runs

    paths, manifest = model_manifest(settings)
    threads = intra_op_threads(settings)
    torch.set_num_threads(threads)
    with suppress(RuntimeError):  # already set in this process (only possible once)
        torch.set_num_interop_threads(settings.inter_op_threads)
    # Benchmark mode would time cuDNN algorithms again for every new input shape, which a dynamic
    # batcher's sizes keep producing; off, PyTorch's heuristics pick at once (pt-dyn/pt-1: 0.97 on an H100).
    torch.backends.cudnn.benchmark = False
    device = settings.torch_device
    warnings = []
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device.startswith("cuda") and not torch.cuda.is_available():
        raise GPUUnavailable(f"TORCH_DEVICE={device} but this PyTorch has no usable CUDA device "
                             f"(torch {torch.__version__}, CUDA build {torch.version.cuda})")
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    if settings.torch_fp16 and not on_gpu:
        warnings.append("TORCH_FP16=1 is ignored on the CPU (no fast float16 path there); running float32")
    # fp16 halves memory traffic on a GPU; CPUs have no fast fp16 path, so it stays fp32 there.
    dtype = torch.float16 if settings.torch_fp16 and on_gpu else torch.float32
    weights = paths.manifest.parent / manifest.state_dict_file
    infer = load_model(weights, manifest.architecture, device, dtype)
    details = {"runtime": "pytorch", "device": str(device), "dtype": str(dtype).removeprefix("torch."),
               "torch": torch.__version__, "intra_op_threads": threads,
               "inter_op_threads": torch.get_num_interop_threads()}
    if on_gpu:
        details["gpu"] = torch.cuda.get_device_name(device)
    return _checked(Backend("pytorch", infer, manifest, on_gpu, threads, details, warnings,
                            version=model_version(weights)), settings)


def requested_providers(spec: str, available: list[str]) -> tuple[list[str], list[str]]:
    if spec.strip().lower() == "auto":
        return [p for p in (TENSORRT, CUDA, CPU) if p in available], []
    wanted, warnings = [], []
    for name in (part.strip() for part in spec.split(",") if part.strip()):
        if (full := PROVIDER_ALIASES.get(name.lower(), name)) not in available:
            warnings.append(f"ORT_PROVIDERS asks for {full}, which this onnxruntime build does not have "
                            f"(available: {', '.join(available)})")
        elif full not in wanted:
            wanted.append(full)
    if CPU not in wanted:
        wanted.append(CPU)  # always the last resort for operators a GPU provider does not take
    return wanted, warnings


def tensorrt_options(settings: ServeSettings, path: Path) -> dict[str, Any]:
    """The optimization guide's TensorRT options; the profile covers every batch we may send, of images as
    the model at ``path`` takes them (CHW float or HWC uint8; read without building a session)."""
    import onnxruntime as ort  # deferred: an optional extra (onnx), loaded only when this runs

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model_input = ort.InferenceSession(str(path), options, providers=[CPU]).get_inputs()[0]
    input_name, shape = model_input.name, "x".join(map(str, model_input.shape[1:]))
    cache = settings.trt_cache_path.expanduser()
    cache.mkdir(parents=True, exist_ok=True)
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


# What fastapi_onnx's app opens: an InferenceSession over the model file with these providers.
SessionOpener = Callable[[Path, list], Any]


def onnx_backend(settings: ServeSettings, open_session: SessionOpener, *, allow_gpu_only_on_cpu: bool = False) -> Backend:
    """fastapi_onnx's model, sessions opened by ``open_session(path, providers)`` (the app's), then what is
    really active read back. ``allow_gpu_only_on_cpu``: run fp16 on the CPU anyway, to check its answers."""
    if remote := _batchers_model(settings):
        return remote
    import onnxruntime as ort  # deferred: an optional extra (onnx), loaded only when this runs

    _, manifest = model_manifest(settings)
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
        options[TENSORRT] = tensorrt_options(settings, path)
    threads = intra_op_threads(settings)
    if any(p in GPU_PROVIDERS for p in wanted):
        preload_cuda_libraries()  # CUDA's libraries, from the nvidia-* wheels, before a session asks for them
    classifier = OnnxClassifier(path, providers=[(p, options.get(p, {})) for p in wanted], open_session=open_session,
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
    details = {**classifier.describe(), "requested_providers": wanted, "onnxruntime": ort.__version__,
               "intra_op_threads": threads, "inter_op_threads": settings.inter_op_threads,
               "execution_mode": settings.ort_execution_mode, "graph_optimization": settings.ort_graph_optimization}
    variant = {"name": settings.onnx_variant, "file": path.name, "size_bytes": path.stat().st_size,
               "precision": PRECISION[settings.onnx_variant],
               "input": f"{classifier.input_name} {classifier.input_dtype} {classifier.input_shape}"}
    return _checked(Backend("onnx", classifier.infer, manifest, on_gpu, threads, details, warnings, variant, classifier,
                            model_version(path), classifier.input_dtype == np.uint8), settings, allow_gpu_only_on_cpu)

