"""The lab node's Prometheus config, loaded by the real Prometheus (the project's copy; its ``promtool``-free
check: a start with that config). The rest of the monitoring files: tests/unit/test_monitoring_files.py."""

import pytest

from dockerspec import DOCKER


def test_prometheus_accepts_the_node_config(tmp_path):
    """The real Prometheus loads the node's config (its targets do not resolve here: they stay down)."""
    from servelab.core.installers.prometheus_install import PrometheusNotFound, locate

    try:
        binary = locate()
    except PrometheusNotFound as exc:
        pytest.skip(f"Prometheus cannot run here: {exc}")
    from servelab.core.procs import ServerProcess, free_port

    port = free_port()
    cmd = [str(binary.path), f"--config.file={DOCKER / 'prometheus' / 'prometheus.yml'}",
           f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"]
    with ServerProcess(cmd, f"http://127.0.0.1:{port}/-/ready", tmp_path / "prometheus.log", ready_timeout=60):
        pass
    assert "Completed loading of configuration file" in (tmp_path / "prometheus.log").read_text()
