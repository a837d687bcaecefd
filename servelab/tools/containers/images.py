"""The lab's images as docker-bake.hcl defines them: their names, and building them where bake cannot.

``build`` builds bake's targets one by one with the legacy builder, for Debian 12's dockerd 20.10: its BuildKit
(v0.8) refuses bake's ``target:`` contexts and could get a newer frontend only from Docker Hub. A current Docker
runs ``docker buildx bake`` itself (``make images``).
"""

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from servelab.core.paths import REPO_ROOT, checkout
from servelab.tools.containers.docker import Docker
from servelab.tools.docker_versions import read_env_file

BAKE_FILE = REPO_ROOT / "docker-bake.hcl"
LOCAL = "servelab"  # SERVELAB_REGISTRY when no registry is named: local names, never pulled
LABEL = "servelab.standin"  # stand-ins carry their inputs' key: one with the same key is not rebuilt


def tag(root: Path = REPO_ROOT) -> str:
    """servelab's version and commit, so a node never runs another commit's images unawares: "-dirty" where what
    they are made of differs from it (saved notebooks do not count), "local" where git cannot say."""
    version = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    # What the images are made of: .dockerignore's allowlist, docker/, the bake file.
    allowed = [line[1:] for line in (root / ".dockerignore").read_text().splitlines() if line.startswith("!")]
    if (found := checkout(*allowed, "docker/", BAKE_FILE.name, ".dockerignore", root=root, digits=12)) is None:
        return f"{version}-local"
    return f"{version}-{found[0]}" + ("-dirty" if found[1] else "")


def lab_env() -> dict[str, str]:
    """docker/.env under this shell's SERVELAB_* variables, as Compose reads them."""
    return {**read_env_file(), **{k: v for k, v in os.environ.items() if k.startswith("SERVELAB_")}}


def registry(env: Mapping[str, str] | None = None) -> str:
    """The registry named (in ``env``, else docker/.env under the shell's SERVELAB_*); LOCAL where none is."""
    return (env if env is not None else lab_env()).get("SERVELAB_REGISTRY") or LOCAL


def compose_ref(name: str) -> str:
    """The image `docker compose` runs for ``name`` in this shell: its SERVELAB_* variables over docker/.env."""
    env = lab_env()
    return f"{registry(env)}/{name}:{env.get('SERVELAB_TAG') or 'local'}"


def compose_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What `docker compose` needs to run this commit's images: its tag, and pull where a registry is named."""
    pulls = registry(env) != LOCAL
    return {"SERVELAB_TAG": tag(), "SERVELAB_PULL_POLICY": "missing" if pulls else "build"}


def variables(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**read_env_file(), **(overrides or {})}


def plan(docker: Docker, targets: tuple[str, ...], env: Mapping[str, str]) -> dict[str, dict]:
    """The targets (and those their contexts name) as bake resolves them: name -> definition."""
    done = docker.buildx("bake", "--file", str(BAKE_FILE), "--print", *targets, cwd=REPO_ROOT, extra_env=dict(env),
                         timeout=120)
    return json.loads(done.stdout)["target"]


def for_images(targets: Mapping[str, dict], refs: set[str]) -> tuple[str, ...]:
    return tuple(name for name, target in targets.items() if refs & set(target.get("tags", [])))


def order(targets: Mapping[str, dict], names: tuple[str, ...] = ()) -> list[str]:
    """``names`` (all targets without), each after the targets its ``target:`` contexts name."""
    ordered: list[str] = []

    def visit(name: str) -> None:
        if name in ordered:
            return
        for source in targets[name].get("contexts", {}).values():
            if source.startswith("target:"):
                visit(source.removeprefix("target:"))
        ordered.append(name)

    for name in names or sorted(targets):
        visit(name)
    return ordered


def build(docker: Docker, targets: Mapping[str, dict], names: tuple[str, ...] = (), log=print) -> list[str]:
    """Build ``names`` (all without) in order, a context named after an image being that target's tag (the next
    FROM finds it in the engine); a stand-in whose label holds its inputs' key is kept. Returns the tags."""
    built = []
    for name in order(targets, names):
        target = targets[name]
        tags = target.get("tags", [])
        for ref, source in target.get("contexts", {}).items():
            assert source.startswith("target:") and ref in targets[source[7:]]["tags"], f"{name}: context {ref}"
        key = target.get("labels", {}).get(LABEL)
        if key and all(docker.image_label(t, LABEL) == key for t in tags):
            built += tags
            continue
        context = Path(REPO_ROOT, target["context"])
        log(f"images: building {name} -> {', '.join(tags)}")
        args = [a for k, v in target.get("args", {}).items() for a in ("--build-arg", f"{k}={v}")]
        args += [a for k, v in target.get("labels", {}).items() for a in ("--label", f"{k}={v}")]
        args += ["--target", target["target"]] if target.get("target") else []
        docker.run("build", "--quiet", "-f", str(context / target.get("dockerfile", "Dockerfile")), *args,
                   *(a for t in tags for a in ("-t", t)), str(context), extra_env={"DOCKER_BUILDKIT": "0"}, timeout=3600)
        built += tags
    return built
