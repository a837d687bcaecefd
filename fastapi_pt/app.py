"""The PyTorch stage: ``uvicorn fastapi_pt.app:app`` from the checkout, or ``servelab serve fastapi-pt``."""

from servelab.servers.fastapi.app import create_app

app = create_app("pytorch")
