"""Docker's CLI plugins for the runner, Compose v2 and buildx: pinned, in the cache, fetched once from Debian 13
(Debian 12 has only docker-compose 1.29 and no buildx) with a source list of our own, and checked by sha256."""

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from servelab.core.fetch import sha256_file
from servelab.core.installers.opt_tools import place
from servelab.tools.containers.docker import Docker, DockerError


@dataclass(frozen=True)
class Plugin:
    package: str  # the Debian package, also the plugin's file name in cli-plugins/
    version: str
    sha256: str


COMPOSE = Plugin("docker-compose", "2.26.1-4",  # Compose 2.26.1; !reset and !override in overrides need 2.24.4 or later
                 "47681197cb2b1ab88206b42a1a92fc75f50d9530a6322d03494a473eed0408ea")
BUILDX = Plugin("docker-buildx", "0.13.1+ds1-3",  # buildx 0.13.1: `bake --print` reads docker-bake.hcl
                "fcf8c48204d1603c8f209451d7827eb91bf30759578baf7704e9e1a87e5f1d7f")
SOURCE = "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main"


def docker_config(cache: Path) -> Path:
    """A DOCKER_CONFIG folder whose cli-plugins/ holds our Compose, so `docker compose` finds it."""
    return Path(cache).expanduser() / "compose"


def ensure(cache: Path, log=print, plugin: Plugin = COMPOSE) -> Path:
    """The pinned plugin's binary (fetched on first use)."""
    target = docker_config(cache) / "cli-plugins" / plugin.package
    stamp = target.with_name(f"{plugin.package}.installed")
    pin = f"{plugin.package} {plugin.version} {plugin.sha256}\n"
    if target.exists() and stamp.exists() and stamp.read_text() == pin:
        return target
    if not shutil.which("apt-get") or not shutil.which("dpkg"):
        raise DockerError(f"{plugin.package} is needed: install Docker's plugin (compose 2.24 or later)")
    with tempfile.TemporaryDirectory(prefix="servelab-compose-") as tmp:
        work = Path(tmp)
        (work / "lists" / "partial").mkdir(parents=True)
        (work / "cache" / "archives" / "partial").mkdir(parents=True)
        (work / "trixie.list").write_text(SOURCE + "\n")
        options = [f"-oDir::Etc::SourceList={work / 'trixie.list'}", "-oDir::Etc::SourceParts=/dev/null",
                   f"-oDir::State::Lists={work / 'lists'}", f"-oDir::Cache={work / 'cache'}",
                   "-oDir::State::status=/dev/null", "-oAPT::Sandbox::User=root", "-qq"]
        for args in (["update"], ["download", f"{plugin.package}={plugin.version}"]):
            done = subprocess.run(["apt-get", *options, *args], cwd=work, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise DockerError(f"apt-get {args[0]} ({plugin.package} from trixie) failed: {done.stderr.strip()[-800:]}")
        [deb] = work.glob(f"{plugin.package}_*.deb")
        if sha256_file(deb) != plugin.sha256:
            raise DockerError(f"{deb.name}: sha256 differs from the pinned {plugin.sha256}")
        subprocess.run(["dpkg", "-x", str(deb), str(work / "x")], check=True, capture_output=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        place(work / "x" / "usr/libexec/docker/cli-plugins" / plugin.package, target)
    stamp.write_text(pin)
    log(f"{plugin.package} {plugin.version} from Debian trixie (sha256 verified) -> {target}")
    return target


def docker(env: dict[str, str], cache: Path, log=print) -> Docker:
    """docker, with our Compose and buildx, against the engine whose variables are in ``env``."""
    return Docker(env, ensure(cache, log), ensure(cache, log, BUILDX))

