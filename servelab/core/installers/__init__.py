"""The pinned third-party binaries the lab runs (perf_analyzer, Prometheus, redis-server); ``opt_tools``: what
they share."""
