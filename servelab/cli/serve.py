"""``servelab serve``: run one of the lab's services in the foreground (Ctrl-C stops it).

Each stage adds its subcommands through a registrar in ``SERVICE_REGISTRARS``.
"""

import argparse
from functools import partial

from servelab.cli.serve_flask import register_flask
from servelab.core.catalogue import SERVICES
from servelab.core.settings import get_settings

RUNTIMES = {"pytorch": "PyTorch", "onnx": "ONNX Runtime"}


def _run_fastapi(kind: str, args: argparse.Namespace) -> int:
    # Deferred: uvicorn, FastAPI and each app's runtime (optional extras) are absent from the Flask image,
    # which has `serve flask`. Each stage's app file is what runs: `uvicorn fastapi_onnx.app:app` serves the same.
    from servelab.servers.fastapi.workers import serve

    settings = get_settings()  # the app's own, read once
    app = "fastapi_pt.app:app" if kind == "pytorch" else "fastapi_onnx.app:app"
    serve(app, settings, kind, args.host or settings.host, args.port or settings.port)
    return 0


def register_fastapi(sub) -> None:
    for name, kind in SERVICES.items():
        p = sub.add_parser(name, help=f"the FastAPI service on {RUNTIMES[kind]} (settings: docs/configuration.md)")
        p.add_argument("--host", help="address to bind (default: HOST, 127.0.0.1)")
        p.add_argument("--port", type=int, help="port (default: PORT, 8000)")
        p.set_defaults(func=partial(_run_fastapi, kind))


# One function per stage; each adds its own subcommands to `servelab serve` (flask: servelab.cli.serve_flask).
SERVICE_REGISTRARS = [register_fastapi, register_flask]


def register(subparsers) -> None:
    serve = subparsers.add_parser("serve", help="run a service in the foreground")
    sub = serve.add_subparsers(dest="serve_command", required=True)
    for register_stage in SERVICE_REGISTRARS:
        register_stage(sub)
