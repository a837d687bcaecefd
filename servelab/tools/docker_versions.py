"""The container versions pinned in ``docker/.env`` (docker/VERSIONS.md says why each), read as Compose does."""

from pathlib import Path

from dotenv import dotenv_values  # python-dotenv, pydantic-settings' own .env reader

from servelab.core.paths import REPO_ROOT

VERSIONS_FILE = REPO_ROOT / "docker" / ".env"


def read_env_file(path: Path = VERSIONS_FILE) -> dict[str, str]:
    return {key: value or "" for key, value in dotenv_values(path).items()}
