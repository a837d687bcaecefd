"""A FastAPI service as a child process on 127.0.0.1: how the lab and the benchmark start one."""

import sys
from pathlib import Path

from servelab.core.procs import ServerProcess


def fastapi_process(service: str, port: int, log: Path, env: dict[str, str], ready_timeout: float = 180) -> ServerProcess:
    """``servelab serve <service>`` on ``port``, ready once ``/ready`` answers; stopped by PID on exit."""
    cmd = [sys.executable, "-m", "servelab", "serve", service, "--host", "127.0.0.1", "--port", str(port)]
    # No access log while measuring: a log line per request is work the lab does not study.
    return ServerProcess(cmd, f"http://127.0.0.1:{port}/ready", log, env={"ACCESS_LOG": "0", **env},
                         ready_timeout=ready_timeout)
