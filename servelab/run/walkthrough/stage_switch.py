"""Switching Triton to a stage from a notebook: show progress, give up in time, and say why. A stage can take
minutes to load (eight PyTorch instances on a small CPU) or never load: a failure says Triton's own account."""

import shlex
import subprocess
import tempfile
import time

from servelab.core.procs import log_tail
from servelab.servers.triton.server import load_state, repository_index, server_address

COMPOSE_LOG = "docker compose -f docker/docker-compose-triton.yaml logs triton_server | tail -n 40"


def _states_line(url: str, models: tuple[str, ...]) -> str:
    """Each model's state in Triton's repository index, with its reason (``UNAVAILABLE: failed to load ...``)."""
    try:
        index = repository_index(url, timeout=10)
    except OSError as exc:
        return f"Triton does not answer ({type(exc).__name__})"
    except RuntimeError as exc:  # Triton's own refusal, e.g. a model-control key that is not its own
        return f"Triton refused its repository index: {exc}"
    states = {e["name"]: e.get("state", "?") + (f": {e['reason']}" if e.get("reason") else "") for e in index}
    return ", ".join(f"{m} {states.get(m, 'not in the repository index')}" for m in models)


def server_log(url: str) -> str:
    """The end of the server's log where `servelab triton up` started it here, else how to read it on the node."""
    if (state := load_state()) is not None and server_address(state["url"]) == server_address(url):
        return log_tail(state["log"], 30)
    return f"\nTriton's log is not readable from here; in your SSH session on the node: {COMPOSE_LOG}"


def diagnosis(url: str, models: tuple[str, ...]) -> str:
    return f"\nTriton says: {_states_line(url, models)}{server_log(url)}"


def run_switch(command: str, url: str, models: tuple[str, ...], *, wait_s: float, interval_s: float = 1.0) -> float:
    """Run ``command``, printing each new state of ``models`` until it exits; its seconds. RuntimeError when it
    fails, TimeoutError past ``wait_s``, both with :func:`diagnosis`."""
    argv = shlex.split(command)
    print(f"$ {command}", flush=True)
    started, shown = time.monotonic(), None
    with tempfile.TemporaryFile("w+") as output, subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT,
                                                                  text=True) as process:
        while process.poll() is None:
            elapsed = time.monotonic() - started
            if elapsed > wait_s:
                process.kill()  # our own child; the server keeps whatever it loaded so far
                raise TimeoutError(f"`{command}` did not finish within {wait_s:g} s{diagnosis(url, models)}")
            if (now := _states_line(url, models)) != shown:
                print(f"  {elapsed:4.0f} s  {now}", flush=True)
                shown = now
            time.sleep(interval_s)
        output.seek(0)
        said = output.read().strip()
    if process.returncode:
        raise RuntimeError(f"`{command}` failed (exit {process.returncode}):\n{said}{diagnosis(url, models)}")
    return time.monotonic() - started
