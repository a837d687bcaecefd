"""``servelab load``: the same client for every stage.

    servelab load fastapi --url http://127.0.0.1:8000 --requests 100            # sequential
    servelab load fastapi --url ... --concurrency 1,2,4,8,16 --requests 500    # closed-loop sweep
    servelab load triton --url 127.0.0.1:8000 --model food_classifier_onnx --rate 120,180 --arrivals poisson
    servelab load perf-analyzer --url 127.0.0.1:8000 --model food_classifier --concurrency 8
    servelab load input-data --input bytes --out input.json

``--requests N`` measured requests (alone: sequential; default 100 sequential, 1000 per closed-loop
level, 10 s worth per open-loop rate), ``--duration S`` a time window instead, ``--warmup W``
unmeasured requests first (``--warmup-seconds S``: for S seconds too). The client runs on as many sender
processes as keep it twice above the rate it expects (``--processes N`` fixes them); each record says how many,
what the client cost per request, and whether the run was client-bound (its busiest sender's event loop on the CPU
over half the window). ``--out FILE`` appends one JSON record per run; the summary table is printed either way. Latency in ms, throughput in requests/s (images/s = req/s x batch).
"""

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Any, get_args

from servelab.core.catalogue import PT
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.tables import num
from servelab.measure.loadgen import ClientOptions, Labels, run_bench
from servelab.measure.perf_analyzer import PerfAnalyzerOptions, run_perf_analyzer, write_input_data
from servelab.measure.records import Load, Record
from servelab.measure.targets import FastAPITarget, Target, TritonTarget
from servelab.report.render import summary_table
from servelab.servers.triton.client import InputKind, input_kind


def _numbers(kind: type, text: str) -> list:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _record_options(g: Any) -> None:
    """What every client's record carries beside its numbers: the stage, its config, the server, the stand-in."""
    g.add_argument("--stage", help="stage name for the record (default: from the target)")
    g.add_argument("--config", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="stage configuration to record (repeatable)")
    g.add_argument("--server-pid", type=int, help="server process whose memory (with children) to record")
    g.add_argument("--monitor-interval", type=float, default=0.5, help="seconds between utilization samples")
    g.add_argument("--stand-in", help="note that the model is a stand-in, shown in every report")
    g.add_argument("--out", type=Path, help="append one JSON record per run to this file")


