"""Open-loop schedules and the load description."""

import numpy as np
import pytest
from scipy import stats

from servelab.measure.records import Load
from servelab.measure.schedule import send_times


def test_poisson_inter_arrivals_are_exponential() -> None:
    rate = 120.0
    times = send_times(3000, rate, "poisson", seed=7)
    gaps = np.diff(times)
    assert times[0] >= 0 and np.all(gaps >= 0)
    # Kolmogorov-Smirnov goodness of fit against Exp(mean 1/rate).
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 0.01
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
    # Bursty, unlike the constant schedule: coefficient of variation ~1.
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.1)


@pytest.mark.parametrize("n", [100, 200, 400, 800])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_schedule_offers_the_rate_it_is_labelled_with(n: int, seed: int) -> None:
    """n requests inside a window of n / rate: an unconditioned seed-0 draw ran 4-18 % longer."""
    rate = 33.3
    for arrivals in ("poisson", "constant"):
        times = send_times(n, rate, arrivals, seed)
        assert len(times) == n and times.max() < n / rate
    # Still Poisson-like inside the window: bursty, not evenly spaced.
    gaps = np.diff(send_times(n, rate, "poisson", seed))
    assert 0.7 < gaps.std() / gaps.mean() < 1.3


def test_poisson_schedule_is_seeded() -> None:
    assert np.array_equal(send_times(100, 50, "poisson", seed=3), send_times(100, 50, "poisson", seed=3))
    assert not np.array_equal(send_times(100, 50, "poisson", seed=3), send_times(100, 50, "poisson", seed=4))


def test_constant_schedule_is_evenly_spaced() -> None:
    times = send_times(5, 4.0, "constant")
    assert times.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize("args", [(0, 10, "poisson"), (5, 0, "constant"), (5, 10, "bursty")])
def test_bad_schedules_are_refused(args) -> None:
    with pytest.raises(ValueError):
        send_times(*args)


def test_load_descriptions() -> None:
    assert Load.sequential(100).label() == "sequential"
    assert Load.closed(8, 500).label() == "concurrency 8"
    assert Load.open(120, "poisson").label() == "poisson 120 req/s"
    assert Load.open(120, "poisson").requests == 1200  # ten seconds' worth by default
    assert Load.open(50, "constant", duration_s=2).requests is None
    with pytest.raises(ValueError):
        Load(mode="open", requests=10)  # no rate
    with pytest.raises(ValueError):
        Load(mode="sequential", concurrency=4)
    with pytest.raises(ValueError):
        Load.closed(4, requests=None)  # no window at all
