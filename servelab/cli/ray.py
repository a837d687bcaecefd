"""``servelab ray up | deploy | rollout | status | down``: the front of ``servelab.servers.rayserve.control``."""

import json
import os
from collections import Counter
from typing import Any

from servelab.core.catalogue import RAY, default_stage
from servelab.core.paths import REPO_ROOT
from servelab.core.procs import save_state
from servelab.core.settings import get_settings
from servelab.core.variants.build import VARIANTS
from servelab.servers.rayserve import control
from servelab.servers.rayserve.cluster import LocalCluster
from servelab.servers.rayserve.options import STAGES


def _address(args) -> str:
    address = getattr(args, "address", None) or get_settings().ray_address
    if not address and (state := control.load_state()):
        address = state["address"]
        for name, value in state["client_env"].items():  # its token
            os.environ.setdefault(name, value)
    if not address:
        raise SystemExit("no Ray cluster: pass --address HOST:PORT, set RAY_ADDRESS, or start one with `servelab ray up`")
    return address


def _print_placement(info: dict[str, Any]) -> None:
    for node in info["nodes"]:
        print(f"  node {node['node_id']} ({'head' if node['head'] else 'worker'}, {node['cpus']:g} logical CPUs): "
              f"{info.get('replicas_per_node', {}).get(node['node_id'], 0)} running replica(s)")


def _up(args) -> None:
    if control.load_state() is not None:
        raise SystemExit(f"a cluster from `servelab ray up` is running ({control.STATE_FILE}); "
                         "`servelab ray down` first")
    cluster = LocalCluster(workers=args.workers, cpus_per_node=get_settings().ray_node_cpus, detach=True,
                           log_dir=REPO_ROOT / ".servelab" / "ray-logs").start()
    save_state(control.STATE_FILE, {"address": cluster.address, "dashboard": cluster.dashboard_url,
                                    "pids": cluster.pids(), "temp_dir": str(cluster.temp_dir),
                                    "client_env": cluster.client_env()})
    os.environ.update(cluster.client_env())
    print(f"Ray cluster up: head {cluster.address} (PID {cluster.head.pid}), {args.workers} worker node(s) "
          f"(PIDs {', '.join(str(n.pid) for n in cluster.nodes)}); dashboard {cluster.dashboard_url}")
    try:
        _deploy(args, cluster.address)
    except BaseException:
        control.stop_saved()
        raise


def _deploy(args, address: str | None = None) -> None:
    settings, info = get_settings(), control.deploy_stage(args.stage, address or _address(args))
    print(f"{args.stage} deployed in {info['deploy_s']} s: http://{settings.ray_serve_host}:{settings.ray_serve_port}/predict")
    _print_placement(info)


def _rollout(args) -> None:
    try:
        info = control.roll_out(args.stage, _address(args), args.model_dir, args.variant)
    except FileNotFoundError as exc:
        raise SystemExit(f"servelab ray rollout: {exc}") from None
    if args.json:
        print(json.dumps(info))
        return
    restarted = set(info["replicas_before"]) - set(info["replicas_after"])
    how = (f"{len(restarted)} replica(s) restarted (not the stage or settings deployed?)" if restarted
           else f"{len(info['replicas_after'])} replica(s), in place")
    print(f"{args.stage} rolled out to {info['variant']} from {info['model_dir']} in {info['rollout_s']} s: {how}")


def _status(args) -> None:
    info = control.status(_address(args))
    if args.json:
        print(json.dumps(info, indent=2))
        return
    print(f"cluster {info['address']}, dashboard {info['dashboard']}")
    info["replicas_per_node"] = Counter(r["node_id"] for r in info["replicas"] if r["state"] == "RUNNING")
    _print_placement(info)
    for r in info["replicas"]:
        print(f"  replica {r['replica']}: {r['state']} on node {r['node_id']} (PID {r['pid']})")


def _down(args) -> None:
    state = control.stop_saved()
    print("no cluster from `servelab ray up` is running" if state is None
          else f"stopped the Ray cluster at {state['address']} (PIDs {', '.join(map(str, state['pids']))})")


def register(subparsers) -> None:
    ray = subparsers.add_parser("ray", help="Ray Serve stages on a (local, multi-node) Ray cluster")
    sub = ray.add_subparsers(dest="ray_command", required=True)
    up = sub.add_parser("up", help="start a local head + worker nodes (by PID), then deploy a stage")
    up.add_argument("--stage", choices=list(STAGES), default=default_stage(RAY.name))
    up.add_argument("--workers", type=int, default=1, help="worker nodes besides the head (default 1)")
    up.set_defaults(func=_up)
    deploy = sub.add_parser("deploy", help="deploy (or redeploy) a stage onto a running cluster")
    deploy.add_argument("--stage", choices=list(STAGES), required=True)
    rollout = sub.add_parser("rollout", help="serve another model on the running stage, in place, while it serves")
    rollout.add_argument("--stage", choices=list(STAGES), required=True, help="the stage running (as deployed)")
    rollout.add_argument("--model-dir", help="a folder laid out as MODEL_DIR (default: MODEL_DIR)")
    rollout.add_argument("--variant", choices=list(VARIANTS), help="its ONNX model (default: ONNX_VARIANT)")
    status = sub.add_parser("status", help="nodes and replicas per node (Ray node ids)")
    for p, func in ((deploy, _deploy), (rollout, _rollout), (status, _status)):  # the options they share, last
        p.add_argument("--address", help="the head's HOST:PORT (default: RAY_ADDRESS, else the `up` cluster)")
        if p is not deploy:
            p.add_argument("--json", action="store_true")
        p.set_defaults(func=func)
    sub.add_parser("down", help="stop the cluster `servelab ray up` started").set_defaults(func=_down)
