"""Prometheus itself: the project installs it without root, finds it, and says how to get it.

Locally the binary comes from Debian's ``prometheus`` package (2.42 in Debian 12), *unpacked*, never
installed: taken from ``SERVELAB_WHEELHOUSE`` where that folder holds it (a GPU machine without network,
``make gpu-wheelhouse``), else ``apt-get download`` (apt checks the package against the signed archive),
then ``dpkg -x`` into ``<environment>/opt/prometheus``; only ``usr/bin/prometheus`` is kept (a Go binary that needs
nothing but libc), so the package's many web-asset dependencies are not needed. The version is pinned
to the 2.42 line the code is tested against, and the .deb's sha256 is recorded beside the binary.
"""

from servelab.core.installers.opt_tools import DebianTool


class PrometheusNotFound(RuntimeError):
    pass


# The flags and API used here are checked against the 2.42 line (Debian 12's); another one is refused.
TOOL = DebianTool("prometheus", "prometheus", "PROMETHEUS", "prometheus", "usr/bin/prometheus", "2.42.",
                  r"version (\S+)", PrometheusNotFound, "run `make prometheus` (or `servelab prometheus install`)",
                  "run `apt-get update` first, or install Prometheus 2.42 yourself and set PROMETHEUS")
locate, installed, install = TOOL.locate, TOOL.installed, TOOL.install
