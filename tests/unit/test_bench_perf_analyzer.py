"""perf_analyzer interop without running it: --input-data from a real photo, its command line, and
its CSV as servelab records (the CSVs in tests/data follow its ``-f --verbose-csv`` format:
microseconds, rows sorted by throughput). The real binary against a real Triton:
test_perf_analyzer_real.py.
"""

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from servelab.core.artifacts import load_manifest
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.preprocess import crop_pixels, preprocess
from servelab.measure.perf_analyzer import (
    Windows,
    input_data,
    perf_analyzer_command,
    records_from_csv,
    write_input_data,
)
from servelab.measure.records import Load

DATA = Path(__file__).parents[1] / "data"
PHOTO = DEFAULT_IMAGE.read_bytes()


def test_bytes_input_data_is_the_photo_in_base64() -> None:
    data = input_data(PHOTO, "bytes")
    [entry] = data["data"]
    [element] = entry["INPUT_IMAGE"]
    assert base64.b64decode(element) == PHOTO


def test_tensor_input_data_is_the_real_preprocessed_photo(artifacts) -> None:
    data = input_data(PHOTO, "tensor", artifacts.manifest)
    raw = base64.b64decode(data["data"][0]["input"]["b64"])
    tensor = np.frombuffer(raw, dtype="<f4").reshape(3, 224, 224)
    m = load_manifest(artifacts.manifest)
    np.testing.assert_array_equal(tensor, preprocess(PHOTO, resize=m.resize, crop=m.crop, mean=m.mean, std=m.std))


def test_uint8_input_data_is_the_real_photos_crop(artifacts) -> None:
    data = input_data(PHOTO, "uint8", artifacts.manifest)
    raw = base64.b64decode(data["data"][0]["image"]["b64"])
    pixels = np.frombuffer(raw, dtype=np.uint8).reshape(224, 224, 3)
    np.testing.assert_array_equal(pixels, crop_pixels(PHOTO, **load_manifest(artifacts.manifest).crop_kwargs()))


def test_write_input_data(tmp_path: Path) -> None:
    path = write_input_data(tmp_path / "sub" / "input.json", PHOTO, "bytes")
    assert json.loads(path.read_text()) == input_data(PHOTO, "bytes")


def test_concurrency_csv_becomes_records() -> None:
    target = {"kind": "triton", "model": "food_classifier"}
    records = records_from_csv((DATA / "perf_analyzer_concurrency.csv").read_text(), stage="pt-1", target=target)
    assert [r.load.label() for r in records] == ["sequential", "concurrency 8", "concurrency 16"]
    one, eight, _ = records
    assert one.tool == "perf_analyzer" and one.stage == "pt-1"
    # Microseconds become milliseconds; inferences/s become requests/s (batch 1).
    assert one.stats.latency.p50_ms == pytest.approx(18.62)
    assert one.stats.latency.p99_ms == pytest.approx(21.48)
    assert one.stats.latency.mean_ms == pytest.approx(18.69)
    assert one.stats.throughput_rps == pytest.approx(51.5)
    assert eight.breakdown.queue_ms == pytest.approx(132.4)
    assert eight.breakdown.service_ms == pytest.approx(0.170 + 18.120 + 0.115)
    assert eight.breakdown.queue_share > 0.85
    assert eight.stats.successes is None and eight.stats.errors == {}  # the CSV does not say


def test_request_rate_csv_with_batches() -> None:
    [r] = records_from_csv((DATA / "perf_analyzer_rate.csv").read_text(), stage="onnx-dyn", target={},
                           batch=2, arrivals="poisson")
    assert r.load.mode == "open" and r.load.rate == 120 and r.load.arrivals == "poisson"
    assert r.stats.items_per_s == pytest.approx(119.8)
    assert r.stats.throughput_rps == pytest.approx(59.9)
    assert r.stats.latency.p95_ms == pytest.approx(11.9)


def test_command_for_each_load(tmp_path: Path) -> None:
    common = dict(url="127.0.0.1:8001", model="food_classifier_onnx", protocol="grpc", batch=1,
                  input_data=tmp_path / "in.json", csv_path=tmp_path / "out.csv")
    cmd = perf_analyzer_command(load=Load.closed(8, requests=2000, warmup=500), windows=Windows(20, 6), **common)
    assert cmd[:3] == ["perf_analyzer", "-m", "food_classifier_onnx"]
    for flag, value in [("-u", "127.0.0.1:8001"), ("-i", "grpc"), ("--concurrency-range", "8"),
                        ("--measurement-mode", "count_windows"), ("--measurement-request-count", "667"),
                        ("--stability-percentage", "20"), ("--max-trials", "6"),
                        ("-f", str(tmp_path / "out.csv")), ("--input-data", str(tmp_path / "in.json"))]:
        assert cmd[cmd.index(flag) + 1] == value
    # Neither flag exists in perf_analyzer 2.50 or measures right there: no warm-up flag, no --request-count.
    assert "--warmup-request-count" not in cmd and "--request-count" not in cmd
    cmd = perf_analyzer_command(load=Load.open(120, "poisson", duration_s=5), **common)
    assert cmd[cmd.index("--request-rate-range") + 1] == "120"
    assert cmd[cmd.index("--request-distribution") + 1] == "poisson"
    assert cmd[cmd.index("--measurement-interval") + 1] == "5000"


def test_count_windows_hold_a_third_of_the_run_at_least_one_request_per_sender() -> None:
    windows = Windows()
    assert windows.requests_per_window(Load.sequential(3)) == 3  # three slow requests of 16 images: kept short
    assert windows.requests_per_window(Load.closed(8, requests=24)) == 8
    assert windows.requests_per_window(Load.closed(16, requests=24)) == 16
    assert windows.requests_per_window(Load.closed(8, requests=2000)) == 667


def test_time_windows_follow_the_plan_s_seconds(tmp_path: Path) -> None:
    """The lab's windows in seconds: perf_analyzer measures in time windows of the same length as servelab's client,
    whatever the load's own requests or duration; each stretched to hold a few requests at the rate servelab
    measured (a window in which none completed fails perf_analyzer)."""
    common = dict(url="127.0.0.1:8001", model="food_classifier_onnx", protocol="http", batch=16,
                  input_data=tmp_path / "in.json", csv_path=tmp_path / "out.csv")
    windows = Windows(stability_pct=1000, max_trials=3, window_s=1.5)
    for load in (Load.closed(4, None, duration_s=4.5), Load.sequential(20)):
        cmd = perf_analyzer_command(load=load, windows=windows, **common)
        assert cmd[cmd.index("--measurement-interval") + 1] == "1500" and "--measurement-mode" not in cmd
        assert cmd[cmd.index("--max-trials") + 1] == "3"
    # An open loop is its rate times its seconds: count windows of a third of its requests, as before.
    cmd = perf_analyzer_command(load=Load.open(30, "poisson", requests=90), windows=windows, **common)
    assert cmd[cmd.index("--measurement-request-count") + 1] == "30" and "--measurement-interval" not in cmd
    assert windows.fitted(100.0) == windows and windows.fitted(None) == windows  # 150 requests a window
    assert windows.fitted(2.0).window_s == Windows.MIN_REQUESTS / 2.0  # slow 16-image requests: longer windows
    assert Windows().fitted(2.0) == Windows()  # count windows are sized by requests already
    assert not windows.tested and Windows(20, 9, 2.0).tested
