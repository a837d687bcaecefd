"""Dynamic batching on real servers: batches form, and each request still gets its own answer."""

import asyncio

import httpx
import pytest

from fastapi_service import b64, metric_samples, predict, predict_concurrently, running
from photos import variants

KINDS = ("pytorch", "onnx")
PHOTOS = variants()


@pytest.fixture(scope="module")
def batching(artifacts, tmp_path_factory):
    logs = tmp_path_factory.mktemp("fastapi-batching-logs")
    settings = {"max_batch_size": 8, "batch_timeout_ms": 20}
    with running("pytorch", artifacts, logs, **settings) as pt, running("onnx", artifacts, logs, **settings) as onnx:
        yield {"pytorch": pt, "onnx": onnx}


@pytest.mark.parametrize("kind", KINDS)
def test_batches_form_and_each_request_gets_its_own_answer(kind, batching):
    url = batching[kind]
    with httpx.Client(timeout=60) as client:
        singles = {name: predict(client, url, data) for name, data in PHOTOS.items()}  # one at a time: batches of 1
        order = [name for _ in range(6) for name in PHOTOS]  # different photos side by side in each batch
        responses = asyncio.run(predict_concurrently(url, [PHOTOS[n] for n in order], 16))
        text = client.get(f"{url}/metrics").text
    assert [r.status_code for r in responses] == [200] * len(order)
    for name, response in zip(order, responses):
        got, want = response.json(), singles[name]
        assert got["prediction"] == want["prediction"], name
        assert abs(got["probability"] - want["probability"]) <= 1e-4, name
    sizes = metric_samples(text, "servelab_batch_size_bucket")
    assert sizes['{le="8.0"}'] > sizes['{le="1.0"}'], sizes  # some inference held more than one image
    batch_sizes = [int(r.headers["server-timing"].rsplit("batch;desc=", 1)[1]) for r in responses]
    assert max(batch_sizes) > 1 and max(batch_sizes) <= 8


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_image_fails_only_its_own_request(kind, batching):
    good, bad = PHOTOS["jpeg"], PHOTOS["jpeg"][:2000]
    images = [good, bad] * 8

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(f"{batching[kind]}/predict", json={"image": b64(data)})
                                          for data in images))

    responses = asyncio.run(send_all())
    assert [r.status_code for r in responses] == [200, 400] * 8
    assert all(r.json()["prediction"] == "Dairy product" for r in responses[::2])
