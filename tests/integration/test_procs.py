"""Servers started through ServerProcess end with us: on stop(), and when our process is killed."""

import os
import subprocess
import sys
import time

import psutil
import pytest

from servelab.core.procs import ServerProcess, free_port, load_state, save_state, stop_saved

PARENT = """
import sys, time
from servelab.core.procs import ServerProcess, free_port, load_state, save_state, stop_saved
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


# A server that starts a helper in a process group of its own, as Ray's worker processes do; the
# helper writes its PID to a file. Then the server answers HTTP.
LEAVES_GROUP = """
import os, subprocess, sys
# process_group=0: the helper leaves the group before it runs, not once its interpreter is up (a race on a busy machine).
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], process_group=0)
open(sys.argv[2], "w").write(str(helper.pid))
os.execvp(sys.executable, [sys.executable, "-m", "http.server", sys.argv[1], "--bind", "127.0.0.1"])
"""


def test_stop_also_ends_what_left_the_process_group(tmp_path):
    port, pid_file = free_port(), tmp_path / "helper.pid"
    server = ServerProcess([sys.executable, "-c", LEAVES_GROUP, str(port), str(pid_file)],
                           f"http://127.0.0.1:{port}/", tmp_path / "log").start()
    helper = int(pid_file.read_text())
    assert psutil.Process(helper).status() != psutil.STATUS_ZOMBIE and os.getpgid(helper) != server.pid
    server.stop()
    assert _gone(helper, 10), "the helper outlived stop()"


def test_ready_check_instead_of_a_url(tmp_path):
    marker = tmp_path / "up"
    server = ServerProcess([sys.executable, "-c", f"import pathlib, time; time.sleep(0.5); "
                            f"pathlib.Path({str(marker)!r}).touch(); time.sleep(60)"], None, tmp_path / "log",
                           ready_check=marker.exists, ready_timeout=20)
    with server:
        assert marker.exists()
    assert server.proc is None


def test_a_saved_server_is_found_and_stopped_by_a_later_command(tmp_path):
    """`up` saves a detached server (`servelab triton up`, `servelab ray up`), `down` stops it by its PID with what
    it started; a PID that another process holds now, or no process at all, is a stale state."""
    port, pid_file, path = free_port(), tmp_path / "helper.pid", tmp_path / "state" / "up.json"
    server = ServerProcess([sys.executable, "-c", LEAVES_GROUP, str(port), str(pid_file)],
                           f"http://127.0.0.1:{port}/", tmp_path / "log", detach=True).start()
    helper = int(pid_file.read_text())
    try:
        save_state(path, {"pids": [server.pid], "key": "k"})
        assert path.stat().st_mode & 0o777 == 0o600 and load_state(path)["key"] == "k"
        save_state(path, {"pids": [os.getpid()], "started": ["0"]})  # this PID, but not the process saved
        assert load_state(path) is None and not path.exists()
        path.write_text('{"pid": 1, "binary": "tritonserver"}')  # what `servelab triton up` wrote before
        assert load_state(path) is None and not path.exists()
        save_state(path, {"pids": [server.pid], "key": "k"})
        assert stop_saved(path, 10)["key"] == "k"
        assert _gone(server.pid, 10) and _gone(helper, 10) and not path.exists()
        assert load_state(path) is None and stop_saved(path, 10) is None
    finally:
        server.stop()
