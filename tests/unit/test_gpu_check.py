"""What `make gpu-check`'s GPU tests (tests/integration/test_gpu.py) rely on, held on the CPU: the agreement
checks send their 64 photos in batches the model takes, and a variant's precision has one name."""

import numpy as np
import pytest

from model_batches import infer_in_batches
from servelab.core.artifacts import load_manifest
from servelab.core.inference import OnnxClassifier
from servelab.core.photos import evaluation_set
from servelab.core.preprocess import preprocess
from servelab.core.settings import get_settings
from servelab.core.variants.build import PRECISION
from servelab.measure.ceiling import PRECISIONS
from servelab.servers.fastapi.runtimes import CPU, max_infer_batch

PHOTOS = 64  # as many as test_gpu's agreement checks


@pytest.fixture(scope="module")
def floats(artifacts) -> np.ndarray:
    kwargs = load_manifest(artifacts.manifest).preprocess_kwargs()
    return np.stack([preprocess(p.read_bytes(), **kwargs) for p in evaluation_set()[:PHOTOS]])


def test_the_agreement_check_sends_batches_the_model_takes(artifacts, floats):
    """Under buckets (what `auto` picks on a GPU) one call of 64 is refused, as on the H200 on 2026-11-28;
    in batches of the service's largest, all 64 are answered, each session keeps its one shape, and the
    answers are those of the model taking all 64 at once."""
    largest = max_infer_batch(get_settings())
    assert largest < PHOTOS  # more photos than one call takes
    buckets = OnnxClassifier(artifacts.onnx, providers=[CPU], shape_policy="buckets", max_batch=largest)
    with pytest.raises(ValueError, match=f"a batch of {PHOTOS} images is larger than the largest"):
        buckets.infer(floats)
    want = OnnxClassifier(artifacts.onnx, providers=[CPU]).infer(floats)  # policy off: all 64 in one call
    for n in (PHOTOS, largest + 3):  # the second ends on a smaller batch, padded up to its bucket
        got = infer_in_batches(buckets.infer, floats[:n], largest)
        assert got.shape == want[:n].shape and np.array_equal(got.argmax(1), want[:n].argmax(1))
        assert np.allclose(got, want[:n], atol=1e-4)
    counts = {c["session_batch"]: c for c in buckets.session_counts()}
    assert counts[str(largest)]["runs"] == PHOTOS // largest + 1 and counts["4"]["runs"] == 1, counts
    assert all(c["shape_changes"] == 0 for c in counts.values()), counts


def test_batches_keep_every_row_in_order_and_refuse_a_size_below_one():
    x = np.arange(10)[:, None]
    calls = []

    def echo(batch):
        calls.append(len(batch))
        return batch * 2

    assert np.array_equal(infer_in_batches(echo, x, 4), x * 2) and calls == [4, 4, 2]
    with pytest.raises(ValueError, match="at least 1"):
        infer_in_batches(echo, x, 0)


def test_a_precision_has_one_name_in_the_variants_the_service_and_the_ceiling():
    """fp32, int8, fp16: what food11_variants.json, /ready's `variant.precision` and the ceiling call them
    (the H200 run's fp16 test expected `float16`, a dtype's name, and failed)."""
    assert PRECISION["fp16"] == "fp16" and PRECISION["fp32"] == "fp32"
    assert set(PRECISION.values()) == {p for pair in PRECISIONS.values() for p in pair}


def test_every_figure_of_the_h200_index_is_in_the_file_it_names():
    """docs/records/gpu-h200-2026-11-28.toml indexes what the docs quote of that run: each figure is written, as
    quoted, in the file its step names, and the record names the commit that ran."""
    import tomllib

    from servelab.core.paths import REPO_ROOT

    records = REPO_ROOT / "docs" / "records"
    index = tomllib.loads((records / "gpu-h200-2026-11-28.toml").read_text(encoding="utf-8"))
    steps = {name: step for name, step in index.items() if isinstance(step, dict)}
    assert steps and index["commit"] == "2c4a03a" and index["date"] == "2026-11-28"
    for name, step in steps.items():
        text = (records / step["log"]).read_text(encoding="utf-8")
        missing = [f for f in step["figures"] if f"{f['value']:g}" not in text]
        assert step["figures"] and not missing, (name, step["log"], missing)
    record = (records / index["record"]).read_text(encoding="utf-8")
    assert "main at commit 2c4a03a" in record and "2026-11-28" in record
