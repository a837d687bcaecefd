"""Steps the provisioning notebooks share, with python-chi, each printing the runbook's advice when it fails.
Runs in Chameleon Jupyter (python-chi and the standard library only)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Sequence

from chi import lease, server
from chi.exception import ResourceError, ServiceError
from invoke.exceptions import UnexpectedExit  # what python-chi's `Server.execute` raises (it runs fabric)

from servelab.run.walkthrough import node_setup, runbook


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


def open_ports(s: server.Server, ports: Iterable[int]) -> None:
    """Attach the instructor's security groups (node_setup.SECURITY_GROUPS) for ``ports``; one attached already is
    kept, so the cell can run again."""
    for name, port, why in node_setup.SECURITY_GROUPS:
        if port not in ports:
            continue
        try:
            s.add_security_group(name)
        except Exception as exc:
            if "already" not in str(exc):
                raise
        print(f"open to the internet: port {port} ({why})")


def reach(s: server.Server) -> str:
    """The server's floating IP (one is associated only where it has none, so a second run takes no other
    address), once SSH answers there."""
    if s.get_floating_ip() is None:
        with runbook.step(runbook.FLOATING_IP, Exception):  # neutron's quota or conflict, through python-chi
            s.associate_floating_ip()
    with runbook.step(runbook.BAD_NODE, ResourceError):
        s.check_connectivity()
    return s.get_floating_ip()


def run(s: server.Server, commands: Iterable[str], failure: runbook.Failure = runbook.INSTALL) -> None:
    """Each command on the server over SSH (as ``cc``), in order; the first that fails stops the rest."""
    for command in commands:
        with runbook.step(failure, UnexpectedExit), runbook.step(runbook.LEASE_ENDED, OSError, EOFError):
            s.execute(command)  # paramiko's lost connection is an OSError (or EOFError): the node went away


def the_lease(name: str) -> lease.Lease:
    """The lease of that name; two of one name (python-chi refuses to choose) print the runbook's row."""
    with runbook.step(runbook.TWO_LEASES, ResourceError):
        return lease.get_lease(name)


def not_yours(names: Sequence[str], net_id: str, confirm: str = "", user: str | None = None) -> None:
    """Refuse, naming them, to delete servers or leases whose name does not end in a part of this Jupyter's user name
    (JUPYTERHUB_USER, else USER; "" where neither is set): a mistyped NET_ID names a classmate's node. ``confirm`` equal
    to ``net_id`` is the student's second, explicit yes (their Chameleon user name may not hold their netID)."""
    if user is None:
        user = os.environ.get("JUPYTERHUB_USER") or os.environ.get("USER") or ""
    user = user.lower()
    parts = {user, *re.split(r"[^a-z0-9]+", user)} - {""}
    foreign = [n for n in names if not any(n.lower().endswith(sep + part) for part in parts for sep in "_-")]
    if foreign and confirm != net_id:
        raise ValueError(f"Not deleted: {', '.join(foreign)} do not carry your Jupyter user name "
                         f"({user or 'not set'}). Check NET_ID ({net_id!r}): a mistyped one deletes a classmate's "
                         f"node. If they are yours, set CONFIRM_NET_ID = {net_id!r} and run the notebook again.")


def release(servers: Iterable[str], lease_name: str) -> list[str]:
    """Delete each named server, then the lease; what is gone is said, not raised, so the cell can run again."""
    named = [*(("server", name, server.get_server) for name in servers), ("lease", lease_name, lease.get_lease)]
    done = []
    for kind, name, get in named:
        try:
            get(name).delete()
            done.append(f"deleted {kind} {name}")
        except Exception as exc:  # noqa: BLE001 - python-chi raises several kinds for "not found"
            done.append(f"no {kind} {name} ({type(exc).__name__}: {exc})")
    return done
