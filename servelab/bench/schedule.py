"""Open-loop send times, computed in advance so the sender never adapts to the server.

``constant`` spaces requests exactly 1/rate apart; ``poisson`` draws exponential inter-arrival
times (mean 1/rate) from a seeded generator, so a run is reproducible.
"""

from typing import Literal

import numpy as np


def send_times(n: int, rate: float, arrivals: Literal["constant", "poisson"], seed: int = 0) -> np.ndarray:
    """Seconds from the start of the run at which each of ``n`` requests is due; the first is at 0."""
    if n < 1 or rate <= 0:
        raise ValueError("need n >= 1 and rate > 0")
    if arrivals == "constant":
        return np.arange(n, dtype=np.float64) / rate
    if arrivals == "poisson":
        gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n - 1)
        return np.concatenate(([0.0], np.cumsum(gaps)))
    raise ValueError(f"unknown arrival process {arrivals!r} (constant or poisson)")
