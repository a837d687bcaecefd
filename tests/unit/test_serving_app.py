"""Both FastAPI stages in process: each app file's own app (``build_app`` in fastapi_pt/app.py and
fastapi_onnx/app.py) under FastAPI's ``TestClient``, with the real backend on the offline stand-in model. The same answers, errors and endpoints that
tests/integration/test_fastapi_services.py checks through uvicorn, without a server process."""

import time
from importlib import import_module

import pytest
from fastapi.testclient import TestClient

from fastapi_service import admin, b64, metric_samples
from photos import png_header, variants
from servelab.core.artifacts import ArtifactPaths, load_manifest
from servelab.core.settings import get_settings

PHOTOS = variants()
SERVICES = {"pytorch": "fastapi_pt", "onnx": "fastapi_onnx"}


@pytest.fixture(scope="module", params=list(SERVICES))
def client(request, model: ArtifactPaths):
    """The app, started (model loaded) and warmed up, as uvicorn would run it."""
    build_app = import_module(f"{SERVICES[request.param]}.app").build_app
    with TestClient(build_app(get_settings()), raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 120
        while (ready := client.get("/ready")).status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.status_code == 200, ready.text
        client.kind = request.param
        yield client


def test_a_real_photo_gets_a_sensible_class_and_its_timing(client):
    response = client.post("/predict", json={"image": b64(PHOTOS["jpeg"])})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["prediction"] == "Dairy product" and body["probability"] > 0.5, body
    assert body["model"] == "food11-efficientnet-lite0-zeroshot"
    timing = dict(part.strip().split(";", 1) for part in response.headers["server-timing"].split(","))
    assert {"queue", "preprocess", "infer", "total"} <= set(timing) and timing["batch"] == "desc=1"


def test_a_batch_answers_each_image_as_a_single_request_does(client):
    names = ["jpeg", "png", "rgba_png", "cmyk_jpeg"]
    singles = [client.post("/predict", json={"image": b64(PHOTOS[n])}).json() for n in names]
    response = client.post("/predict/batch", json={"images": [b64(PHOTOS[n]) for n in names]})
    assert response.status_code == 200, response.text
    for name, got, want in zip(names, response.json()["predictions"], singles):
        assert got["prediction"] == want["prediction"], name
        assert abs(got["probability"] - want["probability"]) <= 1e-4, name


@pytest.mark.parametrize("method, path, kwargs, status, words", [
    ("POST", "/predict", {"content": b"this is not JSON", "headers": {"content-type": "application/json"}}, 422,
     "JSON decode error"),
    ("POST", "/predict", {"json": {"picture": "x"}}, 422, "body.image: Field required"),
    ("POST", "/predict", {"json": {"image": ""}}, 400, "empty"),
    ("POST", "/predict", {"json": {"image": "not base64!!"}}, 400, "not valid base64"),
    ("POST", "/predict", {"json": {"image": b64(b"a shopping list, not a photo")}}, 400, "not an image"),
    ("POST", "/predict", {"json": {"image": b64(png_header(100_000, 100_000))}}, 413, "the image declares"),
    ("POST", "/predict/batch", {"json": {"images": []}}, 400, "no images"),
    ("POST", "/predict/batch", {"json": {"images": ["x"] * 17}}, 413, "MAX_REQUEST_IMAGES"),
    ("GET", "/predict", {}, 405, "Method Not Allowed"),
], ids=["not_json", "missing_field", "empty_string", "invalid_base64", "base64_of_text", "bomb", "batch_empty",
        "batch_too_many", "wrong_method"])
def test_bad_input_gets_a_clear_4xx_and_the_service_keeps_answering(client, method, path, kwargs, status, words):
    response = client.request(method, path, **kwargs)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert words in response.json()["detail"], response.json()
    assert client.post("/predict", json={"image": b64(PHOTOS["jpeg"])}).json()["prediction"] == "Dairy product"


def test_ready_and_health_say_what_runs(client, model):
    manifest = load_manifest(model.manifest)
    body = client.get("/ready").json()
    assert body["status"] == "ready" and body["service"] == SERVICES[client.kind]
    assert body["model"] == manifest.name and body["manifest_sha256"] == manifest.sha256()
    assert body["stand_in"] is True and body["runtime"]["on_gpu"] is False
    # Ray's fields are left out off Ray (10_ray reads a missing `stage` so); other empty ones are null.
    assert "stage" not in body and "placement" not in body and body["workers"] is None
    # With no settings: batch what waits behind busy instances, no request held back for one.
    assert body["batching"]["enabled"] is True and body["batching"]["batch_timeout_ms"] == 0
    assert client.get("/health").json() == {"status": "ok"}


def test_metrics_count_requests_by_route_and_status(client):
    client.post("/predict", json={"image": "not base64!!"})
    client.post("/predict", json={"image": b64(PHOTOS["png"])})
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    requests = metric_samples(response.text, "servelab_http_requests_total")
    assert requests['{method="POST",route="/predict",status="200"}'] >= 1
    assert requests['{method="POST",route="/predict",status="400"}'] >= 1
    assert sum(metric_samples(response.text, "servelab_inference_seconds_count").values()) >= 1


def test_every_prediction_says_which_model_version_answered(client, model):
    from servelab.servers.fastapi.runtimes import model_version

    served = model.manifest.parent / ("food11.onnx" if client.kind == "onnx" else "food11.pt")
    single = client.post("/predict", json={"image": b64(PHOTOS["jpeg"])})
    batch = client.post("/predict/batch", json={"images": [b64(PHOTOS["jpeg"])] * 2})
    for response in (single, batch):
        assert response.json()["model_version"] == response.headers["x-model-version"] == model_version(served)
    assert client.get("/ready").json()["model_version"] == model_version(served)


def test_a_reload_the_service_cannot_do_is_refused_and_it_keeps_answering(client, tmp_path):
    version = client.get("/ready").json()["model_version"]
    refused = {"model_dir": str(tmp_path)}  # an empty folder: no manifest
    assert client.post("/admin/reload", json=refused, headers=admin()).status_code == 404
    if client.kind == "pytorch":  # a variant is an ONNX file
        response = client.post("/admin/reload", json={"variant": "int8"}, headers=admin())
        assert response.status_code == 422 and "applies to fastapi_onnx" in response.text, response.text
    again = client.post("/admin/reload", json={}, headers=admin())
    assert again.status_code == 200 and again.json()["model_version"] == version, again.text
    assert client.post("/predict", json={"image": b64(PHOTOS["jpeg"])}).json()["model_version"] == version
