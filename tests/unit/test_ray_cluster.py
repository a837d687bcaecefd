"""``LocalCluster`` starts a node once more only when Ray's raylet missed its fixed time to register.

A short script stands in for ``ray start --block`` (a real process, read through the real
``ServerProcess``): it fails as told on its first runs, then prints Ray's ready line.
"""

import sys
import textwrap

import pytest

from servelab.core.procs import ServerProcess
from servelab.servers.rayserve import cluster as ray_cluster

NODE = textwrap.dedent("""
    import pathlib, sys, time
    runs = pathlib.Path(sys.argv[1]); failures = sys.argv[2:]
    n = int(runs.read_text() or 0) if runs.exists() else 0
    runs.write_text(str(n + 1))
    if n < len(failures):
        print(failures[n], flush=True); sys.exit(1)
    print("This command will now block forever", flush=True); time.sleep(60)
""")
MISSED = "Exception: The current node timed out during startup. This could happen because ..."


class ScriptedCluster(ray_cluster.LocalCluster):
    failures: list[str] = []

    def _node(self, name: str, args: list[str]) -> ServerProcess:
        log = self.log_dir / f"ray-{name}.log"
        log.write_text("")
        return ServerProcess([sys.executable, "-c", NODE, str(self.log_dir / f"{name}.runs"), *self.failures], None, log,
                             ready_timeout=20, stop_timeout=2, ready_check=lambda: ray_cluster.READY_LINE in log.read_text())


def started(tmp_path, failures: list[str]) -> tuple[ScriptedCluster, int]:
    cluster = ScriptedCluster(workers=0, log_dir=tmp_path, temp_dir=tmp_path / "slray-test")
    cluster.temp_dir.mkdir()
    cluster.failures = failures
    try:
        cluster.start()
    finally:
        runs = int((tmp_path / "head.runs").read_text())
    return cluster, runs


def test_a_node_that_missed_registration_is_started_once_more(tmp_path, capsys):
    cluster, runs = started(tmp_path, [MISSED])
    try:
        assert runs == 2 and cluster.head.proc.poll() is None
        assert "missed Ray's fixed 30 s to register" in capsys.readouterr().err
    finally:
        cluster.stop()


def test_it_gives_up_after_the_second_miss(tmp_path):
    with pytest.raises(RuntimeError, match="timed out during startup"):
        started(tmp_path, [MISSED, MISSED])
    assert (tmp_path / "head.runs").read_text() == str(ray_cluster.START_TRIES)


def test_any_other_failure_is_not_retried(tmp_path):
    with pytest.raises(RuntimeError, match="port already in use"):
        started(tmp_path, ["port already in use"])
    assert (tmp_path / "head.runs").read_text() == "1"
