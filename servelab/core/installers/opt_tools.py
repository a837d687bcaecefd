"""Where the project unpacks the external tools it runs (perf_analyzer, Prometheus, Redis), and their error."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from servelab.core.fetch import sha256_file
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
        """The environment to start it in: this one, its libraries first on LD_LIBRARY_PATH."""
        env = dict(os.environ)
        if self.library_path:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (self.library_path, env.get("LD_LIBRARY_PATH")) if p)
        return env

    def describe(self) -> str:
        return f"{self.path} ({self.source}{', ' + self.version if self.version else ''})"


def choose_binary(named: str | None, variable: str, project: Path, command: str,
                  library_path: str = "") -> ToolBinary | None:
    """The binary a setting names (``variable``), else the project's, else ``command`` on PATH; None if none is."""
    if named:
        return ToolBinary(Path(named), variable)
    if project.exists():
        return ToolBinary(project, "project", library_path=library_path)
    on_path = shutil.which(command)
    return ToolBinary(Path(on_path), "PATH") if on_path else None


def binary_version(path: Path, pattern: str, not_found: type[Exception], env: dict[str, str] | None = None) -> str:
    """What ``pattern``'s group finds in the output of ``path --version`` (run in ``env``, else this
    environment); ``not_found`` where it does not run."""
    try:
        done = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=20, env=env)
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
    """Debian's ``package`` unpacked (``dpkg -x``, no root) under ``scratch``: (its root, the .deb), from the
    wheelhouse where it holds one, else ``apt-get download`` (which checks it against the signed archive)."""
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


def add_library(library: str, package: str, lib: Path, scratch: Path, fix: str) -> Path | None:
    """``library`` copied into ``lib`` from Debian's ``package`` (``unpack_deb``) unless the system has it: the
    .deb it came from, None where the system's is used."""
    done = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True) if shutil.which("ldconfig") else None
    if done and library in done.stdout:  # the dynamic loader finds it without help
        return None
    root, deb = unpack_deb(package, scratch, fix)
    [found] = root.rglob(library)
    shutil.copy2(found.resolve(), lib / library)
    return deb


@dataclass(frozen=True)
class DebianTool:
    """A server binary the lab starts (Prometheus, redis-server), unpacked from Debian's packages into
    ``opt_dir(tool)`` without root, the libraries the system lacks beside it in ``lib`` (``LD_LIBRARY_PATH``)."""

    tool: str  # its folder under opt/
    command: str  # the binary's name in bin/ and on PATH
    variable: str  # the setting that names one
    package: str
    member: str  # the binary inside the package
    version_line: str  # the line the code is checked against; another is refused
    version_pattern: str  # finds the version in `--version`'s output
    not_found: type[Exception]
    hint: str  # how to get one, in every "not installed"
    fix: str  # ends every install error
    libraries: tuple[tuple[str, str], ...] = ()  # (library, its Debian package)

    @property
    def home(self) -> Path:
        return opt_dir(self.tool)

    def checked(self, binary: ToolBinary) -> ToolBinary:
        """``binary`` with its version, once it has started."""
        return replace(binary, version=binary_version(binary.path, self.version_pattern, self.not_found, binary.env()))

    @cache  # once per process (a frozen dataclass is its key); ``install`` clears it
    def locate(self) -> ToolBinary:
        binary = choose_binary(getattr(get_settings(), self.variable.lower()), self.variable,
                               self.home / "bin" / self.command, self.command,
                               library_path=str(self.home / "lib") if self.libraries else "")
        if binary is None:
            raise self.not_found(f"{self.command} is not installed: {self.hint}")
        return self.checked(binary)

    def installed(self) -> bool:
        """Whether ``home`` holds the binary and the stamp its install wrote last says ``version_line``."""
        try:
            stamp = json.loads((self.home / "installed.json").read_text())
        except (OSError, ValueError):
            return False
        return stamp.get("version", "").startswith(self.version_line) and (self.home / "bin" / self.command).exists()

    def install(self, log=print) -> ToolBinary:
        """The package (and the libraries the system lacks) unpacked; checked to start and be on the version line."""
        for folder in ("bin", "lib"):
            (self.home / folder).mkdir(parents=True, exist_ok=True)
        (self.home / "installed.json").unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(prefix=f"servelab-{self.tool}-") as tmp:
            root, deb, version = unpack_pinned(self.package, Path(tmp), self.version_line, self.fix)
            debs = [deb, *filter(None, (add_library(library, package, self.home / "lib", Path(tmp), self.fix)
                                        for library, package in self.libraries))]
            shas = {d.name: sha256_file(d) for d in debs}
            place(root / self.member, self.home / "bin" / self.command)
        binary = self.checked(ToolBinary(self.home / "bin" / self.command, "project",
                                         library_path=str(self.home / "lib") if self.libraries else ""))
        (self.home / "installed.json").write_text(json.dumps({"version": version, "debs": shas}, indent=1) + "\n")
        DebianTool.locate.cache_clear()
        log(f"{self.tool}: {binary.path} from {', '.join(shas)}")
        return binary


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
