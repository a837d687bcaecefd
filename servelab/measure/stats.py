"""Client-side statistics: latency percentiles in milliseconds and throughput in requests/s."""

from collections import Counter
from collections.abc import Sequence

import numpy as np

from servelab.measure.records import Latency, Stats


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


def summarize(
    latencies_s: Sequence[float],
    errors: Counter,
    wall_s: float,
    batch: int = 1,
    send_lags_s: Sequence[float] = (),
    late_after_s: float = 0.010,
    offered_rps: float | None = None,
    shed: Counter | None = None,
) -> Stats:
    """``latencies_s`` of successful requests only; throughput = successes / measured wall time; ``shed``:
    requests the server refused under load, by reason (neither successes nor errors)."""
    successes, shed = len(latencies_s), shed or Counter()
    throughput = successes / wall_s if wall_s > 0 else 0.0
    lags = np.asarray(send_lags_s, dtype=np.float64)
    return Stats(
        requests=successes + sum(errors.values()) + sum(shed.values()),
        successes=successes,
        errors=dict(sorted(errors.items())),
        shed=dict(sorted(shed.items())),
        wall_s=wall_s,
        throughput_rps=throughput,
        items_per_s=throughput * batch,
        latency=latency_summary(latencies_s),
        late_sends=int((lags > late_after_s).sum()),
        max_send_lag_ms=float(lags.max() * 1000) if lags.size else None,
        offered_rps=offered_rps,
    )
