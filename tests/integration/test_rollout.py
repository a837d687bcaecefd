"""A new model version rolled out under load, on real servers on 127.0.0.1: the FastAPI service's
``POST /admin/reload`` while 16 senders keep sending (no request fails, the versions switch once and in
order), a reload it refuses (the old version keeps serving), and the load generator's rollout record."""

import shutil
from pathlib import Path

import httpx
import onnx
import pytest

from fastapi_service import metric_samples, running
from servelab.core.paths import DEFAULT_IMAGE
from servelab.measure.loadgen import rollout
from servelab.measure.targets import FastAPITarget
from servelab.servers.fastapi.admin import reload
from servelab.servers.fastapi.runtimes import model_version

PHOTO = DEFAULT_IMAGE.read_bytes()


def reexported(model_dir: Path, dest: Path, tag: str) -> Path:
    """``model_dir`` copied to ``dest`` with its ONNX model saved again, tagged: the same weights as a new
    file, so a new version."""
    shutil.copytree(model_dir, dest)
    graph = onnx.load(dest / "food11.onnx")
    graph.metadata_props.add(key="servelab_release", value=tag)
    onnx.save(graph, dest / "food11.onnx")
    return dest


@pytest.fixture(scope="module")
def versions(model, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("versions")
    return {"v1": model.manifest.parent, "v2": reexported(model.manifest.parent, root / "v2", "2"),
            "v3": reexported(model.manifest.parent, root / "v3", "3")}


@pytest.fixture(scope="module")
def onnx_service(model, tmp_path_factory):
    with running("onnx", model, tmp_path_factory.mktemp("rollout-logs")) as url:
        yield url


def served_version(client: httpx.Client, url: str) -> str:
    response = client.post(f"{url}/predict", json={"image": __import__("base64").b64encode(PHOTO).decode()})
    assert response.status_code == 200, response.text
    assert response.headers["x-model-version"] == response.json()["model_version"]
    return response.json()["model_version"]


def test_a_reload_under_16_senders_fails_nothing_and_switches_version_once(onnx_service, versions, client):
    v1, v2 = (model_version(versions[v] / "food11.onnx") for v in ("v1", "v2"))
    assert v1 != v2
    assert client.get(f"{onnx_service}/ready").json()["model_version"] == v1
    record = rollout(FastAPITarget(onnx_service, PHOTO), lambda: reload(onnx_service, versions["v2"]),
                     stage="fastapi-onnx", at_s=1.5, seconds=4.0)
    r = record.rollout
    assert r.error is None and r.result["model_version"] == v2 and r.result["previous_version"] == v1, r
    assert r.failed == 0 and record.stats.errors == {} and r.shed == 0, r
    assert r.old_versions == [v1] and r.new_version == v2, r
    # Requests that arrived before the swap may finish on v1 after a v2 answer; none sent after one does.
    assert r.old_sent_after_new == 0, r
    assert 0 < r.first_new_s and r.switch_after_done_s < 1.0, r  # visible within a second of the swap
    assert all(x > 0 for x in r.requests) and r.p99_before_ms and r.p99_during_ms and r.p99_after_ms, r
    per = record.per_request
    assert set(per.version) == {v1, v2} and set(per.outcome) == {"ok"}
    done = [sent + latency / 1000 for sent, latency in zip(per.sent_s, per.latency_ms)]
    first_v2 = min(t for t, v in zip(done, per.version) if v == v2)
    assert all(v == v2 for s, v in zip(per.sent_s, per.version) if s > first_v2)
    assert record.timeline.events["rollout_started"] == pytest.approx(r.trigger_s, abs=0.01)
    assert client.get(f"{onnx_service}/ready").json()["model_version"] == v2
    metrics = client.get(f"{onnx_service}/metrics").text
    answered = metric_samples(metrics, "servelab_model_version_requests_total")
    assert answered[f'{{model_version="{v1}"}}'] > 0 and answered[f'{{model_version="{v2}"}}'] > 0, answered
    serving = {k: v for k, v in metric_samples(metrics, "servelab_model_serving").items()}
    assert sorted(serving.values()) == [0.0, 1.0] and any(v2 in k and v == 1.0 for k, v in serving.items()), serving
    assert metric_samples(metrics, "servelab_model_reloads_total")['{outcome="swapped"}'] == 1


@pytest.mark.parametrize("body, status, words", [
    ({"model_dir": "/nonexistent/models"}, 404, "no model manifest"),
    ({"variant": "int8"}, 404, "no food11_u8_int8.onnx"),
    ("broken", 422, "cannot load the model"),
    ({"model_dir": 7, "extra": 1}, 422, "extra"),
])
def test_a_refused_reload_says_why_and_the_old_version_keeps_serving(onnx_service, versions, client, tmp_path,
                                                                     body, status, words):
    if body == "broken":  # a manifest and a truncated ONNX file: found, but it cannot load
        broken = shutil.copytree(versions["v3"], tmp_path / "broken")
        (broken / "food11.onnx").write_bytes((broken / "food11.onnx").read_bytes()[:5000])
        body = {"model_dir": str(broken)}
    before = served_version(client, onnx_service)
    response = client.post(f"{onnx_service}/admin/reload", json=body)
    assert response.status_code == status and words in response.text, response.text
    assert served_version(client, onnx_service) == before
    assert client.get(f"{onnx_service}/ready").json()["model_version"] == before


def test_a_reload_of_the_same_bytes_is_the_same_version(onnx_service, client):
    before = served_version(client, onnx_service)
    response = client.post(f"{onnx_service}/admin/reload", json={})
    assert response.status_code == 200, response.text
    assert response.json()["model_version"] == response.json()["previous_version"] == before
    assert served_version(client, onnx_service) == before
