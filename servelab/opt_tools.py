"""Where the project unpacks the external tools it runs (perf_analyzer, Prometheus), and their error."""

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


class InstallError(RuntimeError):
    """A tool could not be installed; the message says why and what to do instead."""


def opt_dir(tool: str) -> Path:
    """``<environment>/opt/<tool>``: next to the Python environment, so a fresh .venv gets a fresh copy."""
    return Path(sys.prefix) / "opt" / tool


def cmd_install(tool: str, if_missing: bool, installed: Callable[[], bool], install: Callable[[], Any],
                errors: tuple[type[Exception], ...] = (InstallError,)) -> int:
    """`servelab <tool> install [--if-missing]`: exit status 1, with the reason, when it cannot."""
    if if_missing and installed():
        return 0
    try:
        found = install()
    except errors as exc:
        print(f"error: {tool} not installed: {exc}", file=sys.stderr)
        return 1
    print(f"{tool}: ready, {found.describe()}")
    return 0


def cmd_check(tool: str, locate: Callable[[], Any], not_found: type[Exception]) -> int:
    """`servelab <tool> check`: which one would run, or why none can."""
    try:
        print(f"{tool}: {locate().describe()}")
    except not_found as exc:
        print(f"{tool}: MISSING: {exc}", file=sys.stderr)
        return 1
    return 0
