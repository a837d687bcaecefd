"""Where the project unpacks the external tools it runs (perf_analyzer, Prometheus, Redis), and their error."""

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.core.settings import get_settings


class InstallError(RuntimeError):
    """A tool could not be installed; the message says why and what to do instead."""


def opt_dir(tool: str) -> Path:
    """``<environment>/opt/<tool>``: next to the Python environment, so a fresh .venv gets a fresh copy."""
    return Path(sys.prefix) / "opt" / tool


@dataclass(frozen=True)
class ToolBinary:
    """A server binary the lab starts (Prometheus, redis-server): where it is, how it was chosen (the setting
    that names it, "project" for the one `make` unpacked, or "PATH"), its version."""

    path: Path
    source: str
    version: str = ""
    library_path: str = ""  # prepended to LD_LIBRARY_PATH (the project's unpacked libraries)

    def env(self) -> dict[str, str]:
        """Variables to start it with (added to the environment)."""
        if not self.library_path:
            return {}
        return {"LD_LIBRARY_PATH": os.pathsep.join(p for p in (self.library_path, os.environ.get("LD_LIBRARY_PATH"))
                                                   if p)}

    def describe(self) -> str:
        return f"{self.path} ({self.source}, {self.version})"


def choose_binary(named: str | None, variable: str, project: Path, command: str,
                  library_path: str = "") -> ToolBinary | None:
    """The binary a setting names (``variable``), else the project's, else ``command`` on PATH; None if none is."""
    if named:
        return ToolBinary(Path(named), variable)
    if project.exists():
        return ToolBinary(project, "project", library_path=library_path)
    on_path = shutil.which(command)
    return ToolBinary(Path(on_path), "PATH") if on_path else None


def is_installed(tool: str, version_line: str, binary: str) -> bool:
    """Whether ``opt_dir(tool)`` holds ``bin/<binary>`` and the stamp its install wrote last says ``version_line``."""
    try:
        stamp = json.loads((opt_dir(tool) / "installed.json").read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("version", "").startswith(version_line) and (opt_dir(tool) / "bin" / binary).exists()


def binary_version(path: Path, pattern: str, not_found: type[Exception], env: dict[str, str] | None = None) -> str:
    """What ``pattern``'s group finds in the output of ``path --version``; ``not_found`` where it does not run."""
    try:
        done = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=20,
                              env={**os.environ, **(env or {})})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise not_found(f"{path} does not run: {exc}") from None
    found = re.search(pattern, done.stdout + done.stderr)
    if done.returncode != 0 or not found:
        raise not_found(f"{path} does not start: {(done.stderr or done.stdout).strip()[-300:]}")
    return found.group(1)


def wheelhouse() -> Path | None:
    """``SERVELAB_WHEELHOUSE`` when it names a folder: wheels and .debs an installer takes before the network."""
    folder = get_settings().servelab_wheelhouse
    return folder if folder and folder.is_dir() else None


def unpack_deb(package: str, scratch: Path, fix: str) -> tuple[Path, Path]:
    """Debian's ``package`` unpacked (``dpkg -x``, no root) under ``scratch``: (its root, the .deb).

    The .deb comes from the wheelhouse where it holds one (a machine without network), else from
    ``apt-get download`` (apt checks it against the signed archive). ``fix`` ends every error message.
    """
    if not shutil.which("dpkg"):
        raise InstallError(f"{package}: no dpkg here (not Debian/Ubuntu): {fix}")
    local = wheelhouse()
    debs = sorted(local.glob(f"{package}_*.deb")) if local else []
    if not debs:
        if not shutil.which("apt-get"):
            raise InstallError(f"{package}: no apt-get here and no {package}_*.deb in SERVELAB_WHEELHOUSE: {fix}")
        done = subprocess.run(["apt-get", "download", package], cwd=scratch, capture_output=True, text=True,
                              timeout=300)
        debs = sorted(scratch.glob(f"{package}_*.deb"))
        if done.returncode != 0 or not debs:
            where = f" and {local} holds no {package}_*.deb" if local else ""
            raise InstallError(f"`apt-get download {package}` failed ({done.stderr.strip()[-300:]}){where}: {fix}")
    root = scratch / f"{package}-deb"
    subprocess.run(["dpkg", "-x", str(debs[-1]), str(root)], check=True, capture_output=True)
    return root, debs[-1]


def unpack_pinned(package: str, scratch: Path, version_line: str, fix: str) -> tuple[Path, Path, str]:
    """``unpack_deb``, and the package's upstream version (from the .deb's name: unquoted, its epoch dropped),
    refused unless on ``version_line``, the line the code is checked against."""
    root, deb = unpack_deb(package, scratch, fix)
    version = urllib.parse.unquote(deb.name.split("_")[1]).split(":")[-1]
    if not version.startswith(version_line):
        raise InstallError(f"{deb.name} is {package} {version}; servelab is checked against {version_line}x "
                           f"(Debian 12): {fix}")
    return root, deb, version


def place(source: Path, target: Path) -> None:
    """``source`` copied to ``target`` by way of a .part file: never a half-written binary under its real name."""
    part = target.with_name(f"{target.name}.part")
    shutil.copy2(source, part)
    part.replace(target)


def system_has_library(library: str) -> bool:
    """Whether the dynamic loader finds ``library`` (``libb64.so.0d``) without help."""
    done = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True) if shutil.which("ldconfig") else None
    return bool(done and library in done.stdout)


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
