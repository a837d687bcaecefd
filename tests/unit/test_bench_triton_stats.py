"""Triton statistics diffed across a run, on snapshots stored from a real tritonserver 2.51.

The snapshots in tests/data were taken (HTTP JSON, and gRPC ``as_json``) just before and 0.5 s after
240 requests at concurrency 8 from ``servelab load`` to a Python-backend model with dynamic
batching that sleeps 10 ms per execution. The expected figures below were worked out by hand
from those files.
"""

import json
from pathlib import Path

import pytest

from servelab.measure.triton_stats import stats_delta

DATA = Path(__file__).parents[1] / "data"


def _snapshots(kind: str) -> tuple[dict, dict]:
    pair = json.loads((DATA / f"triton_stats_{kind}.json").read_text())
    return pair["before"], pair["after"]


@pytest.mark.parametrize("kind", ["http", "grpc"])  # gRPC's JSON writes 64-bit counters as strings
def test_delta_of_a_real_run(kind: str) -> None:
    before, after = _snapshots(kind)
    b = stats_delta(before, after, "food_classifier")
    assert b.source == "triton-stats"
    assert b.server_requests == 240 and b.server_failures == 0
    assert b.batch_sizes == {1: 6, 2: 12, 3: 9, 4: 19, 5: 7, 6: 6, 7: 4, 8: 1}
    assert sum(size * n for size, n in b.batch_sizes.items()) == 240  # every request in one batch
    assert b.mean_batch_size == pytest.approx(240 / 64)
    assert b.queue_ms == pytest.approx(11.2178, abs=1e-3)
    assert b.parts_ms["compute_infer"] == pytest.approx(11.1306, abs=1e-3)
    assert b.service_ms == pytest.approx(0.0963 + 11.1306 + 1.2276, abs=1e-3)


def test_no_change_gives_an_empty_delta() -> None:
    before, _ = _snapshots("http")
    b = stats_delta(before, before, "food_classifier")
    assert b.server_requests == 0 and b.batch_sizes == {} and b.queue_ms is None and b.mean_batch_size is None


def test_wrong_model_or_a_reload_is_refused() -> None:
    before, after = _snapshots("http")
    with pytest.raises(ValueError, match="exactly one version"):
        stats_delta(before, after, "food_classifier_onnx")
    with pytest.raises(ValueError, match="went backwards"):
        stats_delta(after, before, "food_classifier")
