"""The container versions pinned in ``docker/.env`` (docker/VERSIONS.md says why each), read as Compose does."""

from pathlib import Path

from servelab.core.paths import REPO_ROOT

VERSIONS_FILE = REPO_ROOT / "docker" / ".env"


def read_env_file(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """KEY=VALUE lines of a Compose .env file (comments and blank lines skipped)."""
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env
