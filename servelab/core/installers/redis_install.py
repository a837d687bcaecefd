"""redis-server for the response cache: the project installs it without root, finds it, and says how to get it.

As for Prometheus (``prometheus_install``), Debian's package (7.0 in Debian 12) is *unpacked*, never
installed: from ``SERVELAB_WHEELHOUSE`` where it holds the .debs, else ``apt-get download``, then ``dpkg -x``
into ``<environment>/opt/redis``. The server binary is in ``redis-tools`` (Debian's ``redis-server`` package
only adds a symlink to it, and an init script); it links two libraries a minimal system may lack,
``liblzf.so.1`` (``liblzf1``) and ``libjemalloc.so.2`` (``libjemalloc2``): those missing are unpacked into
``opt/redis/lib`` and found through ``LD_LIBRARY_PATH``. The .debs' sha256 are recorded beside the binary.
"""

from servelab.core.installers.opt_tools import DebianTool


class RedisNotFound(RuntimeError):
    pass


# redis-server is redis-check-rdb under another name (it reads its argv[0]). The flags used here (--save '',
# --appendonly no, --bind, --port) hold from 6 on; checked against Debian 12's 7.0.
TOOL = DebianTool("redis", "redis-server", "REDIS_SERVER", "redis-tools", "usr/bin/redis-check-rdb", "7.",
                  r"v=(\S+)", RedisNotFound, "run `make redis` (or `servelab redis install`)",
                  "run `apt-get update` first, or install redis-server 7 yourself and set REDIS_SERVER",
                  libraries=(("liblzf.so.1", "liblzf1"), ("libjemalloc.so.2", "libjemalloc2")))
locate, installed, install = TOOL.locate, TOOL.installed, TOOL.install
