"""This machine's end-to-end limit for an image-in stage: the most requests/s its cores could serve if
nothing were wasted, from three costs measured in the same run as core time (CPU seconds, every
thread's), so that they add up:

* **the model alone**: ONNX Runtime, NumPy in and out, at each batch size and intra-op thread count
  of ``BATCHES`` × ``thread_counts()``, as many sessions at once as fill the cores; the cheapest point
  (fewest CPU ms per image) is the model's share;
* **preprocessing**: base64 → the model's input (``servelab.core.preprocess``) for the photo in use,
  one thread per core at once;
* **HTTP and JSON**: a route that takes the same body and answers the same shape without any work
  (``benchmarks/simple_app.py``'s ``/noop/predict``), driven by the lab's own closed-loop client: the
  server's and the client's CPU per request (the client shares the machine, as in the lab).

On the CPU: limit = cores ÷ (model + preprocessing + HTTP). On a GPU the model runs there: the limit is
the smaller of the model's own images/s on the GPU (``servelab.measure.ceiling``) and what the CPUs
can feed it, cores ÷ (preprocessing + HTTP); ``binds`` says which.

Each cost is measured with every core working, as a busy server's are: a core whose neighbours idle
runs faster (shared caches and memory bandwidth to itself, a higher clock) than any server can count on.

A stage's best throughput over the limit says how much of the machine it turns into answers; the
rest went to waiting, to threads that got in each other's way, or to work the limit does not count.
"""

import base64
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from pydantic import BaseModel

from servelab.core.artifacts import load_manifest
from servelab.core.inference import onnx_session
from servelab.core.preprocess import prepare_timed
from servelab.core.tables import markdown, num
from servelab.measure.ceiling import model_feed
from servelab.measure.fractions import best_runs
from servelab.measure.records import Record

BATCHES = (1, 16)  # a request alone, and the lab's largest dynamic batch
LIMIT_FILE = "limit.json"  # a lab's limit, beside its records


class ModelPoint(BaseModel):
    batch: int
    threads: int
    sessions: int = 1  # run at once, each on its own thread: ``threads`` × ``sessions`` = the cores
    images_per_s: float
    cpu_ms_per_image: float


class Limit(BaseModel):
    """The three costs as measured (``*_cpu_ms``: CPU milliseconds per image or request) and what they add up to."""

    cores: int
    photo: str
    model: list[ModelPoint]
    preprocess_cpu_ms: float
    http_cpu_ms: float | None = None  # None: not measured (no server given)
    gpu_images_per_s: float | None = None  # the model's ceiling on a GPU, where it runs there
    # req/s side by side at the same senders: "simple app" and "fastapi-onnx, no settings" (servelab.run.reference)
    simple_app: dict[str, float] = {}

    @property
    def cheapest(self) -> ModelPoint:
        return min(self.model, key=lambda p: p.cpu_ms_per_image)

    @property
    def cpu_ms_per_request(self) -> float:
        """What one request costs the CPUs: preprocessing, HTTP, and the model where it runs on them."""
        model = 0.0 if self.gpu_images_per_s else self.cheapest.cpu_ms_per_image
        return model + self.preprocess_cpu_ms + (self.http_cpu_ms or 0.0)

    @property
    def cpu_side_rps(self) -> float:
        return self.cores * 1e3 / self.cpu_ms_per_request

    @property
    def rps(self) -> float:
        return min(self.cpu_side_rps, self.gpu_images_per_s or float("inf"))

    @property
    def binds(self) -> str:
        if self.gpu_images_per_s and self.gpu_images_per_s < self.cpu_side_rps:
            return "the GPU (the model's own images/s there)"
        return "the CPUs"


