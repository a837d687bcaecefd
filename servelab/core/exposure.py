"""Who can reach what on the lab node: the one list of ports open to the internet, and why.

A node with a floating IP is on the public internet, and a testbed's nodes are scanned within minutes. So a
compose service publishes a port on every address only where a student opens it from a browser off the node;
everything else is on 127.0.0.1, reached through the SSH tunnel the notebooks print, and the security groups
open SSH and this list, nothing else (tests/unit/test_compose.py, test_exposure.py; docs/security.md).
"""

SSH_PORT = 22

# (compose service, container port) -> why it is open to the internet. The page students open in their
# browser, from their own computer, and show others: a tunnel per viewer would defeat its purpose.
PUBLIC = {
    ("flask", 5000): "GourmetGram, the web page students open in their browser and classify their own photos with",
}

# Reached through the SSH tunnel (published on the node's 127.0.0.1 only): port -> what answers there.
TUNNELLED = {
    8888: "Jupyter (its token too)",
    8000: "the FastAPI service (/docs; /admin/* also needs ADMIN_TOKEN) or Triton's HTTP API",
    8001: "Triton's gRPC API",
    8002: "Triton's metrics",
    3000: "Grafana (anonymous viewers; its admin password is generated)",
    9090: "Prometheus",
}


def public_ports() -> dict[int, str]:
    """Port -> why, for every port open to the internet besides SSH."""
    return {port: why for (_, port), why in PUBLIC.items()}


def ingress_ports() -> dict[int, str]:
    """What the node's security groups let in: SSH and the public ports."""
    return {SSH_PORT: "SSH: the notebooks' commands and every tunnel", **public_ports()}


def tunnel(address: str, ports: tuple[int, ...] = (8888, 8000, 3000), key: str = "~/.ssh/id_rsa_chameleon") -> str:
    """The ``ssh -L`` command that forwards ``ports`` of the node's 127.0.0.1 to the same ports here."""
    if unknown := set(ports) - set(TUNNELLED):
        raise ValueError(f"not tunnelled: {sorted(unknown)}")
    forwards = " ".join(f"-L {port}:127.0.0.1:{port}" for port in ports)
    return f"ssh {forwards} -i {key} cc@{address}"
