"""Prometheus read back over each run: what the servers counted, beside what the client measured. A fresh scrape
just before and just after each run makes the difference of the server's request counter exact; over the measured
window come its success rate and range queries of its own series. Queries are data, in each family's record
(``servelab.core.catalogue.FAMILIES``).
"""

import math
import time
from dataclasses import dataclass
from string import Template
from typing import Any

from servelab.core.catalogue import FAMILIES
from servelab.core.family import FASTAPI_PREDICT
from servelab.measure.monitoring.prometheus_server import PrometheusClient, PrometheusError
from servelab.measure.records import Record, ServerSeries

# Client and server agree when the counts are equal and the rates within this fraction.
RATE_TOLERANCE = 0.05
# Rates are compared only over a span between scrapes that holds this many requests and two scrape
# intervals: a request more or less at either end of the span then moves the rate by at most 2 %.
MIN_RATE_REQUESTS = 100


# The machine as a whole (the lab's psutil exporter locally; node and dcgm exporters on the node).
MACHINE = {
    "CPU busy (%)": '100 * (1 - avg(rate(node_cpu_seconds_total{mode="idle"}[$w])))',
    "memory used (GiB)": "(sum(node_memory_MemTotal_bytes) - sum(node_memory_MemAvailable_bytes)) / 2^30",
    "GPU utilization (%)": "avg(DCGM_FI_DEV_GPU_UTIL)",
}


