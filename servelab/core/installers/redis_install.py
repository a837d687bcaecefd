"""redis-server for the response cache: the project installs it without root, finds it, and says how to get it.

As for Prometheus (``prometheus_install``), Debian's package (7.0 in Debian 12) is *unpacked*, never
installed: from ``SERVELAB_WHEELHOUSE`` where it holds the .debs, else ``apt-get download``, then ``dpkg -x``
into ``<environment>/opt/redis``. The server binary is in ``redis-tools`` (Debian's ``redis-server`` package
only adds a symlink to it, and an init script); it links two libraries a minimal system may lack,
``liblzf.so.1`` (``liblzf1``) and ``libjemalloc.so.2`` (``libjemalloc2``): those missing are unpacked into
``opt/redis/lib`` and found through ``LD_LIBRARY_PATH``. The .debs' sha256 are recorded beside the binary.

``locate()`` picks: the binary named by ``REDIS_SERVER``; the project's copy; a ``redis-server`` on PATH.
"""

import json
import shutil
import tempfile
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from servelab.core.fetch import sha256_file
from servelab.core.installers import opt_tools
from servelab.core.installers.opt_tools import ToolBinary
from servelab.core.settings import get_settings

PACKAGE = "redis-tools"
BINARY = "usr/bin/redis-check-rdb"  # redis-server is this binary under another name (it reads its argv[0])
LIBRARIES = {"liblzf.so.1": "liblzf1", "libjemalloc.so.2": "libjemalloc2"}  # library -> Debian package
# The flags used here (--save '', --appendonly no, --bind, --port) hold from 6 on; checked against Debian 12's 7.0.
VERSION_LINE = "7."
INSTALL_HINT = "run `make redis` (or `servelab redis install`)"


class RedisNotFound(RuntimeError):
    pass


def _version(binary: ToolBinary) -> str:
    return opt_tools.binary_version(binary.path, r"v=(\S+)", RedisNotFound, binary.env())


@lru_cache
def locate() -> ToolBinary:
    """The redis-server to run, checked to start; raises ``RedisNotFound`` saying how to get one."""
    home = opt_tools.opt_dir("redis")
    binary = opt_tools.choose_binary(get_settings().redis_server, "REDIS_SERVER", home / "bin" / "redis-server",
                                     "redis-server", library_path=str(home / "lib"))
    if binary is None:
        raise RedisNotFound(f"redis-server is not installed: {INSTALL_HINT}")
    return replace(binary, version=_version(binary))


def installed() -> bool:
    return opt_tools.is_installed("redis", VERSION_LINE, "redis-server")


def install(log=print) -> ToolBinary:
    """Debian's redis-tools (and the libraries the system lacks) unpacked; checked to start and be 7.x."""
    home = opt_tools.opt_dir("redis")
    for folder in ("bin", "lib"):
        (home / folder).mkdir(parents=True, exist_ok=True)
    (home / "installed.json").unlink(missing_ok=True)
    fix = "run `apt-get update` first, or install redis-server 7 yourself and set REDIS_SERVER"
    debs = {}
    with tempfile.TemporaryDirectory(prefix="servelab-redis-") as tmp:
        root, deb, version = opt_tools.unpack_pinned(PACKAGE, Path(tmp), VERSION_LINE, fix)
        debs[deb.name] = sha256_file(deb)
        for library, package in LIBRARIES.items():
            if opt_tools.system_has_library(library):
                continue
            lib_root, lib_deb = opt_tools.unpack_deb(package, Path(tmp), fix)
            [found] = [p for p in lib_root.rglob(library)]
            shutil.copy2(found.resolve(), home / "lib" / library)
            debs[lib_deb.name] = sha256_file(lib_deb)
        opt_tools.place(root / BINARY, home / "bin" / "redis-server")
    locate.cache_clear()
    binary = ToolBinary(home / "bin" / "redis-server", "project", library_path=str(home / "lib"))
    binary = replace(binary, version=_version(binary))
    (home / "installed.json").write_text(json.dumps({"version": version, "debs": debs}, indent=1) + "\n")
    log(f"redis: {binary.path} from {', '.join(debs)}")
    return binary
