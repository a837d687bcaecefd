"""The download path against a real HTTP server on 127.0.0.1 serving a locally made state_dict."""

import http.server
import io
import threading

import pytest
import torch

from servelab.core.artifacts import ModelSource, build_artifacts, load_manifest
from servelab.core.fetch import FetchError, git_blob_sha1
from servelab.core.models.mobilenet_v2 import food11_mobilenet_v2


class _Handler(http.server.BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, bytes, int | None]] = {}

    def do_GET(self):
        status, body, announced = self.routes.get(self.path, (404, b"not found", None))
        self.send_response(status)
        self.send_header("Content-Length", str(announced or len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def weights() -> bytes:
    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.save(food11_mobilenet_v2().state_dict(), buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def server(weights):
    _Handler.routes = {
        "/food11.pth": (200, weights, None),
        "/truncated.pth": (200, weights[: len(weights) // 2], len(weights)),
        "/error.pth": (503, b"unavailable", None),
    }
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_right_hash_builds_mobilenet_artifacts(server, weights, tmp_path):
    source = ModelSource.parse(f"{server}/food11.pth", git_blob_sha1(weights))
    manifest = build_artifacts(source, tmp_path, staging=None, log=lambda *_: None)
    assert manifest.architecture == "mobilenet_v2" and not manifest.stand_in
    assert load_manifest(tmp_path / "food11.json") == manifest
    # The rebuilt state_dict holds the downloaded weights.
    saved = torch.load(tmp_path / "food11.pt", weights_only=True)
    original = torch.load(io.BytesIO(weights), weights_only=True)
    assert torch.equal(saved["classifier.1.weight"], original["classifier.1.weight"])


@pytest.mark.parametrize(
    "path, expected",
    [("/food11.pth", "git blob SHA-1"), ("/truncated.pth", "IncompleteRead"), ("/error.pth", "HTTP 503")],
    ids=["wrong_hash", "truncated", "http_error"],
)
def test_failures_are_clear_and_leave_nothing(server, weights, tmp_path, path, expected):
    pinned = git_blob_sha1(weights) if path != "/food11.pth" else "0" * 40
    url = f"{server}{path}"
    with pytest.raises(FetchError) as err:
        build_artifacts(ModelSource.parse(url, pinned), tmp_path, staging=None, log=lambda *_: None)
    message = str(err.value)
    assert url in message and pinned in message and expected in message
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert leftovers == []


def test_second_build_is_skipped(server, weights, tmp_path):
    source = ModelSource.parse(f"{server}/food11.pth", git_blob_sha1(weights))
    build_artifacts(source, tmp_path, staging=None, log=lambda *_: None)
    lines = []
    build_artifacts(source, tmp_path, staging=None, log=lines.append)
    assert lines == [f"models: up to date (food11-mobilenet_v2) in {tmp_path}"]
