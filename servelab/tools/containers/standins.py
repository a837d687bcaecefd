"""Stand-ins for the images no registry can give us here, and the build arguments that pick them.

The Dockerfiles keep their real ``FROM`` lines; other values for bake's ``UBUNTU_IMAGE``, ``TRITON_IMAGE`` and
``TORCH_VERSION`` build the same images on local bases (bake's ``standins`` group, docker/standin/): Debian with
the wheelhouse, the tritonserver of the pinned nvidia-pytriton wheel with perf_analyzer, torch's CPU build.
"""

import shutil
import stat
import tempfile
import zipfile
from pathlib import Path

from servelab.core.installers.perf_analyzer_install import extract_pinned
from servelab.core.paths import REPO_ROOT
from servelab.tools.containers import base_image, images, wheelhouse
from servelab.tools.containers.docker import Docker

STANDIN_DIR = REPO_ROOT / "docker" / "standin"
PYTHON_BASE = "servelab-standin/debian12-py311"
TRITON = "servelab-standin/tritonserver"


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
            target.chmod(0o755 if (info.external_attr >> 16) & stat.S_IXUSR else 0o644)  # its Unix mode: the high bits


def build_args(docker: Docker, cache: Path, versions: dict[str, str], log=print) -> dict[str, str]:
    """Build the stand-ins (once) and return the bake variables that select them, and TRITON_ONNXRUNTIME=false:
    the stand-in Triton has no onnxruntime backend (`servelab triton stage`, in the shell and in Jupyter, renders
    the ONNX stages as the LOCAL STAND-IN)."""
    wheels = wheelhouse.ensure(cache, versions, log)
    key = f"{base_image.key()}-{wheels.name}"
    args = {"UBUNTU_IMAGE": f"{PYTHON_BASE}:{key}", "TRITON_IMAGE": TRITON, "TORCH_VERSION": wheelhouse.cpu_torch()}
    with tempfile.TemporaryDirectory(prefix="servelab-standin-") as tmp:
        work = Path(tmp)
        (work / "triton").mkdir()
        (work / "sdk").mkdir()
        env = images.variables({**versions, **args, "STANDIN_DIR": str(STANDIN_DIR), "STANDIN_KEY": key,
                                "STANDIN_DEBIAN_IMAGE": base_image.ensure(docker, cache, log),
                                "STANDIN_WHEELHOUSE": str(wheels), "STANDIN_WORK": str(work)})
        targets = images.plan(docker, ("standins",), env)
        release = versions["TRITON_RELEASE"]
        if docker.image_label(f"{TRITON}:{release}-py3", images.LABEL) != key:
            [wheel], server = wheels.glob("nvidia_pytriton-*.whl"), work / "triton" / "tritonserver"
            _unzip(wheel, "pytriton/tritonserver/", server)
            _unzip(wheel, "nvidia_pytriton.libs/", server / "lib")
            # The image's Dockerfile links the stub for its own Python from the pytriton it installs.
            shutil.rmtree(server / "python_backend_stubs", ignore_errors=True)
        if docker.image_label(f"{TRITON}:{release}-py3-sdk", images.LABEL) != key:
            extract_pinned(work / "sdk", work, log)
        images.build(docker, targets, log=log)
    return {**args, "TRITON_ONNXRUNTIME": "false"}
