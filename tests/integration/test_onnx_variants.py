"""The ONNX model variants behind fastapi_onnx (ONNX_VARIANT): the uint8 path equals the float path,
the services answer and refuse bad input, /ready says which variant runs."""

import asyncio
import base64
import os
import subprocess
import sys
from contextlib import contextmanager

import numpy as np
import onnxruntime
import pytest

from fastapi_onnx.app import load
from fastapi_service import APPS, b64, predict, running
from photos import variants
from servelab.core.paths import DEFAULT_IMAGE, REPO_ROOT
from servelab.core.postprocess import top1
from servelab.core.procs import free_port
from servelab.core.settings import get_settings
from servelab.core.variants.build import PRECISION, variant_path
from servelab.servers.fastapi.pipeline import Pipeline

PHOTOS = variants()
CPU_ONLY = not any(p in onnxruntime.get_available_providers() for p in ("CUDAExecutionProvider", "TensorrtExecutionProvider"))


@contextmanager
def pipeline_for(variant: str):
    """The service's own pipeline (preprocess + model) for ``variant``, in-process."""
    settings = get_settings().model_copy(update={"onnx_variant": variant})
    pipeline = Pipeline(load(settings), settings)
    try:
        yield pipeline
    finally:
        asyncio.run(pipeline.close())


def _logits(variant: str) -> dict[str, np.ndarray]:
    with pipeline_for(variant) as pipeline:
        return {name: pipeline.backend.infer(pipeline.prepare(b64(data))[None])[0] for name, data in PHOTOS.items()}


def test_the_uint8_path_equals_the_float_path_on_real_photos(artifacts):
    float_path, uint8_path = _logits("fp32"), _logits("u8")
    for name in PHOTOS:
        np.testing.assert_allclose(uint8_path[name], float_path[name], atol=1e-4, err_msg=name)


def test_the_pipeline_feeds_uint8_crops_to_a_uint8_model(artifacts):
    with pipeline_for("u8") as pipeline:
        x = pipeline.prepare(base64.b64encode(DEFAULT_IMAGE.read_bytes()).decode())
    assert x.dtype == np.uint8 and x.shape == (224, 224, 3)


# --- the service ---

BAD_INPUTS = [  # (request body, status, words in the detail)
    ({"image": "not base64!!"}, 400, "not valid base64"),
    ({"image": b64(PHOTOS["jpeg"][:2000])}, 400, "truncated or corrupt"),
    ({"image": b64(b"a shopping list, not a photo")}, 400, "not an image"),
    ({"picture": b64(PHOTOS["jpeg"])}, 422, "Field required"),
]


@pytest.fixture(scope="module")
def fp32_answers(artifacts, client, tmp_path_factory) -> dict[str, dict]:
    with running("onnx", artifacts, tmp_path_factory.mktemp("fp32")) as url:
        return {name: predict(client, url, data) for name, data in PHOTOS.items()}


# Top-1 answers a variant may change on these photos, and how far each may move a probability.
TOLERATED = {"u8": (0, 1e-4), "int8": (1, 0.1)}


@pytest.mark.parametrize("variant", list(TOLERATED))
def test_a_variant_service_answers_as_fp32_and_refuses_bad_input(variant, artifacts, fp32_answers, client, tmp_path):
    changed, tolerance = TOLERATED[variant]
    with running("onnx", artifacts, tmp_path, onnx_variant=variant) as url:
        answers = {name: predict(client, url, data) for name, data in PHOTOS.items()}
        for body, status, words in BAD_INPUTS:
            response = client.post(f"{url}/predict", json=body)
            assert response.status_code == status and words in response.json()["detail"], response.text
        batch = client.post(f"{url}/predict/batch", json={"images": [b64(PHOTOS["jpeg"]), "nope!"]})
        assert batch.status_code == 400 and "image 1:" in batch.json()["detail"]
        ready = client.get(f"{url}/ready").json()
    assert answers["jpeg"]["prediction"] == "Dairy product"
    differ = [n for n in PHOTOS if answers[n]["prediction"] != fp32_answers[n]["prediction"]]
    assert len(differ) <= changed, differ
    for name in set(PHOTOS) - set(differ):
        assert abs(answers[name]["probability"] - fp32_answers[name]["probability"]) <= tolerance, name
    path = variant_path(artifacts.manifest.parent, variant)
    assert ready["variant"] == {"name": variant, "file": path.name, "size_bytes": path.stat().st_size,
                                "precision": PRECISION[variant], "input": "image uint8 ['batch', 224, 224, 3]"}
    log = next(tmp_path.glob("*.log")).read_text()
    assert f"variant {variant}: {path.name}" in log


@pytest.mark.skipif(not CPU_ONLY, reason="this machine has a GPU execution provider")
def test_fp16_refuses_the_cpu_unless_allowed_for_a_correctness_check(artifacts):
    cmd = [sys.executable, "-m", "uvicorn", APPS["onnx"], "--host", "127.0.0.1", "--port", str(free_port())]
    env = {**os.environ, "MODEL_DIR": str(artifacts.manifest.parent), "ONNX_VARIANT": "fp16"}
    run = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "ONNX_VARIANT=fp16 runs only on a GPU" in run.stderr
    settings = get_settings().model_copy(update={"onnx_variant": "fp16"})
    backend = load(settings, allow_gpu_only_on_cpu=True)
    pipeline = Pipeline(backend, settings)
    try:
        x = pipeline.prepare(b64(PHOTOS["jpeg"]))
    finally:
        asyncio.run(pipeline.close())
    assert backend.variant["precision"] == "fp16"
    assert top1(backend.infer(x[None]), backend.manifest.classes)[0].label == "Dairy product"

def test_the_setting_names_every_variant():
    from typing import get_args

    from servelab.core.settings import ServeSettings
    from servelab.core.variants.build import VARIANTS

    assert get_args(ServeSettings.model_fields["onnx_variant"].annotation) == tuple(VARIANTS)
