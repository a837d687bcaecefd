"""A stage family (FastAPI, Triton, Ray Serve) as one record: its name, its title in the report and the
notebooks, the part its stages carry and the PromQL that reads its servers' metrics. The records and their
registry, ``FAMILIES``, are in ``catalogue`` beside the parts; ``servelab.run.families`` adapts each to the lab.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Queries:
    """PromQL for one kind of server; ``$sel`` is the target's label matchers, ``$w`` the rate window."""

    all_requests: str  # an expression: every request the server counted, whatever its outcome
    successes: str  # a plain selector of counters (summed per scrape): successful requests
    series: dict[str, str]
    note: str = ""  # what this family cannot show
    lag_s: float = 0.0  # how long the server may take to publish what it counted (read back after a run)
    per_version: bool = False  # counters per model version: a run that changed the version cannot be counted


# Request routes of the FastAPI services and Ray Serve's proxy (not /metrics, /ready, ...): ``$predict``.
FASTAPI_PREDICT = 'route=~"/predict|/predict/batch"'
FASTAPI_QUERIES = Queries(
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
TRITON_QUERIES = Queries(
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
RAY_QUERIES = Queries(
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


@dataclass(frozen=True)
class Family:
    """One family, once: everything that names, titles, runs or scrapes it reads this record."""

    name: str  # its stages' ``Stage.family``, its Prometheus job and its records' family
    title: str  # as the report's plots and the notebooks print it
    part: type  # what its stages carry (``catalogue.FastAPIPart`` etc.)
    queries: Queries
