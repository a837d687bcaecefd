"""What a test session must leave as it found it: the checkout's folders that hold the user's own work, and
/dev/shm."""

import os
from collections.abc import Iterable
from pathlib import Path

import psutil

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


def in_dev_shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


def named_shm(processes: Iterable[psutil.Process]) -> set[str]:
    """What the processes map from /dev/shm, by name: what a SIGKILL would leave there (one that has ended maps
    nothing)."""
    names = set()
    for p in processes:
        try:
            names |= {Path(m.path).name for m in p.memory_maps() if m.path.startswith("/dev/shm/")}
        except psutil.Error:
            continue
    return names
