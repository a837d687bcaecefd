"""``servelab benchmark --stage limit``: the FastAPI stages against this machine's limit and against the
simplest app a newcomer would write, in one run.

First the limit (``servelab.measure.limit``): the model alone, preprocessing and HTTP, each measured
here as core time. Then, with the same photo and client at ``--concurrency`` closed-loop senders,
alternating in ``--rounds`` windows so a neighbour's load hits all alike: the simple app
(``benchmarks/simple_app.py``: a sync route, one ONNX Runtime session with its own thread defaults),
``fastapi-onnx``'s service with no settings at all (its defaults, as `servelab serve fastapi-onnx`
starts it), the same with one inference per CPU instead of two (``MODEL_INSTANCES``: the one default the
limit cannot show), and the stages ``fastapi-onnx`` (one request per inference) and ``fastapi-onnx-dyn``. Each row: req/s, its ratio to the simple app's, and its fraction of the limit.
Aims for ``fastapi-onnx`` with its defaults: at least the simple app's throughput and 90 % of the limit.
"""

import argparse
import sys
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from servelab.core.artifacts import ArtifactPaths
from servelab.core.catalogue import Stage, of_family
from servelab.core.paths import DEFAULT_IMAGE, REPO_ROOT
from servelab.core.procs import ServerProcess, cpu_count, free_port
from servelab.core.settings import get_settings
from servelab.core.tables import markdown, num
from servelab.measure.families import serve_fastapi
from servelab.measure.limit import Limit, http_cpu_ms, limit_markdown, model_points, preprocess_cpu_ms
from servelab.measure.measure_stage import Labels, measure_stage
from servelab.measure.records import Load, Record
from servelab.measure.targets import FastAPITarget

SIMPLE_APP = REPO_ROOT / "benchmarks" / "simple_app.py"
SIMPLE_AIM, LIMIT_AIM = 1.0, 0.9
# The fp32 ONNX stage: its service runs with no settings beside the simple app (and the variants against it).
FP32_STAGE = next(s for s in of_family("fastapi").values() if s.variant == "fp32")
SIMPLE, DEFAULTS = "simple app", f"{FP32_STAGE.name}, no settings"
ONE_PER_CPU = f"{FP32_STAGE.name}, one inference per CPU"


def serve_simple(stack: ExitStack, logs: Path, model_dir: Path) -> tuple[str, int]:
    """The simple app under uvicorn (one process, its defaults) until ``stack`` closes: (URL, PID)."""
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "--app-dir", str(SIMPLE_APP.parent), f"{SIMPLE_APP.stem}:app",
           "--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
    server = stack.enter_context(ServerProcess(cmd, f"http://127.0.0.1:{port}/ready", logs / "simple_app.log",
                                               env={"MODEL_DIR": str(model_dir)}))
    return f"http://127.0.0.1:{port}", server.pid


def closed_window(url: str, image: bytes, concurrency: int, seconds: float, what: str, warmup: int) -> Record:
    """One closed-loop window of ``seconds`` on the service at ``url``; a failed request fails the benchmark."""
    load = Load.closed(concurrency, requests=None, duration_s=seconds, warmup=warmup)
    [record] = measure_stage(FastAPITarget(url, image), [load], Labels(what))
    if record.stats.errors:
        raise RuntimeError(f"{what}: requests failed: {record.stats.errors}")
    return record


def costs(simple: tuple[str, int], model_dir: Path, photo: Path, concurrency: int, seconds: float,
          gpu_images_per_s: float | None = None) -> Limit:
    """The limit from its three costs, HTTP's on the running simple app ``simple`` (URL, PID)."""
    paths, image = ArtifactPaths.in_dir(model_dir), photo.read_bytes()
    url, pid = simple
    noop = http_cpu_ms(lambda: closed_window(f"{url}/noop", image, concurrency, seconds, "noop", 0).stats.successes, pid)
    return Limit(cores=cpu_count(), photo=photo.name, model=model_points(paths.onnx, cpu_count(), seconds),
                 preprocess_cpu_ms=preprocess_cpu_ms(image, paths.manifest, seconds, cpu_count()), http_cpu_ms=noop,
                 gpu_images_per_s=gpu_images_per_s)


def defaults(stage: Stage) -> Stage:
    """``stage``'s service with no settings at all, as `servelab serve` starts it."""
    return replace(stage, part=replace(stage.fastapi, env={}))


def side_by_side(urls: dict[str, str], image: bytes, concurrency: int, seconds: float, rounds: int) -> dict[str, float]:
    """req/s of each server, in ``rounds`` alternating closed-loop windows, so a neighbour's load hits all alike."""
    done = {what: [0, 0.0] for what in urls}
    for _ in range(rounds):
        for what, url in urls.items():
            stats = closed_window(url, image, concurrency, seconds / rounds, what, 2 * concurrency).stats
            done[what][0] += stats.successes
            done[what][1] += stats.wall_s
    return {what: successes / wall for what, (successes, wall) in done.items()}


def limit_here(model_dir: Path, photo: Path, logs: Path, seconds: float, env: dict[str, str], concurrency: int = 16,
               gpu_images_per_s: float | None = None) -> Limit:
    """``costs``, and the simple app against ``fastapi-onnx`` with no settings but the device's ``env``
    (``Limit.simple_app``), both started for it and stopped after (the lab's)."""
    image = photo.read_bytes()
    with ExitStack() as stack:
        simple = serve_simple(stack, logs, model_dir)
        default = serve_fastapi(stack, defaults(FP32_STAGE), logs,
                                {**env, "MODEL_DIR": str(model_dir)})
        limit = costs(simple, model_dir, photo, concurrency, seconds, gpu_images_per_s)
        rps = side_by_side({SIMPLE: simple[0], DEFAULTS: default}, image, concurrency, 4 * seconds, 2)
    return limit.model_copy(update={"simple_app": rps})


def benchmark_limit(args: argparse.Namespace, logs: Path) -> str:
    image, c = DEFAULT_IMAGE.read_bytes(), args.concurrency
    model_dir = Path(get_settings().model_dir)
    stages = [s for s in of_family("fastapi").values() if s.runtime == "onnx" and "ONNX_VARIANT" not in s.fastapi.env]
    with ExitStack() as stack:
        simple = serve_simple(stack, logs, model_dir)
        urls = {SIMPLE: simple[0], DEFAULTS: serve_fastapi(stack, defaults(FP32_STAGE), logs, {}),
                # The defaults' one choice the limit cannot show: inferences per CPU (runtimes.INFERENCES_PER_CPU).
                ONE_PER_CPU: serve_fastapi(stack, defaults(FP32_STAGE), logs, {"MODEL_INSTANCES": str(cpu_count())}),
                **{s.name: serve_fastapi(stack, s, logs, {}) for s in stages}}
        limit = costs(simple, model_dir, DEFAULT_IMAGE, c, args.cost_seconds)
        rps = side_by_side(urls, image, c, args.duration, args.rounds)
    rows = [[what, num(r, 1), num(r / rps[SIMPLE], 2), f"{r / limit.rps:.0%}",
             f"≥ {SIMPLE_AIM} × simple app, ≥ {LIMIT_AIM:.0%} of the limit" if what == DEFAULTS else ""]
            for what, r in rps.items()]
    table = markdown([f"{c} senders, {DEFAULT_IMAGE.name}", "req/s", "÷ simple app", "of the limit", "aim"], rows,
                     "lrrrl")
    return f"{limit_markdown(limit)}\n\n{table}"
