"""A private Docker engine: our own dockerd, started as a child process and stopped by its PID.

Nothing is shared with another engine: socket, exec root, pid file and log are in a run folder of their own, the
bridge is ours with a 10.X.0.0/16 range nothing else uses, and so is containerd's namespace. The data root lives
in the per-user cache, so a second run is quick; while an engine uses it, another gets a throwaway one. ``stop``
ends the dockerd, then removes what it leaves behind: mounts, its bridges, the iptables rules naming them.
"""

import json
import os
import secrets
import shlex
import shutil
import subprocess
import time
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psutil

from servelab.core.procs import ServerProcess, log_tail
from servelab.tools.containers.docker import Docker

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


class EngineError(RuntimeError):
    pass


def ping(sock: Path) -> bool:
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=2.0) as client:
            return client.get("http://docker/_ping").status_code == 200
    except httpx.HTTPError:
        return False


def _alive(pid: int) -> bool:
    """Running, and not a zombie (an exited child of ours not yet waited for)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _used_second_octets() -> set[int]:
    """10.X of every address and route on the machine, so our range collides with none."""
    out = " ".join(subprocess.run(args, capture_output=True, text=True).stdout
                   for args in (["ip", "-4", "-o", "addr"], ["ip", "-4", "route"]))
    return {int(word.split(".")[1]) for word in out.split() if word.startswith("10.")}


def owner_file(cache: Path) -> Path:
    """Names the engine that uses the cache's data root (one at a time)."""
    return Path(cache).expanduser() / "engine" / "owner.json"


@dataclass
class EngineState:
    """What `servelab containers` needs to find, reuse and stop a running engine."""

    pid: int
    socket: str
    run_dir: str
    data_root: str
    bridge: str
    octet: int  # our range is 10.<octet>.0.0/16
    owns_cache: bool  # whether it uses the cache's data root (else a throwaway one in run_dir)

    @property
    def env(self) -> dict[str, str]:
        return {"DOCKER_HOST": f"unix://{self.socket}"}


