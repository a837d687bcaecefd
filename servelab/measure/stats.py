"""Client-side latency percentiles, in milliseconds (a run's whole ``Stats``: ``loadgen.RawRun.stats``)."""

from collections.abc import Sequence

import numpy as np

from servelab.measure.records import Latency


def latency_summary(latencies_s: Sequence[float]) -> Latency:
    """Mean, p50/p90/p95/p99, max and the 0..100 percentile curve, all in milliseconds."""
    if len(latencies_s) == 0:
        return Latency()
    ms = np.asarray(latencies_s, dtype=np.float64) * 1000.0
    cdf = np.percentile(ms, np.arange(101))  # the named percentiles are its points (100: the max)
    return Latency(mean_ms=float(ms.mean()), p50_ms=float(cdf[50]), p90_ms=float(cdf[90]), p95_ms=float(cdf[95]),
                   p99_ms=float(cdf[99]), max_ms=float(cdf[100]), cdf_ms=[round(float(v), 4) for v in cdf])

