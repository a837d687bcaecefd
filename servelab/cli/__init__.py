"""The `servelab` command. Each feature module adds its own subcommand with ``register``."""

import argparse
import importlib
import sys

# Subcommand modules, imported only when present so each role installs only what it needs.
COMMAND_MODULES = (
    "servelab.cli.models",  # models build | variants
    "servelab.serve",  # serve fastapi-pt | fastapi-onnx | flask
    "servelab.triton.cli",  # triton up | down | stage
    "servelab.rayserve.cli",  # ray up | deploy | status | down
    "servelab.cli.bench",  # bench fastapi | triton | perf-analyzer | input-data
    "servelab.bench.perf_analyzer_binary",  # perf-analyzer install | check | run
    "servelab.monitoring.prometheus_binary",  # prometheus install | check
    "servelab.cli.report",  # report
    "servelab.cli.benchmark",  # benchmark (in-process vs HTTP ratios for the FastAPI services)
    "servelab.lab",  # lab
    "servelab.doctor.cli",  # doctor
    "servelab.gpu_check",  # gpu-check
    "servelab.containers.cli",  # containers up | down | stop | env
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="servelab", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            # Skip a command whose module or third-party dependency is absent: each role (a FastAPI
            # image, the Flask image) installs only its own extra. A broken servelab import still fails.
            if missing == name or name.startswith(f"{missing}.") or not missing.startswith("servelab"):
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
