"""Run the lab's compose stages on this machine, for real, with a private Docker engine (``engine``), the
unchanged compose files plus the no-GPU override (``compose_stages``), and stand-in base images where
NVIDIA's cannot be pulled (``standins``); ``servelab.cli.containers`` is ``servelab containers``.
"""
