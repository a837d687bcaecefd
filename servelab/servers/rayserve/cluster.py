"""A real multi-node Ray cluster on this machine: a head and worker nodes as child processes (docs/ray.md).

Each node is its own ``ray start --block`` process on 127.0.0.1, in a session of its own, stopped by its PID:
``ServerProcess`` ends the process group and then whatever is left of the session (Ray's worker processes leave the
group). ``RAY_NODE_CPUS`` logical CPUs and a ``servelab_node`` resource per node are a CPU stand-in for a lab node's
capacity. ``kill_worker`` is the node-failure run: SIGKILL to a worker's whole session, as a lost machine.

Ray's own gRPC servers listen on every interface (Ray has no option to bind them to 127.0.0.1), so the
cluster uses token authentication with a token of its own (``client_env()`` is what a driver needs to
join). An explicit token also keeps the nodes consistent: Ray 2.60's head turns token auth on by itself
when ``~/.ray/auth_token`` exists, its workers do not, and they then cannot join.
"""

import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from servelab.core.procs import ServerProcess, free_port

READY_LINE = "This command will now block forever"  # `ray start --block` prints it once the node is up
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # small: replicas pass requests, not tensors, through it
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 5.0  # `ray start --block` may take 30 s to wind down on SIGTERM; past this, SIGKILL
# Ray gives a new raylet a fixed 30 s to register with the GCS (ray/_private/node.py), with no setting
# to lengthen it; a busy machine can miss it. That one failure is worth a second try, no other.
MISSED_REGISTRATION = "timed out during startup"
START_TRIES = 2


def ray_binary() -> str:
    return str(Path(sys.executable).with_name("ray"))


# The environment of every node (and so of its Serve proxy and replicas).
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage reports: nothing leaves the machine
    # The one proxy runs on the head; by default it sends requests to the head's own replicas
    # while they keep up, which leaves a worker node idle under light load. Spread them instead.
    "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",
    # Each node's metrics agent publishes every 10 s by default; the lab reads counts back after each run.
    "RAY_metrics_report_interval_ms": "500",
}


@dataclass
class LocalCluster:
    workers: int = 1
    cpus_per_node: int = 2
    log_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    temp_dir: Path | None = None  # Ray's session folder; short, for its unix sockets (≤ 107 bytes)
    head: ServerProcess | None = None
    nodes: list[ServerProcess] = field(default_factory=list)  # the worker nodes, in start order
    dashboard_port: int | None = None
    detach: bool = False  # `servelab ray up`: the nodes outlive this process (`down` stops them)
    token: str = ""  # the cluster's authentication token (made by start())
    metrics: dict[str, str] = field(default_factory=dict)  # node name -> host:port of its metrics agent

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def token_path(self) -> Path:
        return self.temp_dir / "auth_token"

    def client_env(self) -> dict[str, str]:
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path)}

    @property
    def dashboard_url(self) -> str | None:
        return f"http://127.0.0.1:{self.dashboard_port}" if self.dashboard_port else None

    def _node(self, name: str, args: list[str]) -> ServerProcess:
        log = self.log_dir / f"ray-{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")  # readiness reads this run's lines only
        metrics_port = free_port()
        self.metrics[name] = f"127.0.0.1:{metrics_port}"
        cmd = [ray_binary(), "start", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", str(self.cpus_per_node),
               "--resources", json.dumps({"servelab_node": 1}), "--object-store-memory", str(OBJECT_STORE_BYTES),
               "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(metrics_port),
               "--disable-usage-stats", *args]
        return ServerProcess(cmd, None, log, env={**RAY_ENV, **self.client_env(), **self.env}, ready_timeout=START_TIMEOUT_S,
                             stop_timeout=STOP_TIMEOUT_S, detach=self.detach, ready_check=lambda: READY_LINE in log.read_text(errors="replace"))

    def _start_node(self, name: str, args: list[str]) -> ServerProcess:
        for attempt in range(1, START_TRIES + 1):
            try:
                return self._node(name, args).start()
            except RuntimeError as exc:
                if attempt == START_TRIES or MISSED_REGISTRATION not in str(exc):
                    raise
                print(f"ray: the {name} node missed Ray's fixed 30 s to register with the GCS "
                      f"(a busy machine); starting it once more", file=sys.stderr, flush=True)

    def start(self) -> "LocalCluster":
        self.port = self.port or free_port()
        self.temp_dir = self.temp_dir or Path(tempfile.mkdtemp(prefix="slray-", dir="/tmp"))
        self.token = secrets.token_hex(32)  # 256 bits, as `ray get-auth-token --generate` makes
        self.token_path.touch(mode=0o600)
        self.token_path.write_text(self.token)
        self.dashboard_port = free_port()  # its REST API reports replicas and their nodes (`serve_state`)
        head = ["--head", "--port", str(self.port), "--temp-dir", str(self.temp_dir), "--ray-client-server-port",
                str(free_port()), "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
                "--dashboard-port", str(self.dashboard_port)]
        try:
            self.head = self._start_node("head", head)
            for i in range(self.workers):
                self.nodes.append(self._start_node(f"worker{i + 1}", ["--address", self.address]))
        except BaseException:
            self.stop()
            raise
        return self

    def kill_worker(self, index: int = -1) -> int:
        """SIGKILL a worker node's whole session, as when a machine is lost; returns its PID."""
        node = self.nodes.pop(index)
        pid = node.pid
        ServerProcess.kill_session(pid)
        node.proc.wait(10)
        node.proc = None
        return pid

    def stop(self) -> None:
        for pid in self.pids():  # all wind down at once; each stop() then waits
            with suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        for node in reversed(self.nodes):
            node.stop()
        self.nodes.clear()
        if self.head is not None:
            self.head.stop()
            self.head = None
        if self.temp_dir is not None and self.temp_dir.name.startswith("slray-"):
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def pids(self) -> list[int]:
        return [p.pid for p in [self.head, *self.nodes] if p is not None and p.pid]

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def driver(address: str) -> Iterator[str | None]:
    """This process a Ray driver on the cluster at ``address`` while inside; yields the dashboard's URL."""
    import ray  # deferred: an optional extra (ray), loaded only when this runs

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    url = ray.init(address=address, log_to_driver=False, logging_level="WARNING", namespace="servelab").dashboard_url
    try:
        yield (url if "://" in url else f"http://{url}") if url else None
    finally:
        if ray.is_initialized():
            ray.shutdown()


def alive_nodes() -> list[dict]:
    import ray  # deferred: an optional extra (ray), loaded only when this runs

    return [{"node_id": n["NodeID"], "head": "node:__internal_head__" in n["Resources"],
             "cpus": n["Resources"].get("CPU", 0), "address": n["NodeManagerAddress"]}
            for n in ray.nodes() if n["Alive"]]
