"""`make gpu-check`'s install, on this CPU machine, as it met the H100 machine (docs/gpu/README.md).

There, ``python3`` was itself a virtual environment holding a CUDA PyTorch, and the machine had no
network. Here ``GPU_PYTHON`` is such a venv holding a **stand-in torch made for this test only**: a
pure-Python package named ``torch`` that has no tensors, only ``torch.version.cuda``, and declares
the requirements of the real torch 2.11.0 that meet a pin (``setuptools<82`` among them, as recorded
in the constraints file's header). ``.venv-gpu`` is then built by the Makefile's own recipe, offline,
from a wheelhouse, for the ``torch`` extra (the ``gpu`` extra's 400 MB of GPU wheels are not needed
to prove the mechanism: the same recipe, pins and resolver, fewer wheels).
"""

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from servelab.tools.gpu_constraints import checked_torch, conflicts, pins

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "constraints-gpu-cu13.txt"
TORCH = "2.11.0"  # the H100 machine's (torch 2.11.0+cu130)
STAND_IN = f"{TORCH}+cu130"
# No index may be reached while .venv-gpu is built: the GPU machine had none.
pytestmark = pytest.mark.slow  # virtual environments built and installed into, offline

OFFLINE = {"PIP_NO_INDEX": "1", "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_CONSTRAINT": ""}


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def stand_in_torch_wheel(folder: Path) -> Path:
    """The installer test's stand-in for a CUDA torch (see the module docstring); never PyTorch."""
    pinned = pins(CONSTRAINTS)
    requires = [r for r in checked_torch(CONSTRAINTS)[TORCH] if canonicalize_name(Requirement(r).name) in pinned]
    dist = f"torch-{STAND_IN}.dist-info"
    files = {
        "torch/__init__.py": b'"""servelab\'s installer-test stand-in for torch: no tensors, only torch.version."""\n'
                             b"from torch.version import __version__, cuda  # noqa: F401\n",
        "torch/version.py": f'__version__ = "{STAND_IN}"\ncuda = "13.0"\n'.encode(),
        f"{dist}/METADATA": ("Metadata-Version: 2.1\nName: torch\nVersion: " + STAND_IN +
                             "\nSummary: servelab installer-test stand-in, not PyTorch\n" +
                             "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: servelab-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    wheel = folder / f"torch-{STAND_IN}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        record = [_record_line(p, d) for p, d in files.items()] + [f"{dist}/RECORD,,"]
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return wheel


def run(cmd: list[str], env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def gpu_machine(tmp_path_factory):
    """(GPU_PYTHON: a venv with the stand-in torch, a wheelhouse for `.[torch]` without torch)."""
    root = tmp_path_factory.mktemp("gpu-machine")
    wheel = stand_in_torch_wheel(root)
    venv = root / "torch-venv"
    assert run([sys.executable, "-m", "venv", str(venv)]).returncode == 0
    python = venv / "bin" / "python"
    done = run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], env=OFFLINE)
    assert done.returncode == 0, done.stderr
    # Made the way `make gpu-wheelhouse` makes the real one (pins of GPU_CONSTRAINTS), for this Python.
    house = root / "wheelhouse"
    done = run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", str(house),
                "--find-links", str(root), "-c", str(CONSTRAINTS), f"torch=={STAND_IN}", ".[torch]", "setuptools"],
               env={"PIP_CONSTRAINT": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    (house / wheel.name).unlink()  # the machine's torch is used, never one from the wheelhouse
    sums = [f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}" for w in sorted(house.glob("*.whl"))]
    (house / "SHA256SUMS").write_text("\n".join(sums) + "\n")  # as `make gpu-wheelhouse` writes it
    return python, house


def make_venv_gpu(tmp_path: Path, python: Path, house: Path, constraints: Path = CONSTRAINTS):
    venv = tmp_path / "venv-gpu"
    done = run(["make", "--no-print-directory", f"{venv}/.installed", f"GPU_PYTHON={python}", f"GPU_VENV={venv}",
                f"GPU_WHEELHOUSE={house}", f"GPU_CONSTRAINTS={constraints}", "GPU_EXTRA=torch"], env=OFFLINE)
    return venv, done


def test_venv_gpu_sees_the_torch_of_a_gpu_python_that_is_a_venv_and_installs_offline(gpu_machine, tmp_path):
    python, house = gpu_machine
    # The defect: a venv made from a venv sees the base interpreter's packages, not torch.
    plain = tmp_path / "plain"
    assert run([str(python), "-m", "venv", "--system-site-packages", str(plain)]).returncode == 0
    assert run([str(plain / "bin" / "python"), "-c", "import torch"]).returncode != 0

    venv, done = make_venv_gpu(tmp_path, python, house)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"torch {STAND_IN} CUDA 13.0" in done.stdout
    seen = run([str(venv / "bin" / "python"), "-c",
                "import torch, servelab.core.preprocess, setuptools; print(torch.__file__, setuptools.__version__)"])
    assert seen.returncode == 0, seen.stderr
    torch_file, setuptools_version = seen.stdout.split()
    assert torch_file.startswith(str(python.parent.parent))  # GPU_PYTHON's own torch, not a copy
    assert int(setuptools_version.split(".")[0]) < 82  # torch's requirement held against the pins
    assert (venv / ".installed").exists()


def test_a_pin_that_torch_excludes_stops_the_install_with_the_reason(gpu_machine, tmp_path):
    """The H100's second failure, made again: the constraints before they were checked against torch."""
    python, house = gpu_machine
    old = tmp_path / "constraints-old.txt"
    old.write_text(CONSTRAINTS.read_text().replace("setuptools==81.0.0", "setuptools==84.2.1"))
    venv, done = make_venv_gpu(tmp_path, python, house, old)
    assert done.returncode != 0 and not (venv / ".installed").exists()
    assert "setuptools<82" in done.stdout + done.stderr


def test_the_pins_satisfy_every_checked_torch_release():
    checked = checked_torch(CONSTRAINTS)
    assert TORCH in checked and len(checked) >= 2
    for version, requires in checked.items():
        assert any(r.startswith("setuptools") for r in requires), version
        assert conflicts(pins(CONSTRAINTS), requires) == [], version
    # ... and the check can fail: the pin the H100 met.
    assert conflicts({"setuptools": "84.2.1"}, checked[TORCH]) == ["setuptools<82 excludes the pin setuptools==84.2.1"]
