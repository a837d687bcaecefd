"""``servelab benchmark``: the front of ``servelab.run.side_by_side`` (what HTTP adds, measured side by side)."""

import argparse
import sys
from pathlib import Path

from servelab.run import side_by_side


def register(subparsers) -> None:
    p = subparsers.add_parser("benchmark", help="the model alone (its ceiling); in-process pipeline vs end-to-end "
                                                "HTTP for the FastAPI stages",
                              description=side_by_side.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    measures = [side_by_side.LIMIT_MEASURE, side_by_side.CEILING_MEASURE, *side_by_side.STAGES,
                side_by_side.PREPROCESS_MEASURE, side_by_side.VARIANTS_MEASURE, side_by_side.RAY_MEASURE]
    p.add_argument("--measure", nargs="+", choices=measures, default=measures,
                   help="what to measure (default: all): the FastAPI stages against this machine's limit and the "
                        "simplest app (limit), the model alone (ceiling), a FastAPI stage, preprocessing in threads "
                        "against worker processes, fastapi-onnx's model variants, or Ray Serve (ray-dyn) against "
                        "fastapi-onnx-dyn")
    p.add_argument("--variants", nargs="+", default=["u8", "int8", "int8dyn", "fp16"],
                   help="variants compared with fp32 in --measure variants (default: all; fp16 only where a GPU runs it)")
    p.add_argument("--requests", type=int, default=200, help="sequential requests of each kind (default 200)")
    p.add_argument("--duration", type=float, default=12.0, help="seconds of each throughput measurement (default 12)")
    p.add_argument("--rounds", type=int, default=4, help="alternating rounds the throughput seconds are split into (default 4)")
    p.add_argument("--concurrency", type=int, default=16, help="concurrent senders (default 16)")
    p.add_argument("--max-batch-size", type=int, default=16, help="MAX_BATCH_SIZE with batching on (default 16)")
    p.add_argument("--batch-timeout-ms", type=float, default=5.0, help="BATCH_TIMEOUT_MS with batching on (default 5)")
    p.add_argument("--ceiling-repeats", type=int, default=20, help="ceiling: timed runs per batch size (default 20)")
    p.add_argument("--ceiling-seconds", type=float, default=5.0,
                   help="ceiling: at most this many seconds of timed runs per batch size (default 5)")
    p.add_argument("--cost-seconds", type=float, default=2.0, help="limit: seconds of each part's measurement, every "
                   "core on it (the model at each batch and thread count, preprocessing, HTTP; default 2)")
    p.add_argument("--limit-json", type=Path, help="limit: also write the measured limit here (JSON, as the lab's "
                                                   "limit.json)")
    p.add_argument("--records", type=Path, nargs="+",
                   help="ceiling: a lab's records.jsonl; every stage is then shown as a fraction of the ceiling")
    p.add_argument("--ceiling-json", type=Path, help="ceiling: also write the measured result here (JSON)")
    # The old spelling, kept for one release: these are measurements, not the catalogue's stages.
    p.add_argument("--stage", nargs="+", choices=measures, dest="old_stage", help=argparse.SUPPRESS)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.old_stage:
        print("servelab benchmark: --stage is now --measure (what it names are measurements, not stages); "
              "--stage goes in the next release", file=sys.stderr)
        args.measure = args.old_stage
    return side_by_side.run(args)
