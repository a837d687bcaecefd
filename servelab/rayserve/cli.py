"""``servelab ray``: a local multi-node Ray cluster and the Ray Serve stages on it.

    servelab ray up --stage ray-2 [--workers 1]     # a head + workers on 127.0.0.1 (by PID), then deploy
    servelab ray deploy --stage ray-dyn [--address HOST:PORT]   # (re)deploy onto a running cluster
    servelab ray status [--address HOST:PORT]       # nodes, replicas per node (Ray node ids)
    servelab ray down                               # stop what `up` started

The cluster to deploy to: ``--address``, else ``RAY_ADDRESS``, else the one ``up`` started. Serve's
HTTP proxy listens on ``RAY_SERVE_HOST:RAY_SERVE_PORT`` with the FastAPI services' API.
"""

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from servelab.paths import REPO_ROOT
from servelab.procs import session_members

STATE_FILE = REPO_ROOT / ".servelab" / "ray-up.json"


def _settings():
    from servelab.settings import get_settings

    return get_settings()


def _address(args) -> str:
    address = getattr(args, "address", None) or _settings().ray_address
    if not address and (state := load_state()):
        address = state["address"]
        for name, value in state["client_env"].items():  # its token
            os.environ.setdefault(name, value)
    if not address:
        raise SystemExit("no Ray cluster: pass --address HOST:PORT, set RAY_ADDRESS, or start one with `servelab ray up`")
    return address


def deploy_stage(name: str, address: str) -> dict[str, Any]:
    """Connect as a driver, deploy the stage, and return where its replicas run."""
    from servelab.rayserve.cluster import alive_nodes, connect, disconnect
    from servelab.rayserve.deployment import deploy
    from servelab.rayserve.serve_state import placement
    from servelab.rayserve.stages import STAGES

    dashboard = connect(address)
    try:
        started = time.monotonic()
        deploy(STAGES[name], _settings())
        nodes = alive_nodes()
        where = placement(dashboard) if dashboard else {}
        return {"stage": name, "deploy_s": round(time.monotonic() - started, 1), "nodes": nodes,
                "dashboard": dashboard, **where}
    finally:
        disconnect()


def deploy_in_child(name: str, cluster, port: int, log: Path, timeout_s: float = 300.0) -> None:
    """``servelab ray deploy`` onto a ``LocalCluster`` as a child process (the lab, the benchmark): this
    process never becomes a Ray driver. Serve's proxy gets ``port`` on 127.0.0.1."""
    import subprocess
    import sys

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        subprocess.run([sys.executable, "-m", "servelab", "ray", "deploy", "--stage", name, "--address",
                        cluster.address], stdout=out, stderr=subprocess.STDOUT, check=True, timeout=timeout_s,
                       env={**os.environ, **cluster.client_env(), "RAY_SERVE_PORT": str(port), "RAY_SERVE_HOST": "127.0.0.1"})


def status(address: str) -> dict[str, Any]:
    from servelab.rayserve.cluster import alive_nodes, connect, disconnect
    from servelab.rayserve.serve_state import replica_rows, serve_details

    dashboard = connect(address)
    try:
        details = serve_details(dashboard) if dashboard else {}
        return {"address": address, "dashboard": dashboard, "nodes": alive_nodes(), "replicas": replica_rows(details)}
    finally:
        disconnect()


def _print_placement(info: dict[str, Any]) -> None:
    heads = {n["node_id"] for n in info["nodes"] if n["head"]}
    for node in info["nodes"]:
        role = "head" if node["node_id"] in heads else "worker"
        print(f"  node {node['node_id']} ({role}, {node['cpus']:g} logical CPUs): "
              f"{info.get('replicas_per_node', {}).get(node['node_id'], 0)} running replica(s)")


# --- the cluster `up` leaves running ---------------------------------------------------------

def save_state(state: dict[str, Any]) -> None:
    STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    STATE_FILE.write_text(json.dumps(state, indent=2) + "\n")


