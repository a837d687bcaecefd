"""Prometheus metrics of one service, served at ``GET /metrics``: what Triton's statistics show for Triton
(queue versus work time, the batch sizes inference really ran), so the stages can be compared, plus ONNX
Runtime's session runs and shape changes (read at each scrape) and the response cache's results.

Where several server processes share a port (``servelab.servers.fastapi.workers``), prometheus_client's
multiprocess mode adds up every process's counters and histograms at each scrape (a gauge says how it
combines: ``multiprocess_mode``); the sessions' runs are those of the process that answers the scrape.
"""

import os
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import get_args

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servelab.core.wire import SECONDS_BUCKETS, VERSION_HEADER
from servelab.servers.fastapi.errors import SHED_KEY
from servelab.servers.fastapi.schemas import ShedReason
from servelab.servers.fastapi.siblings import METRICS_ENV

METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
START_KEY = "servelab.started"  # scope key: when the request entered the app (perf_counter)
_VERSION_KEY = VERSION_HEADER.lower().encode()  # as ASGI gives header names


class Metrics:
    def __init__(self, max_batch: int):
        self.registry = CollectorRegistry()
        self.sessions: SessionCollector | None = None
        r = self.registry
        self.requests = Counter("servelab_http_requests", "HTTP requests by route, method and status code.",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("servelab_http_request_duration_seconds", "Time from receiving a request to its "
                                 "response, by route.", ["route"], buckets=SECONDS_BUCKETS, registry=r)
        self.in_progress = Gauge("servelab_http_requests_in_progress", "Requests being handled now.", registry=r,
                                 multiprocess_mode="livesum")
        self.queue = Histogram("servelab_queue_seconds", "Time a prediction request waited: for a preprocessing "
                               "worker, then for its inference batch.", buckets=SECONDS_BUCKETS, registry=r)
        self.preprocess = Histogram("servelab_preprocess_seconds", "Decoding and preprocessing time of a request.",
                                    buckets=SECONDS_BUCKETS, registry=r)
        self.infer = Histogram("servelab_inference_seconds", "Duration of one inference call.",
                               buckets=SECONDS_BUCKETS, registry=r)
        sizes = [b for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128) if b < max_batch] + [max_batch]
        self.batch_size = Histogram("servelab_batch_size", "Images per inference call (above 1 with dynamic "
                                    "batching or batched requests).", buckets=sizes, registry=r)
        self.images = Counter("servelab_images", "Images classified.", registry=r)
        self.shed = Counter("servelab_shed_requests", "Prediction requests refused with 503 under load, by reason: "
                            "queue_full (MAX_QUEUE_REQUESTS) or queue_timeout (MAX_QUEUE_DELAY_MS).", ["reason"], registry=r)
        for reason in get_args(ShedReason):  # both at 0 from the start, so a rate over them is defined before any shedding
            self.shed.labels(reason)
        self.cache = Counter("servelab_response_cache", "POST /predict requests by what the response cache "
                             "(CACHE_URL) did: hit (answered from it), miss (the model answered; kept), error "
                             "(Redis failed: the model answered).", ["result"], registry=r)
        self.version_requests = Counter("servelab_model_version_requests", "Prediction requests answered, by the "
                                        "model version that answered them (the X-Model-Version header).",
                                        ["model_version"], registry=r)
        self.version_latency = Histogram("servelab_model_version_request_duration_seconds", "Time from receiving "
                                         "a prediction request to its response, by the model version that "
                                         "answered it.", ["model_version"], buckets=SECONDS_BUCKETS, registry=r)
        self.serving = Gauge("servelab_model_serving", "1 for the model version answering new requests, 0 for "
                             "one a reload replaced.", ["model_version", "model"], registry=r,
                             multiprocess_mode="livemax")
        self.reloads = Counter("servelab_model_reloads", "POST /admin/reload calls, by outcome: swapped, or "
                               "refused (the model was missing or broken; the old one kept serving).",
                               ["outcome"], registry=r)
        for outcome in ("swapped", "refused"):
            self.reloads.labels(outcome)
        self.preprocess_pool_restarts = Counter("servelab_preprocess_pool_restarts", "Times a preprocessing worker "
                                                "process died and its pool was replaced.", registry=r)

    def watch_sessions(self, counts: Callable[[], list[dict]]) -> None:  # read at every scrape
        self.sessions = SessionCollector(counts)
        self.registry.register(self.sessions)

    def observe_batch(self, images: int, seconds: float) -> None:
        self.batch_size.observe(images)
        self.infer.observe(seconds)

    def render(self) -> tuple[bytes, str]:
        if not os.environ.get(METRICS_ENV):
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        every = CollectorRegistry()
        MultiProcessCollector(every)
        if self.sessions is not None:
            every.register(self.sessions)
        return generate_latest(every), CONTENT_TYPE_LATEST


class SessionCollector(Collector):
    """Runs and shape changes per ONNX Runtime session, labelled by the batch size it takes (``any``
    under ORT_SHAPE_POLICY=off); warm-up runs count. A shape change is a run whose input shape differs
    from that session's previous run: on a GPU each one costs a new cuDNN algorithm choice."""

    def __init__(self, counts: Callable[[], list[dict]]):
        self.counts = counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        runs = CounterMetricFamily("servelab_onnx_session_runs", "Runs of each ONNX Runtime session, warm-up "
                                   "included, by the batch size it takes.", labels=["session_batch"])
        changes = CounterMetricFamily("servelab_onnx_session_shape_changes", "Runs of each ONNX Runtime session "
                                      "whose input shape differed from its previous run's.", labels=["session_batch"])
        for count in self.counts():
            runs.add_metric([count["session_batch"]], count["runs"])
            changes.add_metric([count["session_batch"]], count["shape_changes"])
        yield from (runs, changes)


class MetricsMiddleware:
    """Counts every HTTP request, those refused before a handler too (413, 422, 404, shed)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: set[str]):
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = scope[START_KEY] = perf_counter()
        status, version = 500, None

        async def send_and_note(message: Message) -> None:
            nonlocal status, version
            if message["type"] == "http.response.start":
                status = message["status"]
                version = next((v.decode() for k, v in message.get("headers", ()) if k == _VERSION_KEY), None)
            await send(message)

        self.metrics.in_progress.inc()
        try:
            await self.app(scope, receive, send_and_note)  # an exception escaping here is a 500
        finally:
            self.metrics.in_progress.dec()
            # Unknown paths and methods share one label, so clients cannot grow the metric without bound.
            route = scope["path"] if scope["path"] in self.routes else "other"
            method = scope["method"] if scope["method"] in METHODS else "other"
            self.metrics.requests.labels(route, method, str(status)).inc()
            elapsed = perf_counter() - started
            self.metrics.latency.labels(route).observe(elapsed)
            if version:  # a prediction, answered by this model version
                self.metrics.version_requests.labels(version).inc()
                self.metrics.version_latency.labels(version).observe(elapsed)
            if reason := scope.get(SHED_KEY):  # set where the request was shed (errors._shed)
                self.metrics.shed.labels(reason).inc()
