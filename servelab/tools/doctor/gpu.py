"""GPU checks: the GPUs and their driver, PyTorch kernels for them, ONNX Runtime's active providers, TensorRT.
Each hands what it read to a pure ``*_result`` function, so a P100 node's recorded outputs test the decisions."""

import re
from collections.abc import Mapping, Sequence

from servelab.core.hardware import NODE_TYPES, NVIDIA_SMI_QUERY, Capability, Gpu, cc, node_type_of, parse_gpus
from servelab.core.inference import onnx_session
from servelab.tools.docker_versions import read_env_file
from servelab.tools.doctor.runner import Context, Result

LAB_NODE_CAPABILITY = (6, 0)  # the lab node's Tesla P100s
# The oldest drivers documented for CUDA 12.6 containers on data-center GPUs (docker/VERSIONS.md).
MIN_DRIVER = (525, 85)
# Current TensorRT releases support Turing (7.5) and newer; Pascal is gone.
TENSORRT_MIN_CAPABILITY = (7, 5)
# Oldest compute capability in PyTorch's CUDA wheels (2.8 and later), by their local version tag.
TORCH_BUILD_MIN_CAPABILITY = {"cu126": (5, 0), "cu128": (7, 5), "cu129": (7, 5), "cu130": (7, 5)}
TENSORRT, CUDA, CPU = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"

def gpus(ctx: Context) -> list[Gpu]:
    """The NVIDIA GPUs here; none without a working driver."""
    out = ctx.output(NVIDIA_SMI_QUERY)
    return parse_gpus(out.stdout) if out.ok else []


def pins(ctx: Context) -> dict[str, str]:
    """docker/.env of the checkout; empty where servelab runs without one (inside an image)."""
    path = ctx.repo / "docker" / ".env"
    return read_env_file(path) if path.is_file() else {}


def _no_gpu(name: str) -> Result:
    return Result(name, "skip", "no NVIDIA GPU here (see the gpus line)")


def gpus_result(ctx: Context) -> Result:
    name, out = "gpus", ctx.output(NVIDIA_SMI_QUERY)
    if out.missing:
        if ctx.node:
            return Result(name, "fail", "nvidia-smi not found: this machine has no NVIDIA driver",
                          "create the server from the CC-Ubuntu24.04-CUDA image, as 2_create_server_nvidia does")
        return Result(name, "skip", "no NVIDIA GPU here (nvidia-smi not found): GPU checks are skipped; "
                                    "the local lab runs on the CPU")
    if not out.ok:
        return Result(name, "fail" if ctx.node else "warn", f"nvidia-smi failed: {out.why()}",
                      "the NVIDIA driver is not working; `nvidia-smi` alone says why (after a driver update, reboot)")
    try:
        found = parse_gpus(out.stdout)
    except ValueError as exc:
        return Result(name, "fail", f"could not read nvidia-smi's answer: {exc}",
                      "run `nvidia-smi` by hand: the driver answers in a form this check does not know")
    return gpu_list_result(found, node=ctx.node)


def gpu_list_result(found: Sequence[Gpu], *, node: bool) -> Result:
    name = "gpus"
    if not found:
        return Result(name, "fail" if node else "skip", "nvidia-smi lists no GPU")
    if old := [g for g in found if g.capability < LAB_NODE_CAPABILITY]:
        return Result(name, "fail", "; ".join(g.describe() for g in old) + ": older than compute capability "
                      f"{cc(LAB_NODE_CAPABILITY)}, the oldest the pinned CUDA 12.6 builds run on",
                      "use a node with newer GPUs (gpu_p100 or later)")
    drivers = sorted({g.driver for g in found})
    detail = f"{len(found)} GPU(s), driver {', '.join(drivers)}: " + "; ".join(g.describe() for g in found)
    if old_driver := [d for d in drivers if tuple(int(x) for x in d.split(".")[:2]) < MIN_DRIVER]:
        return Result(name, "warn", detail + f"; driver {old_driver[0]} is older than {MIN_DRIVER[0]}.{MIN_DRIVER[1]}, "
                      "the oldest documented for CUDA 12.6 containers", "use a newer node image (CC-Ubuntu24.04-CUDA)")
    if node:
        kind = node_type_of(g.name for g in found)
        if kind and kind.gpus is not None and len(found) != kind.gpus:  # a lost GPU: the lab's placements differ
            return Result(name, "fail", detail + f"; a {kind.name} node has {kind.gpus}",
                          "a bad node: ask your instructor for another (docs/class.md, When something fails)")
        detail += (f"; a {kind.name} node ({kind.site})" if kind else
                   f"; not one of the GPU node types the lab knows ({', '.join(NODE_TYPES)}): the same images run "
                   "from compute capability 6.0 on")
    return Result(name, "pass", detail)


