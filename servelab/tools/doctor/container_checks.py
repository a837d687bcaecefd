"""Container checks: Docker and its NVIDIA runtime, the Triton container's /dev/shm, and the Triton image itself.
A missing piece fails on the node, where every stage runs in Docker; locally, where none does, it is a skip."""

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servelab.servers.triton.python_backend import instance_count
from servelab.tools.containers import images
from servelab.tools.doctor.gpu import Gpu, gpus, has_kernels
from servelab.tools.doctor.runner import Context, Output, Result

DOCKER_INFO = ("docker", "info", "--format", "{{json .}}")
TRITON_COMPOSE = Path("docker") / "docker-compose-triton.yaml"
DOCKER_DEFAULT_SHM = 64 * 1024**2
# Python backend: each model instance starts with a 1 MiB shared-memory region (Triton's
# shm-default-byte-size) that grows to hold the tensors it exchanges with the server.
SHM_REGION = 1024**2
PHOTO_BYTES = 1024**2  # an encoded photo (a TYPE_STRING element), generously
DTYPE_BYTES = {"TYPE_FP32": 4, "TYPE_FP16": 2, "TYPE_INT32": 4, "TYPE_INT64": 8, "TYPE_UINT8": 1, "TYPE_BOOL": 1}
# Run inside the Triton image: its Python-backend stub, run without arguments, only complains about them,
# which needs every library it links to load (as docker/Dockerfile.triton checks at build time); then
# what the image's torch sees.
STUB = "/opt/tritonserver/backends/python/triton_python_backend_stub"
CONTAINER_PROBE = f"""
import json, subprocess, torch
stub = subprocess.run([{STUB!r}], capture_output=True, text=True)
count = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(json.dumps({{"stub": (stub.stdout + stub.stderr)[-300:], "torch": torch.__version__,
                  "cuda": torch.cuda.is_available(), "arch_list": torch.cuda.get_arch_list(),
                  "capabilities": [list(torch.cuda.get_device_capability(i)) for i in range(count)]}}))
"""


def _needed(ctx: Context) -> str:
    return "fail" if ctx.node else "skip"


def docker_info(ctx: Context) -> dict[str, Any] | None:
    out = ctx.output(DOCKER_INFO)
    return json.loads(out.stdout) if out.ok else None


def docker(ctx: Context) -> Result:
    name, out = "docker", ctx.output(DOCKER_INFO)
    if out.missing:
        return Result(name, _needed(ctx), "Docker is not installed" + ("" if ctx.node else " (the local lab needs none)"),
                      "2_create_server_nvidia installs it; run its Docker step again" if ctx.node else "")
    if not out.ok:
        fix = ("add yourself to the docker group (sudo usermod -aG docker $USER) and open a new SSH session"
               if "permission denied" in out.stderr.lower() else "start it: sudo systemctl start docker")
        detail = f"the Docker daemon is not reachable: {out.why()}" + ("" if ctx.node else " (the local lab needs none)")
        return Result(name, _needed(ctx), detail, fix if ctx.node else "")
    return Result(name, "pass", f"Docker {json.loads(out.stdout).get('ServerVersion', '?')}, daemon reachable")


def nvidia_runtime(ctx: Context) -> Result:
    name, info = "nvidia-runtime", docker_info(ctx)
    if info is None:
        return Result(name, "skip", "no Docker daemon to ask (see the docker line)")
    runtimes = sorted(info.get("Runtimes") or {})
    if "nvidia" in runtimes:
        return Result(name, "pass", f"Docker runtimes: {', '.join(runtimes)} (default {info.get('DefaultRuntime', '?')})")
    return Result(name, "fail" if ctx.node else "warn" if gpus(ctx) else "skip",
                  f"Docker has no nvidia runtime (runtimes: {', '.join(runtimes) or 'none'}): containers cannot use the GPUs",
                  "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker "
                  "(the NVIDIA container toolkit step of 2_create_server_nvidia)")


def compose_bytes(text: str) -> int:
    """A Compose byte value: ``2gb``, ``512m``, ``1048576`` (units are powers of 1024)."""
    if (found := re.fullmatch(r"(\d+)\s*([kmg]?)b?", text.strip().strip("'\"").lower())) is None:
        raise ValueError(f"not a Compose size: {text!r}")
    return int(found[1]) * 1024 ** " kmg".index(found[2] or " ")


def item_bytes(tensors: Sequence[Mapping[str, Any]]) -> int:
    """Bytes one batch item takes in these config inputs or outputs."""
    return sum(PHOTO_BYTES if t["data_type"] == "TYPE_STRING"
               else math.prod(int(d) for d in t.get("dims", [])) * DTYPE_BYTES.get(t["data_type"], 8) for t in tensors)


