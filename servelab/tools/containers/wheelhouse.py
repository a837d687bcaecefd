"""The wheelhouse the local images install from: HTTPS from inside containers does not verify here.

The host downloads every package the Dockerfiles install, with constraints.txt and torch's CPU build, into a
folder keyed by those inputs; the stand-in base points pip at it, so the Dockerfiles' ``pip install`` run unchanged.
"""

import hashlib
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.utils import canonicalize_name

from servelab.core.paths import REPO_ROOT
from servelab.tools.gpu_constraints import pins

CONSTRAINTS = REPO_ROOT / "constraints.txt"
# The Python the images run (Debian 12's python3.11), which may be older than the host's: packages
# that need a later 3.11 (soupsieve 4.1 needs 3.11.5) must not be picked.
IMAGE_PYTHON = "3.11.2"


def pinned(package: str) -> str:
    return pins(CONSTRAINTS)[canonicalize_name(package)]


def cpu_torch() -> str:
    """The stand-in for docker/.env's CUDA torch: the same release, CPU build."""
    return f"{pinned('torch')}+cpu"


def image_extras() -> list[str]:
    """The extras the Dockerfiles' ``pip install ".[...]"`` lines name (Ray's image is built on the node only)."""
    dockerfiles = [*REPO_ROOT.glob("*/Dockerfile"), *(REPO_ROOT / "docker").glob("Dockerfile.*")]
    return sorted({extra for path in dockerfiles if path.name != "Dockerfile.ray"
                   for extras in re.findall(r'"\.\[([\w,]+)\]"', path.read_text()) for extra in extras.split(",")})


def requirements(versions: dict[str, str]) -> list[str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    wanted = [*project["build-system"]["requires"], *project["project"]["dependencies"]]
    wanted += [req for extra in image_extras() for req in extras[extra] if not req.startswith("servelab")]
    wanted += [f"pip=={versions['PIP_VERSION']}", f"torch=={cpu_torch()}",
               f"onnxruntime-gpu=={versions['ONNXRUNTIME_GPU_VERSION']}",
               f"jupyterlab=={versions['JUPYTERLAB_VERSION']}", f"bash_kernel=={versions['BASH_KERNEL_VERSION']}",
               # redis needs it below Python 3.11.3 (the images' 3.11.2); `pip download --python-version` judges
               # a dependency's python_full_version marker by this interpreter, so it is named here.
               f"async-timeout=={pinned('async-timeout')}"]
    return sorted(set(wanted))


def key(versions: dict[str, str]) -> str:
    digest = hashlib.sha256("\n".join([IMAGE_PYTHON, *requirements(versions)]).encode())
    digest.update(CONSTRAINTS.read_bytes())
    return digest.hexdigest()[:12]


def ensure(cache: Path, versions: dict[str, str], log=print) -> Path:
    """The wheelhouse folder for these inputs (downloaded once; pip's own cache makes a redo quick)."""
    target = Path(cache).expanduser() / "wheelhouse" / key(versions)
    if (target / ".complete").exists():
        return target
    part = target.with_name(target.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    reqs = requirements(versions)
    log(f"wheelhouse: pip download {len(reqs)} requirements with constraints.txt -> {target}")
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
                           "--python-version", IMAGE_PYTHON, "--dest", str(part), "-c", str(CONSTRAINTS), *reqs],
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"pip download for the wheelhouse failed: {done.stderr.strip()[-2000:]}")
    (part / ".complete").write_text("\n".join(reqs) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    part.rename(target)
    for old in target.parent.iterdir():  # wheelhouses of earlier pins: one is ~700 MB
        if old != target:
            shutil.rmtree(old, ignore_errors=True)
    return target
