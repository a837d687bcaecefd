"""servelab doctor on a 2x P100 lab node as its tools answered (tests/data/doctor), fed through the same checks by
a runner that answers exact command lines. For real on this machine: tests/integration/test_doctor_here.py."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from servelab.core.hardware import node_type
from servelab.core.paths import REPO_ROOT
from servelab.tools.doctor import container_checks as containers
from servelab.tools.doctor import gpu
from servelab.tools.doctor.checks import CHECKS
from servelab.tools.doctor.container_checks import (
    DOCKER_INFO,
    compose_bytes,
    container_probe_command,
    triton_container_result,
)
from servelab.tools.doctor.gpu import (
    CPU,
    CUDA,
    NVIDIA_SMI_QUERY,
    Gpu,
    active_providers,
    has_kernels,
    onnxruntime_result,
    parse_gpus,
    pinned_torch_result,
    tensorrt_result,
    tiny_model,
    torch_kernels_result,
)
from servelab.tools.doctor.runner import Context, Output, Result, exit_code, run_checks

DATA = Path(__file__).parents[1] / "data" / "doctor"
P100_SMI = (DATA / "nvidia-smi-query-2xP100.csv").read_text()
P100 = parse_gpus(P100_SMI)
# torch.cuda.get_arch_list() of PyTorch's CUDA 12.6 and CUDA 12.8 builds (2.8 and later).
CU126_ARCHS = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
CU128_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]
IMAGE = "servelab/triton_server:local"
IMAGE_INSPECT = ("docker", "image", "inspect", "--format", "{{.Id}}", IMAGE)


class RecordedTools:
    """A runner that answers each command line with what the real tool printed for it, and nothing else."""

    def __init__(self, answers: dict[tuple[str, ...], Output]) -> None:
        self.answers, self.asked = answers, []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> Output:
        assert 0 < timeout_s <= 180, "every external command runs with a timeout"
        self.asked.append(tuple(argv))
        return self.answers[tuple(argv)]


def _node_tools() -> dict[tuple[str, ...], Output]:
    return {
        NVIDIA_SMI_QUERY: Output(0, P100_SMI),
        DOCKER_INFO: Output(0, (DATA / "docker-info-node.json").read_text()),
        IMAGE_INSPECT: Output(1, "", f"Error response from daemon: No such image: {IMAGE}\n"),
    }


def _by_name(results: list[Result]) -> dict[str, Result]:
    return {r.name: r for r in results}


def test_exit_code_follows_failures() -> None:
    assert exit_code([Result("a", "pass", ""), Result("b", "warn", ""), Result("c", "skip", "")]) == 0
    assert exit_code([Result("a", "pass", ""), Result("b", "fail", "", "fix it")]) == 1


def test_a_check_that_crashes_is_a_failure_and_the_rest_still_run() -> None:
    tools = RecordedTools({NVIDIA_SMI_QUERY: Output(0, "0, Tesla P100-PCIE-16GB, 535.183.01, [N/A], 16384 MiB\n")})
    ctx = Context(node=True, run=tools)
    results = _by_name(run_checks([c for c in CHECKS if c.name in ("python", "gpus", "torch-kernels")], ctx))
    assert results["gpus"].status == "fail" and "could not read nvidia-smi's answer" in results["gpus"].detail
    assert results["torch-kernels"].status == "fail" and "the check itself failed: ValueError" in results["torch-kernels"].detail
    assert results["python"].status == "pass"
    assert tools.asked == [NVIDIA_SMI_QUERY]  # asked once, read by both checks


def test_the_cpus_8_bit_instructions_are_said_locally_never_failed() -> None:
    """Locally the doctor says what hardware.cpu_int8 reads from this CPU's flags (tests/unit/test_cpu_int8.py
    checks it on written cpuinfo texts); on the node INT8 runs on the GPU, so it is not asked there."""
    from servelab.core.hardware import cpu_int8

    [result] = run_checks([c for c in CHECKS if c.name == "cpu-int8"], Context(run=RecordedTools({})))
    assert result.status in ("pass", "skip") and result.detail == cpu_int8().sentence()
    assert "8-bit instructions" in result.detail
    assert run_checks([c for c in CHECKS if c.name == "cpu-int8"], Context(node=True, run=RecordedTools({}))) == []


# --- the lab node: 2x P100, as its tools answered --------------------------------------------------


def test_p100_node_gpus_tensorrt_and_docker() -> None:
    tools = RecordedTools(_node_tools())
    results = _by_name(run_checks(CHECKS, Context(node=True, run=tools)))

    assert results["gpus"].status == "pass"
    assert results["gpus"].detail == (
        "2 GPU(s), driver 535.183.01: GPU 0 Tesla P100-PCIE-16GB (compute capability 6.0, 16384 MiB); "
        "GPU 1 Tesla P100-PCIE-16GB (compute capability 6.0, 16384 MiB); a gpu_p100 node (CHI@TACC)")
    trt = results["tensorrt"]
    assert trt.status == "skip" and trt.detail.startswith("not applicable")
    assert "Tesla P100-PCIE-16GB is 6.0" in trt.detail and "CUDA execution provider" in trt.detail
    assert results["docker"] == Result("docker", "pass", "Docker 28.2.2, daemon reachable")
    assert results["nvidia-runtime"].status == "pass" and "nvidia" in results["nvidia-runtime"].detail
    assert results["pinned-torch"].status == "pass"
    # The image is not in yet (bin/node-setup fetches it in the background): the check says where to look rather
    # than failing or pulling, and names no later notebook as its source (none builds it).
    triton = results["triton-container"]
    assert triton.status == "skip" and "`bin/node-setup` fetches it (`tail ~/images.log`)" in triton.detail
    assert "images: done" in triton.detail and "5_triton_setup" not in triton.detail
    # This environment's torch and onnxruntime are CPU builds, as on the node's own venv: reported, not failed.
    assert results["torch-kernels"].status == "skip" and "CPU build" in results["torch-kernels"].detail
    assert results["onnxruntime"].status == "skip" and "no GPU provider" in results["onnxruntime"].detail
    assert "model-artifacts" not in results
    assert exit_code(list(results.values())) == 0


def test_node_without_driver_or_docker_daemon_fails_with_fixes() -> None:
    tools = RecordedTools({
        NVIDIA_SMI_QUERY: Output(9, (DATA / "nvidia-smi-no-driver.txt").read_text()),
        DOCKER_INFO: Output(1, (DATA / "docker-info-daemon-down.json").read_text(),
                            (DATA / "docker-info-daemon-down.stderr").read_text()),
    })
    results = _by_name(run_checks(CHECKS, Context(node=True, run=tools)))
    assert results["gpus"].status == "fail"
    assert results["gpus"].detail.startswith("nvidia-smi failed: NVIDIA-SMI has failed because it couldn't communicate")
    assert results["docker"].status == "fail"
    assert "Cannot connect to the Docker daemon" in results["docker"].detail
    assert results["docker"].fix == "start it: sudo systemctl start docker"
    assert results["nvidia-runtime"].status == "skip"
    assert exit_code(list(results.values())) == 1


def test_docker_permission_denied_says_to_join_the_docker_group() -> None:
    denied = ("permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock: "
              "Get \"http://%2Fvar%2Frun%2Fdocker.sock/v1.50/info\": dial unix /var/run/docker.sock: connect: permission denied\n")
    tools = RecordedTools({DOCKER_INFO: Output(1, (DATA / "docker-info-daemon-down.json").read_text(), denied)})
    result = containers.docker(Context(node=True, run=tools))
    assert result.status == "fail" and "usermod -aG docker" in result.fix


def test_node_without_the_nvidia_runtime_fails() -> None:
    info = json.loads((DATA / "docker-info-node.json").read_text())
    del info["Runtimes"]["nvidia"]
    tools = RecordedTools({DOCKER_INFO: Output(0, json.dumps(info)), NVIDIA_SMI_QUERY: Output(0, P100_SMI)})
    result = containers.nvidia_runtime(Context(node=True, run=tools))
    assert result.status == "fail" and "nvidia-ctk runtime configure" in result.fix


def _probe_answer(**changes: object) -> Output:
    seen = {"stub": (DATA / "python-backend-stub-no-arguments.txt").read_text(), "torch": "2.13.0+cu126",
            "cuda": True, "arch_list": CU126_ARCHS, "capabilities": [[6, 0], [6, 0]], **changes}
    return Output(0, json.dumps(seen) + "\n")


def test_triton_container_stub_starts_and_torch_sees_both_p100s() -> None:
    tools = RecordedTools({**_node_tools(), IMAGE_INSPECT: Output(0, "sha256:0123\n"),
                           container_probe_command(IMAGE): _probe_answer()})
    result = containers.triton_container(Context(node=True, run=tools))
    assert result.status == "pass", result
    assert "sees 2 GPU(s)" in result.detail and "torch 2.13.0+cu126" in result.detail
    (ran,) = [argv for argv in tools.asked if argv[:2] == ("docker", "run")]
    assert ran[ran.index("--gpus") + 1] == "all" and ran[ran.index("--pull") + 1] == "never"


@pytest.mark.parametrize(("answer", "expected"), [
    (_probe_answer(stub="error while loading shared libraries: libpython3.11.so.1.0"), "stub does not start"),
    (_probe_answer(cuda=False, capabilities=[]), "sees 0 GPU(s), the host has 2"),
    (_probe_answer(torch="2.13.0+cu128", arch_list=CU128_ARCHS), "no kernels for compute capability 6.0"),
    (Output(125, "", "docker: Error response from daemon: could not select device driver \"\" with capabilities: [[gpu]].\n"),
     "could not select device driver"),
])
def test_triton_container_failures(answer: Output, expected: str) -> None:
    result = triton_container_result(answer, P100)
    assert result.status == "fail" and expected in result.detail and result.fix


# --- the decisions, on the P100's numbers ----------------------------------------------------------


def test_parse_gpus_reads_the_p100_node() -> None:
    assert P100 == [Gpu(0, "Tesla P100-PCIE-16GB", "535.183.01", (6, 0), "16384 MiB"),
                    Gpu(1, "Tesla P100-PCIE-16GB", "535.183.01", (6, 0), "16384 MiB")]


@pytest.mark.parametrize(("answer", "said"), [
    ("0, Quadro RTX 6000, 570.86.15, 7.5, 24576 MiB\n", "; a gpu_rtx_6000 node (CHI@UC)"),
    ("0, Tesla V100-SXM2-16GB, 570.86.15, 7.0, 16384 MiB\n1, Tesla V100-SXM2-16GB, 570.86.15, 7.0, 16384 MiB\n",
     "; a gpu_v100 node (CHI@UC)"),
    ("0, NVIDIA A100 80GB PCIe, 570.86.15, 8.0, 81920 MiB\n", "; a gpu_a100_pcie node (CHI@UC)"),
    ("0, NVIDIA H200, 580.159.04, 9.0, 143771 MiB\n", "; not one of the GPU node types the lab knows (gpu_p100, "
     "gpu_v100, gpu_rtx_6000, gpu_a100_pcie): the same images run from compute capability 6.0 on"),
])
def test_the_node_s_type_is_named_from_its_gpus(answer: str, said: str) -> None:
    result = gpu.gpu_list_result(parse_gpus(answer), node=True)
    assert result.status == "pass" and result.detail.endswith(said)
    assert not gpu.gpu_list_result(parse_gpus(answer), node=False).detail.endswith(said)  # the local doctor: no node


def test_a_node_type_the_lab_does_not_know_is_refused_with_the_list() -> None:
    assert node_type("gpu_rtx_6000").capability == (7, 5)
    with pytest.raises(ValueError, match="'gpu_k80' is not one the lab knows: gpu_p100, gpu_v100, gpu_rtx_6000"):
        node_type("gpu_k80")


def test_old_gpus_and_old_drivers() -> None:
    k80 = parse_gpus("0, Tesla K80, 470.256.02, 3.7, 11441 MiB\n")
    assert gpu.gpu_list_result(k80, node=True).status == "fail"
    old_driver = parse_gpus("0, Tesla P100-PCIE-16GB, 470.256.02, 6.0, 16384 MiB\n")
    result = gpu.gpu_list_result(old_driver, node=True)
    assert result.status == "warn" and "older than 525.85" in result.detail


def test_kernel_matching() -> None:
    assert has_kernels(CU126_ARCHS, (6, 0))
    assert has_kernels(["sm_60"], (6, 1))  # same major, newer minor runs the sm_60 cubin
    assert not has_kernels(CU128_ARCHS, (6, 0))
    assert not has_kernels(["sm_70"], (6, 0))
    assert has_kernels(["compute_50"], (6, 0))  # PTX is compiled for newer GPUs at load time
    assert not has_kernels(["compute_70"], (6, 0))


def test_torch_without_sm_60_fails_with_the_cu126_build_as_fix() -> None:
    versions = {"TORCH_VERSION": "2.13.0+cu126", "TORCH_INDEX_URL": "https://download.pytorch.org/whl/cu126"}
    result = torch_kernels_result(P100, CU128_ARCHS, "2.13.0+cu128", versions)
    assert result.status == "fail" and "no kernels for sm_60" in result.detail
    assert "torch==2.13.0+cu126" in result.fix and "--index-url https://download.pytorch.org/whl/cu126" in result.fix
    assert torch_kernels_result(P100, CU126_ARCHS, "2.13.0+cu126", versions).status == "pass"


def test_pinned_torch_must_keep_the_p100s() -> None:
    assert pinned_torch_result("2.13.0+cu126", P100).status == "pass"
    result = pinned_torch_result("2.13.0+cu128", [])  # checked for the lab node even without a GPU here
    assert result.status == "fail" and "the lab node's P100s (6.0)" in result.detail and "+cu126" in result.fix
    assert pinned_torch_result("2.13.0+rocm7.0", []).status == "warn"


def test_onnxruntime_on_p100s_cuda_active_on_both() -> None:
    active = {(CUDA, 0): [CUDA, CPU], (CUDA, 1): [CUDA, CPU]}
    result = onnxruntime_result("1.26.0", P100, [CUDA, CPU], [CPU], active)
    assert result.status == "pass"
    assert result.detail == ("onnxruntime 1.26.0, active: GPU 0 CUDAExecutionProvider: CUDAExecutionProvider, "
                             "CPUExecutionProvider; GPU 1 CUDAExecutionProvider: CUDAExecutionProvider, CPUExecutionProvider")


def test_tensorrt_does_not_apply_to_p100_and_applies_from_7_5() -> None:
    assert tensorrt_result(P100, [CUDA, CPU]).status == "skip"
    t4 = parse_gpus("0, Tesla T4, 550.54.15, 7.5, 15360 MiB\n")
    assert tensorrt_result(t4, ["TensorrtExecutionProvider", CUDA, CPU]).status == "pass"
    assert tensorrt_result([], []).detail == "no NVIDIA GPU here (see the gpus line)"


def test_a_gpu_provider_that_falls_back_to_the_cpu_fails() -> None:
    """Asked for the CUDA provider, this CPU build of onnxruntime really runs on the CPU alone: what a
    node whose CUDA libraries do not load sees. get_providers() shows it; the doctor reports it."""
    model = tiny_model()
    assert active_providers(model, CPU) == [CPU]
    fell_back = active_providers(model, CUDA, 0)
    assert fell_back == [CPU]
    result = onnxruntime_result("1.26.0", P100, [CUDA, CPU], [CPU], {(CUDA, 0): [CUDA, CPU], (CUDA, 1): fell_back})
    assert result.status == "fail"
    assert "CUDAExecutionProvider is in onnxruntime 1.26.0 but did not start on GPU 1" in result.detail and result.fix


def test_compose_sizes_and_shm_need(tmp_path: Path) -> None:
    assert compose_bytes("2gb") == 2 * 1024**3 and compose_bytes("512m") == 512 * 1024**2 and compose_bytes("100") == 100
    with pytest.raises(ValueError):
        compose_bytes("lots")
    # The same repository with shm_size taken out of the Triton compose file: Docker's 64 MiB is too little.
    shutil.copytree(REPO_ROOT / "models_staging", tmp_path / "models_staging", ignore=shutil.ignore_patterns("configs"))
    (tmp_path / "docker").mkdir()
    compose = (REPO_ROOT / "docker" / "docker-compose-triton.yaml").read_text()
    assert "    shm_size: 2gb\n" in compose
    (tmp_path / "docker" / "docker-compose-triton.yaml").write_text(compose.replace("    shm_size: 2gb\n", ""))
    result = containers.triton_shm(Context(repo=tmp_path))
    assert result.status == "fail" and "Docker's default 64 MiB" in result.detail and "pt-4x4" in result.detail
    assert containers.triton_shm(Context()).status == "pass"


def test_a_p100_node_missing_a_gpu_fails() -> None:
    one = parse_gpus("0, Tesla P100-PCIE-16GB, 550.54.15, 6.0, 16384 MiB\n")
    result = gpu.gpu_list_result(one, node=True)
    assert result.status == "fail" and result.detail.endswith("; a gpu_p100 node has 2")
    assert "ask your instructor for another" in result.fix
    assert gpu.gpu_list_result(one * 2, node=True).status == "pass"
