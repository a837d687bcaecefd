"""Honest providers: the options a provider was asked for against those its session holds, and whether a
provider's libraries load at all (TensorRT's are checked this way before ``ORT_PROVIDERS=auto`` offers it)."""

import shutil
import subprocess

import pytest

from servelab.core.inference import OnnxClassifier, library_load_error, options_not_in_force
from servelab.servers.fastapi.runtimes import CPU, CUDA, TENSORRT

# What ONNX Runtime 1.31's CUDA provider reports (get_provider_options) with only device_id set: its defaults.
CUDA_DEFAULTS = {
    "device_id": "0", "has_user_compute_stream": "0", "user_compute_stream": "0", "gpu_mem_limit": "18446744073709551615",
    "arena_extend_strategy": "kNextPowerOfTwo", "cudnn_conv_algo_search": "EXHAUSTIVE", "do_copy_in_default_stream": "1",
    "cudnn_conv_use_max_workspace": "1", "enable_cuda_graph": "0", "cudnn_conv1d_pad_to_nc1d": "0",
    "tunable_op_enable": "0", "prefer_nhwc": "0", "use_tf32": "1",
}
ASKED = {CUDA: {"cudnn_conv_algo_search": "HEURISTIC"}}


def test_a_dropped_option_is_found():
    # What a session retried with fallback providers holds: CUDA's defaults, HEURISTIC gone.
    problems = options_not_in_force(ASKED, {CUDA: CUDA_DEFAULTS, CPU: {}})
    assert problems == [(f"{CUDA}: cudnn_conv_algo_search=HEURISTIC was asked for, but the session runs with "
                         "cudnn_conv_algo_search=EXHAUSTIVE")]


def test_options_in_force_pass_booleans_and_numbers_as_onnx_runtime_writes_them():
    held = {**CUDA_DEFAULTS, "cudnn_conv_algo_search": "HEURISTIC"}
    asked = {CUDA: {"cudnn_conv_algo_search": "HEURISTIC", "do_copy_in_default_stream": True, "device_id": 0,
                    "use_tf32": "true", "enable_cuda_graph": False}}
    assert options_not_in_force(asked, {CUDA: held, CPU: {}}) == []


def test_an_option_the_session_does_not_report_is_not_taken_as_in_force():
    asked = {TENSORRT: {"trt_fp16_enable": True}}
    assert options_not_in_force(asked, {TENSORRT: {"device_id": "0"}}) == [
        f"{TENSORRT}: trt_fp16_enable=True was asked for, but the session has no trt_fp16_enable"]


def test_an_inactive_provider_is_left_to_the_inactive_provider_warning():
    assert options_not_in_force(ASKED, {CPU: {}}) == []


def test_a_real_session_reports_what_it_holds_and_the_classifier_compares_it(artifacts):
    classifier = OnnxClassifier(artifacts.onnx, providers=[(CPU, {})])
    assert classifier.provider_options == {CPU: {}}
    assert classifier.requested_options == {CPU: {}} and classifier.options_not_in_force() == []
    assert classifier.describe()["provider_options"] == {CPU: {}}


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the fake libraries")
def test_library_load_error_names_the_missing_library_a_provider_links_against(tmp_path):
    """A stand-in for libonnxruntime_providers_tensorrt.so, linked against a libnvinfer.so.10 that the
    loader finds only through the rpath of the second build."""
    tensorrt = tmp_path / "tensorrt"
    tensorrt.mkdir()
    (tmp_path / "nvinfer.c").write_text("int createInferBuilder_INTERNAL(void) { return 0; }\n")
    (tmp_path / "provider.c").write_text("int createInferBuilder_INTERNAL(void);\n"
                                         "int GetProvider(void) { return createInferBuilder_INTERNAL(); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tensorrt / "libnvinfer.so.10"), "-Wl,-soname,libnvinfer.so.10",
                    str(tmp_path / "nvinfer.c")], check=True)
    for name, rpath in (("without", []), ("with", [f"-Wl,-rpath,{tensorrt}"])):
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / f"libprovider_{name}.so"),
                        str(tmp_path / "provider.c"), "-L", str(tensorrt), "-l:libnvinfer.so.10", *rpath], check=True)
    missing = library_load_error([tmp_path / "libprovider_without.so"])
    assert missing is not None and "libnvinfer.so.10" in missing
    assert library_load_error([tmp_path / "libprovider_with.so"]) is None
    assert "libonnxruntime_providers_tensorrt.so" in library_load_error([tmp_path / "libonnxruntime_providers_tensorrt.so"])
