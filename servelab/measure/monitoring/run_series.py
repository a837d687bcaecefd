"""Prometheus read back over each run: what the servers counted, beside what the client measured. A fresh scrape
just before and just after each run makes the difference of the server's request counter exact; over the measured
window come its success rate and range queries of its own series. Queries are data per stage family.
"""

import math
import time
from dataclasses import dataclass
from string import Template
from typing import Any

from servelab.measure.monitoring.prometheus_server import PrometheusClient, PrometheusError
from servelab.measure.records import Record, ServerSeries

# Client and server agree when the counts are equal and the rates within this fraction.
RATE_TOLERANCE = 0.05
# Rates are compared only over a span between scrapes that holds this many requests and two scrape
# intervals: a request more or less at either end of the span then moves the rate by at most 2 %.
MIN_RATE_REQUESTS = 100


@dataclass(frozen=True)
class Family:
    """PromQL for one kind of server; ``$sel`` is the target's label matchers, ``$w`` the rate window."""

    all_requests: str  # an expression: every request the server counted, whatever its outcome
    successes: str  # a plain selector of counters (summed per scrape): successful requests
    series: dict[str, str]
    note: str = ""  # what this family cannot show
    lag_s: float = 0.0  # how long the server may take to publish what it counted (read back after a run)
    per_version: bool = False  # counters per model version: a run that changed the version cannot be counted


