"""The docker client and Compose, pointed at one engine."""

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


class DockerError(RuntimeError):
    pass


def client() -> str:
    """Debian's docker client (it matches the engine); any `docker` on PATH otherwise."""
    for candidate in ("/usr/bin/docker", shutil.which("docker")):
        if candidate and Path(candidate).exists():
            return candidate
    raise DockerError("no docker client: install Docker (`apt-get install docker.io`)")


@dataclass
class Docker:
    """``docker`` and ``docker compose`` commands against the engine whose variables are in ``env``."""

    env: dict[str, str]
    compose_binary: Path | None = None
    buildx_binary: Path | None = None
    timeout: float = 900.0

    def environ(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, **self.env, **(extra or {})}

    def run(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self._run([client(), *args], **kw)

    def compose(self, *args: str, **kw) -> subprocess.CompletedProcess:
        if self.compose_binary is None:
            raise DockerError("no Docker Compose")
        # The plugin binary run by itself acts as `docker-compose`, same commands as `docker compose`.
        return self._run([str(self.compose_binary), *args], **kw)

    def buildx(self, *args: str, **kw) -> subprocess.CompletedProcess:
        if self.buildx_binary is None:
            raise DockerError("no docker buildx")
        return self._run([str(self.buildx_binary), *args], **kw)

    def _run(self, cmd: list[str], check: bool = True, timeout: float | None = None,
             extra_env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run(cmd, env=self.environ(extra_env), capture_output=True, text=True,
                              timeout=timeout or self.timeout, cwd=cwd)
        if check and done.returncode != 0:
            raise DockerError(f"`{' '.join(cmd[:6])} ...` failed ({done.returncode}):\n"
                              + (done.stdout[-2000:] + done.stderr[-4000:]))
        return done

    def image_label(self, ref: str, label: str) -> str:
        done = self.run("image", "inspect", "--format", f'{{{{index .Config.Labels "{label}"}}}}', ref, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""
