"""What the FastAPI services share (fastapi_pt/app.py, fastapi_onnx/app.py: each app file holds its own
FastAPI and model code, ``servelab serve fastapi-pt|fastapi-onnx`` runs it).

Modules: ``service`` (startup, readiness, the routes besides /predict), ``schemas`` (request/response bodies),
``errors`` (status codes), ``runtimes`` (devices, execution providers, threads, GPU checks), ``pipeline``
(worker pool), ``batcher`` (dynamic batching), ``timing`` (Server-Timing), ``metrics`` (Prometheus)."""
