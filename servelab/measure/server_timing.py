"""The standard ``Server-Timing`` response header (``queue;dur=1.2, preprocess;dur=3.4, infer;dur=8.0``, in
milliseconds), and its mean over a run; ``batch;desc=4`` is the server's batch size for that request.
"""

from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field

from servelab.measure.records import Breakdown


@dataclass(frozen=True)
class ServerTiming:
    durations_ms: dict[str, float]
    descriptions: dict[str, str]


def parse_server_timing(header: str | None) -> ServerTiming:
    """Parse one header value; malformed metrics and parameters are skipped, never fatal."""
    durations: dict[str, float] = {}
    descriptions: dict[str, str] = {}
    for metric in (header or "").split(","):
        name, *params = (part.strip() for part in metric.split(";"))
        if not name:
            continue
        for param in params:
            key, _, value = param.partition("=")
            key, value = key.strip().lower(), value.strip().strip('"')
            if key == "dur":
                with suppress(ValueError):
                    durations[name] = float(value)
            elif key == "desc":
                descriptions[name] = value
    return ServerTiming(durations, descriptions)


@dataclass
class TimingSums:
    """Running sums of Server-Timing metrics over the successful measured requests."""

    images_per_request: int = 1
    sums: Counter = field(default_factory=Counter)  # name -> ms (a Counter: runs merge by ``update``)
    counts: Counter = field(default_factory=Counter)
    images_by_batch: Counter = field(default_factory=Counter)  # server batch size -> images served in such batches

    def add(self, timing: ServerTiming) -> None:
        for name, value in timing.durations_ms.items():
            self.sums[name] += value
            self.counts[name] += 1
        if (batch := timing.descriptions.get("batch", "")).isdigit() and int(batch) > 0:
            self.images_by_batch[int(batch)] += self.images_per_request

    def breakdown(self) -> Breakdown | None:
        """Means per request; service = preprocess + infer (or total - queue when only those exist)."""
        if not self.sums:
            return None
        mean = {name: self.sums[name] / self.counts[name] for name in self.sums}
        service = (mean.get("preprocess", 0.0) + mean.get("infer", 0.0) if "preprocess" in mean or "infer" in mean
                   else mean["total"] - mean.get("queue", 0.0) if "total" in mean else None)
        # A batch of b images is seen once per image it served, so it executed images / b times.
        executions = {b: n / b for b, n in self.images_by_batch.items()}
        served = sum(self.images_by_batch.values())
        return Breakdown(source="server-timing", queue_ms=mean.get("queue"), service_ms=service, parts_ms=mean,
                         batch_sizes={b: round(n) for b, n in executions.items()},
                         mean_batch_size=served / sum(executions.values()) if executions else None,
                         server_requests=max(self.counts.values()))