def _read_state(path: Path) -> EngineState | None:
    try:
        return EngineState(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


class Engine:
    """``start()`` / ``stop()``, or a context manager. ``detach`` leaves it running (`servelab containers up`)."""

    def __init__(self, cache: Path, detach: bool = False, log=print):
        self.cache = Path(cache).expanduser()
        self.detach, self.log = detach, log
        self.state: EngineState | None = None
        self._server: ServerProcess | None = None

    @staticmethod
    def dockerd() -> str:
        if found := shutil.which("dockerd", path=f"{os.environ.get('PATH', os.defpath)}:/usr/sbin"):
            return found
        raise EngineError("no dockerd: install Docker (`apt-get install docker.io`)")

    @classmethod
    def available(cls) -> str:
        """Empty when an engine can be started here, else the reason it cannot."""
        if os.geteuid() != 0:
            return "a private dockerd needs root (this user is not)"
        try:
            cls.dockerd()
        except EngineError as exc:
            return str(exc)
        if not shutil.which("ip"):
            return "no `ip` command (iproute2)"
        return ""

    @classmethod
    def attach(cls, cache: Path) -> EngineState | None:
        """The engine a detached `servelab containers up` left running, if it still answers."""
        state = _read_state(owner_file(cache))
        return state if state and _alive(state.pid) and ping(Path(state.socket)) else None

    def start(self) -> EngineState:
        if reason := self.available():
            raise EngineError(reason)
        self._clean_stale()
        token = secrets.token_hex(3)
        bridge = f"slab{token}"
        # Unix socket paths are limited to 108 bytes: keep the run folder short.
        run_dir = self.cache / "run" / token
        run_dir.mkdir(parents=True)
        owner = _read_state(owner_file(self.cache))  # the cache's data root is ours unless its owner still runs
        owns_cache = owner is None or not _alive(owner.pid)
        data_root = self.cache / "engine" / "data" if owns_cache else run_dir / "data"
        data_root.mkdir(parents=True, exist_ok=True)
        octet = next((o for o in range(231, 255) if o not in _used_second_octets()), None)
        if octet is None:
            raise EngineError("no free 10.X.0.0/16 range for the engine's networks")
        sock = run_dir / "docker.sock"
        self.state = state = EngineState(0, str(sock), str(run_dir), str(data_root), bridge, octet, owns_cache)
        try:
            for args in (["link", "add", "name", bridge, "type", "bridge"],
                         ["addr", "add", f"10.{octet}.0.1/24", "dev", bridge],
                         ["link", "set", bridge, "up"]):
                subprocess.run(["ip", *args], check=True, capture_output=True, text=True)
            cmd = [self.dockerd(), "--data-root", str(data_root), "--exec-root", str(run_dir / "exec"),
                   "--pidfile", str(run_dir / "dockerd.pid"), "-H", f"unix://{sock}",
                   "--bridge", bridge, "--default-address-pool", f"base=10.{octet}.128.0/17,size=24",
                   "--containerd-namespace", f"servelab-{token}",
                   "--containerd-plugins-namespace", f"servelab-{token}-plugins"]
            # The API is on a unix socket, which ServerProcess cannot poll: wait for it here.
            self._server = ServerProcess(cmd, ready_url=None, log=run_dir / "dockerd.log", detach=self.detach,
                                         stop_timeout=STOP_TIMEOUT_S).start()
            state.pid = self._server.pid
            deadline = time.monotonic() + START_TIMEOUT_S
            while not ping(sock):
                if self._server.proc.poll() is not None or time.monotonic() > deadline:
                    raise EngineError(f"dockerd did not start{log_tail(run_dir / 'dockerd.log', 15)}")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        (run_dir / "engine.json").write_text(json.dumps(asdict(state)))
        if owns_cache:
            owner_file(self.cache).write_text(json.dumps(asdict(state)))
        self.log(f"engine: dockerd PID {state.pid}, socket {sock}, bridge {bridge} (10.{octet}.0.0/16)"
                 + ("" if owns_cache else ", throwaway data root: the cache's is in use"))
        return state

    def _clean_stale(self) -> None:
        """Leftovers of engines of ours whose dockerd is gone (killed with us, or the machine stopped)."""
        for state_file in (self.cache / "run").glob("*/engine.json"):
            if (state := _read_state(state_file)) and not _alive(state.pid):
                _cleanup(state, self.log)

    def stop(self) -> None:
        state, self.state = self.state, None
        if state is None:
            return
        # dockerd alone first: it stops its containers through containerd, then containerd.
        if state.pid and _alive(state.pid):
            stop_dockerd(state)
        if self._server is not None:
            self._server.stop()  # whatever is left of its process group
            self._server = None
        _cleanup(state, self.log)

    def __enter__(self) -> EngineState:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_pid(pid: int, timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM a detached dockerd of ours (it stops its containers first), SIGKILL if it lingers."""
    with suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):
        proc = psutil.Process(pid)
        proc.terminate()
        for lingering in psutil.wait_procs([proc], timeout)[1]:
            lingering.kill()
            lingering.wait(10.0)


def stop_detached(cache: Path, log=print) -> bool:
    """Stop the engine a detached `servelab containers up` started; False if none runs."""
    if (state := Engine.attach(cache)) is None:
        owner_file(cache).unlink(missing_ok=True)
        return False
    stop_dockerd(state)
    _cleanup(state, log)
    return True


def stop_dockerd(state: EngineState) -> None:
    """Remove every container, network and volume of the engine (all ours): `restart: unless-stopped` would start
    them again with the next daemon on the cached data root. Then stop its dockerd."""
    docker = Docker(state.env, timeout=120)
    if ids := docker.run("ps", "--all", "--quiet", check=False).stdout.split():
        docker.run("rm", "--force", "--volumes", *ids, check=False)
    docker.run("network", "prune", "--force", check=False)
    docker.run("volume", "prune", "--force", check=False)
    stop_pid(state.pid)


def _cleanup(state: EngineState, log) -> None:
    """What a stopped dockerd may leave: mounts, its bridges, iptables rules naming them or its range."""
    run_dir = Path(state.run_dir)
    namespace = f"servelab-{state.bridge.removeprefix('slab')}"
    for proc in psutil.process_iter(["cmdline"]):  # containerd shims that outlived a killed dockerd hold containers
        args = proc.info["cmdline"] or []
        if args and args[0].endswith("containerd-shim-runc-v2") and namespace in args:
            stop_pid(proc.pid, timeout=5.0)
    roots = (str(run_dir), state.data_root)
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for target in sorted((m for m in mounts if m.startswith(roots)), key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True)
    prefix = f"10.{state.octet}."
    links = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout.splitlines()
    bridges = {state.bridge} | {line.split()[1] for line in links if f" {prefix}" in line}
    for name in bridges:
        subprocess.run(["ip", "link", "del", name], capture_output=True)
    _remove_iptables_rules(bridges, prefix)
    owner = Path(state.data_root).parent / "owner.json"
    if (found := _read_state(owner)) and found.pid == state.pid:
        owner.unlink(missing_ok=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    log(f"engine: stopped PID {state.pid}, removed bridge(s) {', '.join(sorted(bridges))}")


def _remove_iptables_rules(bridges: set[str], prefix: str) -> None:
    """Delete only the rules that name one of our bridges or addresses; the chains stay (shared)."""
    if not shutil.which("iptables-save"):
        return
    table = ""
    for line in subprocess.run(["iptables-save"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith("-A ") and (any(f" {b} " in f"{line} " for b in bridges) or f" {prefix}" in line
                                         or f"/{prefix}" in line):
            subprocess.run(["iptables", "-t", table, "-D", *shlex.split(line[3:])], capture_output=True)
