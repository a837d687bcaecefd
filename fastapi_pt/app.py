"""The PyTorch stage: ``uvicorn fastapi_pt.app:app`` from the checkout, or ``servelab serve fastapi-pt``."""

from servelab.serving import create_app

app = create_app("pytorch")
