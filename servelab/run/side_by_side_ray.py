"""``servelab benchmark --measure ray``: Ray Serve's batching stage against FastAPI's, same pipeline, machine and photo,
alternating in ``--rounds`` windows (A B, B A…). ``Server-Timing`` gives the time inside the app; the rest is outside
it: for FastAPI the loopback hop and uvicorn, for Ray Serve also its proxy and the hop to the replica and back."""

import argparse
import statistics
from contextlib import ExitStack
from pathlib import Path

from servelab.core.catalogue import FASTAPI, RAY, Lesson, of_family
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.settings import get_settings
from servelab.core.tables import markdown, num
from servelab.measure.limit import closed_window
from servelab.measure.measure_stage import alternate
from servelab.measure.records import Record
from servelab.run.families import RayAdapter, serve_fastapi

# Ray Serve's batching stage against the FastAPI stage that batches, both serving the ONNX Runtime pipeline.
RAY_MEASURE = next(s for s in of_family(RAY.name).values() if s.ray.batching)
FASTAPI_STAGE = next(s for s in of_family(FASTAPI.name).values() if s.lesson == Lesson.BATCHING)


def _rps(records: list[Record]) -> float:
    """Successes per second over all of a side's windows."""
    return sum(r.stats.successes for r in records) / sum(r.stats.wall_s for r in records)


def _row(what: str, records: list[Record], base_rps: float) -> tuple[str, ...]:
    """A side's row: its req/s against ``base_rps`` (FastAPI's), each other figure its windows' mean."""
    mean = lambda value: statistics.mean(value(r) for r in records)  # noqa: E731
    part = lambda name: mean(lambda r: r.breakdown.parts_ms.get(name, 0.0))  # noqa: E731
    latency, total = mean(lambda r: r.stats.latency.mean_ms), part("total")
    return (what, num(_rps(records)), num(_rps(records) / base_rps, 2), num(mean(lambda r: r.stats.latency.p50_ms)),
            *(num(v) for v in (latency, part("queue"), part("preprocess"), part("infer"), total, latency - total,
                               mean(lambda r: r.breakdown.mean_batch_size or 1))))


def benchmark_ray(args: argparse.Namespace, logs: Path) -> str:
    settings, image, c = get_settings(), DEFAULT_IMAGE.read_bytes(), args.concurrency
    whats = {FASTAPI_STAGE.name: f"1 process, batching ≤ {args.max_batch_size} / {args.batch_timeout_ms:g} ms",
             RAY_MEASURE.name: f"{RAY_MEASURE.ray.replicas} replicas on 2 nodes, @serve.batch ≤ "
                               f"{settings.ray_batch_max_size} / {settings.ray_batch_wait_ms:g} ms"}
    with ExitStack() as stack:
        url = serve_fastapi(stack, FASTAPI_STAGE, logs, {"MAX_BATCH_SIZE": str(args.max_batch_size),
                                                 "BATCH_TIMEOUT_MS": str(args.batch_timeout_ms)}).url
        ray = stack.enter_context(RayAdapter(logs, settings.ray_node_cpus).start(RAY_MEASURE))
        window = args.duration / args.rounds
        records = alternate([lambda _, name=name, url=url: [closed_window(url, image, c, window, name, 2 * c)]
                             for name, url in ((FASTAPI_STAGE.name, url), (RAY_MEASURE.name, ray.url))], args.rounds)
    sides = {f"{name}: {what}": [r for r in records if r.stage == name] for name, what in whats.items()}
    base = _rps([r for r in records if r.stage == FASTAPI_STAGE.name])  # the ratios' denominator
    return markdown((f"{c} senders", "req/s", "ratio", "p50 ms", "mean ms", "queue ms", "preprocess ms", "infer ms",
                     "in the app ms", "outside the app ms", "mean batch"),
                    [_row(what, side, base) for what, side in sides.items()], "l" + "r" * 10)
