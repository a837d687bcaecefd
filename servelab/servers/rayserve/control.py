"""Controlling a local multi-node Ray cluster and the Ray Serve stages on it (``servelab ray``, whose front
is ``servelab.cli.ray``). Serve's HTTP proxy listens on ``RAY_SERVE_HOST:RAY_SERVE_PORT`` with the FastAPI
services' API."""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from servelab.core import procs
from servelab.core.artifacts import ArtifactPaths
from servelab.core.paths import REPO_ROOT
from servelab.core.settings import get_settings
from servelab.core.variants.build import variant_path
from servelab.servers.rayserve.cluster import STOP_TIMEOUT_S, alive_nodes, driver
from servelab.servers.rayserve.options import STAGES
from servelab.servers.rayserve.serve_state import placement, replica_rows, serve_details

STATE_FILE = REPO_ROOT / ".servelab" / "ray-up.json"


def deploy_stage(name: str, address: str) -> dict[str, Any]:
    # Deferred, not a circle: importing it loads ray (an optional extra) only when this runs.
    from servelab.servers.rayserve.deployment import deploy

    with driver(address) as dashboard:
        started = time.monotonic()
        deploy(STAGES[name], get_settings())
        nodes = alive_nodes()
        where = placement(dashboard) if dashboard else {}
        return {"stage": name, "deploy_s": round(time.monotonic() - started, 1), "nodes": nodes,
                "dashboard": dashboard, **where}


def deploy_in_child(name: str, cluster, port: int, log: Path, timeout_s: float = 300.0) -> None:
    """``servelab ray deploy`` onto a ``LocalCluster`` as a child process (the lab, the benchmark): this
    process never becomes a Ray driver. Serve's proxy gets ``port`` on 127.0.0.1. A failed deploy raises
    ``RuntimeError`` with the end of the child's log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = log.stat().st_size if log.exists() else 0
    with open(log, "ab") as out:
        done = subprocess.run([sys.executable, "-m", "servelab", "ray", "deploy", "--stage", name, "--address",
                               cluster.address], stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                              env={**os.environ, **cluster.client_env(), "RAY_SERVE_PORT": str(port),
                                   "RAY_SERVE_HOST": "127.0.0.1"})
    if done.returncode:
        # The log may sit in a folder the caller deletes: the error carries the child's last words.
        tail = log.read_bytes()[start:].decode(errors="replace").strip().splitlines()[-25:]
        raise RuntimeError(f"servelab ray deploy --stage {name} exited {done.returncode} ({log}):\n"
                           + "\n".join(f"    {line}" for line in tail))


def roll_out(name: str, address: str, model_dir: Path | str | None = None, variant: str | None = None) -> dict[str, Any]:
    """Roll the running stage ``name`` over to the model in ``model_dir`` as ``variant`` in place
    (``deployment.reconfigure``); the seconds from the connection until every replica served it (``rollout_s``,
    not the caller's ``ready_s``) and the replicas before and after: the same ones, unless the stage or its
    settings differ from what runs (Ray restarts them then)."""
    # Deferred: the deployment imports Ray and the FastAPI app (optional extras).
    from servelab.servers.rayserve.deployment import reconfigure

    settings = get_settings()
    model_dir, variant = Path(model_dir or settings.model_dir).resolve(), variant or settings.onnx_variant
    # Refused here: a replica whose reconfigure fails is replaced, and its replacements fail the same way,
    # until none serves. The lab's nodes share this machine's disk: the replicas see what the driver sees.
    for path in (ArtifactPaths.in_dir(model_dir).manifest, variant_path(model_dir, variant)):
        if not path.is_file():
            raise FileNotFoundError(f"cannot roll out {variant} from {model_dir}: no {path.name} there")
    with driver(address) as dashboard:
        before = sorted(placement(dashboard)["replica_nodes"]) if dashboard else []
        started = time.monotonic()
        reconfigure(STAGES[name], settings, {"model_dir": str(model_dir), "variant": variant})
        rollout_s, ready_unix = time.monotonic() - started, time.time()
        after = sorted(placement(dashboard)["replica_nodes"]) if dashboard else []
        return {"stage": name, "model_dir": str(model_dir), "variant": variant, "rollout_s": round(rollout_s, 3),
                "ready_unix": round(ready_unix, 3), "replicas_before": before, "replicas_after": after}


async def roll_out_in_child(name: str, cluster, model_dir: Path | str | None = None, variant: str | None = None,
                            timeout_s: float = 300.0) -> dict[str, Any]:
    """``servelab ray rollout --json`` onto a ``LocalCluster`` as a child process, awaited (``rollout_load``'s
    action); its answer, or ``RuntimeError`` with its output. ``ready_s`` counts from this call (the child's
    seconds connecting to the cluster included, leaving it not) until every replica served the new model."""
    called = time.time()
    args = ["--model-dir", str(model_dir)] if model_dir else []
    args += ["--variant", variant] if variant else []
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "servelab", "ray", "rollout", "--stage", name, "--address", cluster.address, "--json",
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **cluster.client_env()})
    try:
        out, err = await asyncio.wait_for(child.communicate(), timeout_s)
    except asyncio.TimeoutError:
        child.kill()
        await child.wait()
        raise
    if child.returncode:
        raise RuntimeError(f"servelab ray rollout --stage {name} exited {child.returncode}:\n"
                           f"{(out + err).decode(errors='replace')[-3000:]}")
    answer = json.loads(out.splitlines()[-1])  # its one line of JSON, after whatever Ray printed
    return {**answer, "ready_s": round(answer["ready_unix"] - called, 3)}


def status(address: str) -> dict[str, Any]:
    with driver(address) as dashboard:
        details = serve_details(dashboard) if dashboard else {}
        return {"address": address, "dashboard": dashboard, "nodes": alive_nodes(), "replicas": replica_rows(details)}


# --- the cluster `up` leaves running ---------------------------------------------------------

def load_state() -> dict[str, Any] | None:
    return procs.load_state(STATE_FILE)


def stop_saved() -> dict[str, Any] | None:
    if (state := procs.stop_saved(STATE_FILE, STOP_TIMEOUT_S)) and Path(state["temp_dir"]).name.startswith("slray-"):
        shutil.rmtree(state["temp_dir"], ignore_errors=True)
    return state
