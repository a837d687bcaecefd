"""The Ray part's two Chameleon nodes (``9_ray_setup``), with python-chi: a head and a worker in one lease,
started, prepared, given the cluster's token and a firewall, then brought up head first. Runs in Chameleon
Jupyter (python-chi and the standard library only); every value comes from the notebook."""

from __future__ import annotations

import secrets
import shlex
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from chi import lease, server

from servelab.run.walkthrough import chameleon, node_setup, runbook

IMAGE = "CC-Ubuntu24.04-CUDA"
CHECKOUT = node_setup.CHECKOUT
# Written on each node by `cluster_files`, read by the compose files (git-ignored, never in an image).
CLUSTER_DIR = f"{CHECKOUT}/.ray-cluster"
HEAD_COMPOSE = "docker/docker-compose-ray-head.yaml"
WORKER_COMPOSE = "docker/docker-compose-ray-worker.yaml"
# Open to everyone: SSH on both nodes, GourmetGram (the page students open) on the head.
SSH_PORT, GOURMETGRAM_PORT = 22, 5000
CHAIN = "SERVELAB_RAY"


@dataclass(frozen=True)
class RayNodes:
    lease: str
    head: str
    worker: str

    @classmethod
    def for_student(cls, net_id: str) -> RayNodes:
        return cls(f"serve_ray_{net_id}", f"node-ray-head-{net_id}", f"node-ray-worker-{net_id}")


def reserve(name: str, start: datetime, length: timedelta, head_type: str, worker_type: str) -> lease.Lease:
    """Submit the lease: one reservation of two nodes when both are of one type, else one per type."""
    new = lease.Lease(name, start_date=start, end_date=start + length)
    for node_type, amount in Counter([head_type, worker_type]).items():
        new.add_node_reservation(amount=amount, node_type=node_type)
    # idempotent: running the cell again keeps the lease of that name instead of booking a second one.
    new.submit(idempotent=True, wait_for_active=False)
    return new


def reservation_id(found: lease.Lease, node_type: str) -> str:
    """The lease's node reservation for ``node_type`` (in its ``resource_properties``)."""
    reservations = found.node_reservations
    matching = [r for r in reservations if f'"{node_type}"' in (r.get("resource_properties") or "")]
    if not matching and len(reservations) != 1:
        raise ValueError(f"lease {found.name} has no reservation for {node_type}")
    return (matching or reservations)[0]["id"]


def start_servers(found: lease.Lease, nodes: RayNodes, head_type: str, worker_type: str,
                  image: str = IMAGE) -> tuple[server.Server, server.Server]:
    """Both servers, booted in parallel (about 10 minutes) from ``image`` (the class's prepared image, or
    Chameleon's own), each with the instructor's security groups (SSH; GourmetGram on the head), a floating IP and
    SSH answering. The firewall below still closes Ray's ports where a site applies no security group."""
    made = []
    for name, node_type in ((nodes.head, head_type), (nodes.worker, worker_type)):
        s = server.Server(name, reservation_id=reservation_id(found, node_type), image_name=image)
        s.submit(idempotent=True, wait_for_active=False)
        made.append(s)
    for s, ports in zip(made, ((SSH_PORT, GOURMETGRAM_PORT), (SSH_PORT,)), strict=True):
        chameleon.wait_active(s)
        chameleon.open_ports(s, ports)
        chameleon.reach(s)
    return made[0], made[1]


def private_address(s: server.Server) -> str:
    """The server's fixed IPv4 address (the shared network's, not the floating IP)."""
    fixed = [a["addr"] for addresses in s.addresses.values() for a in addresses
             if a.get("OS-EXT-IPS:type") == "fixed" and a.get("version", 4) == 4]
    if not fixed:
        raise ValueError(f"server {s.name} has no fixed IPv4 address yet: {s.addresses}")
    return fixed[0]


prepare_commands = node_setup.node_commands  # everything a node needs before its compose file starts


