"""Only whoever holds ADMIN_TOKEN changes what a FastAPI service serves, and only to a model under MODEL_ROOT."""

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fastapi_onnx.app import build_app
from fastapi_service import admin
from servelab.core.artifacts import ArtifactPaths
from servelab.core.settings import get_settings


def started(settings) -> Iterator[TestClient]:
    with TestClient(build_app(settings), raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 120
        while client.get("/ready").status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        yield client


@pytest.fixture(scope="module")
def guarded(model: ArtifactPaths) -> Iterator[TestClient]:
    """The service as the tests' servers run: a token, and MODEL_ROOT the session's temporary folders."""
    yield from started(get_settings())


@pytest.fixture(scope="module")
def tokenless(model: ArtifactPaths) -> Iterator[TestClient]:
    yield from started(get_settings().model_copy(update={"admin_token": ""}))


def test_without_a_token_set_the_admin_routes_are_not_there(tokenless):
    for headers in ({}, admin(), {"Authorization": "Bearer "}):
        answer = tokenless.post("/admin/reload", json={}, headers=headers)
        assert answer.status_code == 404, answer.text
    assert "/admin/reload" not in tokenless.get("/openapi.json").json()["paths"]
    assert tokenless.get("/admin/reload").status_code == 404


def test_with_a_token_set_a_method_no_admin_route_takes_is_405(guarded):
    for method in ("GET", "PUT", "DELETE"):
        assert guarded.request(method, "/admin/reload").status_code == 405


@pytest.mark.parametrize("headers, status", [
    ({}, 401),
    ({"Authorization": "Basic dXNlcjpwYXNz"}, 401),
    ({"Authorization": "Bearer"}, 401),
    ({"Authorization": "Bearer not-the-token"}, 403),
    ({"Authorization": f"Bearer {os.environ.get('ADMIN_TOKEN', '')}x"}, 403),
])
def test_a_reload_without_the_right_token_is_refused_before_its_body_is_read(guarded, headers, status):
    before = guarded.get("/ready").json()["model_version"]
    answer = guarded.post("/admin/reload", content=b"{not json", headers=headers)  # 400/422 had the body been read
    assert answer.status_code == status and answer.json()["detail"], answer.text
    assert (answer.headers.get("www-authenticate") == "Bearer") == (status == 401)
    assert guarded.get("/ready").json()["model_version"] == before
    assert "/admin/reload" in guarded.get("/openapi.json").json()["paths"]  # listed where it can be used


def test_a_model_dir_outside_model_root_is_refused_and_nothing_loads(guarded, model, tmp_path_factory):
    root = Path(os.environ["MODEL_ROOT"]).resolve()
    outside = Path("/var/tmp") / f"servelab-outside-{os.getpid()}"
    shutil.copytree(model.manifest.parent, outside)
    try:
        link = tmp_path_factory.mktemp("links") / "models"
        link.symlink_to(outside)  # under the root by its name, outside it where it leads
        before = guarded.get("/ready").json()["model_version"]
        climbed = root.joinpath(*[".."] * len(root.parts), outside.relative_to("/"))  # starts under the root
        for model_dir in (outside, link, climbed):
            answer = guarded.post("/admin/reload", json={"model_dir": str(model_dir)}, headers=admin())
            assert answer.status_code == 403, answer.text
            assert "outside MODEL_ROOT" in answer.json()["detail"] and str(outside) in answer.json()["detail"]
            assert guarded.get("/ready").json()["model_version"] == before
    finally:
        shutil.rmtree(outside)


def test_a_model_dir_under_model_root_reloads(guarded, model, tmp_path_factory):
    copy = shutil.copytree(model.manifest.parent, tmp_path_factory.mktemp("inside") / "models")
    answer = guarded.post("/admin/reload", json={"model_dir": str(copy)}, headers=admin())
    assert answer.status_code == 200, answer.text
    assert answer.json()["model_dir"] == str(copy.resolve())
