"""This machine's end-to-end limit for an image-in stage: the most requests/s it could serve if nothing were
wasted, from what each part of a request DELIVERS with every core on it, measured in the same run: the model
alone (``model_points``), preprocessing (``preprocess_part``, a worker process per core) and HTTP + JSON
(``http_part``: ``benchmarks/simple_app.py``'s no-op route, driven by the lab's own client). The parts share the
cores one after another, so limit = 1 / (1/r_model + 1/r_pre + 1/r_http); on a GPU, the smaller of the model's
fp32 ceiling there and 1 / (1/r_pre + 1/r_http). ``machine_limit`` measures it in rounds that alternate with the
servers set against it, so that a neighbour's load (a shared VM) hits the limit and the servers alike.

**Why throughput, not CPU time.** cores ÷ (CPU ms per request) assumes each core gives a whole second of work
each second; SMT siblings and a hypervisor's share break that. On a fresh 2-CPU VM (AMD EPYC, AVX2; issue 43)
the model alone gave 75 img/s at 13.2 CPU ms per image: a second of the machine was one core's CPU time, not
two. CPU time said 103 req/s where fastapi-onnx served 70.6 (94 % of the model alone); beside others' tests
(docs/records/benchmark-limit-2cpu.log) it said 140-156 req/s where fastapi-onnx served 15-45 % of it.
Throughput with every core busy carries those losses in (a core whose neighbours idle runs faster than a busy
server's can); CPU ms are still shown, as information (``cpu_time_rps``). A stage's best run over the limit is
the share of the machine it turns into answers; a stage above it (a cheaper variant, a client that preprocesses)
is doing less work.
"""

import base64
import multiprocessing
import os
import statistics
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import psutil
from pydantic import BaseModel

from servelab.core.artifacts import ArtifactPaths, load_manifest
from servelab.core.hardware import Device
from servelab.core.inference import onnx_session
from servelab.core.preprocess import prepare_timed
from servelab.core.procs import cpu_count
from servelab.core.tables import markdown, num
from servelab.measure.ceiling import measure_ceiling, model_feed
from servelab.measure.fractions import best_runs
from servelab.measure.measure_stage import Labels, measure_stage
from servelab.measure.records import Load, Record
from servelab.measure.targets import FastAPITarget

BATCHES = (1, 16)  # a request alone, and the lab's largest dynamic batch
LIMIT_FILE = "limit.json"  # a lab's limit, beside its records
START_TIMEOUT_S = 120.0  # for the preprocessing workers to import and warm up


class ModelPoint(BaseModel):
    batch: int
    threads: int
    sessions: int = 1  # run at once, each on its own thread: ``threads`` × ``sessions`` = the cores
    images_per_s: float
    cpu_ms_per_image: float  # information


class Part(BaseModel):
    """One part of a request, measured with every core on it: what it delivers, and what it cost."""

    per_s: float  # images/s (preprocessing) or requests/s (HTTP), wall clock
    cpu_ms: float | None = None  # CPU ms per image or request (information)
    processes: int = 1  # the processes that did it at once (HTTP: the no-op route's servers)


class Limit(BaseModel):
    """What each part delivered with every core busy, and what they add up to (``rps``)."""

    cores: int
    photo: str
    device: Device = "cpu"  # where the model runs: "gpu" takes ``gpu_images_per_s``, not ``model``
    model: list[ModelPoint] = []  # the model alone on the CPUs (not measured where it runs on a GPU)
    preprocess: Part
    http: Part | None = None  # None: not measured
    gpu_images_per_s: float | None = None  # the model's fp32 ceiling on the GPU
    # req/s side by side at the same senders: "simple app" and "fastapi-onnx, no settings" (servelab.run.reference)
    simple_app: dict[str, float] = {}

    @property
    def best(self) -> ModelPoint | None:
        """The model's point with the most images/s (None on a GPU: the model is not on the CPUs)."""
        return max(self.model, key=lambda p: p.images_per_s, default=None)

    @property
    def parts(self) -> dict[str, float]:
        """Each part on the CPUs and what it delivers per second with every core on it."""
        parts = {"the model": self.best.images_per_s} if self.device == "cpu" and self.best else {}
        parts["preprocessing"] = self.preprocess.per_s
        if self.http:
            parts["HTTP + JSON"] = self.http.per_s
        return parts

    @property
    def ms_per_request(self) -> float:
        """Milliseconds of the whole machine per request: each part's share, one after another."""
        return sum(1e3 / rate for rate in self.parts.values())

    @property
    def cpu_side_rps(self) -> float:
        return 1e3 / self.ms_per_request

    @property
    def rps(self) -> float:
        return min(self.cpu_side_rps, self.gpu_images_per_s or float("inf"))

    @property
    def binds(self) -> str:
        if self.gpu_images_per_s and self.gpu_images_per_s < self.cpu_side_rps:
            return "the GPU (the model's own images/s there)"
        return "the CPUs"

    @property
    def cpu_ms_per_request(self) -> float | None:
        """What one request cost the CPUs (information): the parts' CPU ms, the model's at its best point."""
        costs = [self.preprocess.cpu_ms, self.http.cpu_ms if self.http else 0.0]
        if self.device == "cpu":
            costs.append(self.best.cpu_ms_per_image if self.best else None)
        return None if None in costs else sum(c for c in costs if c is not None)

    @property
    def cpu_time_rps(self) -> float | None:
        """What CPU time alone would say (cores ÷ CPU ms per request), which overstates it (this module's doc)."""
        return self.cores * 1e3 / cpu_ms if (cpu_ms := self.cpu_ms_per_request) else None