def prepare(s: server.Server, repo_url: str, *, gpu: bool) -> None:
    chameleon.run(s, prepare_commands(repo_url, gpu=gpu))


def new_token() -> str:
    """The cluster's shared secret for Ray's token authentication (RAY_AUTH_MODE=token)."""
    return secrets.token_hex(32)


def cluster_files(token: str, node_address: str, head_address: str) -> str:
    """A command writing the node's ``node.env`` and the token, readable by its user only, never printed."""
    env = f"NODE_PRIVATE_IP={node_address}\nHEAD_PRIVATE_IP={head_address}\n"
    return (f"umask 077 && mkdir -p {CLUSTER_DIR}"
            f" && printf %s {shlex.quote(env)} > {CLUSTER_DIR}/node.env"
            f" && printf %s {shlex.quote(token)} > {CLUSTER_DIR}/auth_token")


def firewall(peers: Sequence[str], public_ports: Iterable[int]) -> str:
    """One idempotent command: new TCP connections only from this node, ``peers`` and on ``public_ports``.
    Bare metal has no security groups and a floating IP forwards every port, while Ray listens on many."""
    rules = ["-i lo -j ACCEPT", "-m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
             *(f"-s {peer} -j ACCEPT" for peer in peers),
             *(f"-p tcp --dport {port} -j ACCEPT" for port in sorted(set(public_ports))),
             "-p tcp --syn -j DROP"]
    return " && ".join([
        f"(sudo iptables -N {CHAIN} 2>/dev/null || sudo iptables -F {CHAIN})",
        *(f"sudo iptables -A {CHAIN} {rule}" for rule in rules),
        f"(sudo iptables -C INPUT -j {CHAIN} 2>/dev/null || sudo iptables -I INPUT -j {CHAIN})",
    ])


def _compose(file: str, arguments: str) -> str:
    return f"cd {CHECKOUT} && docker compose -f {file} {arguments}"


def alive_nodes_check(count: int, wait_s: int) -> str:
    """A command waiting (``wait_s`` at most) for ``count`` live Ray nodes; it fails with the count it saw."""
    probe = "\n".join([
        "import time, ray",
        "ray.init(address='auto', logging_level='ERROR')",
        f"deadline = time.monotonic() + {wait_s}",
        f"while (alive := sum(n['Alive'] for n in ray.nodes())) < {count}:",
        f"    assert time.monotonic() < deadline, f'{{alive}} of {count} Ray nodes alive after {wait_s} s'",
        "    time.sleep(5)",
        "print(alive, 'Ray nodes alive')",
    ])
    return _compose(HEAD_COMPOSE, f"exec -T ray_head python -c {shlex.quote(probe)}")


def bring_up(head: server.Server, worker: server.Server, *, worker_gpu: bool, wait_s: int = 900) -> None:
    """The head, then the worker, then both in Ray (``--force-recreate``: an old container keeps an old token)."""
    # The first start builds the images; a build that fails or a container that never turns healthy says what to do.
    chameleon.run(head, [_compose(HEAD_COMPOSE, "up -d --wait --force-recreate ray_head")], runbook.UNHEALTHY)
    # A worker without a GPU runs the compose file's CPU variant (profile `cpu`).
    worker_up = "up -d --force-recreate ray_worker" if worker_gpu else "--profile cpu up -d --force-recreate ray_worker_cpu"
    chameleon.run(worker, [_compose(WORKER_COMPOSE, worker_up)], runbook.UNHEALTHY)
    chameleon.run(head, [f"mkdir -p {CHECKOUT}/results", _compose(HEAD_COMPOSE, "up -d flask jupyter"),
                         alive_nodes_check(2, wait_s), _compose(HEAD_COMPOSE, "exec -T ray_head ray status")],
                  runbook.UNHEALTHY)


def release(nodes: RayNodes) -> list[str]:
    """Delete both servers and the lease, whichever still exist."""
    return chameleon.release([nodes.head, nodes.worker], nodes.lease)
