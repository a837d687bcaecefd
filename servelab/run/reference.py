"""``servelab benchmark --measure limit``: the FastAPI stages against this machine's limit (``machine_limit``, which the
lab's report calls too) and against the simplest app a newcomer would write (``benchmarks/simple_app.py``), a window
each in every one of the limit's rounds, so that a neighbour's load hits all alike. Each row's CPU ms per request of the
server's processes says where one process saturates on more cores than this run had."""

import argparse
import sys
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from servelab.core.catalogue import FASTAPI, Stage, of_family
from servelab.core.hardware import Device, environment_gaps, gpu_count, resolve, stage_env
from servelab.core.paths import DEFAULT_IMAGE, REPO_ROOT
from servelab.core.procs import ServerProcess, cpu_count, free_port
from servelab.core.settings import get_settings
from servelab.core.tables import markdown, num
from servelab.measure.limit import Limit, closed_window, cpu_since, limit_markdown, machine_limit, tree_cpu_s
from servelab.run.families import serve_fastapi

__all__ = ["FP32_STAGE", "benchmark_limit", "closed_window", "limit_here"]  # closed_window: side_by_side's too

SIMPLE_AIM, LIMIT_AIM = 1.0, 0.9
# The fp32 ONNX stage: its service runs with no settings beside the simple app (and the variants against it).
SIMPLE_APP = REPO_ROOT / "benchmarks" / "simple_app.py"  # its /noop/predict is the limit's HTTP route
FP32_STAGE = next(s for s in of_family(FASTAPI.name).values() if s.variant == "fp32")
SIMPLE, DEFAULTS = "simple app", f"{FP32_STAGE.name}, no settings"
ONE_PER_CPU = f"{FP32_STAGE.name}, one inference per CPU"


@dataclass(frozen=True)
class Served:
    """One server side by side: its req/s, and what a request cost its processes."""

    rps: float
    cpu_ms: float | None  # CPU ms per request, the server's PID and its children together
    processes: int  # the server's processes (its PID and its children) at the end


def serve_simple_app(stack: ExitStack, logs: Path, model_dir: Path, workers: int = 1) -> tuple[str, int]:
    """The simple app under uvicorn (``workers`` processes on one port) until ``stack`` closes: (URL, PID)."""
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "--app-dir", str(SIMPLE_APP.parent), f"{SIMPLE_APP.stem}:app",
           "--host", "127.0.0.1", "--port", str(port), "--no-access-log", *(["--workers", str(workers)] * (workers > 1))]
    name = "simple_app.log" if workers == 1 else f"simple_app-{workers}-processes.log"
    server = stack.enter_context(ServerProcess(cmd, f"http://127.0.0.1:{port}/ready", logs / name,
                                               env={"MODEL_DIR": str(model_dir)}))
    return f"http://127.0.0.1:{port}", server.pid


def serve(stack: ExitStack, stage: Stage, logs: Path, env: dict[str, str]) -> tuple[str, int]:
    """``stage``'s service with ``env`` over its settings (``serve_fastapi``): (URL, PID), as the simple app's."""
    server = serve_fastapi(stack, stage, logs, env)
    return server.url, server.pid


def defaults(stage: Stage) -> Stage:
    """``stage``'s service with no settings at all, as `servelab serve` starts it."""
    return replace(stage, part=replace(stage.fastapi, env={}))


class SideBySide:
    """Servers (name -> URL, PID) measured in alternating closed-loop windows, a round at a time."""

    def __init__(self, servers: dict[str, tuple[str, int]], image: bytes, concurrency: int, window: float):
        self.servers, self.image, self.concurrency, self.window = servers, image, concurrency, window
        self.done: dict[str, Counter[str]] = {what: Counter() for what in servers}  # each server's sums over the rounds

    def round(self, _: int = 0) -> None:
        """Each server's window, in turn: its req/s and its processes' CPU."""
        for what, (url, pid) in self.servers.items():
            before = tree_cpu_s(pid)
            record = closed_window(url, self.image, self.concurrency, self.window, what, 2 * self.concurrency)
            self.done[what].update(successes=record.stats.successes, wall_s=record.stats.wall_s,
                                   cpu_s=cpu_since(before, pid),  # the warm-up's requests are in it too
                                   requests=record.stats.successes + (record.warmup_requests or 2 * self.concurrency))

    def served(self) -> dict[str, Served]:
        return {what: Served(d["successes"] / d["wall_s"], d["cpu_s"] * 1e3 / d["requests"],
                             len(tree_cpu_s(self.servers[what][1]))) for what, d in self.done.items()}