# Request routes of the FastAPI services and Ray Serve's proxy (not /metrics, /ready, ...): ``$predict``.
FASTAPI_PREDICT = 'route=~"/predict|/predict/batch"'
FASTAPI = Family(
    all_requests="sum(servelab_http_requests_total{$sel,$predict})",
    successes='servelab_http_requests_total{$sel,$predict,status=~"2.."}',
    series={
        "request rate (req/s)": 'sum(rate(servelab_http_requests_total{$sel,$predict,status=~"2.."}[$w]))',
        "p50 (ms)": "1000 * histogram_quantile(0.5, sum by (le) "
                    "(rate(servelab_http_request_duration_seconds_bucket{$sel,$predict}[$w])))",
        "p99 (ms)": "1000 * histogram_quantile(0.99, sum by (le) "
                    "(rate(servelab_http_request_duration_seconds_bucket{$sel,$predict}[$w])))",
        "queue (ms)": "1000 * sum(rate(servelab_queue_seconds_sum{$sel}[$w])) "
                      "/ sum(rate(servelab_queue_seconds_count{$sel}[$w]))",
        "compute (ms)": "1000 * (sum(rate(servelab_preprocess_seconds_sum{$sel}[$w])) "
                        "/ sum(rate(servelab_preprocess_seconds_count{$sel}[$w])) "
                        "+ sum(rate(servelab_inference_seconds_sum{$sel}[$w])) "
                        "/ sum(rate(servelab_inference_seconds_count{$sel}[$w])))",
        "mean batch": "sum(rate(servelab_batch_size_sum{$sel}[$w])) / sum(rate(servelab_batch_size_count{$sel}[$w]))",
    },
    note="p50/p99 interpolated within the latency histogram's buckets; compute = preprocessing per request + "
         "one inference call",
)
TRITON = Family(
    per_version=True,  # the old version's series end when it unloads, with what it counted
    all_requests="sum(nv_inference_request_success{$sel}) + sum(nv_inference_request_failure{$sel})",
    successes="nv_inference_request_success{$sel}",
    series={
        "request rate (req/s)": "sum(rate(nv_inference_request_success{$sel}[$w]))",
        "mean latency (ms)": "sum(rate(nv_inference_request_duration_us{$sel}[$w])) "
                             "/ sum(rate(nv_inference_request_success{$sel}[$w])) / 1000",
        "queue (ms)": "sum(rate(nv_inference_queue_duration_us{$sel}[$w])) "
                      "/ sum(rate(nv_inference_request_success{$sel}[$w])) / 1000",
        "compute (ms)": "(sum(rate(nv_inference_compute_input_duration_us{$sel}[$w])) "
                        "+ sum(rate(nv_inference_compute_infer_duration_us{$sel}[$w])) "
                        "+ sum(rate(nv_inference_compute_output_duration_us{$sel}[$w]))) "
                        "/ sum(rate(nv_inference_request_success{$sel}[$w])) / 1000",
        "mean batch": "sum(rate(nv_inference_count{$sel}[$w])) / sum(rate(nv_inference_exec_count{$sel}[$w]))",
    },
    note="Triton 2.51 exports latency as sums, not histograms: a mean, no p50/p99",
)
# Ray Serve, from each node's metrics agent: the HTTP proxy (on the head, `$sel`) counts requests and
# their latency; the replicas, on every node of the job, their processing time and @serve.batch sizes.
RAY = Family(
    all_requests="sum(ray_serve_num_http_requests_total{$sel,$predict})",
    successes='ray_serve_num_http_requests_total{$sel,$predict,status_code=~"2.."}',
    series={
        "request rate (req/s)": 'sum(rate(ray_serve_num_http_requests_total{$sel,$predict,status_code=~"2.."}[$w]))',
        "p50 (ms)": "histogram_quantile(0.5, sum by (le) "
                    "(rate(ray_serve_http_request_latency_ms_bucket{$sel,$predict}[$w])))",
        "p99 (ms)": "histogram_quantile(0.99, sum by (le) "
                    "(rate(ray_serve_http_request_latency_ms_bucket{$sel,$predict}[$w])))",
        "compute (ms)": 'sum(rate(ray_serve_deployment_processing_latency_ms_sum{job="ray"}[$w])) '
                        '/ sum(rate(ray_serve_deployment_processing_latency_ms_count{job="ray"}[$w]))',
        "mean batch": 'sum(rate(ray_serve_actual_batch_size_sum{job="ray"}[$w])) '
                      '/ sum(rate(ray_serve_actual_batch_size_count{job="ray"}[$w]))',
        "running replicas": 'sum(ray_serve_deployment_replica_healthy{job="ray"})',
    },
    note="Ray's own metrics: latency at the proxy (p50/p99 within its histogram's buckets), compute = the "
         "replica's processing time; mean batch = Serve's actual_batch_size",
    lag_s=1.5,  # RAY_metrics_report_interval_ms (500 ms locally) and the agent's export
)
# The machine as a whole (the lab's psutil exporter locally; node and dcgm exporters on the node).
MACHINE = {
    "CPU busy (%)": '100 * (1 - avg(rate(node_cpu_seconds_total{mode="idle"}[$w])))',
    "memory used (GiB)": "(sum(node_memory_MemTotal_bytes) - sum(node_memory_MemAvailable_bytes)) / 2^30",
    "GPU utilization (%)": "avg(DCGM_FI_DEV_GPU_UTIL)",
}
FAMILIES = {"fastapi": FASTAPI, "triton": TRITON, "ray": RAY}


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
            count = _scalar(self.client.query(self._fill(FAMILIES[family].all_requests, labels), at))
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
        notes = [FAMILIES[family].note]
        try:
            time.sleep(FAMILIES[family].lag_s)
            at = self._settled[labels["instance"]] = self.client.settle(time.time(), {labels["instance"]})
            after = _scalar(self.client.query(self._fill(FAMILIES[family].all_requests, labels), at)) or 0.0
            if FAMILIES[family].per_version and record.rollout and record.rollout.new_version:
                notes.append("the model's version changed in the run, and the server counts per version: no count")
            else:
                out.requests = round(after - before.requests)
            out.rate_rps, out.rate_span_s = self._rate(FAMILIES[family].successes, labels, start, end)
            if out.rate_rps is None:
                notes.append(f"fewer than two scrapes inside the {end - start:.1f} s window: no server-side rate")
            for name, expr in {**FAMILIES[family].series, **MACHINE}.items():
                points = self._range(self._fill(expr, labels), start, end)
                if points:
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
        ratio = self.rate_ratio
        return None if ratio is None else abs(ratio - 1) <= RATE_TOLERANCE


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
