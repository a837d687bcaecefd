"""GourmetGram through Flask's test client: every route and every error path.

The backends here are real HTTP servers on 127.0.0.1 that answer what a test tells them to (a
prediction, an error status, nothing for too long) or a port nobody listens on; the services
themselves are exercised in test_flask_e2e.py.
"""

import base64
import io
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from PIL import Image

from photos import variants
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.preprocess import preprocess
from servelab.core.procs import free_port
from servelab.core.settings import Settings
from servelab.servers.gourmetgram.web import create_app

TRITON_BACKENDS = ("triton", "triton_onnx", "triton_ensemble")
ALL_BACKENDS = ("fastapi", *TRITON_BACKENDS)
TIMEOUT_S = 0.3
PHOTOS = variants()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, fake: "FakeBackend") -> None:
        self.fake, self.sockets = fake, []
        super().__init__(address, _Handler)

    def get_request(self):
        sock, address = super().get_request()
        self.sockets.append(sock)  # closed on stop(), as a dying process would
        return sock, address


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so the app's pool reuses connections

    def do_POST(self) -> None:
        fake = self.server.fake
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        fake.received.append((self.path, dict(self.headers), body))
        time.sleep(fake.delay)
        payload = fake.body if isinstance(fake.body, bytes) else json.dumps(fake.body).encode()
        try:
            self.send_response(fake.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:  # the test already stopped us
            pass

    def do_GET(self) -> None:
        body = self.server.fake.about.get(self.path)
        payload = json.dumps(body or {"error": "not here"}).encode()
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


class FakeBackend:
    """A real HTTP server standing in for a model service; each test says what it answers."""

    def __init__(self, port: int = 0) -> None:
        self.status, self.body, self.delay = 200, {}, 0.0
        self.about: dict[str, dict] = {}  # GET path -> JSON body (/ready, a Triton model's /config)
        self.received: list[tuple[str, dict, bytes]] = []
        self.server = _Server(("127.0.0.1", port), self)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def answer(self, status: int, body, delay: float = 0.0) -> None:
        self.status, self.body, self.delay = status, body, delay

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        for sock in self.server.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


@pytest.fixture
def fake():
    server = FakeBackend()
    yield server
    server.stop()


def make_app(backend: str, port: int, **settings):
    url = f"127.0.0.1:{port}"
    # A generous timeout, so a busy machine cannot turn a success into a 504; the timeout test sets its own.
    settings = {"backend_timeout": 5.0, **settings}
    app = create_app(Settings(backend=backend, fastapi_server_url=f"http://{url}", triton_server_url=url, **settings))
    return app.test_client()


def prediction(backend: str, label: str = "Dessert", probability: float = 0.75) -> dict:
    """What a healthy backend of this kind answers."""
    if backend == "fastapi":
        return {"prediction": label, "probability": probability}
    if backend == "triton_onnx":
        from servelab.core.labels import CLASSES

        logits = np.full(len(CLASSES), -5.0)
        logits[CLASSES.index(label)] = 5.0
        return {"model_name": "food_classifier_onnx", "model_version": "1",
                "outputs": [{"name": "output", "datatype": "FP32", "shape": [1, len(CLASSES)],
                             "data": logits.tolist()}]}
    return {"model_name": "food_classifier", "model_version": "1",
            "outputs": [{"name": "FOOD_LABEL", "datatype": "BYTES", "shape": [1, 1], "data": [label]},
                        {"name": "PROBABILITY", "datatype": "FP32", "shape": [1, 1], "data": [probability]}]}


def upload(client, data: bytes, name: str = "dish.jpg"):
    return client.post("/classify", data={"photo": (io.BytesIO(data), name)}, content_type="multipart/form-data")


def text_of(response, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>(.*?)</', response.text, re.S)
    assert match, f"no #{element_id} in the page"
    return " ".join(match.group(1).split())


def error_of(response) -> str:
    match = re.search(r'id="error".*?<p>(.*?)</p>', response.text, re.S)
    assert match, "no error message in the page"
    assert "Traceback" not in response.text
    return " ".join(match.group(1).split())


# --- routes -----------------------------------------------------------------------------------


def test_index_has_the_form_the_backend_and_the_sample():
    client = make_app("fastapi", free_port())
    response = client.get("/")
    assert response.status_code == 200
    assert 'enctype="multipart/form-data"' in response.text and 'name="photo"' in response.text
    assert f'name="sample" value="{DEFAULT_IMAGE.name}"' in response.text
    assert "fastapi" in response.text and "/predict" in response.text
    assert "<script" not in response.text  # works without JavaScript
    assert "http" not in re.sub(r"<code>.*?</code>", "", response.text)  # nothing from other sites
    assert "default-src 'self'" in response.headers["Content-Security-Policy"]


def test_stylesheet_is_served_by_the_app():
    response = make_app("fastapi", free_port()).get("/static/gourmetgram.css")
    assert response.status_code == 200 and response.mimetype == "text/css"
    assert b"@import" not in response.data and b"url(" not in response.data


def test_health_does_not_need_the_backend():
    response = make_app("triton", free_port()).get("/health")
    assert response.status_code == 200
    assert response.json == {"status": "ok", "backend": "triton"}


def test_sample_photos_are_served_by_name_only():
    client = make_app("fastapi", free_port())
    response = client.get(f"/samples/{DEFAULT_IMAGE.name}")
    assert response.status_code == 200 and response.data == DEFAULT_IMAGE.read_bytes()
    assert client.get("/samples/..%2F..%2Fpyproject.toml").status_code == 404
    assert client.get("/samples/missing.jpg").status_code == 404


def test_unknown_route_and_wrong_method():
    client = make_app("fastapi", free_port())
    assert client.get("/nope").status_code == 404
    response = client.get("/classify")
    assert response.status_code == 405 and "POST" in response.headers["Allow"]
    assert "405" in error_of(response)


def test_unexpected_errors_show_no_traceback():
    app = make_app("fastapi", free_port()).application

    def boom():
        raise RuntimeError("secret internals")

    app.add_url_rule("/boom", view_func=boom)
    response = app.test_client().get("/boom")
    assert response.status_code == 500
    assert "secret internals" not in response.text and "Something went wrong" in error_of(response)


# --- the happy path, per backend ---------------------------------------------------------------


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_upload_shows_label_probability_backend_and_time(fake, backend, tmp_path):
    fake.answer(200, prediction(backend, "Dessert", 0.75))
    client = make_app(backend, fake.port, model_dir=tmp_path)  # no manifest: default preprocessing
    photo = DEFAULT_IMAGE.read_bytes()
    response = upload(client, photo)
    assert response.status_code == 200, response.text
    assert text_of(response, "label") == "Dessert"
    if backend != "triton_onnx":  # there the app computes the softmax itself
        assert text_of(response, "probability") == "75.0 %"
    assert float(text_of(response, "elapsed").removesuffix(" ms")) > 0
    assert "stand-in" not in response.text  # nobody said so
    assert 'src="data:image/jpeg;base64,' in response.text  # the photo that was classified
    path, headers, body = fake.received[-1]
    if backend == "fastapi":
        assert path == "/predict" and base64.b64decode(json.loads(body)["image"]) == photo
        return
    model = {"triton": "food_classifier", "triton_onnx": "food_classifier_onnx",
             "triton_ensemble": "food_classifier_ensemble"}[backend]
    assert path == f"/v2/models/{model}/infer"
    header_len = int(headers["Inference-Header-Content-Length"])
    request, binary = json.loads(body[:header_len]), body[header_len:]
    (tensor,) = request["inputs"]
    if backend == "triton_onnx":
        assert (tensor["name"], tensor["datatype"], tensor["shape"]) == ("input", "FP32", [1, 3, 224, 224])
        sent = np.frombuffer(binary, np.float32).reshape(1, 3, 224, 224)
        np.testing.assert_array_equal(sent[0], preprocess(photo))
    else:
        assert (tensor["name"], tensor["datatype"], tensor["shape"]) == ("INPUT_IMAGE", "BYTES", [1, 1])
        size = int.from_bytes(binary[:4], "little")  # BYTES elements are length-prefixed
        assert base64.b64decode(binary[4:4 + size]) == photo


def test_triton_onnx_softmax_and_stand_in_note_from_the_manifest(fake, artifacts):
    fake.answer(200, prediction("triton_onnx", "Soup"))
    response = upload(make_app("triton_onnx", fake.port, model_dir=artifacts.manifest.parent),
                      DEFAULT_IMAGE.read_bytes())
    assert response.status_code == 200
    assert text_of(response, "label") == "Soup"
    expected = np.exp(5.0) / (np.exp(5.0) + 10 * np.exp(-5.0))
    assert text_of(response, "probability") == f"{expected * 100:.1f} %"
    assert text_of(response, "model") == "food_classifier_onnx (version 1)"
    assert "zero-shot stand-in" in text_of(response, "stand-in")


def test_fastapi_stage_and_stand_in_come_from_ready(fake):
    fake.answer(200, {**prediction("fastapi"), "model": "food11-efficientnet-lite0-zeroshot"})
    fake.about["/ready"] = {"status": "ready", "service": "fastapi_onnx", "stand_in": True,
                            "runtime": {"runtime": "onnxruntime", "providers": ["CPUExecutionProvider"]}}
    response = upload(make_app("fastapi", fake.port), DEFAULT_IMAGE.read_bytes())
    assert response.status_code == 200
    assert text_of(response, "stage") == "fastapi_onnx (CPUExecutionProvider)"
    assert text_of(response, "model") == "food11-efficientnet-lite0-zeroshot"
    assert "zero-shot stand-in" in text_of(response, "stand-in")


def test_triton_stage_comes_from_the_model_config(fake, tmp_path):
    fake.answer(200, prediction("triton"))
    fake.about["/v2/models/food_classifier/config"] = {"name": "food_classifier", "parameters": {
        "servelab_stage": {"string_value": "pt-dyn (cpu)"}, "servelab_stand_in": {"string_value": "LOCAL STAND-IN: x"}}}
    response = upload(make_app("triton", fake.port, model_dir=tmp_path), DEFAULT_IMAGE.read_bytes())
    assert response.status_code == 200
    assert text_of(response, "stage") == "pt-dyn (cpu)"
    assert text_of(response, "model") == "food_classifier (version 1)"
    assert "LOCAL STAND-IN: x" in response.text
    assert 'id="stand-in"' not in response.text  # no manifest here, so nobody said


def test_the_sample_photo_can_be_classified(fake):
    fake.answer(200, prediction("fastapi", "Bread", 0.5))
    client = make_app("fastapi", fake.port)
    response = client.post("/classify", data={"sample": DEFAULT_IMAGE.name})
    assert response.status_code == 200 and text_of(response, "label") == "Bread"
    assert base64.b64decode(json.loads(fake.received[-1][2])["image"]) == DEFAULT_IMAGE.read_bytes()


@pytest.mark.parametrize("name", sorted(PHOTOS))
def test_every_kind_of_real_photo_is_accepted(fake, name):
    fake.answer(200, prediction("fastapi"))
    assert upload(make_app("fastapi", fake.port), PHOTOS[name]).status_code == 200


def test_threads_share_one_client(fake):
    fake.answer(200, prediction("fastapi"), delay=0.05)
    client = make_app("fastapi", fake.port)
    photo = DEFAULT_IMAGE.read_bytes()
    statuses = []
    threads = [threading.Thread(target=lambda: statuses.append(upload(client, photo).status_code)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * 8
    opened = len(fake.server.sockets)
    for _ in range(5):
        assert upload(client, photo).status_code == 200
    assert len(fake.server.sockets) == opened  # kept-alive connections reused, not one per request


# --- bad uploads ---------------------------------------------------------------------------------


def test_no_file(fake):
    client = make_app("fastapi", fake.port)
    response = client.post("/classify", data={}, content_type="multipart/form-data")
    assert response.status_code == 400 and "no photo was sent" in error_of(response)
    response = client.post("/classify", data={"photo": (io.BytesIO(b""), "")}, content_type="multipart/form-data")
    assert response.status_code == 400 and "no photo was sent" in error_of(response)
    assert fake.received == []


def test_empty_file(fake):
    response = upload(make_app("fastapi", fake.port), b"")
    assert response.status_code == 400 and "empty" in error_of(response)
    assert fake.received == []


@pytest.mark.parametrize("data", [b"hello, this is text", b"%PDF-1.4 not a photo", DEFAULT_IMAGE.read_bytes()[:2000]],
                         ids=["text", "pdf", "truncated-jpeg"])
def test_not_an_image(fake, data):
    response = upload(make_app("fastapi", fake.port), data, "dish.jpg")
    assert response.status_code == 400 and "cannot be classified" in error_of(response)
    assert fake.received == []


def test_unknown_sample(fake):
    response = make_app("fastapi", fake.port).post("/classify", data={"sample": "../../etc/passwd"})
    assert response.status_code == 400 and "no sample photo" in error_of(response)


def test_too_large_file(fake):
    photo = DEFAULT_IMAGE.read_bytes()
    client = make_app("fastapi", fake.port, max_upload_bytes=len(photo) - 1)
    response = upload(client, photo)
    assert response.status_code == 413 and "upload limit" in error_of(response)
    assert upload(client, photo * 50).status_code == 413  # far past the limit: refused while still arriving
    assert fake.received == []


def test_too_many_pixels(fake):
    response = upload(make_app("fastapi", fake.port, max_image_pixels=100_000), DEFAULT_IMAGE.read_bytes())
    assert response.status_code == 413 and "too large" in error_of(response)
    assert fake.received == []


def test_uploads_never_touch_the_disk(fake, monkeypatch):
    import tempfile

    def refuse(*args, **kwargs):
        raise AssertionError("a temporary file was created")

    # Werkzeug spools uploads past 500 KB to tempfile.TemporaryFile unless told otherwise.
    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    fake.answer(200, prediction("fastapi"))
    photo = io.BytesIO()
    Image.effect_noise((1200, 1200), 60).convert("RGB").save(photo, "PNG")
    assert len(photo.getvalue()) > 600_000
    assert upload(make_app("fastapi", fake.port), photo.getvalue(), "../../evil.png").status_code == 200


# --- backend failures ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_backend_down(backend):
    response = upload(make_app(backend, free_port()), DEFAULT_IMAGE.read_bytes())
    assert response.status_code == 502
    assert "cannot be reached" in error_of(response)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_backend_timeout(fake, backend):
    fake.answer(200, prediction(backend), delay=TIMEOUT_S * 5)
    response = upload(make_app(backend, fake.port, backend_timeout=TIMEOUT_S), DEFAULT_IMAGE.read_bytes())
    # 504, not the backend's 200: the app gave up before the backend answered, and says after how long.
    assert response.status_code == 504
    assert f"did not answer within {TIMEOUT_S:g} s" in error_of(response)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize(
    ("status", "shown", "message"),
    [
        (503, 503, "not ready or is overloaded (it broke)"),
        (429, 503, "not ready or is overloaded (it broke)"),
        (500, 502, "failed (HTTP 500: it broke)"),
        (404, 502, "failed (HTTP 404: it broke)"),
    ],
)
def test_backend_errors(fake, backend, status, shown, message):
    fake.answer(status, {"detail": "it broke"} if backend == "fastapi" else {"error": "it broke"})
    response = upload(make_app(backend, fake.port), DEFAULT_IMAGE.read_bytes())
    assert response.status_code == shown
    assert message in error_of(response)


@pytest.mark.parametrize("status", [400, 413])
def test_fastapi_image_complaints_reach_the_user(fake, status):
    fake.answer(status, {"detail": "the image is too small"})
    response = upload(make_app("fastapi", fake.port), DEFAULT_IMAGE.read_bytes())
    assert response.status_code == status
    assert "could not use this image: the image is too small" in error_of(response)


def test_fastapi_422_is_our_fault_not_the_users(fake):
    fake.answer(422, {"detail": "invalid request: body.image: Field required"})
    response = upload(make_app("fastapi", fake.port), DEFAULT_IMAGE.read_bytes())
    assert response.status_code == 502
    assert "failed (HTTP 422: invalid request" in error_of(response)


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_triton_400_is_a_configuration_problem(fake, backend):
    fake.answer(400, {"error": "unexpected inference input 'INPUT_IMAGE'"})
    response = upload(make_app(backend, fake.port), DEFAULT_IMAGE.read_bytes())
    assert response.status_code == 502
    assert "failed (HTTP 400: unexpected inference input" in error_of(response)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("body", [b"<html>oops</html>", {"something": "else"}], ids=["html", "json"])
def test_backend_answer_that_is_not_a_prediction(fake, backend, body):
    fake.answer(200, body)
    response = upload(make_app(backend, fake.port), DEFAULT_IMAGE.read_bytes())
    assert response.status_code == 502
    assert "not a prediction" in error_of(response)


def test_long_backend_errors_are_shortened(fake):
    fake.answer(500, {"detail": "x" * 5000})
    message = error_of(upload(make_app("fastapi", fake.port), DEFAULT_IMAGE.read_bytes()))
    assert 300 < len(message) < 600


@pytest.mark.parametrize("backend", ["fastapi", "triton"])
def test_recovers_when_the_backend_comes_back(backend):
    photo = DEFAULT_IMAGE.read_bytes()
    server = FakeBackend()
    port = server.port
    client = make_app(backend, port)
    try:
        server.answer(200, prediction(backend, "Soup"))
        assert upload(client, photo).status_code == 200  # leaves a kept-alive connection in the pool
        server.stop()
        server = FakeBackend(port)  # restarted at once: the pooled connection is dead, not reused
        server.answer(200, prediction(backend, "Soup"))
        assert upload(client, photo).status_code == 200
        server.stop()
        assert upload(client, photo).status_code == 502
        server = FakeBackend(port)  # back, on the same port
        server.answer(200, prediction(backend, "Noodles/Pasta"))
        response = upload(client, photo)
        assert response.status_code == 200 and text_of(response, "label") == "Noodles/Pasta"
    finally:
        server.stop()
