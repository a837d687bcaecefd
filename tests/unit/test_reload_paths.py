"""A ``model_dir`` no file system path can be (a NUL, a lone surrogate: found by tests/integration/test_fuzz.py)
is refused with a 422 that says why, not a 500 from resolving it; the service goes on answering."""

import json
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from fastapi_onnx.app import build_app
from fastapi_service import admin
from servelab.core.artifacts import ArtifactPaths
from servelab.core.settings import get_settings
from servelab.servers.fastapi.schemas import ReloadRequest

UNUSABLE = {"a NUL": "models\x00/../etc", "a lone surrogate": "\ud800models"}


@pytest.mark.parametrize("path", list(UNUSABLE.values()), ids=list(UNUSABLE))
def test_the_schema_refuses_a_path_no_file_system_holds(path: str):
    with pytest.raises(ValidationError, match="a path"):
        ReloadRequest(model_dir=path)
    assert ReloadRequest(model_dir="models/v2").model_dir.name == "v2"


@pytest.fixture(scope="module")
def service(model: ArtifactPaths) -> Iterator[TestClient]:
    with TestClient(build_app(get_settings()), raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 120
        while client.get("/ready").status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        yield client


@pytest.mark.parametrize("path", list(UNUSABLE.values()), ids=list(UNUSABLE))
def test_the_reload_route_answers_422_with_the_reason(service: TestClient, path: str):
    body = json.dumps({"model_dir": path}).encode()  # \ud800 escaped, as a client that sends one does
    answer = service.post("/admin/reload", content=body, headers={**admin(), "Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert "model_dir" in answer.json()["detail"] and "a path" in answer.json()["detail"]
    assert service.post("/admin/reload", json={"model_dir": "/"}, headers=admin()).status_code == 403
    assert service.get("/ready").status_code == 200
