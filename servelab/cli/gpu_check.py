"""``servelab gpu-check`` (``make gpu-check``): the front of ``servelab.tools.gpu_check``."""

import argparse
from pathlib import Path

from servelab.paths import REPO_ROOT
from servelab.tools import gpu_check


def register(subparsers) -> None:
    p = subparsers.add_parser("gpu-check", help="run the GPU tests and a short GPU lab; write docs/gpu/<gpu>.md",
                              description=gpu_check.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "gpu-check", help="test and lab outputs")
    p.add_argument("--docs", type=Path, default=gpu_check.DOCS, help="where the record goes (default docs/gpu/)")
    p.add_argument("--full", action="store_true", help="the full lab instead of --quick")
    p.set_defaults(func=lambda args: gpu_check.check(args.out, args.docs, args.full))
