"""``servelab doctor [--node] [--images] [--json]``: the front of ``servelab.tools.doctor``."""

import argparse
import json
from dataclasses import asdict

from servelab.tools.doctor import image_checks
from servelab.tools.doctor.checks import CHECKS
from servelab.tools.doctor.runner import Context, exit_code, run_checks


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check this machine for the lab: GPUs, PyTorch and ONNX Runtime builds, Docker, Triton",
        description="One line per check (PASS, WARN, FAIL, SKIP) with the fix; exit status 1 when a check fails.")
    parser.add_argument("--node", action="store_true",
                        help="the lab's GPU node: GPUs and Docker are required; the local-only checks are left out")
    parser.add_argument("--images", action="store_true",
                        help="instead: pull this commit's lab images (where docker/.env names a registry) and run each one's self-check")
    parser.add_argument("--json", action="store_true", help="print the results as a JSON list")
    parser.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    results = run_checks(image_checks.CHECKS if args.images else CHECKS, Context(node=args.node))
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        print(f"servelab doctor ({'images' if args.images else 'lab node' if args.node else 'local'})")
        print("\n".join(r.line() for r in results))
    return exit_code(results)
