"""Prometheus from Debian's package (2.42 in Debian 12), unpacked without root (``DebianTool``): only its Go
binary is kept, which needs nothing but libc, so the package's many web-asset dependencies are not needed."""

from servelab.core.installers.opt_tools import DebianTool


class PrometheusNotFound(RuntimeError):
    pass


# The flags and API used here are checked against the 2.42 line (Debian 12's); another one is refused.
TOOL = DebianTool("prometheus", "prometheus", "PROMETHEUS", "prometheus", "usr/bin/prometheus", "2.42.",
                  r"version (\S+)", PrometheusNotFound, "run `make prometheus` (or `servelab prometheus install`)",
                  "run `apt-get update` first, or install Prometheus 2.42 yourself and set PROMETHEUS")
locate, installed, install = TOOL.locate, TOOL.installed, TOOL.install