def _selector(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def _scalar(result: list[dict[str, Any]]) -> float | None:
    return float(result[0]["value"][1]) if result else None


@dataclass
class Before:
    at: float  # Unix time at which a query sees a scrape taken after the run's start
    requests: float


class PromWatch:
    """Reads one server's metrics around each run; every failure becomes a note, never an exception."""

    def __init__(self, client: PrometheusClient, step_s: float):
        self.client, self.step_s = client, step_s
        self.window = f"{4 * step_s:g}s"  # rate() needs two samples in its window
        # instance -> when its last scrape after a run was seen. Runs follow each other with nothing else
        # sent to the server in between (the lab's case), so that scrape also serves as the next "before";
        # a stage switch sends it requests of its own (Triton's warm-up), so the lab forgets it then.
        self._settled: dict[str, float] = {}

    def forget(self, instance: str) -> None:
        """The server at ``instance`` is gone: a later one there starts afresh."""
        self._settled.pop(instance, None)

    def before(self, family: str, labels: dict[str, str]) -> Before | str:
        """A fresh scrape of the server, and its request count; or why not."""
        try:
            at = self._settled.pop(labels["instance"], None) or self.client.settle(time.time(), {labels["instance"]})
            count = _scalar(self.client.query(self._fill(FAMILIES[family].queries.all_requests, labels), at))
            return Before(at, count or 0.0)
        except PrometheusError as exc:
            return f"Prometheus: {exc}"

    def after(self, record: Record, before: Before | str, family: str, labels: dict[str, str],
              window: tuple[float, float]) -> ServerSeries:
        source = f"prometheus {self.client.url}, {family} {_selector(labels)}"
        if isinstance(before, str):
            return ServerSeries(source=source, note=before)
        start, end = window
        # What servelab's client sent between the two scrapes, warm-up included (perf_analyzer does not say).
        sent = None if record.tool != "servelab" or record.stats.requests is None else record.stats.requests + (
            record.load.warmup if record.warmup_requests is None else record.warmup_requests)
        out = ServerSeries(source=source, start_unix=start, end_unix=end, step_s=self.step_s, client_requests=sent)
        queries = FAMILIES[family].queries
        notes = [queries.note]
        try:
            time.sleep(queries.lag_s)
            at = self._settled[labels["instance"]] = self.client.settle(time.time(), {labels["instance"]})
            after = _scalar(self.client.query(self._fill(queries.all_requests, labels), at)) or 0.0
            if queries.per_version and record.rollout and record.rollout.new_version:
                notes.append("the model's version changed in the run, and the server counts per version: no count")
            else:
                out.requests = round(after - before.requests)
            out.rate_rps, out.rate_span_s = self._rate(queries.successes, labels, start, end)
            if out.rate_rps is None:
                notes.append(f"fewer than two scrapes inside the {end - start:.1f} s window: no server-side rate")
            for name, expr in {**queries.series, **MACHINE}.items():
                if points := self._range(self._fill(expr, labels), start, end):
                    out.series[name] = points
        except PrometheusError as exc:
            notes.append(f"Prometheus: {exc}")
        out.note = "; ".join(n for n in notes if n) or None
        return out

    def _fill(self, expr: str, labels: dict[str, str]) -> str:
        return Template(expr).substitute(sel=_selector(labels), w=self.window, predict=FASTAPI_PREDICT)

    def _rate(self, selector: str, labels: dict[str, str], start: float, end: float
              ) -> tuple[float | None, float | None]:
        """Successes per second between the first and last scrape inside [start, end] (raw samples). A sample is
        stamped when its scrape began, but a busy server reads its counters up to ``scrape_duration_seconds``
        later: that is taken as the sample's time."""
        span = max(1, math.ceil(end - start + self.step_s))
        result = self.client.query(f"{self._fill(selector, labels)}[{span}s]", end)
        durations = self.client.query(f'scrape_duration_seconds{{instance="{labels["instance"]}"}}[{span}s]', end)
        took = {float(t): float(v) for s in durations for t, v in s["values"]}
        times = sorted({float(t) for s in result for t, _ in s["values"] if start <= float(t) <= end})
        if len(times) < 2:
            return None, None

        def counted(at: float) -> float:  # a labelled series appears at its first increment: before that it counted 0
            return sum(max(((float(t), float(v)) for t, v in s["values"] if float(t) <= at), default=(at, 0.0))[1]
                       for s in result)
        first, last = times[0], times[-1]
        elapsed = (last + took.get(last, 0.0)) - (first + took.get(first, 0.0))
        return (counted(last) - counted(first)) / elapsed, elapsed

    def _range(self, expr: str, start: float, end: float) -> list[list[float]]:
        result = self.client.query_range(expr, start, end, self.step_s)
        return [[round(float(t) - start, 3), round(float(v), 4)] for t, v in (result[0]["values"] if result else [])
                if math.isfinite(float(v))]


@dataclass(frozen=True)
class Agreement:
    """One run's client figures against the server's, as the report's table shows them."""

    stage: str
    tool: str
    load: str
    client_requests: int | None
    server_requests: int | None
    client_rps: float | None
    server_rps: float | None
    server_span_s: float | None
    step_s: float | None

    @property
    def rate_comparable(self) -> bool:
        """servelab's client (perf_analyzer reports its last stable windows, not the whole run), and long
        enough between scrapes for the 5 % comparison to mean something (MIN_RATE_REQUESTS)."""
        if self.tool != "servelab" or not self.server_span_s or self.server_rps is None or not self.step_s:
            return False
        return self.server_span_s >= 2 * self.step_s and self.server_rps * self.server_span_s >= MIN_RATE_REQUESTS

    @property
    def counts_agree(self) -> bool | None:
        known = self.client_requests is not None and self.server_requests is not None
        return self.client_requests == self.server_requests if known else None

    @property
    def rate_ratio(self) -> float | None:
        return self.server_rps / self.client_rps if self.client_rps and self.rate_comparable else None

    @property
    def rates_agree(self) -> bool | None:
        return None if (ratio := self.rate_ratio) is None else abs(ratio - 1) <= RATE_TOLERANCE


def agreements(records: list[Record]) -> list[Agreement]:
    return [Agreement(r.stage, r.tool, r.load.label() + (f" x{r.batch}" if r.batch > 1 else ""), r.prometheus.client_requests, r.prometheus.requests,
                      r.stats.throughput_rps, r.prometheus.rate_rps, r.prometheus.rate_span_s, r.prometheus.step_s)
            for r in records if r.prometheus is not None and r.prometheus.start_unix is not None and not r.failed]


def summary(found: list[Agreement]) -> str:
    """One line for the lab's printout."""
    counted = [a for a in found if a.counts_agree is not None]
    rated = [a for a in found if a.rates_agree is not None]
    return (f"{len(found)} runs read back from Prometheus: request counts equal in "
            f"{sum(bool(a.counts_agree) for a in counted)} of {len(counted)}, rates within {RATE_TOLERANCE:.0%} in "
            f"{sum(bool(a.rates_agree) for a in rated)} of {len(rated)} long enough to compare")
