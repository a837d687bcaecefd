"""GourmetGram end to end: a real ``servelab serve flask`` process in front of the real services
(the FastAPI ONNX service, and a local tritonserver at stages pt-1, onnx-1 and ensemble), giving
the same label as asking each service directly. The services are the session's (tests/e2e/conftest.py's
``fastapi_onnx`` and ``local_triton``): these tests only send them requests, and switch Triton's stage.
"""

import base64
import html
import io
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as triton_http
from PIL import Image

from photos import variants
from servelab.core.preprocess import preprocess
from servelab.core.procs import ServerProcess, free_port
from servelab.core.settings import Settings
from servelab.servers.triton import client as triton
from servelab.servers.triton.configs import STAGES

SERVELAB = [sys.executable, "-m", "servelab"]
PHOTOS = {name: data for name, data in variants().items() if name in ("jpeg", "exif_rotated_jpeg", "png")}
# Which Triton stage serves each backend of the app.
TRITON_STAGES = {"triton": "pt-1", "triton_onnx": "onnx-1", "triton_ensemble": "ensemble"}


def gourmetgram(backend: str, log: Path, **env: str) -> ServerProcess:
    port = free_port()
    return ServerProcess([*SERVELAB, "serve", "flask", "--backend", backend, "--port", str(port)],
                         f"http://127.0.0.1:{port}/health", log, env=env, ready_timeout=60)


def classify_page(server: ServerProcess, photo: bytes) -> tuple[str, float, str]:
    """(label, probability, page) as the page shows them after uploading ``photo``."""
    base = server.ready_url.removesuffix("/health")
    response = requests.post(f"{base}/classify", files={"photo": ("dish.jpg", photo, "image/jpeg")}, timeout=60)
    assert response.status_code == 200, response.text
    label = re.search(r'id="label">(.*?)<', response.text).group(1)
    percent = re.search(r'id="probability">([\d.]+) %<', response.text).group(1)
    return html.unescape(label), float(percent) / 100, response.text


def test_fastapi_backend(fastapi_onnx, tmp_path):
    with gourmetgram("fastapi", tmp_path / "flask.log", FASTAPI_SERVER_URL=fastapi_onnx) as app:
        for name, photo in PHOTOS.items():
            direct = requests.post(f"{fastapi_onnx}/predict", json={"image": base64.b64encode(photo).decode()},
                                   timeout=60).json()
            label, probability, page = classify_page(app, photo)
            assert label == direct["prediction"], name
            assert probability == pytest.approx(direct["probability"], abs=0.0006)
        assert "fastapi_onnx" in re.search(r'id="stage">(.*?)<', page).group(1)
        assert direct["model"] in page
        # The largest photo the app accepts still fits the service's body limit once in base64.
        limit = Settings().max_upload_bytes
        pixels = np.random.default_rng(0).integers(0, 256, (1549, 1549, 3), dtype=np.uint8)  # incompressible
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "PNG")
        assert 0.95 * limit < len(buf.getvalue()) <= limit
        classify_page(app, buf.getvalue())


@pytest.mark.parametrize("backend", list(TRITON_STAGES))
def test_triton_backends(local_triton, backend, tmp_path):
    stage = TRITON_STAGES[backend]
    local_triton.apply_stage(STAGES[stage])
    client = triton_http.InferenceServerClient(local_triton.url)
    try:
        with gourmetgram(backend, tmp_path / "flask.log", TRITON_SERVER_URL=local_triton.url) as app:
            for name, photo in PHOTOS.items():
                if backend == "triton_onnx":
                    result = client.infer(STAGES[stage].triton.model, triton.tensor_inputs("http", preprocess(photo)[None]),
                                          outputs=triton.tensor_outputs("http"))
                    (direct,) = triton.tensor_predictions(result)
                else:
                    result = client.infer(STAGES[stage].triton.model, triton.image_inputs("http", [photo]),
                                          outputs=triton.label_outputs("http"))
                    (direct,) = triton.predictions(result)
                label, probability, page = classify_page(app, photo)
                assert label == direct.label, name
                assert probability == pytest.approx(direct.probability, abs=0.0006)
            assert re.search(r'id="stage">(.*?)<', page).group(1) == f"{stage} (cpu)"
            assert f"{STAGES[stage].triton.model} (version 1)" in page
            assert 'id="stand-in"' in page  # the offline model, and this host has its manifest
    finally:
        client.close()
