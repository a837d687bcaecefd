"""What Ray Serve is running, read from the head's dashboard REST API (no Ray driver needed): the deployment's replicas,
and ``ReplicaSampler``, which samples the running ones while a load runs (the step-load and node-failure runs).
"""

import json
import os
import threading
import time
import urllib.request
from collections import Counter
from contextlib import suppress
from pathlib import Path
from typing import Any

from servelab.core.procs import DIRECT
from servelab.servers.rayserve.options import APP_NAME, DEPLOYMENT_NAME


def serve_details(dashboard: str, timeout_s: float = 5.0, token: str | None = None) -> dict[str, Any]:
    """``token``: the cluster's under token authentication (default: Ray's own variables, as a driver finds it)."""
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or "")
    token = token or os.environ.get("RAY_AUTH_TOKEN") or (path.read_text() if path.name and path.is_file() else None)
    request = urllib.request.Request(f"{dashboard.rstrip('/')}/api/serve/applications/",
                                     headers={"Authorization": f"Bearer {token.strip()}"} if token else {})
    with DIRECT.open(request, timeout=timeout_s) as response:
        return json.load(response)


def replica_rows(details: dict[str, Any]) -> list[dict[str, Any]]:
    """The deployment's replicas: replica id, state, node id, pid."""
    app = details.get("applications", {}).get(APP_NAME) or {}
    deployment = app.get("deployments", {}).get(DEPLOYMENT_NAME) or {}
    return [{"replica": r["replica_id"], "state": r["state"], "node_id": r.get("node_id"), "pid": r.get("pid")}
            for r in deployment.get("replicas", [])]


def placement(dashboard: str, token: str | None = None) -> dict[str, Any]:
    """Running replicas per Ray node id, replica id -> node id, and the head's node id (where the one
    HTTP proxy runs): what a record keeps."""
    details = serve_details(dashboard, token=token)
    rows = [r for r in replica_rows(details) if r["state"] == "RUNNING"]
    return {"replicas_per_node": dict(Counter(r["node_id"] for r in rows)),
            "replica_nodes": {r["replica"]: r["node_id"] for r in rows},
            "proxy_node_id": next(iter(details.get("proxies") or {}), None)}


class ReplicaSampler:
    """Samples running replicas every ``interval_s`` in a thread; marks events (a node killed).
    Times are ``time.perf_counter()``, the load generator's clock."""

    def __init__(self, dashboard: str, interval_s: float = 0.5, token: str | None = None):
        self.dashboard, self.interval_s, self.token = dashboard, interval_s, token
        self.samples: list[tuple[float, int]] = []
        self.events: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with suppress(OSError, ValueError):  # a missed sample; the dashboard may be busy for a moment
                rows = replica_rows(serve_details(self.dashboard, timeout_s=2.0, token=self.token))
                self.samples.append((time.perf_counter(), sum(r["state"] == "RUNNING" for r in rows)))
            self._stop.wait(self.interval_s)

    def mark(self, name: str) -> None:
        self.events.append((time.perf_counter(), name))

    def __enter__(self) -> "ReplicaSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
