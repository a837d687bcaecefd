"""A new model version rolled out under load, on real servers on 127.0.0.1: the FastAPI service's
``POST /admin/reload`` while 16 senders keep sending (no request fails, the versions switch once and in
order), a reload it refuses (the old version keeps serving), Triton's version 2 loaded and version 1
unloaded under the same load, the load generator's rollout record, and GourmetGram's canary (a share
of its predictions to a second service, counted by route and version in its metrics)."""

import asyncio
import base64
import io
import shutil
import time
from pathlib import Path

import httpx
import onnx
import pytest

from fastapi_service import admin, metric_samples, running
from load_cases import rollout
from servelab.core.artifacts import ArtifactPaths
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.procs import free_port
from servelab.core.settings import Settings
from servelab.measure.records import Record
from servelab.measure.targets import FastAPITarget, TritonTarget
from servelab.servers.fastapi.admin import reload
from servelab.servers.fastapi.runtimes import model_version
from servelab.servers.gourmetgram.services import in_canary
from servelab.servers.gourmetgram.web import create_app
from servelab.servers.triton import server
from servelab.servers.triton.configs import get_stage
from triton_repo import make_repository

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
    response = client.post(f"{url}/predict", json={"image": base64.b64encode(PHOTO).decode()})
    assert response.status_code == 200, response.text
    assert response.headers["x-model-version"] == response.json()["model_version"]
    return response.json()["model_version"]


def assert_switched_once(record: Record, old: str, new: str) -> None:
    """No request failed; ``old`` answered before the trigger and ``new`` after; no request sent after the
    new version was ready, or after its first answer, was answered by ``old`` (one sent before may still
    finish on ``old``, after answers of ``new``)."""
    r = record.rollout
    assert r.error is None and r.failed == 0 and record.stats.errors == {} and r.shed == 0, r
    assert r.old_versions == [old] and r.new_version == new and r.old_sent_after_new == r.old_sent_after_ready == 0, r
    per = record.per_request
    assert set(per.version) == {old, new} and set(per.outcome) == {"ok"}
    done = [sent + latency / 1000 for sent, latency in zip(per.sent_s, per.latency_ms)]
    first_new = min(t for t, v in zip(done, per.version) if v == new)
    # 2 µs: sent_s and latency_ms are each rounded to 1 µs, so a rebuilt completion time may be that far off.
    assert all(v == new for sent, v in zip(per.sent_s, per.version) if sent > first_new + 2e-6)
    assert r.p99_before_ms and r.p99_during_ms and r.p99_after_ms, r
    assert record.timeline.events["rollout_started"] == pytest.approx(r.trigger_s, abs=0.01)


def test_a_reload_under_16_senders_fails_nothing_and_switches_version_once(onnx_service, versions, client):
    v1, v2 = (model_version(versions[v] / "food11.onnx") for v in ("v1", "v2"))
    assert v1 != v2
    assert client.get(f"{onnx_service}/ready").json()["model_version"] == v1
    record = rollout(FastAPITarget(onnx_service, PHOTO), lambda: reload(onnx_service, versions["v2"]),
                     stage="fastapi-onnx", at_s=1.5, seconds=3.0, after_s=1.5)
    assert_switched_once(record, v1, v2)
    r = record.rollout
    assert r.result["model_version"] == v2 and r.result["previous_version"] == v1, r
    assert 0 < r.first_new_s and r.switch_after_ready_s is not None, r
    assert all(x > 0 for x in r.requests) and r.p99_after_ms, r
    assert client.get(f"{onnx_service}/ready").json()["model_version"] == v2
    metrics = client.get(f"{onnx_service}/metrics").text
    answered = metric_samples(metrics, "servelab_model_version_requests_total")
    assert answered[f'{{model_version="{v1}"}}'] > 0 and answered[f'{{model_version="{v2}"}}'] > 0, answered
    serving = {k: v for k, v in metric_samples(metrics, "servelab_model_serving").items()}
    assert sorted(serving.values()) == [0.0, 1.0] and any(v2 in k and v == 1.0 for k, v in serving.items()), serving
    assert metric_samples(metrics, "servelab_model_reloads_total")['{outcome="swapped"}'] == 1


@pytest.mark.parametrize("body, status, words", [
    ("missing", 404, "no model manifest"),
    ("no-variant", 404, "no food11_u8_int8.onnx"),
    ("broken", 422, "cannot load the model"),
    ({"model_dir": 7, "extra": 1}, 422, "extra"),
])
def test_a_refused_reload_says_why_and_the_old_version_keeps_serving(onnx_service, versions, client, tmp_path,
                                                                     body, status, words):
    if body == "missing":  # under MODEL_ROOT (tests/conftest.py), but nothing there
        body = {"model_dir": str(tmp_path / "nonexistent")}
    elif body == "broken":  # a manifest and a truncated ONNX file: found, but it cannot load
        broken = shutil.copytree(versions["v3"], tmp_path / "broken")
        (broken / "food11.onnx").write_bytes((broken / "food11.onnx").read_bytes()[:5000])
        body = {"model_dir": str(broken)}
    elif body == "no-variant":  # a model folder without the variants (other tests may have built them in the model's)
        bare = shutil.copytree(versions["v3"], tmp_path / "bare")
        for variant in bare.glob("food11_u8*.onnx"):
            variant.unlink()
        body = {"model_dir": str(bare), "variant": "int8"}
    before = served_version(client, onnx_service)
    response = client.post(f"{onnx_service}/admin/reload", json=body, headers=admin())
    assert response.status_code == status and words in response.text, response.text
    assert served_version(client, onnx_service) == before
    assert client.get(f"{onnx_service}/ready").json()["model_version"] == before


