"""``servelab secrets [--rotate]``: the compose files' generated secrets (``servelab.tools.containers.node_secrets``)."""

import argparse

from servelab.core.paths import REPO_ROOT
from servelab.tools.containers.node_secrets import FILES, SECRETS_DIR, write


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "secrets", help="generate the lab node's secrets (FastAPI's ADMIN_TOKEN, Grafana's admin password) into .secrets/",
        description="Writes .secrets/lab.env (ADMIN_TOKEN, for fastapi_server and Jupyter) and .secrets/grafana.env "
                    "(Grafana's admin password), readable by you only and never committed; keeps those that exist. "
                    "Run it before the first `docker compose up` (docs/security.md).")
    parser.add_argument("--rotate", action="store_true",
                        help="new values for all of them (recreate the containers to use them)")
    parser.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> None:
    for name, what in write(rotate=args.rotate).items():
        print(f"{what} {(SECRETS_DIR / name).relative_to(REPO_ROOT)} ({FILES[name]})")
