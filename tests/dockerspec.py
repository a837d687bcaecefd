"""Read the container setup as Docker would, without a Docker engine: the versions file, Compose
files with their ${VAR} interpolation, Dockerfiles and .dockerignore. Used by test_compose.py and
test_dockerfiles.py."""

import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from servelab.tools.docker_versions import read_env_file

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
# The stage files; the monitoring file goes beside one of them (-f) and has tests of its own.
MONITORING_COMPOSE = DOCKER / "docker-compose-monitoring.yaml"
COMPOSE_FILES = sorted(p for p in DOCKER.glob("docker-compose-*.yaml") if p != MONITORING_COMPOSE)
DOCKERFILES = sorted(p for p in [*REPO.glob("*/Dockerfile"), *DOCKER.glob("Dockerfile.*")])
# The shell variable that picks the FastAPI stage, and its values (docker/README.md).
FASTAPI_STAGES = ("fastapi_pt", "fastapi_onnx")


def venv_tool(name: str) -> Path:
    """A console script installed beside the running interpreter (check-jsonschema, hadolint)."""
    return Path(sys.executable).parent / name


def run_tool(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv_tool(name)), *args], capture_output=True, text=True, timeout=120)


_VAR = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def variables(text: str) -> set[str]:
    """Names of the ${VAR...} references in a Compose value."""
    return {m["name"] for m in _VAR.finditer(text) if m["name"]}


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's interpolation: ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}, $$."""

    def substitute(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m["name"], m["op"], m["arg"]
        value = env.get(name)
        unset_or_empty = value is None or (value == "" and op is not None and op.startswith(":"))
        if op in ("-", ":-") and unset_or_empty:
            return arg
        if op in ("?", ":?") and unset_or_empty:
            raise KeyError(f"{name}: {arg}")
        return value or ""

    return _VAR.sub(substitute, text)


def resolve(node, env: Mapping[str, str]):
    """A parsed Compose document with every string interpolated."""
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, dict):
        return {k: resolve(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve(v, env) for v in node]
    return node


def load_compose(path: Path, **shell: str) -> dict:
    """A compose file as `docker compose config` sees it: versions file first, then shell variables."""
    raw = yaml.safe_load(path.read_text())
    return resolve(raw, {**read_env_file(), **shell})


def compose_variants() -> Iterator[tuple[Path, dict[str, str], dict]]:
    """Every compose file under every value of its stage variable: (file, shell, resolved document)."""
    for path in COMPOSE_FILES:
        uses_stage = "FASTAPI_STAGE" in variables(path.read_text())
        for shell in [{"FASTAPI_STAGE": s} for s in FASTAPI_STAGES] if uses_stage else [{}]:
            yield path, shell, load_compose(path, **shell)


def environment(service: dict) -> dict[str, str | None]:
    """A service's environment as a mapping; None marks a variable passed through from the shell."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = [item.split("=", 1) for item in env]
        return {pair[0]: pair[1] if len(pair) == 2 else None for pair in pairs}
    return {k: None if v is None else str(v) for k, v in env.items()}


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined; comments (and parser directives) dropped."""
    instructions, pending, start = [], "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, args = (pending + stripped).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        pending = ""
    return instructions


def dockerfile_for(service: dict, compose_path: Path) -> Path:
    build = service["build"]
    context = (compose_path.parent / build.get("context", ".")).resolve()
    return context / build.get("dockerfile", "Dockerfile")


def _pattern_regex(pattern: str) -> re.Pattern:
    pattern = pattern.strip().strip("/")
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out, i = out + ".*", i + 2
            if pattern.startswith("/", i):
                out, i = out + "(?:/)?", i + 1
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def dockerignored(relative: str, dockerignore: Path = REPO / ".dockerignore") -> bool:
    """Whether a path (relative to the build context) is left out of the context.

    Docker's rule: the last pattern that matches the path or one of its parent folders decides, and a
    leading ``!`` re-includes."""
    lines = [ln.strip() for ln in dockerignore.read_text().splitlines()]
    parts = Path(relative).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for line in lines:
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        regex = _pattern_regex(line.lstrip("!"))
        if any(regex.match(c) for c in candidates):
            ignored = not negate
    return ignored
