"""Machinery beside the lab: it keeps the lab honest and installable. Students run two of its commands on
the node, ``servelab doctor --node`` and ``servelab secrets``; the rest they never call.

* ``doctor`` — ``servelab doctor``: is this machine ready for the lab (GPUs, builds, Docker, Triton)?
* ``render_notebooks`` and ``notebook_blocks`` — the ``.ipynb`` files rendered from ``notebooks/*.md``,
  with the blocks generated from the project itself (``make notebooks``).
* ``lease_plan`` — how long each notebook takes on the node, against the lease.
* ``gpu_check`` — ``servelab gpu-check``: the GPU tests and a short GPU lab, written to ``docs/gpu/``;
  ``gpu_carry`` — the wheelhouse in folders that fit a lent GPU machine's calls.
* ``gpu_constraints`` — checks ``constraints-gpu-cu13.txt`` against each torch's requirements.
* ``docker_versions`` — the container images' pinned versions (``docker/.env``).
* ``photos_collect`` — how ``servelab/data/photos/`` was made.
* ``containers`` — compose stages on a private Docker engine, and the node's secrets (``servelab secrets``).

The pinned third-party binaries (perf_analyzer, Prometheus, redis-server) are installed by
``servelab.core.installers``, at the bottom of the layers, because the lab locates them through it.
"""