def register(subparsers: Any) -> None:
    bench = subparsers.add_parser("load", help="measure latency and throughput of a stage",
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = bench.add_subparsers(dest="bench_command", required=True)
    model = argparse.ArgumentParser(add_help=False)  # the Triton model's options: triton, perf-analyzer, input-data
    model.add_argument("--model", default=PT, help="model name (default %(default)s)")
    model.add_argument("--input", choices=get_args(InputKind),
                       help="INPUT_IMAGE bytes, the preprocessed `input` tensor, or the uint8 `image` crop "
                            "(default: what the catalogue's model takes, servelab.core.catalogue.MODELS)")
    model.add_argument("--manifest", type=Path, help="model manifest with the preprocessing sizes (tensor or uint8 input)")
    for name, help_text, func in (
        ("fastapi", "POST /predict (base64 JSON) to a FastAPI service", _cmd_bench),
        ("triton", "infer through tritonclient's asyncio HTTP or gRPC client", _cmd_bench),
        ("perf-analyzer", "run perf_analyzer (see `servelab perf-analyzer check`) and record its results",
         _cmd_perf_analyzer),
    ):
        p = sub.add_parser(name, help=help_text, parents=[] if name == "fastapi" else [model])
        if name == "fastapi":
            p.add_argument("--url", default="http://127.0.0.1:8000", help="base URL (default %(default)s)")
        else:
            p.add_argument("--url", default="127.0.0.1:8000", help="Triton HOST:PORT, no scheme (default %(default)s)")
            p.add_argument("--protocol", choices=("http", "grpc"), default="http")
        p.add_argument("--image", type=Path, default=DEFAULT_IMAGE,
                       help="photo to send (default: the bundled real photo)")
        p.add_argument("--batch", type=int, default=1, help="images per request (default 1)")
        g = p.add_argument_group("load (latency in ms, throughput in requests/s)")
        g.add_argument("--requests", type=int, help="measured requests per run (alone: a sequential run)")
        g.add_argument("--duration", type=float, help="measure for this many seconds instead (or as well)")
        g.add_argument("--warmup", type=int, default=10, help="unmeasured requests first (default %(default)s)")
        g.add_argument("--concurrency", type=partial(_numbers, int), help="closed loop: senders, e.g. 8 or 1,2,4,8,16")
        g.add_argument("--rate", type=partial(_numbers, float), help="open loop: requests/s, e.g. 120 or 120,180,240")
        g.add_argument("--arrivals", choices=("constant", "poisson"), default="poisson", help="open-loop arrivals")
        g.add_argument("--seed", type=int, default=0, help="seed of the Poisson schedule")
        if func is _cmd_bench:  # servelab's own client (perf_analyzer has its own)
            g.add_argument("--max-inflight", type=int, default=128, help="open loop: most requests outstanding")
            g.add_argument("--timeout", type=float, default=30.0, help="per-request timeout in seconds")
            g.add_argument("--warmup-seconds", type=float,
                           help="a warm-up window too: unmeasured requests until both it and --warmup are done")
            c = p.add_argument_group("client (servelab.measure.senders: its sender processes)")
            c.add_argument("--processes", type=int,
                           help="sender processes (default: as many as keep the client 2x above the rate it expects)")
            c.add_argument("--max-processes", type=int,
                           help="the most sender processes it may plan (default: half the CPUs)")
        _record_options(p.add_argument_group("record"))
        p.set_defaults(func=func)
    # perf-analyzer's own, on the last of them
    p.add_argument("--input-data", type=Path, help="existing --input-data JSON (default: written from --image)")
    p.add_argument("--extra", default="", help="more perf_analyzer arguments, e.g. '--async'")

    data = sub.add_parser("input-data", parents=[model],
                          help="write perf_analyzer --input-data JSON from a real photo")
    data.add_argument("--image", type=Path, default=DEFAULT_IMAGE, help="photo (default: the bundled real photo)")
    data.add_argument("--out", type=Path, default=Path("input.json"), help="where to write (default %(default)s)")
    data.set_defaults(func=_cmd_input_data)


def loads_from_args(args: argparse.Namespace) -> list[Load]:
    """The runs the flags ask for: a sweep over --concurrency or --rate values, else one sequential run."""
    if args.concurrency and args.rate:
        raise SystemExit("choose --concurrency (closed loop) or --rate (open loop), not both")
    window: dict[str, Any] = {"warmup": args.warmup, "seed": args.seed}
    if args.requests is not None or args.duration is not None:
        window |= {"requests": args.requests, "duration_s": args.duration}
    # servelab's own client only (perf_analyzer takes neither)
    window |= {key: value for key, value in (("max_inflight", getattr(args, "max_inflight", None)),
                                             ("warmup_s", getattr(args, "warmup_seconds", None))) if value}
    if args.rate:
        return [Load.open(rate, args.arrivals, **window) for rate in args.rate]
    if args.concurrency:
        return [Load.closed(c, **window) for c in args.concurrency]
    return [Load.sequential(**window)]


def _input_kind(args: argparse.Namespace) -> str:
    try:
        return args.input or input_kind(args.model)
    except ValueError as exc:
        raise SystemExit(f"servelab load: {exc}") from None


def _target(args: argparse.Namespace) -> Target:
    image, name = args.image.read_bytes(), args.image.name
    if args.bench_command == "fastapi":
        return FastAPITarget(args.url, image, args.batch, name)
    return TritonTarget(args.url, args.model, image, args.protocol, _input_kind(args), args.batch, name, args.manifest)


def _default_stage(args: argparse.Namespace) -> str:
    return args.stage or ("fastapi" if args.bench_command == "fastapi" else f"triton-{args.model}")


def _finish(records: list[Record], out: Path | None) -> int:
    """Print the summary table; fail when a run measured nothing or had no successful request."""
    print(summary_table(records))
    for r in records:
        if r.failed:
            print(f"FAILED {r.stage} [{r.load.label()}]: {r.failed}")
    if out:
        print(f"appended {len(records)} record(s) to {out}")
    measured = [r.failed is None and ((r.stats.successes or 0) > 0 or r.tool == "perf_analyzer") for r in records]
    return 0 if all(measured) else 1


def _cmd_bench(args: argparse.Namespace) -> int:
    target, loads, records = _target(args), loads_from_args(args), []
    labels = Labels(_default_stage(args), dict(args.config), args.stand_in, args.server_pid)
    client = ClientOptions(args.timeout, args.monitor_interval, args.out, processes=args.processes,
                           max_processes=args.max_processes)
    for i, load in enumerate(loads, 1):
        records.append(run_bench(target, load, labels, client))
        r, s = records[-1], records[-1].stats
        print(f"[{i}/{len(loads)}] {r.stage} {r.load.label()}: {s.successes} ok, {s.error_count} errors, "
              f"p50 {num(s.latency.p50_ms)} ms, {s.throughput_rps:.1f} req/s", file=sys.stderr, flush=True)
    return _finish(records, args.out)


def _cmd_perf_analyzer(args: argparse.Namespace) -> int:
    target = _target(args)
    labels = Labels(_default_stage(args), dict(args.config), args.stand_in, args.server_pid)
    options = PerfAnalyzerOptions(input_data_path=args.input_data, extra=tuple(args.extra.split()),
                                  monitor_interval_s=args.monitor_interval, out=args.out)
    return _finish([run_perf_analyzer(target, load, labels, options) for load in loads_from_args(args)], args.out)


def _cmd_input_data(args: argparse.Namespace) -> None:
    kind = _input_kind(args)
    path = write_input_data(args.out, args.image.read_bytes(), kind, args.manifest)
    print(f"wrote {path} ({kind} input from {args.image.name}); use: perf_analyzer -m {args.model} --input-data {path}")
