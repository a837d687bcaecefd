"""``servelab serve``: run one of the lab's services in the foreground (Ctrl-C stops it); ``serve flask`` runs
GourmetGram under gunicorn with the options its container's command gives too."""

import argparse
from functools import partial
from typing import get_args

from servelab.core.catalogue import SERVICES
from servelab.core.settings import FlaskSettings, Settings, get_settings

RUNTIMES = {"pytorch": "PyTorch", "onnx": "ONNX Runtime"}
# Threads, not more processes: a request mostly waits on the backend, and each process holds one
# connection pool that its threads share.
GUNICORN_OPTIONS = {"worker_class": "gthread", "threads": 8, "graceful_timeout": 10, "accesslog": "-",
                    # no runtime-control socket in $HOME: several servers may run side by side
                    "control_socket_disable": True}


def _run_fastapi(kind: str, args: argparse.Namespace) -> None:
    # Deferred: uvicorn, FastAPI and each app's runtime (optional extras) are absent from the Flask image,
    # which has `serve flask`. Each stage's app file is what runs: `uvicorn fastapi_onnx.app:app` serves the same.
    from servelab.servers.fastapi.workers import serve

    settings = get_settings()  # the app's own, read once
    app = "fastapi_pt.app:app" if kind == "pytorch" else "fastapi_onnx.app:app"
    serve(app, settings, kind, args.host or settings.host, args.port or settings.port)


def _run_flask(args: argparse.Namespace) -> None:
    # Deferred: gunicorn and Flask (the flask extra) are absent from the FastAPI images.
    from gunicorn.app.base import BaseApplication

    from servelab.servers.gourmetgram.web import create_app  # deferred: Flask, only for this command

    settings = Settings(**({"backend": args.backend} if args.backend else {}))
    # Built once before forking, so a bad setting fails here with its message; the backend's
    # connection pool is still empty then, so no worker inherits another's sockets.
    app = create_app(settings)
    options = {**GUNICORN_OPTIONS, "bind": f"{args.host}:{args.port}", "workers": args.workers}

    class GourmetGram(BaseApplication):
        def load_config(self) -> None:
            for key, value in options.items():
                self.cfg.set(key, value)

        def load(self):
            return app

    print(f"GourmetGram on http://{args.host}:{args.port} asking {settings.backend}", flush=True)
    GourmetGram().run()


def register(subparsers) -> None:
    sub = subparsers.add_parser("serve", help="run a service in the foreground").add_subparsers(
        dest="serve_command", required=True)
    for name, kind in SERVICES.items():
        p = sub.add_parser(name, help=f"the FastAPI service on {RUNTIMES[kind]} (settings: docs/configuration.md)")
        p.add_argument("--host", help="address to bind (default: HOST, 127.0.0.1)")
        p.add_argument("--port", type=int, help="port (default: PORT, 8000)")
        p.set_defaults(func=partial(_run_fastapi, kind))
    p = sub.add_parser("flask", help="GourmetGram, the web front end, under gunicorn")
    p.add_argument("--backend", choices=get_args(FlaskSettings.model_fields["backend"].annotation),
                   help="the service to ask (default: $BACKEND, else fastapi)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=5000, help="port to bind (default: 5000)")
    p.add_argument("--workers", type=int, default=1, help="gunicorn worker processes (default: 1)")
    p.set_defaults(func=_run_flask)
