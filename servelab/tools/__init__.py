"""Machinery the students never use: it keeps the lab honest and installable, it is not the lab.

* ``doctor`` — ``servelab doctor``: is this machine ready for the lab (GPUs, builds, Docker, Triton)?
* ``installers`` — the pinned third-party binaries the lab runs (perf_analyzer, Prometheus): where they
  are and how they get into ``.venv/opt``. The lab *locates* them through here, so this one package
  sits at the bottom of the layers (it imports only settings and fetch).
* ``render_notebooks`` and ``notebook_blocks`` — the ``.ipynb`` files rendered from ``notebooks/*.md``,
  with the blocks generated from the project itself (``make notebooks``).
* ``gpu_check`` — ``servelab gpu-check``: the GPU tests and a short GPU lab, written to ``docs/gpu/``.
* ``gpu_constraints`` — checks ``constraints-gpu-cu13.txt`` against each torch's requirements.
* ``docker_versions`` — the container images' pinned versions (``docker/.env``).
* ``photos_collect`` — how ``servelab/data/photos/`` was made.

``servelab.tools.containers`` (compose stages on a private Docker engine) is tooling of the same kind; it
stays where it is while the stage catalogue moves into ``servelab.core.catalogue``.
"""
