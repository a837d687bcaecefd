"""Checks for running the lab locally (`make lab`): Python, Linux, the CPU's 8-bit instructions, the model, the
bundled tritonserver, perf_analyzer."""

import ctypes.util
import importlib.metadata
import platform
import sys
import sysconfig
from pathlib import Path

from servelab.core.artifacts import ArtifactPaths, load_manifest
from servelab.core.hardware import cpu_int8
from servelab.core.installers.perf_analyzer_install import PerfAnalyzerNotFound, locate
from servelab.core.settings import ModelSettings
from servelab.tools.doctor.runner import Context, Result

MIN_PYTHON = (3, 11)


def python_version(ctx: Context) -> Result:
    version = platform.python_version()
    if sys.version_info[:2] < MIN_PYTHON:
        return Result("python", "fail", f"Python {version}; servelab needs {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer",
                      "install Python 3.11 or newer, then recreate the environment (rm -rf .venv; make .venv/.installed)")
    return Result("python", "pass", f"Python {version} ({sys.executable})")


def linux(ctx: Context) -> Result:
    if (system := platform.system()) != "Linux":
        return Result("linux", "fail", f"{system}: the bundled tritonserver and the server process handling need Linux",
                      "use a Linux machine or VM (Debian 12, Ubuntu 22.04 or newer), or WSL2 on Windows")
    return Result("linux", "pass", f"Linux {platform.release()} ({platform.machine()})")


def int8_instructions(ctx: Context) -> Result:
    """Whether the INT8 stages can beat fp32 here, from the CPU's flags (a fact of the machine, never a failure)."""
    found = cpu_int8()
    return Result("cpu-int8", "pass" if found.known else "skip", found.sentence())


def model_artifacts(ctx: Context) -> Result:
    paths = ArtifactPaths.in_dir(ModelSettings().model_dir)
    if missing := [p.name for p in (paths.state_dict, paths.manifest, paths.onnx) if not p.is_file()]:
        return Result("model-artifacts", "fail", f"{', '.join(missing)} missing in {paths.onnx.parent}",
                      "build them: servelab models build (offline stand-in) or servelab models build --source lab")
    manifest = load_manifest(paths.manifest)
    kind = "offline stand-in" if manifest.stand_in else "the lab's trained weights"
    return Result("model-artifacts", "pass", f"{paths.onnx.parent}: {manifest.architecture}, {kind}")


def local_tritonserver(ctx: Context) -> Result:
    # Deferred, not a circle: importing it loads tritonclient (an optional extra) only when this runs.
    from servelab.servers.triton.server import wheel_dirs

    name = "local-tritonserver"
    fix = "install the triton extra: pip install -c constraints.txt -e '.[triton]' (make .venv/.installed does)"
    try:
        server, _ = wheel_dirs()
    except RuntimeError as exc:
        return Result(name, "fail", str(exc), fix)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    binary, stub = server / "bin" / "tritonserver", server / "python_backend_stubs" / python / "triton_python_backend_stub"
    if not binary.is_file() or not stub.is_file():
        return Result(name, "fail", f"{binary if not binary.is_file() else stub} is missing", fix)
    # The stub embeds libpython: a Python built without a shared library cannot run the Python backend.
    libpython = str(sysconfig.get_config_var("INSTSONAME") or "")
    if not (Path(str(sysconfig.get_config_var("LIBDIR"))) / libpython).is_file() and not ctypes.util.find_library(f"python{python}"):
        return Result(name, "fail", f"the Python-backend stub needs {libpython or f'libpython{python}'}, which is not installed",
                      f"sudo apt-get install libpython{python}")
    version = importlib.metadata.version("nvidia-pytriton")
    return Result(name, "pass", f"tritonserver from nvidia-pytriton {version}, Python-backend stub for Python {python}")


def perf_analyzer(ctx: Context) -> Result:
    """The perf_analyzer the lab would run, checked to start (servelab.core.installers.perf_analyzer_install)."""
    try:
        return Result("perf-analyzer", "pass", locate().describe())
    except PerfAnalyzerNotFound as exc:
        # A warning, not a failure: without it the lab records its runs as failed and goes on.
        return Result("perf-analyzer", "warn", "perf_analyzer cannot run: the lab records its runs as failed",
                      str(exc))