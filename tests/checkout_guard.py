"""The checkout's folders that hold the user's own work; a test session must leave them as they were."""

from pathlib import Path

from servelab.core.fetch import sha256_file
from servelab.core.paths import REPO_ROOT

USER_FOLDERS = ("models", "models_staging", "results")


def fingerprint(root: Path = REPO_ROOT) -> dict[str, tuple]:
    """Every folder and file under the user's folders: relative path -> (size, mtime in ns, SHA-256)."""
    prints: dict[str, tuple] = {}
    for folder in USER_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file():
                stat = path.stat()
                prints[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns, sha256_file(path))
            else:
                prints[str(path.relative_to(root))] = ("folder",)
    return prints


def changes(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """What differs, one line per path."""
    return ([f"added {p}" for p in sorted(after.keys() - before.keys())]
            + [f"removed {p}" for p in sorted(before.keys() - after.keys())]
            + [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]])
