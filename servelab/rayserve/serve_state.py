"""What Ray Serve is running, read from the head's dashboard REST API (no Ray driver needed).

``serve_details(dashboard)`` is ``GET /api/serve/applications/``; ``replica_rows`` lists the
deployment's replicas with their state and Ray node id; ``ReplicaSampler`` samples the number of
running replicas in a thread while a load runs (the step-load and node-failure runs).
"""

import json
import threading
import time
from collections import Counter
from typing import Any

from servelab.procs import DIRECT
from servelab.rayserve.stages import APP_NAME, DEPLOYMENT_NAME


def serve_details(dashboard: str, timeout_s: float = 5.0) -> dict[str, Any]:
    with DIRECT.open(f"{dashboard.rstrip('/')}/api/serve/applications/", timeout=timeout_s) as response:
        return json.load(response)


def replica_rows(details: dict[str, Any]) -> list[dict[str, Any]]:
    """The deployment's replicas: replica id, state, node id, pid."""
    app = details.get("applications", {}).get(APP_NAME) or {}
    deployment = app.get("deployments", {}).get(DEPLOYMENT_NAME) or {}
    return [{"replica": r["replica_id"], "state": r["state"], "node_id": r.get("node_id"), "pid": r.get("pid")}
            for r in deployment.get("replicas", [])]


def placement(dashboard: str) -> dict[str, Any]:
    """Running replicas per Ray node id, replica id -> node id, and the head's node id (where the one
    HTTP proxy runs): what a record keeps."""
    details = serve_details(dashboard)
    rows = [r for r in replica_rows(details) if r["state"] == "RUNNING"]
    return {"replicas_per_node": dict(Counter(r["node_id"] for r in rows)),
            "replica_nodes": {r["replica"]: r["node_id"] for r in rows},
            "proxy_node_id": next(iter(details.get("proxies") or {}), None)}


class ReplicaSampler:
    """Samples running replicas every ``interval_s`` in a thread; marks events (a node killed).
    Times are ``time.perf_counter()``, the load generator's clock."""

    def __init__(self, dashboard: str, interval_s: float = 0.5):
        self.dashboard, self.interval_s = dashboard, interval_s
        self.samples: list[tuple[float, int]] = []
        self.events: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rows = replica_rows(serve_details(self.dashboard, timeout_s=2.0))
                self.samples.append((time.perf_counter(), sum(r["state"] == "RUNNING" for r in rows)))
            except (OSError, ValueError):
                pass  # a missed sample; the dashboard may be busy for a moment
            self._stop.wait(self.interval_s)

    def mark(self, name: str) -> None:
        self.events.append((time.perf_counter(), name))

    def __enter__(self) -> "ReplicaSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
