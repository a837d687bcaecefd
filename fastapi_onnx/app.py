"""The ONNX Runtime stage: ``uvicorn fastapi_onnx.app:app`` from the checkout, or ``servelab serve fastapi-onnx``."""

from servelab.servers.fastapi.app import create_app

app = create_app("onnx")
