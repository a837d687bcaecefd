"""Stand-ins for the images no registry can give us here, and the build arguments that pick them.

The lab's Dockerfiles keep their real ``FROM`` lines; the compose files pass every docker/.env
version as a build argument, so exporting other values for ``UBUNTU_IMAGE``, ``CUDA_BASE_IMAGE``,
``TRITON_IMAGE`` and ``TORCH_VERSION`` makes the same Dockerfiles build on local images:

* ``servelab-standin/debian12-py311`` for ubuntu:22.04 and the CUDA runtime image: the debootstrap
  base plus the wheelhouse (docker/standin/Dockerfile.base);
* ``servelab-standin/tritonserver:<release>-py3``: the tritonserver bundled in the pinned
  nvidia-pytriton wheel, Python backend only (docker/standin/Dockerfile.tritonserver);
* ``servelab-standin/tritonserver:<release>-py3-sdk``: perf_analyzer from the tritonclient 2.50.0
  wheel (docker/standin/Dockerfile.sdk);
* torch: the CPU build of the pinned release instead of its CUDA 12.6 build.

Every stand-in carries a ``servelab.standin`` label with its content key; an image whose key matches
is not rebuilt.
"""

import shutil
import stat
import tempfile
import zipfile
from pathlib import Path

from servelab.core.installers.perf_analyzer_install import extract_pinned
from servelab.core.paths import REPO_ROOT
from servelab.tools.containers import base_image, wheelhouse
from servelab.tools.containers.docker import Docker

STANDIN_DIR = REPO_ROOT / "docker" / "standin"
PYTHON_BASE = "servelab-standin/debian12-py311"
TRITON = "servelab-standin/tritonserver"
LABEL = "servelab.standin"


def _build(docker: Docker, dockerfile: str, context: Path, tag: str, key: str, args: dict[str, str], log) -> str:
    if docker.image_label(tag, LABEL) == key:
        return tag
    log(f"stand-in: building {tag} ({dockerfile})")
    build_args = [a for name, value in args.items() for a in ("--build-arg", f"{name}={value}")]
    docker.run("build", "--quiet", "-f", str(STANDIN_DIR / dockerfile), *build_args,
               "--label", f"{LABEL}={key}", "-t", tag, str(context),
               extra_env={"DOCKER_BUILDKIT": "0"}, timeout=1800)
    return tag


def _unzip(wheel: Path, prefix: str, dest: Path) -> None:
    """The members under ``prefix`` of a wheel, with their executable bits (zipfile drops them)."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if not info.filename.startswith(prefix) or info.is_dir():
                continue
            target = dest / info.filename[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, target.open("wb") as out:
                shutil.copyfileobj(src, out)
            mode = info.external_attr >> 16
            target.chmod(0o755 if mode & stat.S_IXUSR else 0o644)


def _triton_context(wheels: Path, into: Path) -> None:
    [wheel] = wheels.glob("nvidia_pytriton-*.whl")
    server = into / "tritonserver"
    _unzip(wheel, "pytriton/tritonserver/", server)
    _unzip(wheel, "nvidia_pytriton.libs/", server / "lib")
    # The image's Dockerfile links the stub for its own Python from the pytriton it installs.
    shutil.rmtree(server / "python_backend_stubs", ignore_errors=True)


def build_args(docker: Docker, cache: Path, versions: dict[str, str], log=print) -> dict[str, str]:
    """Build the stand-ins (once) and return the build arguments that select them."""
    wheels = wheelhouse.ensure(cache, versions, log)
    debian = base_image.ensure(docker, cache, log)
    key = f"{base_image.key()}-{wheels.name}"
    python_base = _build(docker, "Dockerfile.base", wheels, f"{PYTHON_BASE}:{key}", key,
                         {"DEBIAN_IMAGE": debian}, log)
    release = versions["TRITON_RELEASE"]
    with tempfile.TemporaryDirectory(prefix="servelab-standin-") as tmp:
        work = Path(tmp)
        server_tag = f"{TRITON}:{release}-py3"
        if docker.image_label(server_tag, LABEL) != key:
            _triton_context(wheels, work / "triton")
        _build(docker, "Dockerfile.tritonserver", work / "triton", server_tag, key, {"BASE_IMAGE": python_base}, log)
        sdk_tag = f"{TRITON}:{release}-py3-sdk"
        if docker.image_label(sdk_tag, LABEL) != key:
            (work / "sdk").mkdir()
            extract_pinned(work / "sdk", work, log)
        _build(docker, "Dockerfile.sdk", work / "sdk", sdk_tag, key, {"BASE_IMAGE": python_base}, log)
    return {"UBUNTU_IMAGE": python_base, "CUDA_BASE_IMAGE": python_base, "TRITON_IMAGE": TRITON,
            "TORCH_VERSION": wheelhouse.cpu_torch()}
