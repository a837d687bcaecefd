"""The CPU side of the GPU path: device selection, `--device gpu` and `make gpu-check` without a GPU,
the gpu marker's skips, and the GPU record's parts. The GPU side is tests/integration/test_gpu.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.core.hardware import (
    NO_GPU,
    NoGpu,
    environment_gaps,
    gpu_count,
    instances_say,
    resolve,
    runs_on_fastapi,
    runs_on_triton,
    stage_env,
)
from servelab.tools.gpu_check import (
    DESIGNS,
    PytestOutcome,
    checkout_commit,
    record_markdown,
    run_tests,
    run_within,
    slug,
)

REPO = Path(__file__).resolve().parents[2]
without_gpu = pytest.mark.skipif(gpu_count() > 0, reason="what a machine without a GPU does")


@pytest.mark.parametrize(("requested", "gpus", "device"), [
    ("auto", 0, "cpu"), ("auto", 1, "gpu"), ("auto", 2, "gpu"), ("cpu", 2, "cpu"), ("gpu", 1, "gpu"),
])
def test_device_selection(requested, gpus, device):
    assert resolve(requested, gpus) == device


def test_a_gpu_this_environment_cannot_use_is_left_alone_by_auto_and_refused_by_gpu():
    said = []
    assert resolve("auto", 1, ["PyTorch 2.13.0+cpu is a CPU build"], log=said.append) == "cpu"
    assert "PyTorch 2.13.0+cpu is a CPU build" in said[0]
    with pytest.raises(NoGpu, match="cannot use the GPU: PyTorch 2.13.0\\+cpu is a CPU build"):
        resolve("gpu", 1, ["PyTorch 2.13.0+cpu is a CPU build"])


def test_gpu_without_a_gpu_is_an_error_that_says_why():
    with pytest.raises(NoGpu, match=r"no NVIDIA GPU \(nvidia-smi lists none\)"):
        resolve("gpu", 0)
    with pytest.raises(ValueError, match="auto, cpu or gpu"):
        resolve("cuda", 1)


def test_on_the_gpu_every_server_must_really_use_it():
    # One FastAPI server process with its model: the design that has run on a GPU (an H200).
    assert stage_env("gpu") == {"TORCH_DEVICE": "cuda", "ORT_PROVIDERS": "auto", "REQUIRE_GPU": "1", "WORKERS": "1"}
    assert stage_env("cpu")["ORT_PROVIDERS"] == "cpu" and stage_env("cpu")["REQUIRE_GPU"] == "0"


def test_where_a_stage_runs_is_read_from_what_the_server_reports():
    assert runs_on_fastapi({"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}) == \
        "onnxruntime CUDAExecutionProvider, CPUExecutionProvider"
    assert runs_on_fastapi({"device": "cuda:0", "dtype": "float16", "gpu": "NVIDIA H100"}) == \
        "torch cuda:0 (NVIDIA H100) float16"
    config = {"backend": "python", "instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}] * 2,
              "parameters": {"servelab_gpu_placement": {"string_value": "this machine has 1"}}}
    assert runs_on_triton(config) == "triton python: 2x KIND_GPU on GPU 0 + 2x KIND_GPU on GPU 0 (this machine has 1)"


def test_what_triton_instances_say_is_read_from_the_latest_load_in_its_log():
    """Lines as the models log them (models_staging/*/1/model.py), on a GPU; the CPU lab checks real ones."""
    stand_in = ('W1123 backend.py:160] "food_classifier_onnx_{i}_0: LOCAL STAND-IN (Python backend running ONNX Runtime '
                "1.31.1, ['{p}', 'CPUExecutionProvider'] on cuda:{i}, 1 threads, input float32) in place of Triton's\"")
    log = "\n".join([stand_in.format(i=0, p="CPUExecutionProvider"),  # an earlier stage's load
                      'I1123 "food_classifier_0_0: food11 in PyTorch (float32) on cuda:0, 3 CPU threads"',
                      stand_in.format(i=0, p="CUDAExecutionProvider"), stand_in.format(i=1, p="CUDAExecutionProvider")])
    assert instances_say(log, "food_classifier_onnx", 2) == \
        "1x CUDAExecutionProvider on cuda:0, 1x CUDAExecutionProvider on cuda:1"
    assert instances_say(log, "food_classifier", 1) == "1x PyTorch on cuda:0"
    assert instances_say(log, "food_classifier_ensemble", 0) == ""


@without_gpu
def test_lab_on_the_gpu_without_one_fails_at_once_with_the_reason(tmp_path):
    run = subprocess.run([sys.executable, "-m", "servelab", "lab", "--quick", "--device", "gpu", "--out", str(tmp_path / "r")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and NO_GPU in run.stderr and "--device cpu" in run.stderr
    assert not (tmp_path / "r").exists()  # nothing measured, nothing written


@without_gpu
def test_make_gpu_check_without_a_gpu_says_so_and_exits_0(tmp_path):
    run = subprocess.run(["make", "--no-print-directory", "gpu-check", f"GPU_VENV={tmp_path / 'venv'}"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and f"gpu-check: {NO_GPU}" in run.stdout, run.stdout + run.stderr
    assert not (tmp_path / "venv").exists()  # it built nothing
    run = subprocess.run([sys.executable, "-m", "servelab", "gpu-check", "--docs", str(tmp_path / "docs")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and NO_GPU in run.stdout and not (tmp_path / "docs").exists()


@without_gpu
def test_gpu_tests_skip_with_the_reason_and_the_record_reads_their_outcome(tmp_path):
    """What CI shows for them, through the same JUnit file gpu-check reads."""
    junit = tmp_path / "gpu.xml"
    run = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "tests/integration/test_gpu.py", "-q", "-rs",
                          "-p", "no:cacheprovider", f"--junitxml={junit}"], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-3000:]
    outcome = PytestOutcome.from_junit(junit)
    assert outcome.skipped >= 10 and outcome.passed == outcome.failed == 0
    assert {message for _, result, message in outcome.results} == {NO_GPU}
    assert any("test_triton_kind_gpu" in name for name, _, _ in outcome.results)


def test_the_gpu_tests_write_nothing_into_their_output_folder_until_they_end(tmp_path):
    """gpu-check's output folder is the checkout's results/gpu-check by default, and the tests' session fails
    where results/ changed while it ran (tests/conftest.py's `own_folders`): on the H200 on 2026-11-28 the
    tests' own log, growing there, failed it. A test run by gpu-check's runner sees the folder as it was
    before (an earlier run's files gone, nothing new); the log and JUnit report arrive once the tests end."""
    out = tmp_path / "gpu-check"
    out.mkdir()
    (out / "gpu-tests.log").write_text("an earlier run's log")
    probe = tmp_path / "probe" / "test_probe.py"
    probe.parent.mkdir()
    probe.write_text("import pathlib\nimport pytest\n\n\n@pytest.mark.gpu\ndef test_the_output_folder_is_untouched():\n"
                     f"    assert sorted(p.name for p in pathlib.Path({str(out)!r}).iterdir()) == []\n")
    said = []
    code, outcome = run_tests(out, 120.0, target=str(probe), log=said.append)
    assert code == 0 and outcome is not None and (outcome.passed, outcome.failed) == (1, 0), outcome
    assert sorted(p.name for p in out.iterdir()) == ["gpu-tests.log", "gpu-tests.xml"]
    assert "1 passed" in (out / "gpu-tests.log").read_text() and "earlier run" not in (out / "gpu-tests.log").read_text()
    during = said[0].split("its output: ", 1)[1].split(" while it runs")[0]  # where the log was, as it said
    assert not Path(during).is_relative_to(out) and said[0].endswith(f"then {out / 'gpu-tests.log'})")


def test_gpu_names_become_file_names():
    assert slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert slug("Tesla P100-PCIE-16GB") == "tesla-p100-pcie-16gb"


def test_this_environment_says_what_it_lacks_for_a_gpu():
    import onnxruntime
    import torch

    gaps = environment_gaps()
    assert (torch.version.cuda is None) == any("is a CPU build" in g for g in gaps)
    has_cuda_provider = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    assert has_cuda_provider != any("no CUDA execution provider" in g for g in gaps)


def test_a_command_past_its_time_is_stopped_with_what_it_started(tmp_path):
    """gpu-check's bound on its tests and its lab: the command and the servers it started end together."""
    pid_file = tmp_path / "pid"
    code = run_within(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], 1.0, tmp_path / "log")
    assert code is None
    assert not Path(f"/proc/{pid_file.read_text().strip()}").exists()
    assert run_within(["sh", "-c", "exit 3"], 10.0, tmp_path / "log2") == 3


def test_a_lab_budget_too_short_for_a_stage_names_each_stage_not_run(artifacts, tmp_path):
    run = subprocess.run([sys.executable, "-m", "servelab", "lab", "--quick", "--stages", "fastapi-onnx,onnx-1",
                          "--budget", "0.5", "--out", str(tmp_path / "r")],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    record = json.loads((tmp_path / "r" / "run.json").read_text())
    assert record["stages"] == [] and set(record["not_run"]) == {"fastapi-onnx", "onnx-1"}
    assert "time budget (0.5 s)" in record["not_run"]["onnx-1"] and "NOT RUN onnx-1" in run.stdout
    report = (tmp_path / "r" / "report.md").read_text()
    assert "**fastapi-onnx (not run)**" in report and "**onnx-1 (not run)**" in report
    assert not (tmp_path / "r" / "records.jsonl").exists() or not (tmp_path / "r" / "records.jsonl").read_text()
    assert "limit:" not in run.stdout and not (tmp_path / "r" / "limit.json").exists()  # nothing to set against it


def test_the_gpu_record_names_what_the_budget_cut_and_never_counts_it_passed():
    cut = {"GPU tests": "stopped by the time budget (285 s) before they ended",
           "onnx-fp16": "the time budget (200 s) has 4 s left and a stage took up to 31 s"}
    md = record_markdown([], {}, None, "`servelab lab --plan gpu-check`, exit 0", "today", {}, None, cut)
    section = md.split("## Not run: cut by the time budget")[1].split("##")[0]
    assert "- **onnx-fp16**: the time budget (200 s)" in section and "- **GPU tests**: stopped" in section
    assert "not run to the end: stopped by the time budget (285 s)" in md and "passed" not in md
    assert "## Not run: cut by the time budget\n\nnothing" in record_markdown([], {}, None, "x", "today")


def test_the_gpu_record_says_which_fastapi_design_served_more():
    one, shared = DESIGNS
    assert "WORKERS" in DESIGNS[one] and DESIGNS[one]["WORKERS"] == stage_env("gpu")["WORKERS"]  # the lab's default
    md = record_markdown([], {}, None, "x", "today", designs={one: 650.0, shared: 520.0})
    assert f"| {shared} | 520.0 |" in md and f"Served more here: **{one}** (1.25×)." in md


def test_the_gpu_record_names_the_commit_it_ran(tmp_path):
    """The H200's record of 2026-11-28 did not say which commit ran; a record now does, where git can say."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
    short = checkout_commit().split()[0]  # 7 digits or more; git's own --short grew to 8 in CI's clone
    assert len(short) >= 7 and head.startswith(short)
    assert "`make gpu-check`, today, commit abc1234 with local changes." in record_markdown(
        [], {}, None, "x", "today", commit="abc1234 with local changes")
    assert checkout_commit(tmp_path) is None  # a copy of the tree without .git
    assert "commit unknown (no git here)" in record_markdown([], {}, None, "x", "today")
