"""GourmetGram for gunicorn: ``gunicorn flask_app.app:app`` from the repository root.

Everything lives in ``servelab.servers.gourmetgram``; this module only builds the app from the
environment (BACKEND, FASTAPI_SERVER_URL, TRITON_SERVER_URL, FOOD11_MODEL_NAME, ...).
"""

from pathlib import Path

from servelab.servers.gourmetgram.web import create_app

app = create_app(root=Path(__file__).resolve().parent)
