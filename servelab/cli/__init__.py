"""The `servelab` command: the top layer, argparse fronts only.

Each module here adds its own subcommand with ``register`` and calls into the layers below it
(orchestration, report, measurement, servers, core; see docs/architecture.md).
"""

import argparse
import importlib
import sys

# Subcommand modules, imported only when present so each role installs only what it needs.
COMMAND_MODULES = (
    "servelab.cli.models",  # models build | variants
    "servelab.cli.serve",  # serve fastapi-pt | fastapi-onnx | flask
    "servelab.cli.triton",  # triton up | down | stage
    "servelab.cli.ray",  # ray up | deploy | status | down
    "servelab.cli.load",  # load fastapi | triton | perf-analyzer | input-data
    "servelab.cli.installers",  # perf-analyzer install | check | run; prometheus install | check
    "servelab.cli.report",  # report
    "servelab.cli.benchmark",  # benchmark (in-process vs HTTP ratios for the FastAPI services)
    "servelab.cli.lab",  # lab
    "servelab.cli.doctor",  # doctor
    "servelab.cli.gpu_check",  # gpu-check
    "servelab.cli.containers",  # containers up | down | stop | env
    "servelab.cli.node_secrets",  # secrets (the node's generated ADMIN_TOKEN and Grafana password)
    "servelab.cli.classroom",  # class status (where each student of a class stands on Chameleon)
)

# servelab packages that .dockerignore keeps out of every image: the local container runner runs on
# the host only (`servelab containers` is simply absent inside a container).
LEFT_OUT_OF_IMAGES = ("servelab.tools.containers",)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="servelab", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            # Skip a command whose module or third-party dependency is absent: each role (a FastAPI
            # image, the Flask image) installs only its own extra, and no image holds the packages in
            # LEFT_OUT_OF_IMAGES. A broken servelab import still fails.
            if (missing == name or name.startswith(f"{missing}.") or not missing.startswith("servelab")
                    or missing in LEFT_OUT_OF_IMAGES):
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
