"""What the local lab's Prometheus scrapes (a ``Targets`` file of ``file_sd_configs``, rewritten atomically) and
how it is read back (``PrometheusClient``, whose ``settle()`` waits until each target it names was scraped after a
given moment, so that a counter read afterwards includes everything that happened before it).
"""

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from servelab.core.fetch import write_atomic
from servelab.core.procs import DIRECT

TARGETS_FILE = "targets.json"


class Targets:
    """The scrape targets, one entry per metrics endpoint, in a ``file_sd_configs`` JSON file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._entries: dict[str, dict[str, Any]] = {}
        self._write()

    def add(self, address: str, job: str, **labels: str) -> None:
        """Scrape ``address`` (host:port, its /metrics) from now on; registering it again replaces its labels."""
        self._entries[address] = {"targets": [address], "labels": {"job": job, **labels}}
        self._write()

    def remove(self, address: str) -> None:
        self._entries.pop(address, None)
        self._write()

    def _write(self) -> None:
        # Prometheus may read the file at any moment: it must never see half of it (its folder is made too).
        text = json.dumps(list(self._entries.values()), indent=1) + "\n"
        write_atomic(self.path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def config_yaml(targets: Path, scrape_interval_s: float) -> str:
    """One scrape job for every target; each target's job label comes from the targets file."""
    # Timeout below the interval (Prometheus requires it); a slow /metrics is a failed scrape, seen in `up`.
    interval_ms = max(100, round(scrape_interval_s * 1000))
    return f"""global:
  scrape_interval: {interval_ms}ms
  scrape_timeout: {max(100, interval_ms * 4 // 5)}ms
  evaluation_interval: {interval_ms}ms
scrape_configs:
  - job_name: servelab
    file_sd_configs:
      - files: [{json.dumps(str(targets))}]
        refresh_interval: 5s
"""


class PrometheusError(RuntimeError):
    pass


@dataclass
class PrometheusClient:
    url: str  # http://host:port

    def _get(self, path: str, timeout: float = 10.0, **params: Any) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        try:
            with DIRECT.open(f"{self.url}{path}?{query}", timeout=timeout) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
            raise PrometheusError(f"{path}: HTTP {exc.code}: {body.get('error', '')}") from None
        except (OSError, ValueError) as exc:
            raise PrometheusError(f"Prometheus at {self.url} did not answer: {type(exc).__name__}: {exc}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query (at Unix time ``at``, default now): [{"metric": {...}, "value": [t, "v"]}, ...]."""
        return self._get("/api/v1/query", query=expr, time=at)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query: [{"metric": {...}, "values": [[t, "v"], ...]}, ...]."""
        return self._get("/api/v1/query_range", query=expr, start=start, end=end, step=step)["result"]

    def targets(self) -> list[dict[str, Any]]:
        return self._get("/api/v1/targets", state="active")["activeTargets"]

    def settle(self, after: float, instances: set[str], timeout: float = 10.0) -> float:
        """Wait until each of ``instances`` (targets) was scraped successfully after Unix time ``after``; returns a
        time at which an instant query sees those scrapes."""
        deadline = time.monotonic() + timeout
        while True:
            found = {t["labels"].get("instance"): t for t in self.targets()}
            # lastScrape is RFC 3339 in nanoseconds: fromisoformat keeps the microseconds.
            stale = sorted(i for i in instances if (t := found.get(i)) is None or t["health"] != "up"
                           or datetime.fromisoformat(t["lastScrape"]).timestamp() <= after)
            if instances and not stale:
                return time.time()
            if time.monotonic() > deadline:
                raise PrometheusError(f"no fresh scrape of {', '.join(stale)} within {timeout:.0f} s")
            time.sleep(0.05)
