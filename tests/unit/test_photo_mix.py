"""The skewed photo mix the response cache is measured with: seeded Zipf-like draws over the bundled photos,
and the cache counters the load generator reads back (FastAPI's metric text, Triton's statistics)."""

import json
from pathlib import Path

import numpy as np
import pytest

from servelab.core.photos import all_photos, zipf_draws, zipf_ranks
from servelab.measure.loadgen import cache_delta
from servelab.measure.targets import PhotoMix, response_cache_counts
from servelab.measure.triton_stats import cache_counts

DATA = Path(__file__).parents[1] / "data"


def test_the_same_seed_draws_the_same_sequence_and_another_seed_another() -> None:
    assert np.array_equal(zipf_draws(556, 5000, seed=3), zipf_draws(556, 5000, seed=3))
    assert not np.array_equal(zipf_draws(556, 5000, seed=3), zipf_draws(556, 5000, seed=4))


def test_the_top_photo_is_drawn_most_and_popularity_falls_with_rank() -> None:
    n, draws = 556, 200_000
    counts = np.bincount(zipf_draws(n, draws, s=1.0, seed=11), minlength=n)
    ranks = zipf_ranks(n, seed=11)
    assert counts.argmax() == ranks[0]
    # p(rank k) = (1/k) / H_n: the top photo about 1/H_556 = 14.5 % of draws, rank 2 half of it, rank 10 a tenth.
    share = counts[ranks] / draws
    harmonic = (1.0 / np.arange(1, n + 1)).sum()
    assert share[0] == pytest.approx(1 / harmonic, rel=0.03)
    assert share[1] == pytest.approx(share[0] / 2, rel=0.06)
    assert share[9] == pytest.approx(share[0] / 10, rel=0.15)
    assert share[:10].sum() > 0.4 > share[-100:].sum()  # skewed: ten photos draw more than the last hundred
    assert ranks[0] != 0 or ranks[1] != 1  # popularity is not simply file order


def test_s_zero_is_uniform_and_bad_arguments_are_refused() -> None:
    counts = np.bincount(zipf_draws(10, 100_000, s=0.0, seed=1), minlength=10)
    assert counts.min() > 0.9 * 10_000
    with pytest.raises(ValueError):
        zipf_draws(0, 10)


def test_the_mix_sends_the_bundled_photos_in_its_seeded_order() -> None:
    mix = PhotoMix.zipf(seed=2, draws=1000)
    assert len(mix.images) == len(all_photos()) and mix.order == tuple(zipf_draws(len(all_photos()), 1000, 1.0, 2))
    assert mix.describe()["seed"] == 2 and 0 < mix.describe()["distinct_photos"] < len(all_photos())


def test_cache_counters_from_fastapi_metrics_and_triton_statistics() -> None:
    text = ('# TYPE servelab_response_cache_total counter\nservelab_response_cache_total{result="hit"} 7.0\n'
            'servelab_response_cache_total{result="miss"} 3.0\nservelab_response_cache_total{result="error"} 0.0\n'
            'servelab_response_cache_created{result="hit"} 1.7e+09\n')
    assert response_cache_counts(text) == {"hits": 7, "misses": 3, "errors": 0}
    assert response_cache_counts("# TYPE servelab_response_cache_total counter\n") is None  # no cache there
    stats = json.loads((DATA / "triton_stats_http.json").read_text())["before"]  # a model without the cache
    model = stats["model_stats"][0]["name"]
    assert cache_counts(stats, model) is None
    inference = stats["model_stats"][0]["inference_stats"]
    inference["cache_hit"]["count"], inference["cache_miss"]["count"] = 40, 60
    # Misses: every success the cache did not answer (Triton's cache_miss may be short of them).
    assert cache_counts(stats, model) == {"hits": 40, "misses": inference["success"]["count"] - 40}
    delta = cache_delta({"hits": 10, "misses": 5}, {"hits": 25, "misses": 10, "errors": 1}, "x")
    assert (delta.hits, delta.misses, delta.errors, delta.hit_ratio) == (15, 5, 1, 15 / 21)
    assert cache_delta({"hits": 1, "misses": 1}, {"hits": 1, "misses": 1}, "x") is None
    with pytest.raises(ValueError):
        cache_delta({"hits": 5, "misses": 0}, {"hits": 1, "misses": 0}, "x")
