"""What one batcher process behind every server process (``SHARED_BATCHER``) does to ``fastapi-onnx``.

The service as ``servelab serve`` starts it, twice side by side, with the same ``WORKERS`` server processes
(default: one per CPU) and the default batching: each process with its own model (the CPU's default), and
all in front of one batcher process that holds the model (the GPU's default). ``--rounds`` rounds, each a
closed loop of ``--senders`` for ``--seconds`` on one service then on the other. Printed per round: req/s,
the mean batch the model ran, the service's CPU ms per request (every process of it), and the ratio of the
two services' req/s. On the CPU batching does not pay, so the aim here is no loss (ratio ≥ 0.9); the gain
it is built for, batches as full as one process's, is the GPU's to show. The record:
docs/records/shared-batcher-2cpu.log.

    .venv/bin/python benchmarks/shared_batcher.py
"""

import argparse
import tempfile
from contextlib import ExitStack
from pathlib import Path

import httpx
from retry_storm import run

from servelab.core.catalogue import STAGES
from servelab.core.settings import get_settings
from servelab.measure.records import Load
from servelab.run.families import serve_fastapi
from servelab.run.reference import defaults

SERVICES = {"own models": "0", "shared batcher": "1"}


def batches(url: str) -> tuple[float, float]:
    """(images, inferences) the service's batch-size histogram has counted so far."""
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    value = {line.split()[0]: float(line.split()[1]) for line in lines if line.startswith("servelab_batch_size_")}
    return value["servelab_batch_size_sum"], value["servelab_batch_size_count"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--senders", type=int, default=8, help="closed-loop senders")
    parser.add_argument("--seconds", type=float, default=15.0, help="each measured window")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "servelab-shared-batcher",
                        help="the servers' logs")
    args = parser.parse_args()
    env = {"MODEL_DIR": str(get_settings().model_dir), "ORT_PROVIDERS": "cpu"}
    with ExitStack() as stack:
        servers = {}
        for name, shared in SERVICES.items():
            server = serve_fastapi(stack, defaults(STAGES["fastapi-onnx"]), args.logs / shared, {**env, "SHARED_BATCHER": shared})
            servers[name] = (server.url, server.pid)
        load = Load.closed(args.senders, requests=None, duration_s=args.seconds, warmup_s=2.0)
        for round_ in range(1, args.rounds + 1):
            rps = {}
            for name, (url, pid) in servers.items():
                images, inferences = batches(url)
                record, cpu_s = run(url, pid, load, "fastapi-onnx")
                after = batches(url)
                rps[name] = record.stats.throughput_rps
                print(f"round {round_}, {name}: {rps[name]:.1f} req/s, mean batch "
                      f"{(after[0] - images) / max(1, after[1] - inferences):.2f}, "
                      f"{cpu_s * 1000 / max(1, record.stats.requests):.1f} CPU ms per request, "
                      f"errors {record.stats.errors or 'none'}", flush=True)
            print(f"round {round_}: shared batcher / own models = {rps['shared batcher'] / rps['own models']:.2f} "
                  "(aim on the CPU >= 0.90)", flush=True)


if __name__ == "__main__":
    main()
