"""Why the lab bounds Triton's queue by the wait, not by its length.

``onnx-dyn`` under the lab's overload (1.5 × the capacity given), three ways on one local tritonserver: as it
is, with ``max_queue_size: 8``, and with the lab's own bound (``catalogue.bounded``: refuse a request that
waited ``QUEUE_WAIT_US``). Triton's verbose log, turned on through its logging API, says when each batch
started. With a size bound, once the queue is full Triton 2.51's batcher waits out its 500 ms timer between
batches: it does not prefetch under a queue policy, and the arrivals it refuses never wake it. The record:
docs/records/triton-queue-policy-2cpu.log.

    .venv/bin/python benchmarks/triton_queue_policy.py --capacity 74
"""

import argparse
import json
import re
import tempfile
import urllib.request
from datetime import datetime
from pathlib import Path

from servelab.core.catalogue import OVERLOADED, QUEUE_BOUND, STAGES, TRITON, bounded
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.settings import get_settings
from servelab.measure.loadgen import Labels, overload_load, run_bench
from servelab.run.families import TritonAdapter

BATCH = re.compile(r"^I\d{4} (\d\d:\d\d:\d\d\.\d+) .*executing (\d+) requests")
STALL_MS = 450  # a batch start this long after the last one: the 500 ms timer, not a batch's own time


def batch_starts(log: Path, offset: int) -> list[tuple[datetime, int]]:
    """(start, requests) of each batch the Python backend logged after ``offset``."""
    with log.open(errors="replace") as f:
        f.seek(offset)
        found = (BATCH.match(line) for line in f)
        return [(datetime.strptime(m[1], "%H:%M:%S.%f"), int(m[2])) for m in found if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=float, required=True, help="onnx-dyn's measured capacity, req/s")
    parser.add_argument("--seconds", type=float, default=6.0, help="how long each overload lasts")
    args = parser.parse_args()
    base = next(STAGES[name] for name in OVERLOADED if STAGES[name].family == TRITON.name)  # the overload case's
    settings = get_settings()
    family = TritonAdapter(Path(tempfile.mkdtemp()), settings.triton_model_repository, "cpu",
                          manifest=settings.model_dir / "food11.json")
    with family.start(base) as triton:
        body = json.dumps({"log_verbose_level": 1}).encode()
        urllib.request.urlopen(urllib.request.Request(f"http://{triton.server.url}/v2/logging", body, method="POST"),
                               timeout=10)
        for stage in (base, bounded(base, max_queue_size=QUEUE_BOUND), bounded(base)):
            triton.switch(stage)
            offset = triton.log.stat().st_size
            target = triton.target(stage, DEFAULT_IMAGE.read_bytes())
            load, labels = overload_load(args.capacity, args.seconds)
            stats = run_bench(target, load, Labels(stage.name, config=labels, server_pid=triton.pid)).stats
            starts = batch_starts(triton.log, offset)
            gaps = [(b[0] - a[0]).total_seconds() * 1000 for a, b in zip(starts, starts[1:])]
            print(f"{stage.name} ({stage.about}):\n  served {stats.successes} ({stats.throughput_rps:.1f} req/s), "
                  f"shed {sum(stats.shed.values())} {stats.shed}, p50 {stats.latency.p50_ms:.0f} ms, "
                  f"p99 {stats.latency.p99_ms:.0f} ms\n  {len(starts)} batches, "
                  f"{sum(g >= STALL_MS for g in gaps)} started ≥ {STALL_MS} ms after the one before; "
                  f"batch start to start, ms: {sorted(round(g) for g in gaps)}", flush=True)


if __name__ == "__main__":
    main()
