"""The lab's images as docker-bake.hcl defines them: their names, and building them where bake cannot.

``build`` builds bake's targets one by one with the legacy builder, for Debian 12's dockerd 20.10: its BuildKit
(v0.8) refuses bake's ``target:`` contexts and could get a newer frontend only from Docker Hub. A current Docker
runs ``docker buildx bake`` itself (``make images``).
"""

import hashlib
import json
import os
import subprocess
import tomllib
from collections.abc import Mapping
from fnmatch import fnmatchcase
from pathlib import Path

from servelab.core.paths import REPO_ROOT, git
from servelab.tools.containers.docker import Docker
from servelab.tools.docker_versions import read_env_file

BAKE_FILE = REPO_ROOT / "docker-bake.hcl"
LOCAL = "servelab"  # SERVELAB_REGISTRY when no registry is named: local names, never pulled
LABEL = "servelab.standin"  # stand-ins carry their inputs' key: one with the same key is not rebuilt


def _inputs(root: Path = REPO_ROOT) -> tuple[list[str], list[str]]:
    """What the images are made of: .dockerignore's allowlist with what builds it (docker/, the bake file,
    .dockerignore), and its exclusions (the host-only runner, build leftovers)."""
    rules = [line.strip() for line in (root / ".dockerignore").read_text().splitlines()]
    allowed = [rule[1:] for rule in rules if rule.startswith("!")]
    excluded = [rule for rule in rules if rule and rule != "*" and not rule.startswith(("!", "#"))]
    return [*allowed, "docker/", BAKE_FILE.name, ".dockerignore"], excluded


def _excluded(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore's ``patterns`` leave ``path`` out: a pattern names it or a folder above it."""
    parts = path.split("/")
    aboves = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    # fnmatch's * crosses "/", so "**/x" matches x in any folder but the top one: that one is "x".
    return any(fnmatchcase(above, p) or fnmatchcase(above, p.removeprefix("**/")) for above in aboves for p in patterns)


def tag(root: Path = REPO_ROOT) -> str:
    """servelab's version and a hash of the image inputs at HEAD, so a node never runs images of other inputs
    unawares, and a commit that changes none (a notebook, a doc) keeps the images pushed before it. Where inputs
    differ from HEAD (edited, or new and untracked; saved notebooks do not count), "-dirty-" and a hash of their
    content: compose's `never` builds only a missing image, so each edit needs a tag of its own. "local" where git
    cannot say."""
    version = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    paths, excluded = _inputs(root)

    def of_inputs(*args: str) -> list[str]:
        return git(*args, "--", *paths, root=root).splitlines()
    try:
        # "mode type blob<TAB>path": every input's content and name at HEAD.
        tree = [line for line in of_inputs("ls-tree", "-r", "HEAD") if not _excluded(line.split("\t", 1)[1], excluded)]
        changed = sorted(path for path in {*of_inputs("diff", "--name-only", "--no-renames", "HEAD"),
                                           *of_inputs("ls-files", "--others", "--exclude-standard")}
                         if not _excluded(path, excluded))
    except (OSError, subprocess.SubprocessError):
        return f"{version}-local"
    digest = hashlib.sha256("\n".join(tree).encode()).hexdigest()[:12]
    if not changed:
        return f"{version}-{digest}"
    edits = hashlib.sha256()
    for path in changed:  # a deleted input counts by its name alone
        edits.update(path.encode() + b"\0" + ((root / path).read_bytes() if (root / path).is_file() else b"") + b"\0")
    return f"{version}-{digest}-dirty-{edits.hexdigest()[:8]}"


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
    """What `docker compose` needs to run this commit's images: its tag, and the policy. A named registry: pull
    what is missing. None: `never`, which Compose reads as "run the image there (node-setup built it, or `docker
    load` put it), build it only where it is missing, never pull": `build` would rebuild it on every `up`."""
    return {"SERVELAB_TAG": tag(), "SERVELAB_PULL_POLICY": "missing" if registry(env) != LOCAL else "never"}


def variables(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**read_env_file(), **(overrides or {})}


def plan(docker: Docker, targets: tuple[str, ...], env: Mapping[str, str]) -> dict[str, dict]:
    """The targets (and those their contexts name) as bake resolves them: name -> definition."""
    done = docker.buildx("bake", "--file", str(BAKE_FILE), "--print", *targets, cwd=REPO_ROOT, extra_env=dict(env),
                         timeout=120)
    return json.loads(done.stdout)["target"]


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
        if (key := target.get("labels", {}).get(LABEL)) and all(docker.image_label(t, LABEL) == key for t in tags):
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
