"""What the FastAPI services share (each app file, fastapi_pt/app.py and fastapi_onnx/app.py, holds its own
FastAPI and model code; ``servelab serve fastapi-pt|fastapi-onnx`` runs it). docs/architecture.md follows
one request through these modules; each says what it is for."""
