"""The pinned third-party binaries the lab runs: where they are (``locate``) and how they are installed.

* ``perf_analyzer`` — NVIDIA's perf_analyzer from its pinned wheels (``servelab perf-analyzer``);
* ``prometheus`` — Debian's Prometheus 2.42 unpacked without root (``servelab prometheus``);
* ``opt_tools`` — what both share: ``.venv/opt/<tool>``, the offline wheelhouse, unpacking a .deb.
"""
