"""redis-server for the response cache, from Debian's ``redis-tools`` (7.0 in Debian 12; its ``redis-server``
package only adds a symlink and an init script), unpacked without root (``DebianTool``), with the two libraries
a minimal system may lack."""

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
