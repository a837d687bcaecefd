"""`servelab load` from the command line, against the tiny server (a real process)."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.measure.records import read_records
from servelab.measure.senders import BOUND_FRACTION
from tinyserver import running


def servelab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servelab", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def server() -> str:
    with running(service_ms=5, slots=1) as url:
        yield url


def test_sweep_appends_one_record_per_run_and_prints_the_table(server: str, tmp_path: Path) -> None:
    out = tmp_path / "records.jsonl"
    done = servelab("load", "fastapi", "--url", server, "--concurrency", "1,2,4", "--requests", "40",
                    "--warmup", "4", "--stage", "tiny", "--config", "slots=1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0].split()
    for column in ("p50", "p95", "p99", "ms", "req/s", "errors"):
        assert column in header
    records = read_records(out)
    assert [r.load.concurrency for r in records] == [1, 2, 4]
    assert all(r.stats.successes == 40 and r.stage == "tiny" and r.config == {"slots": "1"} for r in records)
    # In ms, not seconds: the server holds each request its 5 ms (its own Server-Timing says so), the client more.
    assert records[0].breakdown.service_ms == pytest.approx(5, rel=0.01)
    assert records[0].breakdown.service_ms <= records[0].stats.latency.p50_ms
    assert "[3/3] tiny concurrency 4" in done.stderr
    # Appends, never overwrites.
    assert servelab("load", "fastapi", "--url", server, "--requests", "5", "--out", str(out)).returncode == 0
    assert len(out.read_text().splitlines()) == 4
    assert read_records(out)[-1].load.mode == "sequential"


def test_open_loop_and_duration_flags(server: str, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    done = servelab("load", "fastapi", "--url", server, "--rate", "50,100", "--arrivals", "constant",
                    "--duration", "0.4", "--warmup", "0", "--out", str(out))
    assert done.returncode == 0, done.stderr
    loads = [r.load for r in read_records(out)]
    assert [(x.mode, x.rate, x.arrivals, x.duration_s) for x in loads] == [
        ("open", 50, "constant", 0.4), ("open", 100, "constant", 0.4)]
    assert [r.stats.successes for r in read_records(out)] == [20, 40]


def test_client_flags_reach_the_record(server: str, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    done = servelab("load", "fastapi", "--url", server, "--concurrency", "2", "--requests", "30", "--warmup", "0",
                    "--warmup-seconds", "0.2", "--processes", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    [record] = read_records(out)
    assert record.load.warmup_s == 0.2 and record.warmup_requests > 0
    assert record.client.processes == 2 and record.stats.successes == 30
    assert record.client.cpu_ms_per_request > 0 and record.client.bound == (record.client.busy > BOUND_FRACTION)


def test_a_stage_that_is_down_fails_the_command(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = servelab("load", "triton", "--url", f"127.0.0.1:{port}", "--requests", "3", "--warmup", "0")
    assert done.returncode == 1
    assert "connection_refused 3" in done.stdout


def test_conflicting_load_flags_are_refused(server: str) -> None:
    done = servelab("load", "fastapi", "--url", server, "--concurrency", "2", "--rate", "10")
    assert done.returncode != 0 and "not both" in done.stderr + done.stdout


def test_input_data_and_missing_perf_analyzer(tmp_path: Path) -> None:
    path = tmp_path / "input.json"
    done = servelab("load", "input-data", "--out", str(path))
    assert done.returncode == 0, done.stderr
    assert list(json.loads(path.read_text())["data"][0]) == ["INPUT_IMAGE"]
    # No perf_analyzer to be found: a failed measurement that says how to get one, and a failing exit.
    records = tmp_path / "records.jsonl"
    done = subprocess.run([sys.executable, "-m", "servelab", "load", "perf-analyzer", "--concurrency", "8",
                           "--config", "instances=2", "--out", str(records)], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(tmp_path), "PERF_ANALYZER": str(tmp_path / "nowhere")})
    assert done.returncode == 1 and "FAILED" in done.stdout and "make perf-analyzer" in done.stdout
    assert json.loads(records.read_text())["config"]["instances"] == "2"  # the stage's config, as servelab load's
