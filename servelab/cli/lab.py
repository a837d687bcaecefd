"""``servelab lab``: the front of ``servelab.run.lab``."""

from pathlib import Path

from servelab.core.paths import DEFAULT_IMAGE
from servelab.run import lab
from servelab.run.plan import LAB_STAGES, PLANS, TOUR_STAGES


def register(subparsers) -> None:
    p = subparsers.add_parser("lab", help="run the lab's stages locally (CPU or GPU) and write results/")
    plan = p.add_mutually_exclusive_group()
    plan.add_argument("--full", action="store_true",
                      help="every stage, every load, both clients on every Triton stage (instead of the tour: "
                           f"{', '.join(s.name for s in TOUR_STAGES)}, each lesson once)")
    plan.add_argument("--quick", action="store_true", help="every stage, a few requests each (a smoke run, tests)")
    plan.add_argument("--plan", choices=list(PLANS), help="a plan by name (--full and --quick are two of them)")
    p.add_argument("--stages", help=f"comma-separated subset of: {', '.join(s.name for s in LAB_STAGES)}")
    p.add_argument("--out", type=Path, default=lab.RESULTS, help="results folder (default: results/)")
    p.add_argument("--image", type=Path, default=DEFAULT_IMAGE, help="the photo sent in every request")
    p.add_argument("--concurrency", help="closed-loop concurrencies, comma-separated, measured after one at a time "
                   "instead of the sweep to the knee (default: the sweep, doubling to where throughput stops growing)")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default=None,
                   help="where every stage runs (default: LAB_DEVICE, auto = the GPU where nvidia-smi lists one)")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="start no stage that would end after this many seconds from the command's start; "
                        "those are named as not run in run.json and the report (default: no limit)")
    p.set_defaults(func=lab.run_lab)
