"""The ONNX model variants behind fastapi_onnx (ONNX_VARIANT): the uint8 path equals the float path,
the services answer and refuse bad input, /ready says which variant runs."""

import asyncio
import base64
from contextlib import contextmanager

import httpx
import numpy as np
import pytest

from fastapi_service import b64, predict, running
from photos import variants
from servelab.paths import DEFAULT_IMAGE
from servelab.serving.backends import load_backend
from servelab.serving.pipeline import Pipeline
from servelab.settings import get_settings

PHOTOS = variants()


@contextmanager
def pipeline_for(variant: str):
    """The service's own pipeline (preprocess + model) for ``variant``, in-process."""
    settings = get_settings().model_copy(update={"onnx_variant": variant})
    pipeline = Pipeline(load_backend("onnx", settings), settings)
    try:
        yield pipeline
    finally:
        asyncio.run(pipeline.close())


def _logits(variant: str) -> dict[str, np.ndarray]:
    with pipeline_for(variant) as pipeline:
        return {name: pipeline.backend.infer(pipeline.prepare(b64(data))[None])[0] for name, data in PHOTOS.items()}


def test_the_uint8_path_equals_the_float_path_on_real_photos(u8_model):
    float_path, uint8_path = _logits("fp32"), _logits("u8")
    for name in PHOTOS:
        np.testing.assert_allclose(uint8_path[name], float_path[name], atol=1e-4, err_msg=name)


def test_the_pipeline_feeds_uint8_crops_to_a_uint8_model(u8_model):
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
def client():
    with httpx.Client(timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def fp32_answers(artifacts, client, tmp_path_factory) -> dict[str, dict]:
    with running("onnx", artifacts, tmp_path_factory.mktemp("fp32")) as url:
        return {name: predict(client, url, data) for name, data in PHOTOS.items()}


def test_the_u8_service_answers_as_fp32_and_refuses_bad_input(u8_model, artifacts, fp32_answers, client, tmp_path):
    with running("onnx", artifacts, tmp_path, onnx_variant="u8") as url:
        for name, data in PHOTOS.items():
            got, want = predict(client, url, data), fp32_answers[name]
            assert got["prediction"] == want["prediction"], name
            assert abs(got["probability"] - want["probability"]) <= 1e-4, name
        for body, status, words in BAD_INPUTS:
            response = client.post(f"{url}/predict", json=body)
            assert response.status_code == status and words in response.json()["detail"], response.text
        batch = client.post(f"{url}/predict/batch", json={"images": [b64(PHOTOS["jpeg"]), "nope!"]})
        assert batch.status_code == 400 and "image 1:" in batch.json()["detail"]
        ready = client.get(f"{url}/ready").json()
    assert ready["variant"]["name"] == "u8" and ready["variant"]["file"] == "food11_u8.onnx"
    assert ready["variant"]["size_bytes"] == u8_model.stat().st_size
    assert "uint8" in ready["variant"]["input"] and ready["variant"]["precision"]
    log = next(tmp_path.glob("*.log")).read_text()
    assert "variant u8: food11_u8.onnx" in log


def test_the_setting_names_every_variant():
    from typing import get_args

    from servelab.models.variants import VARIANTS
    from servelab.settings import ServeSettings

    assert get_args(ServeSettings.model_fields["onnx_variant"].annotation) == tuple(VARIANTS)
