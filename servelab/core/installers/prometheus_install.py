"""Prometheus itself: the project installs it without root, finds it, and says how to get it.

Locally the binary comes from Debian's ``prometheus`` package (2.42 in Debian 12), *unpacked*, never
installed: taken from ``SERVELAB_WHEELHOUSE`` where that folder holds it (a GPU machine without network,
``make gpu-wheelhouse``), else ``apt-get download`` (apt checks the package against the signed archive),
then ``dpkg -x`` into ``<environment>/opt/prometheus``; only ``usr/bin/prometheus`` is kept (a Go binary that needs
nothing but libc), so the package's many web-asset dependencies are not needed. The version is pinned
to the 2.42 line the code is tested against, and the .deb's sha256 is recorded beside the binary.

``locate()`` picks: the binary named by ``PROMETHEUS``; the project's copy; a ``prometheus`` on PATH.
"""

import json
import tempfile
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from servelab.core.fetch import sha256_file
from servelab.core.installers.opt_tools import (
    ToolBinary,
    binary_version,
    choose_binary,
    is_installed,
    opt_dir,
    place,
    unpack_pinned,
)
from servelab.core.settings import get_settings

PACKAGE = "prometheus"
# The flags and API used here are checked against this line (Debian 12's); another one is refused.
VERSION_LINE = "2.42."
INSTALL_HINT = "run `make prometheus` (or `servelab prometheus install`)"


class PrometheusNotFound(RuntimeError):
    pass


def _version(path: Path) -> str:
    return binary_version(path, r"version (\S+)", PrometheusNotFound)


@lru_cache
def locate() -> ToolBinary:
    """The Prometheus to run, checked to start; raises ``PrometheusNotFound`` saying how to get one."""
    binary = choose_binary(get_settings().prometheus, "PROMETHEUS", opt_dir("prometheus") / "bin" / "prometheus",
                           "prometheus")
    if binary is None:
        raise PrometheusNotFound(f"Prometheus is not installed: {INSTALL_HINT}")
    return replace(binary, version=_version(binary.path))


def installed() -> bool:
    return is_installed("prometheus", VERSION_LINE, "prometheus")


def install(log=print) -> ToolBinary:
    """Debian's package (from the wheelhouse or apt), the binary taken out, checked to start and be 2.42."""
    home = opt_dir("prometheus")
    (home / "bin").mkdir(parents=True, exist_ok=True)
    (home / "installed.json").unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="servelab-prometheus-") as tmp:
        root, deb, version = unpack_pinned(PACKAGE, Path(tmp), VERSION_LINE, "run `apt-get update` first, or "
                                           "install Prometheus 2.42 yourself and set PROMETHEUS")
        place(root / "usr" / "bin" / "prometheus", home / "bin" / "prometheus")
        sha = sha256_file(deb)
    locate.cache_clear()
    binary = ToolBinary(home / "bin" / "prometheus", "project", _version(home / "bin" / "prometheus"))
    (home / "installed.json").write_text(json.dumps({"package": deb.name, "version": version,
                                                     "sha256": sha}, indent=1) + "\n")
    log(f"prometheus: {binary.path} from {deb.name} (sha256 {sha[:16]}...)")
    return binary
