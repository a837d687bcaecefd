"""The local base image: Debian 12 made with debootstrap, because no registry can be reached here; a tarball in
the cache per content key, imported into the engine. Plain minbase: the Dockerfiles install their Python with apt
themselves (`--include=python3.11-venv` fails to configure inside debootstrap).
"""

import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from servelab.tools.containers.docker import Docker

SUITE = "bookworm"
VARIANT = "minbase"
MIRROR = "http://deb.debian.org/debian"
IMAGE = "servelab-standin/debian12"


def key() -> str:
    spec = {"suite": SUITE, "variant": VARIANT, "mirror": MIRROR, "packages": []}  # no --include; the key stays
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def tarball(cache: Path) -> Path:
    return Path(cache).expanduser() / "base" / f"debian-{SUITE}-{VARIANT}-{key()}.tar"


def make_tarball(cache: Path, log=print) -> Path:
    """debootstrap into a scratch folder, drop apt's caches and lists, tar it (numeric owners)."""
    if (target := tarball(cache)).exists():
        return target
    if not shutil.which("debootstrap"):
        raise RuntimeError("debootstrap is needed to make the base image: `apt-get install debootstrap`")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="servelab-rootfs-", dir=target.parent) as tmp:
        root = Path(tmp) / "rootfs"
        log(f"base image: debootstrap --variant={VARIANT} {SUITE} (about a minute, once)")
        done = subprocess.run(["debootstrap", f"--variant={VARIANT}", SUITE, str(root), MIRROR], capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"debootstrap failed: {(done.stdout + done.stderr)[-1500:]}")
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (root / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        part = target.with_suffix(".part")
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(part), "."], check=True)
        part.replace(target)
    return target


def ensure(docker: Docker, cache: Path, log=print) -> str:
    """The base image's name:tag in the engine (imported from the cached tarball when missing)."""
    tag = f"{IMAGE}:{key()}"
    if docker.run("image", "inspect", tag, check=False).returncode == 0:
        return tag
    tar = make_tarball(cache, log)
    docker.run("import", "--change", 'CMD ["/bin/bash"]',
               "--change", 'LABEL org.opencontainers.image.description="LOCAL STAND-IN base: Debian 12 by debootstrap"',
               str(tar), tag)
    log(f"base image: {tag} imported from {tar.name} ({tar.stat().st_size / 2**20:.0f} MiB)")
    return tag
