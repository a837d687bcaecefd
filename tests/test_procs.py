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
                       f"http://127.0.0.1:{port}/", sys.argv[1], detach=sys.argv[2] == "detach").start()
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


def _server_of_killed_parent(tmp_path, mode: str) -> int:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path / "log"), mode],
                              stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert psutil.pid_exists(child)
    parent.kill()  # SIGKILL: no cleanup code of the parent runs
    parent.wait()
    return child


def test_server_dies_with_a_killed_parent(tmp_path):
    assert _gone(_server_of_killed_parent(tmp_path, "attached"), 15), "the server outlived its parent"


def test_a_detached_server_outlives_its_parent(tmp_path):
    """`servelab triton up` returns and leaves its server running for `servelab triton down`."""
    child = _server_of_killed_parent(tmp_path, "detach")
    try:
        assert not _gone(child, 2)
    finally:
        psutil.Process(child).kill()


def test_a_server_that_exits_early_is_reported(tmp_path):
    with pytest.raises(RuntimeError, match="exited with code 3"):
        ServerProcess([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], "http://127.0.0.1:9/",
                      tmp_path / "log", ready_timeout=10).start()


def test_a_server_started_from_a_worker_thread_outlives_the_thread(tmp_path):
    """Linux would signal the child when the forking thread ends; a pool thread ends any time."""
    import threading

    port = free_port()
    server = ServerProcess([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                           f"http://127.0.0.1:{port}/", tmp_path / "log")
    thread = threading.Thread(target=server.start)
    thread.start()
    thread.join()
    try:
        assert not _gone(server.pid, 2)
    finally:
        server.stop()
