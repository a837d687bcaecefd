"""The `servelab` command: the top layer, argparse fronts only.

Each module here adds its own subcommand with ``register``, whose ``func`` returns the exit status (None: 0), and
calls into the layers below it (orchestration, report, measurement, servers, core; see docs/architecture.md).
"""

import argparse
import importlib
import sys

# Subcommand modules, in `servelab --help`'s order, imported only where present: each role installs what it needs.
COMMAND_MODULES = tuple(f"servelab.cli.{name}" for name in (
    "models", "serve", "triton", "ray", "load", "installers", "report", "benchmark", "lab", "doctor", "gpu_check",
    "containers", "node_secrets", "classroom"))

# Kept out of every image by .dockerignore: the local container runner runs on the host only (no `servelab containers`).
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

