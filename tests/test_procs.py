"""Servers started through ServerProcess end with us: on stop(), and when our process is killed."""

import subprocess
import sys
import time

import psutil
import pytest

from servelab.procs import ServerProcess, free_port

PARENT = """
import sys, time
from servelab.procs import ServerProcess, free_port
port = free_port()
server = ServerProcess([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                       f"http://127.0.0.1:{port}/", sys.argv[1]).start()
print(server.pid, flush=True)
time.sleep(120)
"""


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def test_stop_ends_the_server(tmp_path):
    port = free_port()
    server = ServerProcess([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                           f"http://127.0.0.1:{port}/", tmp_path / "log").start()
    pid = server.pid
    server.stop()
    server.stop()  # idempotent
    assert _gone(pid, 10)


def test_server_dies_with_a_killed_parent(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path / "log")], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert psutil.pid_exists(child)
    parent.kill()  # SIGKILL: no cleanup code of the parent runs
    parent.wait()
    assert _gone(child, 15), "the server outlived its parent"


def test_a_server_that_exits_early_is_reported(tmp_path):
    with pytest.raises(RuntimeError, match="exited with code 3"):
        ServerProcess([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], "http://127.0.0.1:9/",
                      tmp_path / "log", ready_timeout=10).start()