def shm_needed(repository: Path) -> tuple[int, str, int]:
    """(bytes, stage, instances) for the stage whose Python-backend models may hold the most shared
    memory at once on the node: each instance its region plus one full batch of inputs and outputs."""
    from google.protobuf import json_format  # deferred: tritonclient's, an optional extra (bench)

    # Deferred, not a circle: importing it loads tritonclient (an optional extra) only when this runs.
    from servelab.servers.triton.configs import STAGES, effective_config

    most = (0, "", 0)
    for stage in STAGES.values():
        need = instances = 0
        for model in stage.triton.models:
            config = json_format.MessageToDict(
                effective_config(stage, model, kind="gpu", onnxruntime=True, repository=repository),
                preserving_proto_field_name=True)
            if config.get("backend") != "python":
                continue
            count = instance_count(config.get("instance_group", []))
            batch = max(1, int(config.get("max_batch_size", 1)))
            per_item = item_bytes(config.get("input", [])) + item_bytes(config.get("output", []))
            need += count * (SHM_REGION + batch * per_item)
            instances += count
        most = max(most, (need, stage.name, instances))
    return most


def mib(n: int) -> str:
    return f"{n / 1024**2:.0f} MiB"


def triton_shm(ctx: Context) -> Result:
    name, compose = "triton-shm", ctx.repo / TRITON_COMPOSE
    if not compose.is_file():
        return Result(name, "skip", f"no {TRITON_COMPOSE} here (servelab runs outside its checkout)")
    try:
        need, stage, instances = shm_needed(ctx.repo / "models_staging")
    except ImportError as exc:
        return Result(name, "skip", f"{exc.name} is not installed, so the stages cannot be read")
    found = re.search(r"^\s+shm_size:\s*(\S+)\s*$", compose.read_text(), re.MULTILINE)  # its only service with one
    size = compose_bytes(found[1]) if found else None
    have = f"shm_size {mib(size)}" if size else f"no shm_size (Docker's default {mib(DOCKER_DEFAULT_SHM)})"
    estimate = f"about {mib(need)} for stage {stage} ({instances} Python-backend instances, a full batch each)"
    if (size or DOCKER_DEFAULT_SHM) < need:
        return Result(name, "fail", f"Triton's /dev/shm: {have}, but the Python backend may need {estimate}",
                      f"set shm_size of triton_server in {TRITON_COMPOSE} to at least {mib(need)}")
    return Result(name, "pass", f"Triton's /dev/shm: {have}, enough for {estimate}")


def container_probe_command(image: str) -> tuple[str, ...]:
    # --pull never: a check never fetches an image (`servelab doctor --images` pulls the lab's).
    return ("docker", "run", "--rm", "--pull", "never", "--gpus", "all", "--entrypoint", "python", image,
            "-c", CONTAINER_PROBE)


def triton_container_result(out: Output, found: Sequence[Gpu]) -> Result:
    """The probe's answer (``CONTAINER_PROBE`` run in the Triton image) against the GPUs of the host."""
    name = "triton-container"
    if not out.ok:
        return Result(name, "fail", f"the Triton image did not run with the GPUs: {out.why()}",
                      "check the nvidia-runtime line; `docker run --rm --gpus all IMAGE nvidia-smi` shows the error")
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    if "arguments" not in seen["stub"]:
        return Result(name, "fail", f"the Python-backend stub does not start: {seen['stub'].strip()}",
                      "rebuild the image: docker compose -f docker/docker-compose-triton.yaml build triton_server")
    torch = f"torch {seen['torch']} in the container"
    if not seen["cuda"] or len(seen["capabilities"]) != len(found):
        return Result(name, "fail", f"{torch} sees {len(seen['capabilities'])} GPU(s), the host has {len(found)}",
                      "the container needs --gpus all (compose: deploy.resources.reservations.devices)")
    if missing := [c for c in seen["capabilities"] if not has_kernels(seen["arch_list"], (c[0], c[1]))]:
        return Result(name, "fail", f"{torch} has no kernels for compute capability {missing[0][0]}.{missing[0][1]} "
                      f"(it has {', '.join(seen['arch_list'])})", "pin TORCH_VERSION to a +cu126 build in docker/.env and rebuild")
    return Result(name, "pass", f"the Python-backend stub starts; {torch} sees {len(found)} GPU(s) and has kernels "
                                f"for them ({', '.join(seen['arch_list'])})")


def triton_container(ctx: Context) -> Result:
    name, compose = "triton-container", ctx.repo / TRITON_COMPOSE
    if not (found := gpus(ctx)):
        return Result(name, "skip", "no NVIDIA GPU here (see the gpus line)")
    if (info := docker_info(ctx)) is None or "nvidia" not in (info.get("Runtimes") or {}):
        return Result(name, "skip", "needs Docker with the NVIDIA runtime (see the docker and nvidia-runtime lines)")
    if not compose.is_file():
        return Result(name, "skip", f"no {TRITON_COMPOSE} here (servelab runs outside its checkout)")
    image = images.compose_ref("triton_server")
    if not ctx.output(("docker", "image", "inspect", "--format", "{{.Id}}", image)).ok:
        # bin/node-setup fetches every core-path image in 3_fastapi_setup, in the background: its log says how far.
        return Result(name, "skip", f"the Triton image {image} is not on this node yet: `bin/node-setup` fetches it "
                                    "(`tail ~/images.log`); run the doctor again once that log ends with `images: done`")
    return triton_container_result(ctx.output(container_probe_command(image), timeout_s=180), found)
