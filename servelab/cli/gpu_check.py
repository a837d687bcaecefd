"""``servelab gpu-check`` (``make gpu-check``): the front of ``servelab.tools.gpu_check``."""

import argparse
from pathlib import Path

from servelab.core.paths import REPO_ROOT
from servelab.run.plan import GPU_CHECK_STAGES, LAB_STAGES
from servelab.tools import gpu_check


def register(subparsers) -> None:
    p = subparsers.add_parser("gpu-check", help="run the GPU tests and a short GPU lab; write docs/gpu/<gpu>.md",
                              description=gpu_check.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "gpu-check", help="test and lab outputs")
    p.add_argument("--docs", type=Path, default=gpu_check.DOCS, help="where the record goes (default docs/gpu/)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--full", action="store_true", help="every lab stage with the full lab's loads (no time limit "
                       "unless --budget); default: " + ", ".join(s.name for s in GPU_CHECK_STAGES))
    which.add_argument("--stages", help="these stages with the quick lab's loads (no time limit unless --budget), "
                       f"comma-separated, of: {', '.join(s.name for s in LAB_STAGES)}")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help=f"seconds for the whole check, install not included (default {gpu_check.DEFAULT_BUDGET_S:g} "
                        "for the default stages; 0: no limit); what it cuts is recorded as not run")
    p.set_defaults(func=lambda args: gpu_check.check(args.out, args.docs, args.full, args.stages, args.budget))
