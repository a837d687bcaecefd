"""Triton's own response cache on the tier's tritonserver (started with the wheel's local cache,
TRITON_CACHE_BYTES): pt-1 with ``response_cache { enable: true }`` answers a repeated photo from the cache,
as its statistics (cache_hit, cache_miss) and metrics (successes beyond the model's inferences) count, with the answer
the model gave; the load generator's record holds the window's hit ratio from those statistics."""

import time
import urllib.request

import pytest
import tritonclient.http as httpclient

from servelab.core.catalogue import with_cache
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.photos import all_photos
from servelab.measure.loadgen import Labels, run_bench
from servelab.measure.records import Load
from servelab.measure.targets import PhotoMix, TritonTarget
from servelab.measure.triton_stats import cache_counts
from servelab.servers.triton import client as triton_io
from servelab.servers.triton.configs import get_stage


@pytest.fixture(scope="module")
def cached(local_triton):
    """The shared server switched to pt-1 with the response cache, and back to pt-1 afterwards."""
    config = local_triton.apply_stage(with_cache(get_stage("pt-1")))
    try:
        yield local_triton, config
    finally:
        local_triton.apply_stage(get_stage("pt-1"))


def _infer(c: httpclient.InferenceServerClient, model: str, image: bytes) -> list:
    result = c.infer(model, triton_io.image_inputs("http", [image]), outputs=triton_io.label_outputs("http"))
    return triton_io.predictions(result)


def _counts(c: httpclient.InferenceServerClient, model: str) -> dict[str, int]:
    return cache_counts(c.get_inference_statistics(model), model)


SUCCESS_AND_INFERENCES = ("nv_inference_request_success", "nv_inference_count")


def _counts_after(c, model: str, before: dict[str, int], requests: int) -> dict[str, int]:
    """The counters once they count ``requests`` more (Triton updates its statistics just after answering)."""
    for _ in range(40):
        after = _counts(c, model)
        if sum(after.values()) - sum(before.values()) >= requests:
            break
        time.sleep(0.05)
    return after


def _quiet_counts(c, model: str) -> dict[str, int]:
    """The counters once two reads in a row agree (the last request counted)."""
    previous = _counts(c, model)
    for _ in range(40):
        time.sleep(0.1)
        current = _counts(c, model)
        if current == previous:
            break
        previous = current
    return previous


def _metric(triton, name: str, model: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{triton.ports.metrics}/metrics", timeout=10).read().decode()
    [value] = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and f'model="{model}"' in line]
    return value


def test_a_repeated_photo_is_a_hit_with_the_models_answer(cached) -> None:
    triton, config = cached
    model = get_stage("pt-1").triton.model
    assert config["response_cache"] == {"enable": True}
    c = httpclient.InferenceServerClient(triton.url)
    try:
        photo, other = DEFAULT_IMAGE.read_bytes(), all_photos()[0].read_bytes()
        first = _infer(c, model, photo)  # the model answers, and the cache keeps it
        before = _quiet_counts(c, model)
        metrics_before = {name: _metric(triton, name, model) for name in SUCCESS_AND_INFERENCES}
        second = _infer(c, model, photo)
        third = _infer(c, model, other)  # another input: a miss
        after = _counts_after(c, model, before, 2)
    finally:
        c.close()
    assert second == first  # the cached answer is the model's
    assert third != first
    assert (after["hits"] - before["hits"], after["misses"] - before["misses"]) == (1, 1)
    # Triton's metrics agree: two requests succeeded, the model ran for one of them (nv_inference_count
    # "does not include cached requests"; this tritonserver exports no per-model cache metrics).
    success, inferences = (_metric(triton, name, model) - metrics_before[name] for name in SUCCESS_AND_INFERENCES)
    assert (success, inferences) == (2, 1)


def test_the_record_holds_tritons_hit_ratio_of_a_skewed_load(cached) -> None:
    triton, _ = cached
    model = get_stage("pt-1").triton.model
    record = run_bench(TritonTarget(triton.url, model, b"", mix=PhotoMix.zipf(seed=5)),
                       Load.closed(2, requests=120, warmup=10), Labels("pt-1-cache"))
    assert record.stats.errors == {}
    assert record.cache is not None and record.cache.source == "triton-stats"
    assert record.cache.hits + record.cache.misses == 120
    assert record.cache.hit_ratio > 0.3