def has_kernels(arch_list: Sequence[str], capability: Capability) -> bool:
    """Whether a build with these ``torch.cuda.get_arch_list()`` entries runs on that GPU: a cubin of the
    same major version and an equal or lower minor, or PTX of an equal or lower version (JIT-compiled)."""
    for arch in arch_list:
        if (found := re.fullmatch(r"(sm|compute)_(\d+)(\d)[a-z]?", arch)) is None:
            continue
        built = (int(found[2]), int(found[3]))
        if found[1] == "sm" and built[0] == capability[0] and built[1] <= capability[1]:
            return True
        if found[1] == "compute" and built <= capability:
            return True
    return False


def torch_kernels_result(found: Sequence[Gpu], arch_list: Sequence[str], version: str,
                         versions: Mapping[str, str]) -> Result:
    name = "torch-kernels"
    if missing := [g for g in found if not has_kernels(arch_list, g.capability)]:
        sms = sorted({f"sm_{g.capability[0]}{g.capability[1]}" for g in missing})
        pinned = versions.get("TORCH_VERSION", "2.13.0+cu126")
        return Result(name, "fail", f"PyTorch {version} has no kernels for {', '.join(sms)} "
                      f"({missing[0].name}); it has: {', '.join(arch_list) or 'none'}",
                      f"install PyTorch's CUDA 12.6 build (cu126), which has sm_60: pip install 'torch=={pinned}' "
                      f"--index-url {versions.get('TORCH_INDEX_URL', 'https://download.pytorch.org/whl/cu126')}")
    return Result(name, "pass", f"PyTorch {version} has kernels for every GPU here ({', '.join(arch_list)})")


def torch_kernels(ctx: Context) -> Result:
    name, found = "torch-kernels", gpus(ctx)
    if not found:
        return _no_gpu(name)
    try:
        import torch  # deferred: an optional extra (torch), loaded only when this runs
    except ImportError:
        return Result(name, "skip", "PyTorch is not installed in this environment")
    if torch.version.cuda is None:
        return Result(name, "skip", f"PyTorch {torch.__version__} here is a CPU build: on the node it only "
                                    "exports the model; the containers bring the CUDA build (see pinned-torch)")
    return torch_kernels_result(found, torch.cuda.get_arch_list(), torch.__version__, pins(ctx))


def pinned_torch_result(pinned: str, found: Sequence[Gpu]) -> Result:
    """Whether the containers' pinned PyTorch build has kernels for the lab node's P100s and the GPUs here."""
    name, tag = "pinned-torch", pinned.partition("+")[2]
    if (floor := TORCH_BUILD_MIN_CAPABILITY.get(tag)) is None:
        return Result(name, "warn", f"docker/.env pins torch {pinned}, a build whose GPU range this check "
                      "does not know", "pin a +cu126 build: PyTorch's CUDA 12.6 wheels keep sm_60")
    targets = {LAB_NODE_CAPABILITY: "the lab node's P100s", **{g.capability: g.name for g in found}}
    if too_old := [f"{what} ({cc(capability)})" for capability, what in targets.items() if capability < floor]:
        return Result(name, "fail", f"docker/.env pins torch {pinned}, whose kernels start at compute capability "
                      f"{cc(floor)}: nothing for {', '.join(too_old)}",
                      "pin TORCH_VERSION to a +cu126 build (and TORCH_INDEX_URL to .../whl/cu126) in docker/.env")
    return Result(name, "pass", f"the containers' torch {pinned} has kernels from compute capability {cc(floor)} "
                                f"on, so for {', '.join(f'{w} ({cc(c)})' for c, w in targets.items())}")


def pinned_torch(ctx: Context) -> Result:
    if (pinned := pins(ctx).get("TORCH_VERSION")) is None:
        return Result("pinned-torch", "skip", "no docker/.env here (servelab runs outside its checkout)")
    return pinned_torch_result(pinned, gpus(ctx))


