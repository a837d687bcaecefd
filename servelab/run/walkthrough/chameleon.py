"""Steps the provisioning notebooks share, with python-chi, each printing the runbook's advice when it fails.
Runs in Chameleon Jupyter (python-chi and the standard library only)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable

from chi import lease, server
from chi.exception import ResourceError, ServiceError
from invoke.exceptions import UnexpectedExit  # what python-chi's `Server.execute` raises (it runs fabric)

from servelab.run.walkthrough import runbook


def origin_url() -> str:
    """Where this checkout was cloned from; an SSH address (git@host:owner/repo.git) becomes https."""
    try:
        url = subprocess.run(["git", "remote", "get-url", "origin"], capture_output=True, text=True, check=True,
                             timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        raise ValueError("This notebook is not in a git clone with an 'origin': set REPO_URL.") from err
    if url.startswith("git@"):
        host, path = url.removeprefix("git@").split(":", 1)
        url = f"https://{host}/{path}"
    return url


def wait_active(s: server.Server) -> None:
    """Wait until the server is ACTIVE: python-chi gives up after 20 minutes, while the node goes on booting."""
    with runbook.step(runbook.CHI_TIMEOUT, ServiceError):
        s.wait(status="ACTIVE")
    if s.status == "ERROR":
        print(runbook.SERVER_ERROR.advice())
        raise RuntimeError(f"{s.name} is in ERROR")


def reach(s: server.Server) -> str:
    """The server's floating IP (one is associated only where it has none, so a second run takes no other
    address), once SSH answers there."""
    if s.get_floating_ip() is None:
        s.associate_floating_ip()
    with runbook.step(runbook.BAD_NODE, ResourceError):
        s.check_connectivity()
    return s.get_floating_ip()


def run(s: server.Server, commands: Iterable[str], failure: runbook.Failure = runbook.INSTALL) -> None:
    """Each command on the server over SSH (as ``cc``), in order; the first that fails stops the rest."""
    for command in commands:
        with runbook.step(failure, UnexpectedExit):
            s.execute(command)


def release(servers: Iterable[str], lease_name: str) -> list[str]:
    """Delete each named server, then the lease; what is gone is said, not raised, so the cell can run again."""
    done = []
    for name in servers:
        try:
            server.get_server(name).delete()
            done.append(f"deleted server {name}")
        except Exception as exc:  # noqa: BLE001 - python-chi raises several kinds for "not found"
            done.append(f"no server {name} ({type(exc).__name__}: {exc})")
    try:
        lease.get_lease(lease_name).delete()
        done.append(f"deleted lease {lease_name}")
    except Exception as exc:  # noqa: BLE001 - likewise
        done.append(f"no lease {lease_name} ({type(exc).__name__}: {exc})")
    return done