def _is_ray_node(pid: int) -> bool:
    """True if ``pid`` runs a `ray start` we started (a reused PID is someone else's)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"start" in cmdline and b"--block" in cmdline and any(part.endswith(b"/ray") for part in cmdline[:2])


def load_state() -> dict[str, Any] | None:
    if not STATE_FILE.exists():
        return None
    state = json.loads(STATE_FILE.read_text())
    if not any(_is_ray_node(pid) for pid in state["pids"]):
        STATE_FILE.unlink()
        return None
    return state


def stop_saved(timeout_s: float = 10.0) -> dict[str, Any] | None:
    """SIGTERM each node `up` started, then SIGKILL what is left of their sessions."""
    state = load_state()
    if state is None:
        return None
    pids = [pid for pid in state["pids"] if _is_ray_node(pid)]
    for pid in pids:
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_is_ray_node(pid) for pid in pids):
        time.sleep(0.2)
    for pid in pids:
        for member in session_members(pid):
            os.kill(member, signal.SIGKILL)
    if Path(state["temp_dir"]).name.startswith("slray-"):
        shutil.rmtree(state["temp_dir"], ignore_errors=True)
    STATE_FILE.unlink(missing_ok=True)
    return state


# --- commands --------------------------------------------------------------------------------

def _up(args) -> int:
    from servelab.rayserve.cluster import LocalCluster

    if load_state() is not None:
        raise SystemExit(f"a cluster from `servelab ray up` is running ({STATE_FILE}); `servelab ray down` first")
    settings = _settings()
    cluster = LocalCluster(workers=args.workers, cpus_per_node=settings.ray_node_cpus, detach=True,
                           log_dir=REPO_ROOT / ".servelab" / "ray-logs").start()
    save_state({"address": cluster.address, "dashboard": cluster.dashboard_url, "pids": cluster.pids(),
                "temp_dir": str(cluster.temp_dir), "client_env": cluster.client_env()})
    os.environ.update(cluster.client_env())
    print(f"Ray cluster up: head {cluster.address} (PID {cluster.head.pid}), {args.workers} worker node(s) "
          f"(PIDs {', '.join(str(n.pid) for n in cluster.nodes)}); dashboard {cluster.dashboard_url}")
    try:
        info = deploy_stage(args.stage, cluster.address)
    except BaseException:
        stop_saved()
        raise
    print(f"{args.stage} deployed in {info['deploy_s']} s: http://{settings.ray_serve_host}:{settings.ray_serve_port}/predict")
    _print_placement(info)
    return 0


def _deploy(args) -> int:
    settings = _settings()
    info = deploy_stage(args.stage, _address(args))
    print(f"{args.stage} deployed in {info['deploy_s']} s: http://{settings.ray_serve_host}:{settings.ray_serve_port}/predict")
    _print_placement(info)
    return 0


def _status(args) -> int:
    info = status(_address(args))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"cluster {info['address']}, dashboard {info['dashboard']}")
    running = [r for r in info["replicas"] if r["state"] == "RUNNING"]
    info["replicas_per_node"] = {n["node_id"]: sum(r["node_id"] == n["node_id"] for r in running) for n in info["nodes"]}
    _print_placement(info)
    for r in info["replicas"]:
        print(f"  replica {r['replica']}: {r['state']} on node {r['node_id']} (PID {r['pid']})")
    return 0


def _down(args) -> int:
    state = stop_saved()
    print("no cluster from `servelab ray up` is running" if state is None
          else f"stopped the Ray cluster at {state['address']} (PIDs {', '.join(map(str, state['pids']))})")
    return 0


def register(subparsers) -> None:
    from servelab.rayserve.stages import STAGES

    ray = subparsers.add_parser("ray", help="Ray Serve stages on a (local, multi-node) Ray cluster")
    sub = ray.add_subparsers(dest="ray_command", required=True)
    p = sub.add_parser("up", help="start a local head + worker nodes (by PID), then deploy a stage")
    p.add_argument("--stage", choices=list(STAGES), default="ray-2")
    p.add_argument("--workers", type=int, default=1, help="worker nodes besides the head (default 1)")
    p.set_defaults(func=_up)
    p = sub.add_parser("deploy", help="deploy (or redeploy) a stage onto a running cluster")
    p.add_argument("--stage", choices=list(STAGES), required=True)
    p.add_argument("--address", help="the head's HOST:PORT (default: RAY_ADDRESS, else the `up` cluster)")
    p.set_defaults(func=_deploy)
    p = sub.add_parser("status", help="nodes and replicas per node (Ray node ids)")
    p.add_argument("--address", help="the head's HOST:PORT (default: RAY_ADDRESS, else the `up` cluster)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_status)
    p = sub.add_parser("down", help="stop the cluster `servelab ray up` started")
    p.set_defaults(func=_down)
