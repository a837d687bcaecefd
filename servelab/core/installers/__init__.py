"""The pinned third-party binaries the lab runs (perf_analyzer, Prometheus, redis-server): where they are
(``locate``) and how they are installed; ``opt_tools`` holds what they share.
"""
