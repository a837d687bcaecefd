"""``servelab lab``: the front of ``servelab.lab``."""

from pathlib import Path

from servelab import lab
from servelab.paths import DEFAULT_IMAGE


def register(subparsers) -> None:
    p = subparsers.add_parser("lab", help="run every lab stage locally (CPU or GPU) and write results/")
    p.add_argument("--quick", action="store_true", help="a few requests per measurement (tests, a first look)")
    p.add_argument("--stages", help=f"comma-separated subset of: {', '.join(s.name for s in lab.LAB_STAGES)}")
    p.add_argument("--out", type=Path, default=lab.RESULTS, help="results folder (default: results/)")
    p.add_argument("--image", type=Path, default=DEFAULT_IMAGE, help="the photo sent in every request")
    p.add_argument("--concurrency", help="closed-loop concurrencies, comma-separated (default 8,16; --quick: 8)")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default=None,
                   help="where every stage runs (default: LAB_DEVICE, auto = the GPU where nvidia-smi lists one)")
    p.set_defaults(func=lab.run_lab)
