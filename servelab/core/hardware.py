"""The hardware facts: the GPUs here, and where the lab runs: ``--device cpu|gpu|auto`` (``LAB_DEVICE``), the
one switch for every stage, which decides each server's settings (``stage_env``) and the Triton instance kind.

Nothing here assumes a GPU works: every probe of ``stack()`` (the header of every record and report) is bounded
and optional, a missing part named as missing. INT8 pays on a CPU only with fast 8-bit instructions
(``cpu_int8``): every record keeps its CPU's flags (``CPU_FLAGS``), so a report says it of the machine that ran.
``NODE_TYPES`` needs the standard library only, as Chameleon Jupyter has it; only ``gpu_p100`` is the original
lab's node, and no run on the others is recorded here, so what is said of them is a prediction.
"""

import json
import os
import re
import shutil
import subprocess
import urllib.request
from collections import Counter
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

Device = Literal["cpu", "gpu"]
NVIDIA_SMI_QUERY = (
    "nvidia-smi", "--query-gpu=index,name,driver_version,compute_cap,memory.total", "--format=csv,noheader",
)
Capability = tuple[int, int]  # CUDA compute capability (major, minor)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    driver: str
    capability: Capability
    memory: str

    def describe(self) -> str:
        return f"GPU {self.index} {self.name} (compute capability {cc(self.capability)}, {self.memory})"


@dataclass(frozen=True)
class NodeType:
    name: str
    site: str
    gpu: str  # what nvidia-smi's name of its GPUs holds
    capability: Capability
    gpus: int | None = None  # GPUs a node of the type has (None: not recorded here, so not checked)
    # Logical CPUs a node shows at least: two server sockets of 12 or more cores, even with hyper-threading off.
    # A laptop or a small VM shows fewer (the grader's check, servelab.report.check).
    cpus: int = 24


NODE_TYPES = {t.name: t for t in (
    # Pascal: the original lab's node, 2x Tesla P100-PCIE-16GB and 2x 12-core Xeon E5-2670 v3 (48 threads).
    NodeType("gpu_p100", "CHI@TACC", "P100", (6, 0), gpus=2),
    NodeType("gpu_v100", "CHI@UC", "V100", (7, 0)),  # Volta: tensor cores for fp16
    NodeType("gpu_rtx_6000", "CHI@UC", "RTX 6000", (7, 5)),  # Turing: TensorRT's oldest, int8 tensor cores
    NodeType("gpu_a100_pcie", "CHI@UC", "A100", (8, 0)),  # Ampere
)}


def node_type(name: str) -> NodeType:
    """The node type of that name; an unknown one is an error that lists the known ones."""
    try:
        return NODE_TYPES[name]
    except KeyError:
        raise ValueError(f"NODE_TYPE {name!r} is not one the lab knows: {', '.join(NODE_TYPES)}") from None


def node_type_of(gpu_names: Iterable[str]) -> NodeType | None:
    """The node type whose GPU every one of these GPU names is (None: none, or a mix)."""
    names = list(gpu_names)
    found = [t for t in NODE_TYPES.values() if names and all(t.gpu in n for n in names)]
    return found[0] if len(found) == 1 else None


CLOUD_INIT_ID = Path("/var/lib/cloud/data/instance-id")
METADATA_URL = "http://169.254.169.254/openstack/latest/meta_data.json"
METADATA_TIMEOUT_S = 0.5  # off a cloud nothing answers there: a run waits this long once per process
UNKNOWN_INSTANCE = "unknown"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@cache
def instance_id(cloud_init: Path = CLOUD_INIT_ID, url: str = METADATA_URL) -> str:
    """The node's own instance UUID (Nova's server id): cloud-init's copy, else OpenStack's metadata service; so a
    record says which server ran it (``servelab class`` reads the student's from Chameleon). Off a cloud: unknown."""
    found = ""
    with suppress(OSError, UnicodeDecodeError):
        found = cloud_init.read_text(encoding="utf-8").strip()  # "iid-datasource-none" where no cloud is
    if not UUID.fullmatch(found):
        with suppress(OSError, ValueError, AttributeError):  # no service, a slow one, or not OpenStack's JSON
            with urllib.request.urlopen(url, timeout=METADATA_TIMEOUT_S) as answer:
                found = str(json.load(answer).get("uuid") or "")
    return found if UUID.fullmatch(found) else UNKNOWN_INSTANCE


