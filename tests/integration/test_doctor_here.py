"""servelab doctor for real on this machine (no GPU, no Docker daemon): the command itself, as a process. On a
2x P100 lab node as its tools answered: tests/unit/test_doctor.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.core.installers.perf_analyzer_install import install_dir
from servelab.tools.doctor.checks import CHECKS
from servelab.tools.doctor.runner import Result

SERVELAB = Path(sys.executable).parent / "servelab"


def _by_name(results: list[Result]) -> dict[str, Result]:
    return {r.name: r for r in results}


# --- this machine, for real ------------------------------------------------------------------------


def _doctor(*args: str, model_dir: Path, **more_env: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "MODEL_DIR": str(model_dir), **more_env}
    return subprocess.run([str(SERVELAB), "doctor", *args], capture_output=True, text=True, env=env, timeout=120)


def _doctor_json(*args: str, model_dir: Path, **more_env: str) -> tuple[int, dict[str, Result]]:
    done = _doctor("--json", *args, model_dir=model_dir, **more_env)
    return done.returncode, _by_name([Result(**r) for r in json.loads(done.stdout)])


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="for machines without an NVIDIA driver")
def test_on_this_cpu_machine_gpu_checks_skip_and_the_rest_run(tmp_path: Path) -> None:
    code, results = _doctor_json(model_dir=tmp_path)

    assert results["gpus"].status == "skip" and "nvidia-smi not found" in results["gpus"].detail
    for name in ("torch-kernels", "tensorrt", "triton-container"):
        assert (results[name].status, results[name].detail) == ("skip", "no NVIDIA GPU here (see the gpus line)")
    assert results["onnxruntime"].status == "pass" and "CPUExecutionProvider active (no GPU here)" in results["onnxruntime"].detail
    assert results["python"].status == results["linux"].status == "pass"
    assert results["pinned-torch"].status == "pass" and "2.13.0+cu126" in results["pinned-torch"].detail
    assert results["triton-shm"].status == "pass"
    # No daemon here: reported, not failed, since the local lab runs without Docker.
    assert results["docker"].status == "skip" and "the local lab needs none" in results["docker"].detail
    assert results["nvidia-runtime"].status == "skip"
    # MODEL_DIR is an empty folder: the one failure, with its fix, and the exit status follows it.
    assert results["model-artifacts"].status == "fail" and "servelab models build" in results["model-artifacts"].fix
    assert [r.name for r in results.values() if r.status == "fail"] == ["model-artifacts"]
    assert code == 1


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="for machines without an NVIDIA driver")
def test_exit_status_is_zero_when_nothing_fails(artifacts) -> None:
    done = _doctor(model_dir=artifacts.onnx.parent)
    text, code = done.stdout, done.returncode
    lines = text.splitlines()
    assert lines[0] == "servelab doctor (local)"
    assert len(lines) == 1 + len(CHECKS)  # one line per check
    assert not any(line.startswith("FAIL") for line in lines), text
    assert code == 0


def test_perf_analyzer_line_names_the_binary_or_the_fix(tmp_path: Path) -> None:
    _, results = _doctor_json(model_dir=tmp_path, PERF_ANALYZER=str(tmp_path / "nowhere"))
    missing = results["perf-analyzer"]
    assert missing.status == "warn" and "make perf-analyzer" in missing.fix and "nowhere" in missing.fix
    if (install_dir() / "bin" / "perf_analyzer").exists():  # `make test` installed the project's copy
        _, results = _doctor_json(model_dir=tmp_path)
        assert results["perf-analyzer"].status == "pass"
        assert results["perf-analyzer"].detail.startswith(str(install_dir() / "bin" / "perf_analyzer"))


def test_on_this_machine_as_a_node_a_missing_gpu_fails(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("for machines without an NVIDIA driver")
    code, results = _doctor_json("--node", model_dir=tmp_path)
    assert results["gpus"].status == "fail" and "CC-Ubuntu24.04-CUDA" in results["gpus"].fix
    assert "model-artifacts" not in results and "local-tritonserver" not in results  # local-only checks
    assert code == 1
