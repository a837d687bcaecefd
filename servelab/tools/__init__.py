"""Machinery beside the lab: it keeps the lab honest and installable (``servelab doctor``, the rendered
notebooks, the lease plan, ``servelab gpu-check``, the containers runner). Students run two of its commands on
the node, ``servelab doctor --node`` and ``servelab secrets``; the rest they never call.

The pinned third-party binaries (perf_analyzer, Prometheus, redis-server) are installed by
``servelab.core.installers``, at the bottom of the layers, because the lab locates them through it.
"""
