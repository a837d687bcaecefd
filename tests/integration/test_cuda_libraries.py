"""CUDA's libraries for ONNX Runtime in a process that does not import torch (``preload_cuda_libraries``).

On the GPU machine ``.venv-gpu`` is a venv made from another venv (GPU_PYTHON, where torch and its
``nvidia-*`` wheels live) with a ``.pth`` naming that venv's site folder (the Makefile's recipe). Here the
same two venvs are built around a fake ``nvidia`` tree of tiny real shared libraries compiled with gcc,
named and linked as CUDA 13's wheels are (``nvidia/cu13/lib``, ``nvidia/cudnn/lib``, and a CUDA 12
per-library folder), and a child Python of the second venv shows, from its own /proc/self/maps, which
files it loaded. No GPU and no real CUDA library is involved.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from servelab.core.paths import REPO_ROOT

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the fake CUDA libraries")

# folder under site-packages -> (library, what it links against)
FAKE_TREE = {
    "nvidia/cu13/lib": [("libcudart.so.13", None), ("libcublasLt.so.13", None), ("libcublas.so.13", "libcublasLt.so.13")],
    "nvidia/cudnn/lib": [("libcudnn_graph.so.9", None), ("libcudnn.so.9", "libcudnn_graph.so.9")],
    "nvidia/curand/lib": [("libcurand.so.10", None)],  # CUDA 12's layout: one folder per library
    "nvidia/cuda_runtime/lib": [("libcudart.so.12", None)],
}
FOLDER = {name: folder for folder, libraries in FAKE_TREE.items() for name, _ in libraries}
CUDART_VERSION = {"libcudart.so.13": 13000, "libcudart.so.12": 12080}


def build_fake_tree(site: Path) -> None:
    for folder, libraries in FAKE_TREE.items():
        lib = site / folder
        lib.mkdir(parents=True)
        for name, needs in libraries:
            source = lib / f"{name}.c"
            # Every fake exports a function saying which file it is; cudart's as the real one is named.
            version = CUDART_VERSION.get(name, 0)
            source.write_text(f"int cudaRuntimeGetVersion(int *v) {{ *v = {version}; return 0; }}\n"
                              if version else f"int fake_{name.split('.')[0]}(void) {{ return 1; }}\n")
            # No rpath: a library that needs another loads only once that one is in the process.
            link = ["-Wl,--no-as-needed", "-L", str(lib), f"-l:{needs}"] if needs else []
            subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib / name), f"-Wl,-soname,{name}", str(source),
                            *link], check=True)
            source.unlink()


def venv(python: str, path: Path) -> Path:
    subprocess.run([python, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def purelib(python: Path) -> Path:
    return Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())


@pytest.fixture(scope="module")
def venv_gpu(tmp_path_factory) -> tuple[Path, Path]:
    """(the second venv's python, the first venv's site folder holding the fake nvidia tree)."""
    root = tmp_path_factory.mktemp("cuda-libraries")
    gpu_python = venv(sys.executable, root / "gpu-python")
    site = purelib(gpu_python)
    build_fake_tree(site)
    python = venv(str(gpu_python), root / "venv-gpu")
    # As the Makefile's gpu-python.pth: the first venv's site folder. onnxruntime, which .venv-gpu installs
    # itself, comes here from the project's own site folder, named after it.
    (purelib(python) / "gpu-python.pth").write_text(f"{site}\n{sysconfig.get_path('purelib')}\n")
    return python, site


def run_child(python: Path, code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    run = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


MAPPED = """
import ctypes, json
mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if "/nvidia/" in line})
version = ctypes.c_int()
# By name, without LD_LIBRARY_PATH, as ONNX Runtime's provider library and cuDNN look for it.
ctypes.CDLL("libcudart.so.13" if any("so.13" in m for m in mapped) else "libcudart.so.12").cudaRuntimeGetVersion(
    ctypes.byref(version))
print(json.dumps({"loaded": {name: str(path) for name, path in loaded.items()}, "mapped": mapped,
                  "cudart": version.value}))
"""


def test_preload_loads_the_nvidia_libraries_a_pth_brings_onto_sys_path(venv_gpu):
    python, site = venv_gpu
    found = run_child(python, "from servelab.core.inference import preload_cuda_libraries\n"
                              "loaded = preload_cuda_libraries()\n" + MAPPED)
    expected = {name: str(site / folder / name) for name, folder in FOLDER.items() if name != "libcudart.so.12"}
    assert found["loaded"] == expected
    # The loader itself mapped those very files (libcublas and libcudnn only load after what they link against).
    assert found["mapped"] == sorted(expected.values())
    assert found["cudart"] == 13000


@pytest.mark.parametrize("major", ["12", "13"])
def test_only_the_cuda_major_onnx_runtime_was_built_for(venv_gpu, major):
    python, site = venv_gpu
    # CUDA 12's folder first: without the major, its runtime would be the one loaded.
    folders = [site / "nvidia/cuda_runtime/lib", site / "nvidia/cu13/lib"]
    found = run_child(python, "from pathlib import Path\nfrom servelab.core.inference import load_cuda_libraries\n"
                              f"loaded = load_cuda_libraries([Path(f) for f in {list(map(str, folders))}], {major!r})\n"
                              + MAPPED)
    cudart = f"libcudart.so.{major}"
    assert [m for m in found["mapped"] if "libcudart" in m] == [str(site / FOLDER[cudart] / cudart)]
    assert found["cudart"] == CUDART_VERSION[cudart]
    # cuBLAS carries the CUDA major too: CUDA 12 has none in this tree.
    assert ("libcublas.so.13" in found["loaded"]) == (major == "13")
