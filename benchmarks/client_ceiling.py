"""What servelab's client can send on this machine, with one sender process and with several, side by side.

Each row is a closed loop of ``--concurrency`` senders for ``--seconds`` against the no-op server
(``servelab.measure.noop_server``, ``--server-processes`` of it sharing one port) with one request body: the lab's
photo as the FastAPI services get it (base64 in JSON), the same photo as Triton's image-in stages get it (by its
HTTP stand-in: a body of the same size), a preprocessed tensor's worth (Triton's tensor-in stages), and a tiny
body (the client's cost with nothing to send). ``req/s`` is what the processes sent per second of wall time;
``per CPU-s`` what each sent per second of its own CPU time (the ceiling every run records, one process's);
``CPU share`` how busy each sender was. On a machine with few CPUs the no-op server and the senders share them,
so more processes may not send more: that is the figure to read, not a failure. The record:
docs/records/client-ceiling-2cpu.log.

    .venv/bin/python benchmarks/client_ceiling.py --processes 4
"""

import argparse
import asyncio

from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.procs import cpu_count
from servelab.core.tables import markdown, num
from servelab.measure.loadgen import measure_ceiling
from servelab.measure.senders import default_max_processes, noop_server_processes
from servelab.measure.targets import FastAPITarget, TritonTarget

PHOTO = DEFAULT_IMAGE.read_bytes()
TENSOR_BYTES = 3 * 224 * 224 * 4  # one preprocessed float32 image


def bodies() -> dict[str, object]:
    """What each row sends (the URL is replaced by the no-op server's)."""
    return {
        f"FastAPI, {DEFAULT_IMAGE.name}": FastAPITarget("http://unused", PHOTO),
        f"Triton image-in, {DEFAULT_IMAGE.name} (stand-in)": TritonTarget("unused:1", "food_classifier", PHOTO),
        # A FastAPI body of a tensor's size stands for the tensor-in stages (no model needed to build it).
        "Triton tensor-in, one float32 crop (stand-in)": FastAPITarget("http://unused", bytes(TENSOR_BYTES * 3 // 4)),
        "tiny body (1 byte)": FastAPITarget("http://unused", b"x"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=max(2, default_max_processes()),
                        help="sender processes for the second row of each body (default: half the CPUs, at least 2)")
    parser.add_argument("--server-processes", type=int, default=None,
                        help="no-op server processes (default: enough for one sender, up to 4, leaving a CPU)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    server = args.server_processes or noop_server_processes()
    rows = []
    for what, target in bodies().items():
        one = None
        for n in (1, args.processes):
            c = asyncio.run(measure_ceiling(target, args.concurrency, args.seconds, server, processes=n))
            one = one or c
            rows.append([what if n == 1 else "", str(c.body_bytes) if n == 1 else "", str(n), num(c.wall_rps),
                         num(c.rps), f"{c.cpu_share:.0%}", num(c.wall_rps / one.wall_rps, 2)])
            print(f"{what}: {n} process(es): {c.wall_rps:.0f} req/s, {c.rps:.0f} per CPU-s each", flush=True)
    print(f"\n{cpu_count()} CPUs; the no-op server on {server} process(es); {args.concurrency} senders in all, "
          f"{args.seconds:g} s per row\n")
    print(markdown(["body", "bytes", "processes", "req/s", "per CPU-s, each", "CPU share, each", "× one process"],
                   rows, "lrrrrrr"))


if __name__ == "__main__":
    main()
