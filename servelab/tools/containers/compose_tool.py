"""Docker Compose v2 for the runner: the pinned plugin in the cache, fetched once from Debian.

Debian 12 has only the old Python docker-compose 1.29; Debian 13 (trixie) packages Compose v2 as one
static binary. We fetch that package with apt-get against a trixie source list kept in a folder of
our own (the machine's apt configuration is untouched), check its sha256, and take the binary out
with ``dpkg -x``. Elsewhere (a student's Docker Desktop) ``docker compose`` itself is used.
"""

import shutil
import subprocess
import tempfile
from pathlib import Path

from servelab.core.fetch import sha256_file

PACKAGE = "docker-compose"
VERSION = "2.26.1-4"  # Compose 2.26.1; !reset and !override in overrides need 2.24.4 or later
SHA256 = "47681197cb2b1ab88206b42a1a92fc75f50d9530a6322d03494a473eed0408ea"
SOURCE = "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main"
PLUGIN_MEMBER = "usr/libexec/docker/cli-plugins/docker-compose"


class ComposeError(RuntimeError):
    pass


def docker_config(cache: Path) -> Path:
    """A DOCKER_CONFIG folder whose cli-plugins/ holds our Compose, so `docker compose` finds it."""
    return Path(cache).expanduser() / "compose"


def plugin_path(cache: Path) -> Path:
    return docker_config(cache) / "cli-plugins" / "docker-compose"


def _stamp(cache: Path) -> Path:
    return docker_config(cache) / "installed"


def ensure(cache: Path, log=print) -> Path:
    """The pinned Compose binary (fetched on first use)."""
    target = plugin_path(cache)
    stamp = _stamp(cache)
    if target.exists() and stamp.exists() and stamp.read_text() == f"{PACKAGE} {VERSION} {SHA256}\n":
        return target
    if not shutil.which("apt-get") or not shutil.which("dpkg"):
        raise ComposeError("Docker Compose v2 is needed: install Docker's compose plugin (2.24 or later)")
    with tempfile.TemporaryDirectory(prefix="servelab-compose-") as tmp:
        work = Path(tmp)
        (work / "lists" / "partial").mkdir(parents=True)
        (work / "cache" / "archives" / "partial").mkdir(parents=True)
        (work / "trixie.list").write_text(SOURCE + "\n")
        options = [f"-oDir::Etc::SourceList={work / 'trixie.list'}", "-oDir::Etc::SourceParts=/dev/null",
                   f"-oDir::State::Lists={work / 'lists'}", f"-oDir::Cache={work / 'cache'}",
                   "-oDir::State::status=/dev/null", "-oAPT::Sandbox::User=root", "-qq"]
        for args in (["update"], ["download", f"{PACKAGE}={VERSION}"]):
            done = subprocess.run(["apt-get", *options, *args], cwd=work, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise ComposeError(f"apt-get {args[0]} ({PACKAGE} from trixie) failed: {done.stderr.strip()[-800:]}")
        [deb] = work.glob(f"{PACKAGE}_*.deb")
        if sha256_file(deb) != SHA256:
            raise ComposeError(f"{deb.name}: sha256 differs from the pinned {SHA256}")
        subprocess.run(["dpkg", "-x", str(deb), str(work / "x")], check=True, capture_output=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_suffix(".part")
        shutil.copy2(work / "x" / PLUGIN_MEMBER, part)
        part.chmod(0o755)
        part.replace(target)
    stamp.write_text(f"{PACKAGE} {VERSION} {SHA256}\n")
    log(f"compose: {PACKAGE} {VERSION} from Debian trixie (sha256 verified) -> {target}")
    return target


def version(binary: Path) -> str:
    done = subprocess.run([str(binary), "version", "--short"], capture_output=True, text=True, timeout=30)
    return done.stdout.strip()

