"""The lab's compose stages as data, and bringing one up or down on an engine.

A stage is a compose file of docker/ and the shell variables the notebooks set, used unchanged, then the no-GPU
override of docker/no-gpu/ (where there is one) and a local one (``StageRunner._write_local_override``).
"""

import json
import resource
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from servelab.core.catalogue import FASTAPI, TRITON, of_family
from servelab.core.paths import REPO_ROOT
from servelab.core.procs import free_port
from servelab.tools.containers import images, node_secrets
from servelab.tools.containers.docker import Docker

COMPOSE_DIR = REPO_ROOT / "docker"
NO_GPU_DIR = COMPOSE_DIR / "no-gpu"
WAIT_TIMEOUT_S = 900
HEALTH_INTERVAL = "3s"


@dataclass(frozen=True)
class ComposeStage:
    name: str
    compose_file: str  # in docker/
    shell: Mapping[str, str] = field(default_factory=dict)  # variables set in the shell, as the notebooks do

    @property
    def path(self) -> Path:
        return COMPOSE_DIR / self.compose_file

    @property
    def no_gpu(self) -> Path | None:
        override = NO_GPU_DIR / self.compose_file
        return override if override.exists() else None

    @property
    def project(self) -> str:
        return yaml.safe_load(self.path.read_text())["name"]


def _compose_stages() -> dict[str, ComposeStage]:
    """The catalogue's FastAPI stages with ``compose=True``, and one Triton stage (`servelab triton stage` switches)."""
    fastapi = {s.name: ComposeStage(s.name, "docker-compose-fastapi.yaml",
                                    {"FASTAPI_STAGE": s.fastapi.service.replace("-", "_"), **s.fastapi.env})
               for s in of_family(FASTAPI.name).values() if s.fastapi.compose}
    triton = ComposeStage(TRITON.name, "docker-compose-triton.yaml", {"BACKEND": "triton"})
    return {**fastapi, triton.name: triton}


STAGES = _compose_stages()


@dataclass
class Running:
    """A stage that is up: its published ports, as ``ports[service][container_port] = host_port``."""

    stage: ComposeStage
    ports: dict[str, dict[int, int]]

    def url(self, service: str, port: int, scheme: str = "http://") -> str:
        return f"{scheme}127.0.0.1:{self.ports[service][port]}"


