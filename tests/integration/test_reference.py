"""The simple app the benchmark measures fastapi-onnx against answers as the model does and refuses bad input,
and the limit's parts are measured from real runs (``servelab.measure.limit.machine_limit``; that the benchmark
and the lab both take their limit from it: tests/e2e/test_benchmark.py)."""

from contextlib import ExitStack

import httpx
import numpy as np

from servelab.core.artifacts import load_manifest
from servelab.core.inference import onnx_session
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.postprocess import top1
from servelab.core.preprocess import preprocess
from servelab.core.procs import cpu_count
from servelab.measure.limit import BATCHES, machine_limit, thread_counts
from servelab.run.reference import serve_simple_app
from tests.fastapi_service import b64


def test_the_simple_app_answers_as_the_model_and_the_limits_parts_are_measured(model, tmp_path):
    manifest = load_manifest(model.manifest)
    sess = onnx_session(model.onnx, ["CPUExecutionProvider"])
    x = preprocess(DEFAULT_IMAGE.read_bytes(), **manifest.preprocess_kwargs())[None]
    [expected] = top1(sess.run(None, {sess.get_inputs()[0].name: x})[0], manifest.classes)
    with ExitStack() as stack:
        url, _ = serve_simple_app(stack, tmp_path, model.manifest.parent)
        answer = httpx.post(f"{url}/predict", json={"image": b64(DEFAULT_IMAGE.read_bytes())}, timeout=30).json()
        assert (answer["prediction"], answer["class_index"]) == (expected.label, expected.index)
        assert np.isclose(answer["probability"], expected.probability, atol=1e-5)
        bad = httpx.post(f"{url}/predict", json={"image": "not base64!"}, timeout=30)
        assert bad.status_code == 400 and "base64" in bad.json()["detail"]
        noop = serve_simple_app(stack, tmp_path, model.manifest.parent, workers=cpu_count())
        limit = machine_limit(model.manifest.parent, DEFAULT_IMAGE, noop, "cpu", seconds=0.2, concurrency=2)
    # Every part keeps every core working: one session per core at one thread, one at all of them; a
    # preprocessing process per core; a no-op server process per core.
    assert [(p.batch, p.threads, p.sessions) for p in limit.model] == [
        (b, t, limit.cores // t) for t in thread_counts(limit.cores) for b in BATCHES]
    assert all(p.images_per_s > 0 and p.cpu_ms_per_image > 0 for p in limit.model)
    assert limit.preprocess.processes == limit.http.processes == limit.cores == cpu_count()
    assert limit.preprocess.per_s > 0 and limit.preprocess.cpu_ms > 0 and limit.http.per_s > 0 and limit.http.cpu_ms > 0
    assert limit.binds == "the CPUs" and limit.gpu_images_per_s is None
