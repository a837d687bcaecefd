"""What a retry storm costs a service that sheds load.

``fastapi-onnx`` as ``servelab serve`` starts it, twice side by side: unbounded, and with its queue bounded
(``MAX_QUEUE_REQUESTS``). First the unbounded one's capacity at ``--senders``
closed-loop senders and the bounded one's unloaded p99 (one request at a time); then the storm: ``--storm``
closed-loop senders that send again the moment an answer arrives, a refusal included (they ignore
``Retry-After``, as many real clients do), for ``--seconds``. Printed side by side: what the storm was served
against the capacity (aim ≥ 80 %), the accepted requests' p99 against the unloaded one (aim ≤ 3×), how many
refusals, and what each cost the service's processes in CPU time; once with refusals held (``SHED_HOLD_MS``,
the default) and once answered at once (``SHED_HOLD_MS=0``), the storms one after the other. The record:
docs/records/retry-storm-2cpu.log.

    .venv/bin/python benchmarks/retry_storm.py
"""

import argparse
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import psutil

from servelab.core.catalogue import OVERLOADED, STAGES
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.procs import cpu_count
from servelab.core.settings import get_settings
from servelab.measure.loadgen import Labels, run_bench
from servelab.measure.records import Load, Record
from servelab.measure.targets import FastAPITarget
from servelab.run.families import serve_fastapi
from servelab.run.reference import defaults


def cpu_s(pid: int) -> float:
    """CPU seconds of a server process and every process under it."""
    root = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)])


def run(url: str, pid: int, load: Load, stage: str) -> tuple[Record, float]:
    before = cpu_s(pid)
    record = run_bench(FastAPITarget(url, DEFAULT_IMAGE.read_bytes()), load, Labels(stage))
    return record, cpu_s(pid) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bound", type=int, default=4, help="MAX_QUEUE_REQUESTS of the bounded services")
    parser.add_argument("--senders", type=int, default=16, help="closed-loop senders for the capacity")
    parser.add_argument("--storm", type=int, default=64, help="closed-loop senders of the storm")
    parser.add_argument("--seconds", type=float, default=8.0, help="each measured window")
    parser.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "servelab-retry-storm",
                        help="the servers' logs")
    args = parser.parse_args()
    env = {"MODEL_DIR": str(get_settings().model_dir), "ORT_PROVIDERS": "cpu"}
    with ExitStack() as stack:
        servers = {}
        bound = {"MAX_QUEUE_REQUESTS": str(args.bound)}
        for name, extra in (("unbounded", {}), ("bounded", bound), ("bounded, no hold", {**bound, "SHED_HOLD_MS": "0"})):
            server = serve_fastapi(stack, defaults(STAGES[OVERLOADED[0]]), args.logs / name.replace(" ", "-"), {**env, **extra})
            servers[name] = (server.url, server.pid)
        window = dict(requests=None, duration_s=args.seconds, warmup=2 * args.storm)
        capacity, _ = run(*servers["unbounded"], Load.closed(args.senders, **window), "unbounded")
        unloaded, _ = run(*servers["bounded"], Load.sequential(requests=None, duration_s=args.seconds, warmup=5),
                          "bounded, one at a time")
        storms = {name: run(*servers[name], Load.closed(args.storm, **window), f"{name}, storm")
                  for name in ("bounded", "bounded, no hold")}
    print(f"fastapi-onnx, {cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}; MAX_QUEUE_REQUESTS={args.bound}")
    print(f"capacity (unbounded, {args.senders} senders): {capacity.stats.throughput_rps:.1f} req/s")
    print(f"unloaded p99 (bounded, one at a time): {unloaded.stats.latency.p99_ms:.1f} ms")
    for name, (storm, spent) in storms.items():
        shed = sum(storm.stats.shed.values())
        served = storm.stats.throughput_rps / capacity.stats.throughput_rps
        p99 = storm.stats.latency.p99_ms / unloaded.stats.latency.p99_ms
        print(f"storm on {name} ({args.storm} senders ignoring Retry-After, {args.seconds:g} s): served "
              f"{storm.stats.throughput_rps:.1f} req/s = {served:.2f}x the capacity (aim >= 0.80); accepted p99 "
              f"{storm.stats.latency.p99_ms:.1f} ms = {p99:.2f}x the unloaded one (aim <= 3); {shed} refused "
              f"({shed / storm.stats.wall_s:.0f}/s); the service's CPU {1000 * spent / max(1, shed + storm.stats.successes):.2f} "
              f"ms per request answered or refused; errors {storm.stats.errors or 'none'}")

if __name__ == "__main__":
    main()
