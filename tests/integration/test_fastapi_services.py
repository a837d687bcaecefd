"""Both FastAPI stages as real uvicorn processes: answers, agreement, errors, load, schema fuzzing."""

import asyncio
import io
import os
import subprocess
import sys

import pytest
from PIL import Image

from fastapi_service import b64, metric_samples, predict, predict_concurrently, running
from photos import coffee, png_header, variants
from servelab.core.artifacts import load_manifest

KINDS = ("pytorch", "onnx")
JSON = {"content-type": "application/json"}
PHOTOS = variants()  # encoding them takes a while: once per module


@pytest.fixture(scope="module")
def services(artifacts, tmp_path_factory):
    logs = tmp_path_factory.mktemp("fastapi-logs")
    with running("pytorch", artifacts, logs) as pt, running("onnx", artifacts, logs) as onnx:
        yield {"pytorch": pt, "onnx": onnx}


@pytest.fixture(scope="module")
def singles(services, client) -> dict[str, dict[str, dict]]:
    """Each service's answer to each photo variant, one request at a time."""
    return {kind: {name: predict(client, url, data) for name, data in PHOTOS.items()}
            for kind, url in services.items()}


def _encode(im: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


def _animated_gif() -> bytes:
    first = coffee()
    return _encode(first, "GIF", save_all=True, append_images=[first.transpose(Image.Transpose.FLIP_LEFT_RIGHT)])


def test_real_photo_gets_a_sensible_class(services, client):
    for kind, url in services.items():
        response = client.post(f"{url}/predict", json={"image": b64(PHOTOS["jpeg"])})
        assert response.status_code == 200, (kind, response.text)
        body = response.json()
        assert body["prediction"] == "Dairy product" and body["probability"] > 0.5, (kind, body)
        assert body["model"] == "food11-efficientnet-lite0-zeroshot"
        timing = dict(part.strip().split(";", 1) for part in response.headers["server-timing"].split(","))
        ms = {name: float(value.removeprefix("dur=")) for name, value in timing.items() if value.startswith("dur=")}
        assert set(ms) == {"queue", "preprocess", "infer", "total"}
        assert 0 < ms["queue"] + ms["preprocess"] + ms["infer"] <= ms["total"]
        assert timing["batch"] == "desc=1"


def test_pytorch_and_onnx_agree(singles):
    for name in PHOTOS:
        pt, onnx = singles["pytorch"][name], singles["onnx"][name]
        assert pt["prediction"] == onnx["prediction"], name
        assert abs(pt["probability"] - onnx["probability"]) <= 1e-3, (name, pt, onnx)


@pytest.mark.parametrize("kind", KINDS)
def test_batch_equals_single_requests(kind, services, client, singles):
    names = list(PHOTOS)
    response = client.post(f"{services[kind]}/predict/batch", json={"images": [b64(PHOTOS[n]) for n in names]})
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert len(predictions) == len(names)
    for name, got in zip(names, predictions):
        want = singles[kind][name]
        assert got["prediction"] == want["prediction"], name
        assert abs(got["probability"] - want["probability"]) <= 1e-4, name


def _cases() -> list[tuple]:
    jpeg, small = PHOTOS["jpeg"], b64(_encode(coffee().resize((64, 48)), "JPEG"))
    twenty_mb = b'{"image": "' + b"A" * (20 * 1024 * 1024) + b'"}'
    one_pixel = _encode(Image.new("RGB", (1, 1), "red"), "PNG")
    return [
        # name, method, path, request keyword arguments, status, words in the detail
        ("not_json", "POST", "/predict", {"content": b"this is not JSON", "headers": JSON}, 422, "JSON decode error"),
        ("json_array", "POST", "/predict", {"json": [small]}, 422, "valid dictionary"),
        ("missing_field", "POST", "/predict", {"json": {"picture": small}}, 422, "body.image: Field required"),
        ("wrong_type", "POST", "/predict", {"json": {"image": 42}}, 422, "body.image: Input should be a valid string"),
        ("null_image", "POST", "/predict", {"json": {"image": None}}, 422, "valid string"),
        ("form_encoded", "POST", "/predict", {"data": {"image": small}}, 422, "must be JSON"),
        ("empty_string", "POST", "/predict", {"json": {"image": ""}}, 400, "empty"),
        ("whitespace_only", "POST", "/predict", {"json": {"image": " \n "}}, 400, "empty"),
        ("invalid_base64", "POST", "/predict", {"json": {"image": "not base64!!"}}, 400, "not valid base64"),
        ("base64_of_text", "POST", "/predict", {"json": {"image": b64(b"a shopping list, not a photo")}}, 400, "not an image"),
        ("truncated_jpeg", "POST", "/predict", {"json": {"image": b64(jpeg[:2000])}}, 400, "truncated or corrupt"),
        ("one_pixel", "POST", "/predict", {"json": {"image": b64(one_pixel)}}, 400, "at least 16 pixels"),
        ("bomb_100k_x_100k", "POST", "/predict", {"json": {"image": b64(png_header(100_000, 100_000))}}, 413, "the image declares"),
        ("body_20_mb", "POST", "/predict", {"content": twenty_mb, "headers": JSON}, 413, "MAX_BODY_BYTES"),
        ("batch_empty", "POST", "/predict/batch", {"json": {"images": []}}, 400, "no images"),
        ("batch_not_a_list", "POST", "/predict/batch", {"json": {"images": small}}, 422, "valid list"),
        ("batch_too_many", "POST", "/predict/batch", {"json": {"images": [small] * 17}}, 413, "MAX_REQUEST_IMAGES"),
        ("batch_one_bad_image", "POST", "/predict/batch", {"json": {"images": [small, "nope!", small]}}, 400, "image 1:"),
        ("wrong_method", "GET", "/predict", {}, 405, "Method Not Allowed"),
        ("unknown_route", "POST", "/classify", {"json": {"image": small}}, 404, "Not Found"),
        # Valid but awkward images are answered (RGB conversion, 16-bit scaling, the first frame).
        ("grey16_png", "POST", "/predict", {"json": {"image": b64(PHOTOS["grey16_png"])}}, 200, None),
        ("cmyk_jpeg", "POST", "/predict", {"json": {"image": b64(PHOTOS["cmyk_jpeg"])}}, 200, None),
        ("rgba_png", "POST", "/predict", {"json": {"image": b64(PHOTOS["rgba_png"])}}, 200, None),
        ("animated_gif", "POST", "/predict", {"json": {"image": b64(_animated_gif())}}, 200, None),
        ("data_url", "POST", "/predict", {"json": {"image": "data:image/jpeg;base64," + small}}, 200, None),
    ]


CASES = _cases()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_inputs_get_their_documented_status(kind, case, services, client):
    name, method, path, kwargs, status, words = case
    url = services[kind]
    response = client.request(method, url + path, **kwargs)
    assert response.status_code == status, (name, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    if status == 200:
        assert body["prediction"] and 0 <= body["probability"] <= 1
    else:
        assert isinstance(body["detail"], str) and words in body["detail"], body
    # The service keeps answering.
    assert client.get(f"{url}/ready").status_code == 200
    assert predict(client, url, PHOTOS["jpeg"])["prediction"] == "Dairy product"


def test_animated_gif_is_classified_by_its_first_frame(services, client):
    still = _encode(coffee(), "GIF")
    for url in services.values():
        assert predict(client, url, _animated_gif()) == predict(client, url, still)


@pytest.mark.parametrize("kind", KINDS)
def test_ready_says_what_runs(kind, services, client, artifacts):
    body = client.get(f"{services[kind]}/ready").json()
    manifest = load_manifest(artifacts.manifest)
    assert body["status"] == "ready" and body["service"] == {"pytorch": "fastapi_pt", "onnx": "fastapi_onnx"}[kind]
    assert body["model"] == manifest.name and body["manifest_sha256"] == manifest.sha256()
    assert body["stand_in"] is True and body["description"] == manifest.description
    assert body["source"] == manifest.source
    if kind == "onnx":
        assert body["runtime"]["providers"] == ["CPUExecutionProvider"]
    else:
        assert body["runtime"]["device"] == "cpu"
    assert body["runtime"]["on_gpu"] is False
    assert body["preprocess_mode"] == "threads"  # PREPROCESS_PROCESSES=auto on the CPU: the model needs the cores
    # No settings: batch what waits behind busy instances, no request held back for one.
    assert body["batching"] == {"enabled": True, "max_batch_size": 16, "batch_timeout_ms": 0.0, "max_request_images": 16,
                                "max_queue_requests": 0, "max_queue_delay_ms": 0}
    assert client.get(f"{services[kind]}/health").json() == {"status": "ok"}
    assert "swagger" in client.get(f"{services[kind]}/docs").text.lower()


@pytest.mark.parametrize("kind", KINDS)
def test_metrics_count_requests_by_route_and_status(kind, services, client):
    url = services[kind]
    client.post(f"{url}/predict", json={"image": "not base64!!"})
    predict(client, url, PHOTOS["png"])
    text = client.get(f"{url}/metrics").text
    requests = metric_samples(text, "servelab_http_requests_total")
    assert requests['{method="POST",route="/predict",status="200"}'] >= 1
    assert requests['{method="POST",route="/predict",status="400"}'] >= 1
    for histogram in ("servelab_http_request_duration_seconds", "servelab_queue_seconds", "servelab_batch_size",
                      "servelab_preprocess_seconds", "servelab_inference_seconds"):
        assert sum(metric_samples(text, histogram + "_count").values()) >= 1, histogram


@pytest.mark.parametrize("kind", KINDS)
def test_requests_at_concurrency_32_each_get_their_own_answer(kind, services, singles):
    """Eight rounds of 32 at once: every answer is the one that photo gets alone, none swapped or lost."""
    names = list(PHOTOS)
    order = [names[i % len(names)] for i in range(256)]
    responses = asyncio.run(predict_concurrently(services[kind], [PHOTOS[n] for n in order], 32))
    errors = [r.status_code for r in responses if r.status_code != 200]
    assert not errors
    for name, response in zip(order, responses):
        assert response.json()["prediction"] == singles[kind][name]["prediction"], name


@pytest.mark.parametrize("kind", KINDS)
def test_schemathesis_finds_no_server_error(kind, services, tmp_path):
    # Every check but positive_data_acceptance: a schema cannot say "base64 of a real photo", so
    # schema-valid random text is rightly refused with 400.
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", f"{services[kind]}/openapi.json", "--checks", "all",
           "--exclude-checks", "positive_data_acceptance", "--max-examples", "40", "--seed", "1",
           "--generation-database", "none", "--request-timeout", "30", "--no-color",
           # The admin route too, past its guard (tests/unit/test_admin_guard.py checks the guard itself).
           "-H", f"Authorization: Bearer {os.environ['ADMIN_TOKEN']}"]
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
