"""``servelab doctor``: is this machine ready for the lab? One line per check, with the fix.

* ``core``: ``Result`` (name, status pass/warn/fail/skip, detail, fix), ``Context`` (the machine,
  and the runner every external program goes through, with a timeout), ``run_checks``.
* ``gpu``: GPUs and driver (``nvidia-smi``), PyTorch kernels for them, the pinned container
  PyTorch, ONNX Runtime's really active providers, whether TensorRT applies.
* ``containers``: Docker, its NVIDIA runtime, Triton's ``/dev/shm`` against what the Python backend
  needs, and the Triton image's Python-backend stub and torch on the GPUs.
* ``local``: Python, Linux, the model artifacts, the bundled tritonserver, perf_analyzer.
* ``checks``: the table of checks; the ``servelab doctor [--node] [--json]`` command is ``servelab.cli.doctor``.
"""