def thread_counts(cores: int) -> tuple[int, ...]:
    """One thread, half the cores, all of them: where ONNX Runtime's intra-op scaling shows."""
    return tuple(sorted({1, max(1, cores // 2), cores}))


def _cpu_ms_per_call(calls: list[Callable[[], object]], seconds: float) -> tuple[int, float, float]:
    """(calls, wall s, CPU ms per call) of each of ``calls`` repeated on a thread of its own, all at once,
    for about ``seconds`` after one untimed call each. The work must release the GIL (ONNX Runtime,
    Pillow and NumPy do); waiting for it costs no CPU time."""
    for call in calls:
        call()
    counts, stop = [0] * len(calls), threading.Event()

    def repeat(i: int) -> None:
        while not stop.is_set():
            calls[i]()
            counts[i] += 1

    threads = [threading.Thread(target=repeat, args=(i,), name=f"limit-{i}") for i in range(len(calls))]
    wall, cpu = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.start()
    stop.wait(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    wall, cpu, done = time.perf_counter() - wall, time.process_time() - cpu, sum(counts)
    if not done:
        raise RuntimeError(f"no call finished in {wall:.1f} s")
    return done, wall, cpu * 1e3 / done


def model_points(model: Path, cores: int, seconds: float) -> list[ModelPoint]:
    """The model alone on the CPU at each batch size and thread count, ``cores // threads`` sessions at
    once (threads sleep when idle, as in the services, so CPU time is work)."""
    import onnxruntime as ort

    points = []
    for threads in thread_counts(cores):
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions = [onnx_session(model, ["CPUExecutionProvider"], options) for _ in range(cores // threads)]
        for batch in BATCHES:
            runs = [lambda sess=sess, feed=model_feed(sess, batch): sess.run(None, feed) for sess in sessions]
            calls, wall, cpu_ms = _cpu_ms_per_call(runs, seconds)
            points.append(ModelPoint(batch=batch, threads=threads, sessions=len(sessions),
                                     images_per_s=calls * batch / wall, cpu_ms_per_image=cpu_ms / batch))
    return points


def preprocess_cpu_ms(image: bytes, manifest: Path, seconds: float, cores: int) -> float:
    """CPU ms per image of base64 text → float32 tensor, on ``cores`` threads at once."""
    text, kwargs = base64.b64encode(image).decode(), load_manifest(manifest).preprocess_kwargs()
    return _cpu_ms_per_call([lambda: prepare_timed(text, **kwargs)] * cores, seconds)[2]


def http_cpu_ms(measure, server_pid: int) -> float:
    """CPU ms per request, server and client, of ``measure()`` (which runs the load in this process and
    returns how many requests succeeded)."""
    server = psutil.Process(server_pid)
    before, cpu = sum(server.cpu_times()[:2]), time.process_time()
    requests = measure()
    spent = sum(server.cpu_times()[:2]) - before + time.process_time() - cpu
    if not requests:
        raise RuntimeError("the no-op route answered no request")
    return spent * 1e3 / requests


def limit_markdown(limit: Limit) -> str:
    """How the limit was made: each cost, the cheapest model point, the sum and what binds."""
    best = limit.cheapest
    rows = [[f"model alone, batch {p.batch}, {p.threads} thread{'s' * (p.threads > 1)}"
             + (f" × {p.sessions} sessions at once" if p.sessions > 1 else ""), num(p.images_per_s, 0),
             num(p.cpu_ms_per_image, 2) + (" ← cheapest" if p is best else "")] for p in limit.model]
    rows += [[f"preprocessing ({limit.photo}), one thread per core", "", num(limit.preprocess_cpu_ms, 2)],
             ["HTTP + JSON (a no-op route, server and client)", "", num(limit.http_cpu_ms, 2)]]
    if limit.gpu_images_per_s:
        rows.append(["model alone on the GPU (its ceiling)", num(limit.gpu_images_per_s, 0), ""])
    table = markdown(["cost", "img/s", "CPU ms per image"], rows, "lrr")
    sum_line = (f"{limit.cores} cores ÷ {limit.cpu_ms_per_request:.2f} CPU ms per request = "
                f"{limit.cpu_side_rps:.1f} req/s from the CPUs")
    if limit.gpu_images_per_s:
        sum_line += f"; the GPU's model ceiling {limit.gpu_images_per_s:.0f} img/s"
    return f"{table}\n\nLimit: {sum_line}: **{limit.rps:.1f} req/s**, bound by {limit.binds}."


def simple_app_line(limit: Limit) -> str:
    """The service with its defaults against the simplest app a newcomer would write, measured side by side."""
    if len(limit.simple_app) != 2:
        return ""
    (simple, simple_rps), (ours, ours_rps) = limit.simple_app.items()
    return (f"Side by side, the same photo and senders: the {simple} (`benchmarks/simple_app.py`) {simple_rps:.1f} req/s, "
            f"{ours} {ours_rps:.1f} req/s: **{ours_rps / simple_rps:.2f}×** the {simple}, "
            f"{ours_rps / limit.rps:.0%} of the limit.")


def against_limit(records: list[Record], limit: Limit) -> str:
    """Every stage's best run (servelab's client, one image per request) as a share of the limit."""
    rows = [[stage, run.load.label(), num(run.stats.items_per_s, 1), f"{run.stats.items_per_s / limit.rps:.0%}"]
            for stage, run in best_runs(records).items()]
    return markdown(["stage", "best run", "req/s", "of the limit"], rows, "llrr")
