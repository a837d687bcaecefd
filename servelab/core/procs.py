"""Start a server as a child process, wait until it answers, and always stop it by its PID, so every server we
start is ours to end and none is left running after Ctrl-C or a failure."""

import ctypes
import fcntl
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from functools import partial
from pathlib import Path
from typing import Any, Self

_PR_SET_PDEATHSIG = 1
try:  # looked up once here: between fork and exec the child may only make the C call
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: stop() remains the only way
    _prctl = None


def die_with_parent(parent: int) -> None:
    """In the child (before exec, or first thing in a worker process): Linux sends it SIGTERM when the thread that
    started it (our main thread, so in effect our process) ends, even when our process is killed with SIGKILL."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # we died before prctl took effect
            os._exit(1)


# Readiness checks go straight to 127.0.0.1, never through a proxy set in the environment.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

def cpu_count() -> int:
    """CPUs this process may run on (a container's CPU set, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def take_place(fd: int, count: int, mine: set[int]) -> int | None:
    """One of ``count`` places that no process holds, now this one's; None where all are held. A place is a
    byte of the file ``fd``, held with a POSIX record lock, which the kernel releases when the process dies,
    however it dies. ``mine``: the places this process holds (its own locks never conflict with each other)."""
    for place in sorted(set(range(count)) - mine):
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, place)
        except OSError:  # another process holds it
            continue
        mine.add(place)
        return place
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_http_ok(url: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    """Poll ``url`` until it answers 200; fail early if ``proc`` exits."""
    deadline, last = time.monotonic() + timeout, "no answer yet"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before {url} was ready{log_tail(log)}")
        try:
            with DIRECT.open(url, timeout=2) as response:
                if response.status == 200:
                    return
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = type(exc).__name__
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout:.0f} s ({last}){log_tail(log)}")


def wait_until(check: Callable[[], bool], what: str, timeout: float, proc: subprocess.Popen | None = None,
               log: Path | None = None) -> None:
    """Poll ``check()`` until it is true; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while not check():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before {what}{log_tail(log)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not {what} after {timeout:.0f} s{log_tail(log)}")
        time.sleep(0.2)


def _stat(pid: int | str) -> list[str]:
    """The fields of /proc/PID/stat after the name (state, ppid, pgrp, session, ..., [19] starttime); [] once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def session_members(sid: int) -> list[int]:
    """PIDs in session ``sid``: a child started with ``start_new_session`` and everything it started,
    also those that moved to process groups of their own (Ray's worker processes do)."""
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and _stat(e.name)[3:4] == [str(sid)]]


def log_tail(log: Path | None, lines: int = 20) -> str:
    """The last lines of a server's log, to end an error message with (empty without a log)."""
    if log is None or not Path(log).exists():
        return ""
    return f"\n--- last lines of {log} ---\n" + "\n".join(Path(log).read_text(errors="replace").splitlines()[-lines:])


class _StartStop:
    """Started on entering a ``with`` block, stopped on leaving it."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ServerProcess(_StartStop):
    """A child server process in its own process group, logging to a file, as a context manager or through
    ``start()``/``stop()`` (idempotent). Unless ``detach`` is set, it also ends when our process dies, however."""

    def __init__(self, cmd: list[str], ready_url: str | None, log: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None, ready_timeout: float = 120.0, stop_timeout: float = 40.0,
                 detach: bool = False, ready_check: Callable[[], bool] | None = None):
        # Ready when ready_url answers 200, or (no URL: a process without HTTP) when ready_check() is true.
        self.cmd, self.ready_url, self.ready_check, self.log = cmd, ready_url, ready_check, Path(log)
        self.env = {**os.environ, **(env or {})}
        # A detached server outlives us (`servelab triton up`); others end when our process ends.
        self.cwd, self.ready_timeout, self.stop_timeout, self.detach = cwd, ready_timeout, stop_timeout, detach
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _preexec(self):
        # Linux ties the parent-death signal to the thread that forks: only the main thread lives as
        # long as the process. From another thread, stop() is the only way the server ends.
        if self.detach or threading.current_thread() is not threading.main_thread():
            return None
        return partial(die_with_parent, os.getpid())

    def start(self) -> "ServerProcess":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            # A new session, so a terminal's Ctrl-C reaches us, not the server; we stop it ourselves.
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                         cwd=self.cwd, start_new_session=True,
                                         preexec_fn=self._preexec())
        try:
            if self.ready_url is not None:
                wait_http_ok(self.ready_url, self.ready_timeout, self.proc, self.log)
            elif self.ready_check is not None:  # neither: the caller checks readiness its own way
                wait_until(self.ready_check, "ready", self.ready_timeout, self.proc, self.log)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM the process group we created; once its leader has gone (and its children, or 3 s more: Triton's
        Python-backend stubs, uvicorn's workers) or after ``stop_timeout``, SIGKILL what is left of the session."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the group id is our child's PID (start_new_session)
            proc.wait(self.stop_timeout)
            children_end = time.monotonic() + 3.0
            while time.monotonic() < children_end:  # until killpg finds none of the group (ProcessLookupError)
                os.killpg(proc.pid, 0)
                time.sleep(0.05)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass  # nothing of the group is left, or it lingers
        finally:
            self.kill_session(proc.pid)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    @staticmethod
    def kill_session(sid: int) -> None:
        """SIGKILL what is left of the session we created (processes that left our process group)."""
        for pid in session_members(sid):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class ChildServer(_StartStop):
    """A server this process runs as a child (``process``, a ``ServerProcess`` its subclass makes), started
    and stopped with it, as a context manager."""

    process: ServerProcess

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def start(self) -> Self:
        self.process.start()
        return self

    def stop(self) -> None:
        self.process.stop()


# --- servers an `up` command leaves running (detached), for later commands to find and stop ---

def save_state(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` for later commands, readable by this user only (it may hold a server's key). Its ``pids``:
    the servers, each leading a session of its own; ``started`` keeps when each started (from the first save), so
    that a PID the system gives another process later is not taken for one of them."""
    state.setdefault("started", [_stat(pid)[19] for pid in state["pids"]])
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(json.dumps(state, indent=2) + "\n")
    path.chmod(0o600)


def _running(state: dict[str, Any]) -> list[int]:  # none where a state file of an older form has no "started"
    return [pid for pid, started in zip(state.get("pids", []), state.get("started", []))
            if (fields := _stat(pid)) and fields[19] == started and fields[0] != "Z"]


def load_state(path: Path) -> dict[str, Any] | None:
    """The state saved at ``path`` while one of its servers still runs (a stale file is removed)."""
    if not path.exists():
        return None
    if not _running(state := json.loads(path.read_text())):
        path.unlink()
        return None
    return state


def stop_saved(path: Path, timeout_s: float) -> dict[str, Any] | None:
    """Stop the servers saved at ``path``: SIGTERM to their process groups, then, once they have ended or after
    ``timeout_s``, SIGKILL to what is left of their sessions (a server's children too). Their state, else None."""
    if (state := load_state(path)) is None:
        return None
    pids = _running(state)
    for pid in pids:
        with suppress(ProcessLookupError):  # it ended a moment ago
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _running(state) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in pids:
        ServerProcess.kill_session(pid)
    path.unlink(missing_ok=True)
    return state