def tiny_model() -> bytes:
    """A one-node ONNX graph (y = relu(x)), built in memory: enough for a session to pick its providers."""
    from onnx import TensorProto, helper  # deferred: an optional extra (torch), loaded only when this runs

    x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT, [1]) for name in ("x", "y"))
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "doctor", [x], [y])
    # IR 8 / opset 17: old enough for every onnxruntime the lab uses (Triton 24.10 has 1.19).
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def active_providers(model: bytes, provider: str, device_id: int | None = None) -> list[str] | str:
    """The providers a session asked for ``provider`` (on GPU ``device_id``) really runs with, or the error: a GPU
    provider whose libraries do not load is silently dropped, though ``get_available_providers()`` lists it."""
    providers = [provider] if device_id is None else [(provider, {"device_id": device_id}), CPU]
    try:
        return onnx_session(model, providers).get_providers()
    except Exception as exc:  # noqa: BLE001 - any failure to start is the answer we report
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def onnxruntime_result(version: str, found: Sequence[Gpu], available: Sequence[str], on_cpu: list[str] | str,
                       on_gpu: Mapping[tuple[str, int], list[str] | str]) -> Result:
    """``on_gpu``: what each (GPU provider, GPU index) session really ran with, from ``active_providers``."""
    name = "onnxruntime"
    if isinstance(on_cpu, str) or CPU not in on_cpu:
        return Result(name, "fail", f"onnxruntime {version} could not run a one-node model on the CPU: {on_cpu}",
                      "reinstall onnxruntime (pip install -c constraints.txt onnxruntime)")
    if not found:
        return Result(name, "pass", f"onnxruntime {version}: {CPU} active (no GPU here)")
    if not on_gpu:
        return Result(name, "skip", f"onnxruntime {version} here has no GPU provider (it has: {', '.join(available)}); "
                      "the fastapi_onnx container brings onnxruntime-gpu (ONNXRUNTIME_GPU_VERSION in docker/.env)")
    if fell_back := {key: got for key, got in on_gpu.items() if isinstance(got, str) or key[0] not in got}:
        (provider, index), got = next(iter(fell_back.items()))
        said = got if isinstance(got, str) else f"it ran on {', '.join(got)}"
        return Result(name, "fail", f"{provider} is in onnxruntime {version} but did not start on GPU {index}: {said}",
                      "onnxruntime-gpu needs the CUDA 12 and cuDNN 9 libraries it was built for; ONNX Runtime's "
                      "own warning above names the library it could not load")
    per_gpu = "; ".join(f"GPU {index} {provider}: {', '.join(got)}" for (provider, index), got in on_gpu.items())
    return Result(name, "pass", f"onnxruntime {version}, active: {per_gpu}")


def onnxruntime(ctx: Context) -> Result:
    try:
        import onnxruntime as ort  # deferred: an optional extra (onnx), loaded only when this runs

        model = tiny_model()
    except ImportError as exc:
        return Result("onnxruntime", "skip", f"{exc.name} is not installed in this environment")
    found, available = gpus(ctx), ort.get_available_providers()
    on_gpu = {(provider, g.index): active_providers(model, provider, g.index)
              for g in found for provider in (TENSORRT, CUDA)
              if provider in available and (provider != TENSORRT or g.capability >= TENSORRT_MIN_CAPABILITY)}
    return onnxruntime_result(ort.__version__, found, available, active_providers(model, CPU), on_gpu)


def tensorrt_result(found: Sequence[Gpu], available: Sequence[str]) -> Result:
    name = "tensorrt"
    if not found:
        return _no_gpu(name)
    if old := [g for g in found if g.capability < TENSORRT_MIN_CAPABILITY]:
        return Result(name, "skip", f"not applicable: current TensorRT releases need compute capability "
                      f"{cc(TENSORRT_MIN_CAPABILITY)} or newer and the {old[0].name} is {cc(old[0].capability)}; "
                      "the ONNX stages use the CUDA execution provider here (ORT_PROVIDERS=cuda,cpu), as expected")
    if TENSORRT in available:
        return Result(name, "pass", "TensorRT applies to these GPUs and this onnxruntime has its provider "
                                    "(the onnxruntime line says whether it started)")
    return Result(name, "skip", "this onnxruntime has no TensorRT provider; the CUDA provider is used")


def tensorrt(ctx: Context) -> Result:
    try:
        # Deferred: an optional extra (onnx), loaded only when this runs.
        from onnxruntime import get_available_providers
    except ImportError:
        return tensorrt_result(gpus(ctx), [])
    return tensorrt_result(gpus(ctx), get_available_providers())
