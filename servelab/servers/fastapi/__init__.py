"""What the FastAPI services share (fastapi_pt/app.py, fastapi_onnx/app.py: each app file holds its own
FastAPI and model code, ``servelab serve fastapi-pt|fastapi-onnx`` runs it).

Modules: ``service`` (startup, readiness, the routes besides /predict), ``schemas`` (request/response bodies),
``errors`` (status codes), ``runtimes`` (devices, execution providers, threads, GPU checks), ``pipeline``
(worker pool), ``batcher`` (dynamic batching), ``timing`` (Server-Timing), ``metrics`` (Prometheus),
``admin`` (the client of the token-guarded ``POST /admin/reload``), ``cache`` (the Redis response cache),
``workers`` (``WORKERS`` server processes on one port), ``shared`` and ``batcher_process`` (one batcher
process holding the model for every server process), ``child`` (a service as a child process, for the runners)."""
