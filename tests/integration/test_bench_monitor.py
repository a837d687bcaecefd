"""Utilization monitors: per-core CPU and the server's memory always; GPUs only where NVML works."""

import subprocess
import sys
import time

import psutil
import pytest

from servelab.measure.monitor import Monitor
from tinyserver import running

BUSY = "import time\nend = time.perf_counter() + 0.4\nwhile time.perf_counter() < end: pass"


def test_samples_cpu_and_server_memory() -> None:
    with running(service_ms=0) as url:
        pid = _pid_of(url)
        with Monitor(interval_s=0.05, server_pid=pid) as mon:
            subprocess.run([sys.executable, "-c", BUSY], check=True)  # one core busy: the samples must see it
        m = mon.result()
    assert len(m.t_s) >= 5 and m.t_s == sorted(m.t_s)  # 0.05 s apart over the child's 0.4 s at least
    assert all(len(sample) == psutil.cpu_count() for sample in m.cpu_pct)
    assert max(max(sample) for sample in m.cpu_pct) > 50
    assert m.server_pid == pid and len(m.rss_mib) == len(m.t_s)
    assert 5 < min(m.rss_mib) < 2000  # a Python server: tens of MiB
    if not m.gpus:  # this machine has no GPU: cleanly absent, with the reason
        assert m.gpu_note and m.gpu_util_mean_pct is None
    assert m.cpu_mean_pct is not None


def test_a_vanished_server_ends_its_memory_series() -> None:
    with running(service_ms=0) as url:
        pid = _pid_of(url)
    with Monitor(interval_s=0.05, server_pid=pid) as mon:
        time.sleep(0.15)
    m = mon.result()
    assert m.rss_mib == [] and m.t_s


def test_without_a_server_pid() -> None:
    with Monitor(interval_s=0.05) as mon:
        time.sleep(0.12)
    m = mon.result()
    assert m.server_pid is None and m.rss_mib == [] and len(m.t_s) >= 2


def _pid_of(url: str) -> int:
    port = int(url.rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
            return conn.pid
    pytest.fail(f"nothing listens on {port}")
