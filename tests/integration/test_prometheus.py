"""A real Prometheus (the project's copy of Debian's 2.42) scraping a real FastAPI stage under load.

What it reads back is checked against the stage's own counters (its /metrics, read directly) and
against the load generator's figures; when Prometheus is gone the lab's reads turn into notes and the
report says so. Outside CI a machine that cannot install Prometheus skips these tests with the
reason; in CI they never skip. Every process here is started by the test and stopped by its PID.
"""

import time
import urllib.request
from collections.abc import Iterator

import psutil
import pytest

from fastapi_service import metric_samples, running
from servelab.core.installers.prometheus_install import PrometheusNotFound, locate
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.procs import free_port
from servelab.measure.loadgen import Labels, run_bench
from servelab.measure.monitoring.run_series import PromWatch, agreements
from servelab.measure.records import Load, Record
from servelab.measure.targets import FastAPITarget
from servelab.report.render import render_report
from servelab.run.lab_metrics import LabPrometheus, LocalPrometheus, MachineExporter
from tools import located_or_skipped

STEP_S = 0.5


@pytest.fixture(scope="module")
def binary():
    return located_or_skipped(locate, PrometheusNotFound, "Prometheus")


@pytest.fixture(scope="module")
def prometheus(binary, tmp_path_factory) -> Iterator[LocalPrometheus]:
    with LocalPrometheus(binary, tmp_path_factory.mktemp("prometheus"), STEP_S, "1h", "64MB") as prom:
        machine = MachineExporter(free_port())
        prom.targets.add(machine.address, "machine")
        try:
            yield prom
        finally:
            machine.stop()


@pytest.fixture(scope="module")
def stage(artifacts, prometheus, tmp_path_factory) -> Iterator[str]:
    """fastapi-onnx with dynamic batching (so batch sizes above 1 show), scraped while it runs."""
    with running("onnx", artifacts, tmp_path_factory.mktemp("logs"), max_batch_size=8, batch_timeout_ms=5) as url:
        address = url.removeprefix("http://")
        prometheus.targets.add(address, "fastapi", stage="fastapi-onnx-dyn")
        yield url
        prometheus.targets.remove(address)


@pytest.fixture(scope="module")
def measured(prometheus, stage) -> tuple[Record, dict[str, float]]:
    """One closed-loop run with Prometheus read before and after it, and the stage's own counters after."""
    watch = PromWatch(prometheus.client, STEP_S)
    labels = {"instance": stage.removeprefix("http://")}
    before = watch.before("fastapi", labels)
    assert not isinstance(before, str), before
    record = run_bench(FastAPITarget(stage, DEFAULT_IMAGE.read_bytes()),
                       Load.closed(8, 400, warmup=8, max_duration_s=60), Labels("fastapi-onnx-dyn"))
    record.prometheus = watch.after(record, before, "fastapi", labels, tuple(record.window_unix))
    with urllib.request.urlopen(f"{stage}/metrics", timeout=10) as response:
        own = metric_samples(response.read().decode(), "servelab_http_requests_total")
    return record, own


def test_counts_equal_the_clients_and_the_stages_own(measured, prometheus, stage):
    record, own = measured
    series = record.prometheus
    assert record.stats.error_count == 0 and record.stats.requests == 400
    assert series.requests == series.client_requests == 408  # warm-up + measured, exactly
    # Prometheus' latest sample of the counter is the stage's own counter (nothing was sent since).
    predict = sum(v for k, v in own.items() if 'route="/predict"' in k)
    at = prometheus.client.settle(time.time(), {stage.removeprefix("http://")})
    scraped = prometheus.client.query(
        f'sum(servelab_http_requests_total{{instance="{stage.removeprefix("http://")}",route="/predict"}})', at)
    assert float(scraped[0]["value"][1]) == predict >= 408


def test_rate_and_series_agree_with_the_load_generator(measured):
    record, _ = measured
    [agreement] = agreements([record])
    assert agreement.counts_agree is True
    # Both rates are measured and set side by side; how close they come is reported (the lab's report), not
    # held to a tolerance here: Prometheus' span and the client's window shift with a busy machine.
    assert agreement.rate_comparable, record.prometheus
    assert agreement.server_rps > 0 and agreement.client_rps > 0 and agreement.rate_ratio is not None
    series = record.prometheus.series
    for name in ("request rate (req/s)", "p50 (ms)", "p99 (ms)", "queue (ms)", "compute (ms)", "mean batch",
                 "CPU busy (%)", "memory used (GiB)"):
        assert len(series.get(name, [])) >= 3, (name, sorted(series))
    # 8 senders and batches of up to 8: the server formed batches above 1, and said so.
    assert max(v for _, v in series["mean batch"]) > 1.2
    assert all(0 <= v <= 100 for _, v in series["CPU busy (%)"])
    # Interpolated in the histogram's buckets, the server's median is recorded at every step.
    assert all(v > 0 for _, v in series["p50 (ms)"]) and record.stats.latency.p50_ms > 0


def test_a_removed_target_is_no_longer_scraped(prometheus):
    exporter = MachineExporter(free_port())
    try:
        prometheus.targets.add(exporter.address, "machine", stage="extra")
        prometheus.client.settle(time.time(), {exporter.address}, timeout=15)
        prometheus.targets.remove(exporter.address)
        deadline = time.monotonic() + 15
        while exporter.address in {t["labels"]["instance"] for t in prometheus.client.targets()}:
            assert time.monotonic() < deadline, "the target stayed after its removal"
            time.sleep(0.2)
    finally:
        exporter.stop()


def test_prometheus_down_the_lab_goes_on_and_says_so(binary, stage, tmp_path):
    logged: list[str] = []
    lab_prom = LabPrometheus(tmp_path / "prometheus", logged.append).start()
    pid = lab_prom.server.pid
    try:
        with lab_prom.scrape(stage.removeprefix("http://"), "fastapi", stage="fastapi-onnx-dyn") as scraped:
            lab_prom.server.stop()  # Prometheus dies between runs (stopped by its PID)
            assert lab_prom.server.pid is None and not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
            before = lab_prom.before(scraped)
            record = run_bench(FastAPITarget(stage, DEFAULT_IMAGE.read_bytes()), Load.sequential(5, warmup=1),
                               Labels("fastapi-onnx-dyn"))
            record.prometheus = lab_prom.after(record, before, scraped, time.time())
    finally:
        lab_prom.stop()
    assert record.stats.successes == 5  # the run itself went on
    assert "did not answer" in record.prometheus.note and record.prometheus.requests is None
    assert any("no server-side series" in line for line in logged)
    render_report([record], tmp_path / "report")
    tables = (tmp_path / "report" / "report-tables.md").read_text()
    assert "**Prometheus was not available for these runs**" in tables and "did not answer" in tables


def test_no_prometheus_binary_is_said_once_and_every_record_notes_it(tmp_path, monkeypatch):
    from servelab.core.settings import get_settings

    monkeypatch.setenv("PROMETHEUS", str(tmp_path / "no-such-prometheus"))
    get_settings.cache_clear()
    locate.cache_clear()
    logged: list[str] = []
    try:
        with LabPrometheus(tmp_path / "prometheus", logged.append) as lab_prom:
            assert lab_prom.server is None and lab_prom.before(None).startswith("Prometheus not running")
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
        locate.cache_clear()
    assert len(logged) == 1 and "the lab goes on without" in logged[0] and "no-such-prometheus" in logged[0]
