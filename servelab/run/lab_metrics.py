"""The lab's Prometheus and machine exporter, started beside its servers if they can be, each server registered
while it runs (``scrape``) and read back after each run. Without Prometheus the lab goes on: each record's
``prometheus`` entry then says why it has no server-side series."""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server

from servelab.core.catalogue import FAMILIES
from servelab.core.installers.opt_tools import ToolBinary
from servelab.core.installers.prometheus_install import PrometheusNotFound, locate
from servelab.core.procs import ChildServer, ServerProcess, free_port
from servelab.core.settings import get_settings
from servelab.measure.monitoring.machine_exporter import MachineCollector
from servelab.measure.monitoring.prometheus_server import TARGETS_FILE, PrometheusClient, Targets, config_yaml
from servelab.measure.monitoring.run_series import Before, PromWatch
from servelab.measure.records import Record, ServerSeries


class LocalPrometheus(ChildServer):
    """``prometheus`` as a child process on 127.0.0.1, its data and targets under ``home``."""

    def __init__(self, binary: ToolBinary, home: Path, scrape_interval_s: float,
                 retention_time: str, retention_size: str):
        self.home, self.port = Path(home), free_port()
        self.home.mkdir(parents=True, exist_ok=True)
        self.targets = Targets(self.home / TARGETS_FILE)
        config = self.home / "prometheus.yml"
        config.write_text(config_yaml(self.targets.path, scrape_interval_s))
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = PrometheusClient(self.url)
        self.process = ServerProcess(
            [str(binary.path), f"--config.file={config}", f"--storage.tsdb.path={self.home / 'data'}",
             f"--storage.tsdb.retention.time={retention_time}", f"--storage.tsdb.retention.size={retention_size}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"],
            f"{self.url}/-/ready", self.home / "prometheus.log", ready_timeout=60, stop_timeout=20)


class MachineExporter:
    """``GET /metrics`` on 127.0.0.1:``port``, from a daemon thread of this process."""

    def __init__(self, port: int):
        self.address = f"127.0.0.1:{port}"
        registry = CollectorRegistry()
        registry.register(MachineCollector())
        self._server, self._thread = start_http_server(port, addr="127.0.0.1", registry=registry)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@dataclass(frozen=True)
class Scraped:
    """One server being scraped: its family (a key of ``FAMILIES``) and the labels that select its series."""

    family: str
    labels: dict[str, str]  # at least "instance" (host:port of its metrics endpoint)


class LabPrometheus:
    def __init__(self, home: Path, log: Callable[[str], None] = print):
        self.home, self.log = Path(home), log
        self.server: LocalPrometheus | None = None
        self.machine: MachineExporter | None = None
        self.watch: PromWatch | None = None
        self.note = ""  # why there is no Prometheus (empty while there is one)

    def start(self) -> "LabPrometheus":
        settings = get_settings()
        try:
            binary = locate()
            self.server = LocalPrometheus(binary, self.home, settings.prometheus_scrape_interval_s,
                                          settings.prometheus_retention_time, settings.prometheus_retention_size)
            self.server.start()
        except (PrometheusNotFound, OSError, RuntimeError, TimeoutError) as exc:
            self.server = None
            self.note = f"Prometheus not running ({str(exc).splitlines()[0]})"
            self.log(f"prometheus: {self.note}; the lab goes on without the servers' own time series")
            return self
        self.machine = MachineExporter(free_port())
        self.server.targets.add(self.machine.address, "machine")
        self.watch = PromWatch(self.server.client, settings.prometheus_scrape_interval_s)
        self.log(f"prometheus: {binary.describe()} at {self.server.url} (PID {self.server.pid}), scraping every "
                 f"{settings.prometheus_scrape_interval_s:g} s; data in {self.home}")
        return self

    def stop(self) -> None:
        if self.machine is not None:
            self.machine.stop()
            self.machine = None
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __enter__(self) -> "LabPrometheus":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @contextmanager
    def scrape(self, address: str, family: str, **labels: str) -> Iterator[Scraped]:
        """Scrape ``address`` (host:port, path /metrics) while the block runs; Ray Serve adds its family."""
        if family not in FAMILIES:
            raise ValueError(f"no queries for the {family!r} family; add its record to servelab.core.catalogue.FAMILIES")
        if self.server is not None:
            self.server.targets.add(address, family, **labels)
        try:
            yield Scraped(family, {"instance": address})
        finally:
            if self.server is not None:
                self.server.targets.remove(address)
            if self.watch is not None:
                self.watch.forget(address)

    def switched(self, scraped: Scraped | None) -> None:
        """The server behind ``scraped`` now serves another stage, and may have counted requests of its own
        meanwhile (Triton runs a model's warm-up requests as it loads it): its next run reads it afresh."""
        if self.watch is not None and scraped is not None:
            self.watch.forget(scraped.labels["instance"])

    def before(self, scraped: Scraped | None) -> Before | str:
        if self.watch is None or scraped is None:
            return self.note or "no metrics endpoint registered for this server"
        return self.watch.before(scraped.family, scraped.labels)

    def after(self, record: Record, before: Before | str, scraped: Scraped | None, called: float) -> ServerSeries:
        """The server's series over ``record``'s measured window (else from ``called`` to now)."""
        if self.watch is None or scraped is None or isinstance(before, str):
            note = before if isinstance(before, str) else self.note
            if self.server is not None and "did not answer" in note:
                self.log(f"prometheus: {note}; this run has no server-side series")
            return ServerSeries(note=note)
        window = tuple(record.window_unix) if record.window_unix else (called, time.time())
        return self.watch.after(record, before, scraped.family, scraped.labels, window)

