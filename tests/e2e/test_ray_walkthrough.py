"""``10_ray`` and its steps (servelab.run.walkthrough.walk_ray), run locally without Ray.

The Ray Serve app (branch ray-serve) answers the FastAPI stages' API and names its stage in
``/ready``. Its **stand-in** here: a real ``servelab serve fastapi-onnx`` behind a small HTTP front on
127.0.0.1 that passes every request through and adds the stage to ``/ready`` — so the notebook's
waiting, measuring and report run for real, against real servers, with a few requests each.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from notebook_harness import execute
from servelab.core.procs import free_port
from servelab.run.walkthrough.walk_ray import STAGE_KEY, deployed_stage


@contextmanager
def stage_front(backend: str, stage: str | None, status: int = 200) -> Iterator[str]:
    """STAND-IN for Ray Serve's proxy: forwards to ``backend``; ``/ready`` answers ``status`` and, unless
    ``stage`` is None, names it. Yields its URL; stopped on exit."""
    target = urlsplit(backend)

    class Front(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                conn.request(self.command, self.path, body=body or None,
                             headers={k: v for k, v in self.headers.items() if k.lower() in ("content-type", "content-length")})
                answer = conn.getresponse()
                payload, code = answer.read(), answer.status
                headers = [(k, v) for k, v in answer.getheaders() if k.lower() in ("content-type", "server-timing")]
            finally:
                conn.close()
            if self.path == "/ready":
                ready = json.loads(payload)
                if stage is not None:
                    ready[STAGE_KEY] = stage
                payload, code = json.dumps(ready).encode(), status
                headers = [("Content-Type", "application/json")]
            self.send_response(code)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _forward

        def log_message(self, *args: object) -> None:  # quiet: the load generator sends hundreds
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Front)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def onnx_service(fastapi_onnx: str) -> str:
    """The session's ``servelab serve fastapi-onnx`` (tests/e2e/conftest.py): these tests only send it requests."""
    return fastapi_onnx


def test_deployed_stage_says_what_the_app_runs_or_why_not(onnx_service: str) -> None:
    with stage_front(onnx_service, "ray-2") as url:
        assert deployed_stage(url) == "ray-2"
    with stage_front(onnx_service, None) as url:
        assert deployed_stage(url) == "ready, but its /ready names no 'stage'"
    with stage_front(onnx_service, "ray-2", status=503) as url:
        assert deployed_stage(url) == "not ready (HTTP 503)"
    assert deployed_stage(f"http://127.0.0.1:{free_port()}") == "no answer (ConnectionError)"


CHECK_RAY = """
from servelab.measure.records import read_records

records = read_records(Path(RESULTS) / "records.jsonl")
assert records == lab.runs
assert [(r.stage, r.load.label()) for r in records] == [
    ("ray-1", "sequential"), ("ray-1", "concurrency 3"), ("ray-2", "sequential"), ("ray-2", "concurrency 3")]
for r in records:
    assert r.stats.successes == r.load.requests and r.stats.error_count == 0, r.stats
    assert r.breakdown.source == "server-timing" and r.stand_in
assert list(lab.by_stage) == ["ray-1", "ray-2"] and ray_4 == ray_dyn == ray_auto == []
assert (Path(RESULTS) / "ray" / "report.md").exists()
"""


def test_ray_notebook_measures_the_stages_it_is_given(onnx_service: str, tmp_path: Path) -> None:
    results = tmp_path / "results"
    with stage_front(onnx_service, "ray-1") as one, stage_front(onnx_service, "ray-2") as two:
        nb = execute(
            "10_ray", tmp_path / "kernel", tmp_path,
            parameters={"RAY_URL": one, "STAGE_URLS": {"ray-2": two}, "FLASK_URL": "", "STAGES": ["ray-1", "ray-2"],
                        "WAIT_S": 30, "SEQUENTIAL_REQUESTS": 4, "SENDERS": 3, "CONCURRENT_REQUESTS": 9, "WARMUP": 1,
                        "RESULTS": str(results)},
            prologue="%colors nocolor", epilogue=CHECK_RAY, timeout=120,
        )
    text = "\n".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))
    assert text.count("Little's law: 3 requests in flight") == 2
    assert [line for line in text.splitlines() if line.startswith("skipped:")] == [
        "skipped: ray-4 is not in STAGES", "skipped: ray-dyn is not in STAGES", "skipped: ray-auto is not in STAGES"]
    assert "| ray-2 |" in "".join(str(out.get("data", {}).get("text/markdown", "")) for cell in nb.cells
                                  for out in cell.get("outputs", []))


def test_a_stage_that_is_not_deployed_fails_in_time(onnx_service: str, tmp_path: Path) -> None:
    from servelab.core.paths import DEFAULT_IMAGE
    from servelab.run.walkthrough.walk_ray import RayWalkthrough

    with stage_front(onnx_service, "ray-1") as url:
        lab = RayWalkthrough(url, DEFAULT_IMAGE, tmp_path / "records.jsonl", wait_s=0.5, stages=["ray-2"])
        with pytest.raises(TimeoutError, match="Ray Serve stage ray-2 at .*; still: ray-1"):
            lab.wait_for_stage("ray-2")
    assert not (tmp_path / "records.jsonl").exists()
