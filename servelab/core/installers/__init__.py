"""The pinned third-party binaries the lab runs: where they are (``locate``) and how they are installed.

* ``perf_analyzer`` — NVIDIA's perf_analyzer from its pinned wheels (``servelab perf-analyzer``);
* ``prometheus``, ``redis`` — Debian's Prometheus 2.42 and redis-server 7 unpacked without root (``servelab
  prometheus``, ``servelab redis``), each one ``opt_tools.DebianTool``;
* ``opt_tools`` — what they share: ``.venv/opt/<tool>``, the offline wheelhouse, unpacking a .deb, ``ToolBinary``.
"""
