"""``catalogue.with_cache``: the cache case of a stage, for each family that has one, rendered as its server takes it."""

import pytest

from servelab.core.catalogue import STAGES, with_cache
from servelab.servers.triton.configs import effective_config, get_stage


def test_a_triton_stage_gets_tritons_response_cache_on_its_model_only(artifacts) -> None:
    from servelab.core.settings import get_settings

    base = get_stage("pt-1")
    cached = with_cache(base)
    assert cached.name == "pt-1-cache" and cached.name not in STAGES
    assert (cached.lesson, cached.baseline) == ("cache", "pt-1")
    repository = get_settings().triton_model_repository
    config = effective_config(cached, base.triton.model, kind="cpu", onnxruntime=False, repository=repository)
    assert config.response_cache.enable
    assert not effective_config(base, base.triton.model, kind="cpu", onnxruntime=False,
                                repository=repository).response_cache.enable


def test_a_fastapi_stage_gets_redis_in_front_and_keeps_its_settings() -> None:
    base = STAGES["fastapi-onnx-dyn"]
    cached = with_cache(base, "redis://127.0.0.1:6390/0")
    assert cached.fastapi.env == {**base.fastapi.env, "CACHE_URL": "redis://127.0.0.1:6390/0"}
    assert cached.fastapi.service == base.fastapi.service and base.fastapi.env.get("CACHE_URL") is None
    with pytest.raises(ValueError, match="give its URL"):
        with_cache(base)
    with pytest.raises(ValueError):
        with_cache(STAGES["ray-1"], "redis://127.0.0.1:6390/0")
