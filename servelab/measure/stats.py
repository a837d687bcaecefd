"""Client-side latency percentiles, in milliseconds (a run's whole ``Stats``: ``loadgen.RawRun.stats``)."""

from collections.abc import Sequence

import numpy as np

from servelab.measure.records import Latency


def latency_summary(latencies_s: Sequence[float]) -> Latency:
    """Mean, p50/p90/p95/p99, max and the 0..100 percentile curve, all in milliseconds."""
    if len(latencies_s) == 0:
        return Latency()
    ms = np.asarray(latencies_s, dtype=np.float64) * 1000.0
    p50, p90, p95, p99 = np.percentile(ms, [50, 90, 95, 99])
    return Latency(
        mean_ms=float(ms.mean()), p50_ms=float(p50), p90_ms=float(p90), p95_ms=float(p95),
        p99_ms=float(p99), max_ms=float(ms.max()),
        cdf_ms=[round(float(v), 4) for v in np.percentile(ms, np.arange(101))],
    )

