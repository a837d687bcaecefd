"""The ONNX Runtime stage: ``uvicorn fastapi_onnx.app:app`` from the checkout, or ``servelab serve fastapi-onnx``."""

from servelab.serving import create_app

app = create_app("onnx")