class StageRunner:
    """Compose commands for the stages on one engine, with the stand-in build arguments."""

    def __init__(self, docker: Docker, work_dir: Path, build_args: Mapping[str, str], *,
                 mounts: Mapping[Path, Path] | None = None, free_ports: bool = False, log=print):
        self.docker, self.work_dir = docker, Path(work_dir)
        self.build_args = dict(build_args)
        self.mounts = {Path(k).resolve(): Path(v).resolve() for k, v in (mounts or {}).items()}
        self.free_ports, self.log = free_ports, log
        self.ports: dict[str, dict[str, dict[int, int]]] = {}  # project -> service -> ports

    def files(self, stage: ComposeStage) -> list[str]:
        files = [stage.path] + ([stage.no_gpu] if stage.no_gpu else [])
        local = self.work_dir / f"{stage.project}.local.yaml"
        files += [local] if local.exists() else []
        return [a for f in files for a in ("-f", str(f))]

    def compose(self, stage: ComposeStage, *args: str, extra: Mapping[str, str] | None = None,
                timeout: float | None = None):
        node_secrets.write()  # the env files the compose files read (kept where they exist), as on the node
        # Compose builds nothing: `up` builds the stage's images from docker-bake.hcl first (or they were
        # pulled: `extra` names a registry and the policy `missing`).
        env = {"SERVELAB_PULL_POLICY": "never", **self.build_args, **stage.shell, **(extra or {})}
        return self.docker.compose(*self.files(stage), *args, extra_env=env, timeout=timeout)

    def build(self, config: dict) -> list[str]:
        """The images the stage runs (and the stages they start from), as docker-bake.hcl defines them."""
        targets = images.plan(self.docker, ("default",), images.variables(self.build_args))
        refs = {service["image"] for service in config["services"].values()}
        wanted = tuple(name for name, target in targets.items() if refs & set(target.get("tags", [])))
        return images.build(self.docker, targets, wanted, log=self.log)

    def _write_local_override(self, stage: ComposeStage, extra: Mapping[str, str] | None) -> tuple[dict, dict]:
        """The local override, which binds every published port to 127.0.0.1 (a free one with ``free_ports``, so
        parallel runs do not collide), mounts ``mounts`` (the tests' folders) in place of the checkout's, checks
        health more often (a stage is up sooner), and caps ``ulimits`` at this machine's hard limits (Triton's
        `memlock: -1`). Returns the stage's resolved config and its published ports."""
        local = self.work_dir / f"{stage.project}.local.yaml"
        local.unlink(missing_ok=True)
        config = json.loads(self.compose(stage, "config", "--format", "json", extra=extra).stdout)
        known = self.ports.get(stage.project, {})
        lines, ports = ["services:"], {}
        for name, service in config["services"].items():
            # The images' checks run every 10-15 s, and Docker 20.10 has no faster start_interval: check
            # every HEALTH_INTERVAL here (the image's own test command and timeouts stay).
            lines += [f"  {name}:", f"    healthcheck: {{interval: {HEALTH_INTERVAL}}}"]
            published = {}
            for port in service.get("ports", []):
                target = int(port["target"])
                host = known.get(name, {}).get(target) or (free_port() if self.free_ports else int(port["published"]))
                published[target] = host
            if published:
                lines.append("    ports: !override")
                lines += [f"      - {json.dumps(f'127.0.0.1:{host}:{target}')}" for target, host in published.items()]
                ports[name] = published
            if ulimits := _within_host_limits(service.get("ulimits") or {}):
                lines.append(f"    ulimits: !override {json.dumps(ulimits)}")
            volumes = service.get("volumes", [])
            if any(v["type"] == "bind" and self._remap(v["source"]) != v["source"] for v in volumes):
                lines.append("    volumes: !override")
                for volume in volumes:
                    bind = volume["type"] == "bind"  # named volumes keep their name
                    entry = {"type": volume["type"], "source": self._remap(volume["source"]) if bind else volume["source"],
                             "target": volume["target"], "read_only": bool(volume.get("read_only", False))}
                    if bind and volume.get("bind", {}).get("create_host_path"):
                        Path(entry["source"]).mkdir(parents=True, exist_ok=True)
                    lines.append(f"      - {json.dumps(entry)}")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text("# Written by `servelab containers`: ports on 127.0.0.1, other host folders, health checks.\n"
                         + "\n".join(lines) + "\n")
        self.ports[stage.project] = ports
        return config, ports

    def _remap(self, source: str) -> str:
        path = Path(source)
        for checkout, other in self.mounts.items():
            if path == checkout or path.is_relative_to(checkout):
                return str(other / path.relative_to(checkout))
        return source

    def up(self, stage: ComposeStage, extra: Mapping[str, str] | None = None) -> Running:
        """Build what the stage needs, start it and wait until every service is healthy."""
        config, ports = self._write_local_override(stage, extra)
        self.build(config)
        self.log(f"stage {stage.name}: compose up ({stage.compose_file}"
                 + (f" + no-gpu/{stage.compose_file}" if stage.no_gpu else "") + ")")
        self.compose(stage, "up", "-d", "--wait", "--wait-timeout", str(WAIT_TIMEOUT_S),
                     extra=extra, timeout=WAIT_TIMEOUT_S + 1200)
        return Running(stage, ports)

    def down(self, stage: ComposeStage) -> None:
        self.compose(stage, "down", "--volumes", "--remove-orphans", "--timeout", "10", timeout=300)
        self.ports.pop(stage.project, None)
        # Images a rebuild replaced (untagged): without this the cached data root grows with every change.
        self.docker.run("image", "prune", "--force", timeout=300)


RLIMITS = {"memlock": resource.RLIMIT_MEMLOCK, "stack": resource.RLIMIT_STACK, "nofile": resource.RLIMIT_NOFILE,
           "nproc": resource.RLIMIT_NPROC}


def _within_host_limits(ulimits: dict) -> dict:
    """A service's ulimits, each capped at this machine's hard limit (runc cannot raise a limit past
    it without the privilege this VM lacks: `memlock: -1` fails here). Empty when none needs capping."""
    capped, changed = {}, False
    for name, value in ulimits.items():
        soft, hard = (value, value) if isinstance(value, int) else (value.get("soft", value.get("single")),
                                                                    value.get("hard", value.get("single")))
        limit = resource.getrlimit(RLIMITS[name])[1] if name in RLIMITS else resource.RLIM_INFINITY
        if limit != resource.RLIM_INFINITY:
            fit = [limit if v in (-1, None) or v > limit else v for v in (soft, hard)]
            changed |= fit != [soft, hard]
            soft, hard = fit
        capped[name] = {"soft": soft, "hard": hard}
    return capped if changed else {}


def checkout_mounts(model_dir: Path, repository: Path, results: Path | None = None,
                    notebooks: Path | None = None) -> dict[Path, Path]:
    """Host folders to mount in place of the checkout's (those that differ)."""
    pairs = {REPO_ROOT / "models": model_dir, REPO_ROOT / "models_staging": repository,
             REPO_ROOT / "results": results, REPO_ROOT / "notebooks": notebooks}
    return {k: Path(v) for k, v in pairs.items() if v is not None and Path(v).resolve() != k.resolve()}