def limit_here(model_dir: Path, photo: Path, logs: Path, seconds: float, device: Device, concurrency: int = 16) -> Limit:
    """``machine_limit``, with the simple app against ``fastapi-onnx``'s defaults in its rounds (the lab's)."""
    with ExitStack() as stack:
        servers = {SIMPLE: serve_simple_app(stack, logs, model_dir),
                   DEFAULTS: serve(stack, defaults(FP32_STAGE), logs,
                                           {**stage_env(device), "MODEL_DIR": str(model_dir)})}
        rounds = 2
        tally = SideBySide(servers, photo.read_bytes(), concurrency, 4 * seconds / rounds)
        noop = serve_simple_app(stack, logs, model_dir, workers=cpu_count())
        limit = machine_limit(model_dir, photo, noop, device, seconds=seconds, concurrency=concurrency, rounds=rounds,
                              between=tally.round)
        served = tally.served()
    return limit.model_copy(update={"simple_app": {what: s.rps for what, s in served.items()}})


def device_here(asked: str = "auto") -> Device:
    """Where the model runs here for ``asked`` (``--device``), as `servelab lab` decides; NoGpu where it cannot."""
    gpus = gpu_count()
    return resolve(asked, gpus, environment_gaps() if gpus else [])


def benchmark_limit(args: argparse.Namespace, logs: Path) -> str:
    image, c = DEFAULT_IMAGE.read_bytes(), args.concurrency
    model_dir = Path(get_settings().model_dir)
    stages = [s for s in of_family(FASTAPI.name).values() if s.runtime == "onnx" and "ONNX_VARIANT" not in s.fastapi.env]
    with ExitStack() as stack:
        servers = {SIMPLE: serve_simple_app(stack, logs, model_dir),
                   DEFAULTS: serve(stack, defaults(FP32_STAGE), logs, {}),
                   # The defaults' one choice the limit cannot show: inferences per CPU (runtimes.INFERENCES_PER_CPU).
                   ONE_PER_CPU: serve(stack, defaults(FP32_STAGE), logs, {"MODEL_INSTANCES": str(cpu_count())}),
                   **{s.name: serve(stack, s, logs, {}) for s in stages}}
        tally = SideBySide(servers, image, c, args.duration / args.rounds)
        noop = serve_simple_app(stack, logs, model_dir, workers=cpu_count())
        limit = machine_limit(model_dir, DEFAULT_IMAGE, noop, device_here(), seconds=args.cost_seconds, concurrency=c,
                              rounds=args.rounds, between=tally.round)
        served = tally.served()
    if getattr(args, "limit_json", None):
        args.limit_json.write_text(limit.model_dump_json(indent=1) + "\n", encoding="utf-8")
    simple = served[SIMPLE].rps
    rows = [[what, num(s.rps, 1), num(s.rps / simple, 2), f"{s.rps / limit.rps:.0%}", num(s.cpu_ms, 2),
             str(s.processes), f"≥ {SIMPLE_AIM} × simple app, ≥ {LIMIT_AIM:.0%} of the limit" if what == DEFAULTS else ""]
            for what, s in served.items()]
    table = markdown([f"{c} senders, {DEFAULT_IMAGE.name}", "req/s", "÷ simple app", "of the limit",
                      "server CPU ms per request", "server processes", "aim"], rows, "lrrrrrl")
    return f"{limit_markdown(limit)}\n\n{table}"