def test_a_reload_of_the_same_bytes_is_the_same_version(onnx_service, client):
    before = served_version(client, onnx_service)
    response = client.post(f"{onnx_service}/admin/reload", json={}, headers=admin())
    assert response.status_code == 200, response.text
    assert response.json()["model_version"] == response.json()["previous_version"] == before
    assert served_version(client, onnx_service) == before


@pytest.fixture(scope="module")
def triton(model, versions, tmp_path_factory):
    """A tritonserver of its own serving food_classifier version 1 (pt-1, CPU instances)."""
    repository = make_repository(tmp_path_factory.mktemp("rollout_repository"))
    log = tmp_path_factory.mktemp("rollout-triton") / "tritonserver.log"
    with server.start_local(get_stage("pt-1"), kind="cpu", repository=repository, log=log) as local:
        yield local


def test_triton_loads_version_2_and_unloads_version_1_under_16_senders_without_a_failure(triton, versions):
    model = "food_classifier"
    assert server.model_versions(triton.url, model) == [1]
    server.stage_version(triton.repository, model, 2, versions["v2"])
    record = rollout(TritonTarget(triton.url, model, PHOTO),
                     # ready_s counted from the trigger, not from when the thread got to run
                     lambda: asyncio.to_thread(server.roll_out_version, triton.url, triton.grpc_url, model, 2,
                                               since=time.monotonic()),
                     stage="pt-1", at_s=1.5, seconds=3.0, after_s=2.0)
    assert_switched_once(record, "1", "2")
    r = record.rollout
    assert r.result["previous_versions"] == [1] and r.result["ready_s"] <= r.result["old_unloaded_s"], r
    assert r.switch_after_ready_s is not None, r
    assert server.model_versions(triton.url, model, ("READY", "UNLOADING")) == [2]


def test_triton_refuses_to_roll_out_a_version_that_is_not_staged_and_keeps_serving(triton):
    with pytest.raises(RuntimeError, match="is it staged"):
        server.roll_out_version(triton.url, triton.grpc_url, "food_classifier", 7)
    assert server.model_versions(triton.url, "food_classifier") == [2]


def test_the_canary_choice_is_seeded_and_keeps_its_share():
    picks = [in_canary(0.1, 0, n) for n in range(20000)]
    assert abs(sum(picks) / len(picks) - 0.1) < 0.01
    assert picks == [in_canary(0.1, 0, n) for n in range(20000)]  # reproducible
    assert picks != [in_canary(0.1, 1, n) for n in range(20000)]  # another seed, other requests
    assert not any(in_canary(0.0, 0, n) for n in range(1000)) and all(in_canary(1.0, 0, n) for n in range(1000))


def gourmetgram_metrics(app) -> dict[tuple[str, str, str], float]:
    """(route, model_version, outcome) -> predictions, from GourmetGram's /metrics."""
    samples = metric_samples(app.get("/metrics").text, "gourmetgram_predictions_total")
    counts = {}
    for key, value in samples.items():
        labels = dict(part.split("=") for part in key.strip("{}").split(","))
        counts[tuple(labels[name].strip('"') for name in ("route", "model_version", "outcome"))] = value
    return counts


def upload(app):
    return app.post("/classify", data={"photo": (io.BytesIO(PHOTO), "coffee.jpg")},
                    content_type="multipart/form-data")


def test_gourmetgram_sends_its_canary_share_to_the_new_version_and_counts_both(onnx_service, versions, client,
                                                                              tmp_path_factory):
    stable = client.get(f"{onnx_service}/ready").json()["model_version"]
    requests = 200
    with running("onnx", ArtifactPaths.in_dir(versions["v3"]), tmp_path_factory.mktemp("canary-logs")) as canary_url:
        canary = client.get(f"{canary_url}/ready").json()["model_version"]
        assert canary != stable
        app = create_app(Settings(backend="fastapi", fastapi_server_url=onnx_service, canary_url=canary_url,
                                  canary_share=0.1, canary_seed=3, backend_timeout=30)).test_client()
        pages = [upload(app) for _ in range(requests)]
    assert all(page.status_code == 200 and 'id="label"' in page.text for page in pages)
    counts = gourmetgram_metrics(app)
    expected = sum(in_canary(0.1, 3, n) for n in range(requests))  # the seeded rule, request by request
    assert counts[("canary", canary, "ok")] == expected and abs(expected / requests - 0.1) < 0.05, counts
    assert counts[("stable", stable, "ok")] == requests - expected, counts
    text = app.get("/metrics").text
    latency = metric_samples(text, "gourmetgram_prediction_duration_seconds_count")
    assert latency[f'{{model_version="{canary}",route="canary"}}'] == expected, latency
    assert metric_samples(text, "gourmetgram_canary_share")[""] == 0.1


def test_a_canary_that_fails_fails_only_its_share_and_is_counted_apart(onnx_service):
    stable_url = onnx_service
    app = create_app(Settings(backend="fastapi", fastapi_server_url=stable_url, canary_url=f"http://127.0.0.1:{free_port()}",
                              canary_share=0.5, backend_timeout=5)).test_client()
    statuses = [upload(app).status_code for _ in range(20)]
    counts = gourmetgram_metrics(app)
    failed = sum(in_canary(0.5, 0, n) for n in range(20))
    assert statuses.count(502) == failed and statuses.count(200) == 20 - failed, statuses
    assert counts[("canary", "", "error")] == failed and sum(v for (route, _, outcome), v in counts.items()
                                                              if route == "stable" and outcome == "ok") == 20 - failed