def thread_counts(cores: int) -> tuple[int, ...]:
    """One thread, half the cores, all of them: where ONNX Runtime's intra-op scaling shows."""
    return tuple(sorted({1, max(1, cores // 2), cores}))


def _at_once(calls: list[Callable[[], object]], seconds: float) -> tuple[int, float, float]:
    """(calls, wall s, CPU ms per call) of each of ``calls`` repeated on a thread of its own, all at once,
    for about ``seconds`` after one untimed call each. The work must release the GIL (ONNX Runtime does);
    waiting for it costs no CPU time."""
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
    import onnxruntime as ort  # deferred: an optional extra (onnx), loaded only when this runs

    points = []
    for threads in thread_counts(cores):
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions = [onnx_session(model, ["CPUExecutionProvider"], options) for _ in range(cores // threads)]
        for batch in BATCHES:
            runs = [lambda sess=sess, feed=model_feed(sess, batch): sess.run(None, feed) for sess in sessions]
            calls, wall, cpu_ms = _at_once(runs, seconds)
            points.append(ModelPoint(batch=batch, threads=threads, sessions=len(sessions),
                                     images_per_s=calls * batch / wall, cpu_ms_per_image=cpu_ms / batch))
    return points


def _preprocess_worker(text: str, kwargs: dict, seconds: float, start) -> tuple[int, float, float]:
    """One preprocessing worker: warm up, wait at ``start`` for the others, then preprocess for ``seconds``;
    (images, wall s, CPU s)."""
    prepare_timed(text, **kwargs)
    start.wait(START_TIMEOUT_S)
    done, wall, cpu = 0, time.perf_counter(), time.process_time()
    while not done or time.perf_counter() - wall < seconds:
        prepare_timed(text, **kwargs)
        done += 1
    return done, time.perf_counter() - wall, time.process_time() - cpu


def preprocess_part(image: bytes, manifest: Path, seconds: float, cores: int) -> Part:
    """Images/s of base64 text → float32 tensor on ``cores`` worker processes, started together once all are warm."""
    text, kwargs = base64.b64encode(image).decode(), load_manifest(manifest).preprocess_kwargs()
    ctx = multiprocessing.get_context("spawn")  # never fork a process that holds threads
    with ctx.Manager() as manager, ctx.Pool(cores) as pool:  # a worker each: every one waits at the barrier
        start = manager.Barrier(cores)
        done = pool.starmap_async(_preprocess_worker, [(text, kwargs, seconds, start)] * cores,
                                  chunksize=1).get(seconds + 2 * START_TIMEOUT_S)
    images = sum(n for n, _, _ in done)
    return Part(per_s=sum(n / wall for n, wall, _ in done), cpu_ms=sum(cpu for _, _, cpu in done) * 1e3 / images,
                processes=cores)


def tree_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) so far of process ``pid`` and of each of its descendants, by PID."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    spent = {}
    for proc in procs:
        with suppress(psutil.NoSuchProcess):  # ended since it was listed
            spent[proc.pid] = sum(proc.cpu_times()[:2])  # user + system
    return spent


def cpu_since(before: dict[int, float], pid: int) -> float:
    """CPU seconds the tree of ``pid`` spent since ``before`` (``tree_cpu_s``): a process started since
    counts all of its time; one that ended since, none of it."""
    return sum(s - before.get(p, 0.0) for p, s in tree_cpu_s(pid).items())


def closed_window(url: str, image: bytes, concurrency: int, seconds: float, what: str, warmup: int) -> Record:
    """One closed-loop window of ``seconds`` on the service at ``url``; a failed request fails the benchmark."""
    load = Load.closed(concurrency, requests=None, duration_s=seconds, warmup=warmup)
    [record] = measure_stage(FastAPITarget(url, image), [load], Labels(what))
    if record.stats.errors:
        raise RuntimeError(f"{what}: requests failed: {record.stats.errors}")
    return record


def http_part(url: str, server_pid: int, image: bytes, concurrency: int, seconds: float, processes: int) -> Part:
    """Requests/s of the no-op route at ``url`` (its servers the tree of ``server_pid``) with the lab's
    client on this machine, and their CPU ms per request, servers and client."""
    closed_window(url, image, concurrency, min(seconds, 1.0), "noop warm-up", 2 * concurrency)
    # The client's CPU: this process's and its children's it has waited for (the sender processes), os.times()[:4].
    server, client = tree_cpu_s(server_pid), sum(os.times()[:4])
    stats = closed_window(url, image, concurrency, seconds, "noop", 0).stats
    spent = cpu_since(server, server_pid) + sum(os.times()[:4]) - client
    if not stats.successes or not stats.wall_s:
        raise RuntimeError("the no-op route answered no request")
    return Part(per_s=stats.successes / stats.wall_s, cpu_ms=spent * 1e3 / stats.successes, processes=processes)


def _mean(rounds: list, *fields: str):
    """The first round's measurement with each of ``fields`` its mean over the rounds (windows of the same length)."""
    return rounds[0].model_copy(update={f: statistics.fmean(getattr(p, f) or 0.0 for p in rounds) for f in fields})


def machine_limit(model_dir: Path, photo: Path, noop: tuple[str, int], device: Device, *, seconds: float,
                  concurrency: int = 16, rounds: int = 1, between: Callable[[int], object] = lambda _: None) -> Limit:
    """This machine's limit for ``photo`` with the fp32 model in ``model_dir`` on ``device``: ``seconds`` of each part
    in ``rounds`` windows, each part its windows' mean, ``between(i)`` run after the ``i``-th (the servers set against
    the limit). ``noop``: (URL, PID) of the simple app, a server process per core, started by the caller."""
    cores, paths, image = cpu_count(), ArtifactPaths.in_dir(model_dir), photo.read_bytes()
    gpu = None
    if device == "gpu":  # the fp32 model's own images/s there (its best batch size, servelab.measure.ceiling)
        ceiling = measure_ceiling(model_dir, precisions=("fp32",), max_seconds=seconds, log=lambda *_: None)
        gpu = getattr(ceiling.best("fp32"), "images_per_s", None)
        if not ceiling.on_gpu or not gpu:
            ran = sorted({p.provider or p.failed or "?" for p in ceiling.points})
            raise RuntimeError(f"the model did not run on the GPU (ran on: {', '.join(ran)})")
    window, (url, pid) = seconds / rounds, noop
    points, preprocess, http = [], [], []  # per round
    for i in range(rounds):
        if device != "gpu":
            points.append(model_points(paths.onnx, cores, window))
        preprocess.append(preprocess_part(image, paths.manifest, window, cores))
        http.append(http_part(f"{url}/noop", pid, image, concurrency, window, cores))
        between(i)
    return Limit(cores=cores, photo=photo.name, device=device, gpu_images_per_s=gpu,
                 model=[_mean(same, "images_per_s", "cpu_ms_per_image") for same in zip(*points)],
                 preprocess=_mean(preprocess, "per_s", "cpu_ms"), http=_mean(http, "per_s", "cpu_ms"))


def _rate(per_s: float | None, unit: str) -> str:
    return f"{num(per_s, 0)} {unit}" if per_s else ""


def limit_markdown(limit: Limit) -> str:
    """How the limit was made: what each part delivered with every core busy, the sum and what binds."""
    rows = [[f"model alone, batch {p.batch}, {p.threads} thread{'s' * (p.threads > 1)}"
             + (f" × {p.sessions} sessions at once" if p.sessions > 1 else ""),
             _rate(p.images_per_s, "img/s") + (" ← best" if p is limit.best else ""), num(p.cpu_ms_per_image, 2)]
            for p in limit.model]
    http = limit.http
    rows += [[f"preprocessing ({limit.photo}), {limit.preprocess.processes} processes at once",
              _rate(limit.preprocess.per_s, "img/s"), num(limit.preprocess.cpu_ms, 2)],
             [f"HTTP + JSON (a no-op route, {http.processes if http else '-'} server processes and the client)",
              _rate(http.per_s, "req/s") if http else "-", num(http.cpu_ms if http else None, 2)]]
    if limit.gpu_images_per_s:
        rows.append(["model alone on the GPU (its fp32 ceiling)", _rate(limit.gpu_images_per_s, "img/s"), ""])
    table = markdown(["part, every core on it", "delivers", "CPU ms each"], rows, "lrr")
    parts = " + ".join(f"{1e3 / rate:.2f} ms ({part})" for part, rate in limit.parts.items())
    sum_line = (f"{parts} = {limit.ms_per_request:.2f} ms of the machine per request = {limit.cpu_side_rps:.1f} req/s "
                "from the CPUs")
    if limit.gpu_images_per_s:
        sum_line += f"; the GPU's model ceiling {limit.gpu_images_per_s:.0f} img/s"
    text = f"{table}\n\nLimit: {sum_line}: **{limit.rps:.1f} req/s**, bound by {limit.binds}."
    if limit.cpu_time_rps:
        text += (f" (CPU time alone would say {limit.cores} cores ÷ {limit.cpu_ms_per_request:.2f} CPU ms per request "
                 f"= {limit.cpu_time_rps:.1f} req/s{' from the CPUs' if limit.device == 'gpu' else ''}: "
                 "information, not the limit.)")
    return text


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