def cc(capability: Capability) -> str:
    return f"{capability[0]}.{capability[1]}"


def parse_gpus(stdout: str) -> list[Gpu]:
    """``nvidia-smi --query-gpu=index,name,driver_version,compute_cap,memory.total --format=csv,noheader``."""
    found = []
    for line in filter(str.strip, stdout.splitlines()):
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 5 or not re.fullmatch(r"\d+\.\d+", parts[-2]):
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        major, minor = parts[-2].split(".")
        # A GPU's name may itself hold a comma: it is everything between the index and the driver.
        found.append(Gpu(int(parts[0]), ", ".join(parts[1:-3]), parts[-3], (int(major), int(minor)), parts[-1]))
    return found


# The one wording of "there is no GPU here", shared by the lab, gpu-check and the gpu test marker.
NO_GPU = "no NVIDIA GPU (nvidia-smi lists none)"
NVIDIA_SMI_TIMEOUT_S = 20


class NoGpu(RuntimeError):
    """``--device gpu`` on a machine where ``nvidia-smi`` lists no GPU."""


def gpu_count() -> int:
    """NVIDIA GPUs visible here (0 without a driver)."""
    with suppress(OSError, subprocess.TimeoutExpired):  # OSError: no nvidia-smi here
        result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
        return sum(line.startswith("GPU ") for line in result.stdout.splitlines()) if result.returncode == 0 else 0
    return 0


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (where it is unset, nvidia-smi's)."""
    if (visible := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        return [d.strip() for d in visible.split(",") if d.strip() not in ("", "-1")]
    return [str(i) for i in range(gpu_count())]


def environment_gaps() -> list[str]:
    """What this Python environment lacks to run the lab on a GPU that is there (empty: nothing)."""
    gaps = []
    try:
        import torch  # deferred: an optional extra (torch), loaded only when this runs
    except ImportError:
        gaps.append("PyTorch is not installed")
    else:
        if not torch.version.cuda:
            gaps.append(f"PyTorch {torch.__version__} is a CPU build")
        elif not torch.cuda.is_available():
            gaps.append(f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU")
    try:
        import onnxruntime as ort  # deferred: an optional extra (onnx), loaded only when this runs
    except ImportError:
        gaps.append("ONNX Runtime is not installed")
    else:
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            gaps.append(f"onnxruntime {ort.__version__} has no CUDA execution provider (onnxruntime-gpu has)")
    return gaps


def resolve(requested: str, gpus: int, gaps: list[str] | None = None, log=print) -> Device:
    """``auto`` -> ``gpu`` where there is one and this environment can use it (``gaps``: what it
    lacks), else ``cpu``, saying why; ``gpu`` without a GPU, or with gaps, is an error."""
    if requested not in ("auto", "cpu", "gpu"):
        raise ValueError(f"device must be auto, cpu or gpu, not {requested!r}")
    if requested == "cpu":
        return "cpu"
    if gpus == 0:
        if requested == "gpu":
            raise NoGpu(f"--device gpu (LAB_DEVICE=gpu), but this machine has {NO_GPU}; "
                        "use --device cpu or auto, or run on a machine with an NVIDIA GPU and driver")
        return "cpu"
    if gaps:
        why = "; ".join(gaps)
        if requested == "gpu":
            raise NoGpu(f"--device gpu, but this environment cannot use the GPU: {why}. "
                        "`make gpu-check` builds one that can (docs/gpu/README.md)")
        log(f"device: the GPU is not used: {why} (`make lab` and `make gpu-check` use .venv-gpu, which can)")
        return "cpu"
    return "gpu"


CPUINFO = Path("/proc/cpuinfo")
# The instructions that make INT8 fast, as /proc/cpuinfo names them -> as people do: x86's u8 x s8 dot products (VNNI)
# and tile multiplies (AMX), ARM's 8-bit dot products (asimddp, "dotprod") and matrix multiply (i8mm).
INT8_INSTRUCTIONS = {"amx_int8": "AMX-INT8", "avx512_vnni": "AVX512-VNNI", "avx_vnni": "AVX-VNNI",
                     "i8mm": "ARM I8MM", "asimddp": "ARM dot product"}
# What a record keeps of its CPU's flags: the architecture's base (x86-64 always has sse2, ARM64 asimd), the
# vector widths, and the 8-bit instructions.
CPU_FLAGS = ("sse2", "avx2", "avx512f", "f16c", "asimd", *INT8_INSTRUCTIONS)
_ARM = ("asimd", "asimddp", "i8mm")


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str] | None:
    """Every flag of this machine's CPUs (x86's ``flags``, ARM's ``Features`` lines); None where the file
    cannot be read or names none (not Linux, say)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    flags = {flag for line in text.splitlines() for key, _, value in [line.partition(":")]
             if key.strip() in ("flags", "Features") for flag in value.split()}
    return frozenset(flags) or None


@dataclass(frozen=True)
class Int8Compute:
    """What 8-bit compute a CPU has, from its flags (``cpu_int8``, ``int8_compute``)."""

    known: bool  # its flags were read
    fast_int8: bool  # it has instructions that make INT8 fast
    instructions: tuple[str, ...]  # those instructions, as cpuinfo names them (INT8_INSTRUCTIONS' order)
    arch: Literal["x86", "arm", ""]  # "": not known
    avx2: bool = False

    @property
    def expect(self) -> Literal["faster", "slower", ""]:
        """INT8 against fp32 where the lab has measured it (ONNX Runtime, x86): faster with VNNI, slower with
        AVX2 alone; elsewhere nothing is promised."""
        if self.arch != "x86":
            return ""
        return "faster" if self.fast_int8 else "slower" if self.avx2 else ""

    def sentence(self, subject: str = "this CPU", where: str = "here") -> str:
        """One line for a report: "this CPU has fast 8-bit instructions (AVX512-VNNI): INT8 is expected faster
        than fp32 here"; ``subject`` and ``where`` say which CPU ("the CPU that ran it", "there")."""
        if not self.known:
            return f"whether {subject} has fast 8-bit instructions is not known (its flags were not read)"
        if self.fast_int8:
            said = f"{subject} has fast 8-bit instructions ({', '.join(INT8_INSTRUCTIONS[f] for f in self.instructions)})"
        else:
            base = {"x86": "AVX2 without VNNI" if self.avx2 else "x86 without VNNI",
                    "arm": "ARM without the 8-bit dot products"}.get(self.arch, "no VNNI, AMX-INT8 or ARM dot product")
            said = f"{subject} has no fast 8-bit instructions ({base})"
        return f"{said}: INT8 is expected {self.expect} than fp32 {where}" if self.expect else said


def int8_compute(flags: Iterable[str] | None) -> Int8Compute:
    """What 8-bit compute a CPU with these flags has (None: its flags are not known), e.g. a record's."""
    if flags is None:
        return Int8Compute(known=False, fast_int8=False, instructions=(), arch="")
    flags = set(flags)
    found = tuple(f for f in INT8_INSTRUCTIONS if f in flags)
    arch = "arm" if flags & set(_ARM) else "x86" if flags & (set(CPU_FLAGS) - set(_ARM)) else ""
    return Int8Compute(known=True, fast_int8=bool(found), instructions=found, arch=arch, avx2="avx2" in flags)


def cpu_int8(cpuinfo: Path = CPUINFO) -> Int8Compute:
    """What 8-bit compute this machine's CPU has, from its own flags (``/proc/cpuinfo``)."""
    return int8_compute(cpu_flags(cpuinfo))


def recorded_flags(cpuinfo: Path = CPUINFO) -> list[str] | None:
    """The flags a record keeps of this machine's CPU (``CPU_FLAGS`` it has); None where they cannot be read."""
    return None if (flags := cpu_flags(cpuinfo)) is None else [f for f in CPU_FLAGS if f in flags]


def stage_env(device: Device) -> dict[str, str]:
    """Settings for every server of a lab on ``device`` (a stage's own come on top). On the GPU each server must
    really use it (``REQUIRE_GPU=1``), or ONNX Runtime would fall back to the CPU under a GPU label; a FastAPI
    service there is one server process, the design that has run on a GPU (an H200; ``make gpu-check``)."""
    if device == "gpu":
        return {"TORCH_DEVICE": "cuda", "ORT_PROVIDERS": "auto", "REQUIRE_GPU": "1", "WORKERS": "1"}
    return {"TORCH_DEVICE": "cpu", "ORT_PROVIDERS": "cpu", "REQUIRE_GPU": "0"}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _nvidia_smi() -> dict[str, Any]:
    if shutil.which("nvidia-smi") is None:
        return {"gpus": [], "gpu_note": NO_GPU}
    try:
        out = subprocess.run(NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
        found = parse_gpus(out.stdout) if out.returncode == 0 else []
    except (subprocess.TimeoutExpired, ValueError) as exc:
        return {"gpus": [], "gpu_note": f"nvidia-smi: {exc}"}
    return {"gpus": [f"{g.index}: {g.name}, compute capability {cc(g.capability)}, {g.memory}" for g in found],
            "driver": ", ".join(sorted({g.driver for g in found})) or None, **({} if found else {"gpu_note": NO_GPU})}


def _torch() -> dict[str, Any]:
    try:
        import torch  # deferred: an optional extra (torch), loaded only when this runs
    except ImportError:
        return {}
    cudnn = torch.backends.cudnn.version() if torch.version.cuda else None
    return {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "cudnn": cudnn, "torch_sees_gpus": torch.cuda.device_count() if torch.version.cuda else 0}


def _onnxruntime() -> dict[str, Any]:
    if (package := next((p for p in ("onnxruntime-gpu", "onnxruntime") if _version(p)), None)) is None:
        return {}
    import onnxruntime as ort  # deferred: an optional extra (onnx), loaded only when this runs

    cuda = None
    with suppress(ImportError):  # deferred as onnxruntime is; a build may lack its build info
        from onnxruntime.capi import build_and_package_info as build
        cuda = getattr(build, "cuda_version", None) or None
    return {"onnxruntime": f"{package} {ort.__version__}", "onnxruntime_cuda": cuda,
            "onnxruntime_providers": ort.get_available_providers()}


@cache
def stack() -> dict[str, Any]:
    """GPUs, driver, CUDA, cuDNN and library versions of this machine (once per process)."""
    return {**_nvidia_smi(), **_torch(), **_onnxruntime(), "tensorrt": _version("tensorrt")}


def describe(found: dict[str, Any]) -> list[str]:
    """A ``stack()`` as lines for a report: GPUs, driver and CUDA first."""
    gpus = "; ".join(found.get("gpus") or []) or found.get("gpu_note") or NO_GPU
    lines = [f"GPUs: {gpus}"]
    if found.get("driver"):
        lines.append(f"NVIDIA driver {found['driver']}")
    if found.get("torch"):
        cuda = (f"CUDA {found['torch_cuda']}, cuDNN {found.get('cudnn')}, sees {found.get('torch_sees_gpus')} GPU(s)"
                if found.get("torch_cuda") else "CPU build")
        lines.append(f"PyTorch {found['torch']} ({cuda})")
    if found.get("onnxruntime"):
        built = f"built for CUDA {found['onnxruntime_cuda']}, " if found.get("onnxruntime_cuda") else ""
        lines.append(f"{found['onnxruntime']} ({built}providers: {', '.join(found.get('onnxruntime_providers', []))})")
    lines.append(f"TensorRT {found['tensorrt']}" if found.get("tensorrt") else "TensorRT: not installed")
    return lines


def runs_on_fastapi(runtime: dict[str, Any]) -> str:
    """Where a FastAPI service's model really runs, from its ``/ready`` ``runtime``: the execution
    providers ONNX Runtime made active (read back from the session), or PyTorch's device."""
    if "providers" in runtime:
        return "onnxruntime " + ", ".join(runtime["providers"])
    gpu = f" ({runtime['gpu']})" if runtime.get("gpu") else ""
    return f"torch {runtime.get('device', '?')}{gpu} {runtime.get('dtype', '')}".rstrip()


def options_in_force(runtime: dict[str, Any]) -> dict[str, Any]:
    """For a record's config: the options each active ONNX Runtime provider of a FastAPI service really ran
    with (read back from its session), from its ``/ready`` ``runtime``; nothing for PyTorch."""
    return {"provider_options": runtime["provider_options"]} if "provider_options" in runtime else {}


GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")  # servelab.servers.fastapi.runtimes unpacks them


def runs_on_cpu(runs_on: str) -> bool:
    """Whether a record's ``runs_on`` (as ``runs_on_fastapi`` and ``runs_on_triton`` write it) says the model ran
    on the CPU: ONNX Runtime with no GPU provider active, PyTorch on cpu, or Triton instances of KIND_CPU or that
    say they run on cpu. An ensemble's (no instance group of its own) says nothing: False."""
    kind, _, rest = runs_on.partition(" ")
    if kind == "onnxruntime":
        return not any(provider in rest for provider in GPU_PROVIDERS)
    if kind == "torch":
        return rest.split(" ", 1)[0] == "cpu"
    return kind == "triton" and ("KIND_CPU" in rest or bool(re.search(r" on cpu\b", rest)))


def runs_on_triton(config: dict[str, Any], instances: str = "") -> str:
    """The instance groups of a model as the server reports them (``GET /v2/models/<m>/config``):
    kind and GPU ids, any note on moved instances, and what the instances say (``instances_say``)."""
    groups = []
    for g in config.get("instance_group", []):
        where = f" on GPU {','.join(map(str, g['gpus']))}" if g.get("gpus") else ""
        groups.append(f"{g.get('count', 1)}x {g.get('kind', '?')}{where}")
    placement = config.get("parameters", {}).get("servelab_gpu_placement", {}).get("string_value")
    backend = config.get("backend") or config.get("platform") or "?"
    return (f"triton {backend}: {' + '.join(groups) or 'no instance group'}" + (f" ({placement})" if placement else "")
            + (f"; instances say: {instances}" if instances else ""))


def instances_say(log_text: str, model: str, instances: int) -> str:
    """Where the ``instances`` latest instances of ``model`` say they run, from Triton's log: each
    Python-backend model logs, once loaded, its device and (ONNX Runtime) the providers it made active."""
    pattern = re.compile(rf"{re.escape(model)}_\d+(?:_\d+)?: (.*)")
    lines = [m[1] for m in map(pattern.search, log_text.splitlines()) if m][-instances:] if instances else []
    where = Counter()
    for line in lines:
        device = re.search(r" on (cuda:\d+|cpu)\b", line)
        provider = re.search(r"\['(\w+ExecutionProvider)'", line)
        runtime = provider[1] if provider else "PyTorch" if "PyTorch" in line else "?"
        where[f"{runtime} on {device[1]}" if device else runtime] += 1
    return ", ".join(f"{n}x {what}" for what, n in where.items())
