"""A tiny HTTP server with a known service time, so queueing theory predicts what the load
generator must measure.

    python tests/tinyserver.py --service-ms 20 --slots 1

It binds 127.0.0.1 on a free port and prints ``PORT <n>`` once it listens. ``slots`` requests are
served at a time, each taking exactly ``service-ms`` (the others wait in FIFO order), so one slot
is an ideal deterministic single server: capacity 1/S, sequential latency S, closed-loop latency
C*S at C senders. ``--service-ms 0`` answers at once (the trivial endpoint for client-speed checks).

Routes (any of them under a prefix that misbehaves on purpose):
  POST [prefix]/predict        200 {"prediction": ...} + a Server-Timing header
  POST [prefix]/predict/batch  200 {"predictions": [one per image in {"images": [...]}]} + Server-Timing
  GET  /health, /count                            200 {"status": "ok", "count": <predict requests so far>}
  GET  /metrics                                   Prometheus text: tiny_requests_total by status
  prefixes: /status/<code> answers <code>; /fail-every/<k> answers 500 to every k-th request;
            /bad-body answers 200 with an error body (the original lab counted those as successes).

``running(...)`` starts it as a real process for tests and stops it by PID.
"""

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

OK_BODY = json.dumps({"prediction": "Bread", "probability": 0.5}).encode()
BAD_BODY = json.dumps({"error": "model failed"}).encode()


class App:
    """A raw ASGI app: as little per-request overhead as possible, so the client is what is measured."""

    def __init__(self, service_s: float, slots: int) -> None:
        self.service_s = service_s
        self.slots = slots
        self.free_at = [0.0] * slots  # when each slot's current job ends, in loop time
        self.lock: asyncio.Lock | None = None
        self.count = 0
        self.answered: collections.Counter[int] = collections.Counter()  # predict requests by the status answered

    async def _serve(self) -> tuple[float, float]:
        """Hold a slot for exactly service_s; returns (queue, service) seconds."""
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        if self.service_s <= 0:
            return 0.0, 0.0
        self.lock = self.lock or asyncio.Lock()
        async with self.lock:  # FIFO: reserve the slot that frees first
            slot = min(range(self.slots), key=self.free_at.__getitem__)
            start = max(arrived, self.free_at[slot])
            # Ends are computed from the previous job's scheduled end, so timer overshoot never
            # accumulates: a saturated slot serves exactly 1/S requests per second.
            self.free_at[slot] = end = start + self.service_s
        await asyncio.sleep(max(0.0, end - loop.time()))
        return start - arrived, self.service_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path: str = scope["path"]
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if scope["method"] == "GET" and path in ("/health", "/count"):
            await _respond(send, 200, json.dumps({"status": "ok", "count": self.count}).encode())
            return
        if scope["method"] == "GET" and path == "/metrics":  # what a new family's record queries (test_adding_a_stage)
            lines = ["# TYPE tiny_requests_total counter"] + [
                f'tiny_requests_total{{status="{status}"}} {n}' for status, n in sorted(self.answered.items())]
            await _respond(send, 200, "\n".join(lines).encode() + b"\n", content_type=b"text/plain; version=0.0.4")
            return
        if scope["method"] != "POST" or not path.endswith(("/predict", "/predict/batch")):
            await _respond(send, 404, b'{"detail":"not found"}')
            return
        self.count += 1
        parts = path.strip("/").split("/")
        if parts[0] == "status":
            self.answered[int(parts[1])] += 1
            await _respond(send, int(parts[1]), b'{"detail":"as asked"}')
            return
        if parts[0] == "fail-every" and self.count % int(parts[1]) == 0:
            self.answered[500] += 1
            await _respond(send, 500, b'{"detail":"planned failure"}')
            return
        t0 = time.perf_counter()
        queue_s, service_s = await self._serve()
        total_ms = (time.perf_counter() - t0) * 1000
        timing = f"queue;dur={queue_s * 1000:.3f}, infer;dur={service_s * 1000:.3f}, total;dur={total_ms:.3f}"
        if parts[0] == "bad-body":
            answer = BAD_BODY
        elif path.endswith("/batch"):  # one result per image, in order
            answer = json.dumps({"predictions": [json.loads(OK_BODY)] * len(json.loads(body)["images"])}).encode()
        else:
            answer = OK_BODY
        self.answered[200] += 1
        await _respond(send, 200, answer, timing)


async def _respond(send, status: int, body: bytes, timing: str | None = None,
                   content_type: bytes = b"application/json") -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if timing:
        headers.append((b"server-timing", timing.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--service-ms", type=float, default=20.0)
    parser.add_argument("--slots", type=int, default=1)
    args = parser.parse_args()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        App(args.service_ms / 1000, args.slots), loop="uvloop", http="httptools",
        log_level="warning", access_log=False, backlog=4096,
    )
    server = uvicorn.Server(config)
    sock.listen(4096)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])


@contextlib.contextmanager
def running(service_ms: float = 20.0, slots: int = 1, startup_s: float = 20.0) -> Iterator[str]:
    """Start the server as a real process; yields its base URL; stops it by PID."""
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--service-ms", str(service_ms), "--slots", str(slots)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        line = _readline(proc, startup_s)
        if not line.startswith("PORT "):
            raise RuntimeError(f"tinyserver did not start (said {line!r})")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if proc.stdout:
            proc.stdout.close()


def _readline(proc: subprocess.Popen, timeout_s: float) -> str:
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            return ""
    return proc.stdout.readline().strip()


if __name__ == "__main__":
    main()
