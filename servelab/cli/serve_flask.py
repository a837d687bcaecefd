"""``servelab serve flask``: GourmetGram under gunicorn, the server its container runs too.

The container's command is the same server with the same options:
``gunicorn --worker-class gthread --workers 2 --threads 8 --no-control-socket --bind 0.0.0.0:5000
flask_app.app:app``.
"""

import argparse
from typing import get_args

from servelab.core.settings import FlaskSettings, Settings

# Threads, not more processes: a request mostly waits on the backend, and each process holds one
# connection pool that its threads share.
GUNICORN_OPTIONS = {"worker_class": "gthread", "threads": 8, "graceful_timeout": 10, "accesslog": "-",
                    # no runtime-control socket in $HOME: several servers may run side by side
                    "control_socket_disable": True}


def register_flask(serve_subparsers: argparse._SubParsersAction) -> None:
    backends = get_args(FlaskSettings.model_fields["backend"].annotation)
    parser = serve_subparsers.add_parser("flask", help="GourmetGram, the web front end, under gunicorn")
    parser.add_argument("--backend", choices=backends, help="the service to ask (default: $BACKEND, else fastapi)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=5000, help="port to bind (default: 5000)")
    parser.add_argument("--workers", type=int, default=1, help="gunicorn worker processes (default: 1)")
    parser.set_defaults(func=serve_flask)


def serve_flask(args: argparse.Namespace) -> int:
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
    return 0
