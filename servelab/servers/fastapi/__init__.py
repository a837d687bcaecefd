"""The FastAPI services (fastapi_pt, fastapi_onnx): one app factory, two backends.

``create_app("pytorch" | "onnx")`` builds the app; ``servelab serve fastapi-pt|fastapi-onnx`` runs it.
Modules: ``app`` (endpoints, startup), ``schemas`` (request/response bodies), ``errors`` (status
codes), ``runtimes`` (PyTorch / ONNX Runtime, devices, execution providers, threads), ``pipeline``
(worker pool), ``batcher`` (dynamic batching), ``timing`` (Server-Timing), ``metrics`` (Prometheus)."""
