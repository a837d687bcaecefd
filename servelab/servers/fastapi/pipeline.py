"""base64 text -> prediction, with the event loop only ever waiting.

Decoding and preprocessing run in a bounded pool of workers, inference in the micro-batcher's thread.
``servelab benchmark`` drives the same ``Pipeline`` in-process to measure what HTTP adds.

**Threads or processes** (``PREPROCESS_PROCESSES``): the workers run ``servelab.core.preprocess.prepare_timed`` in
threads of the server process or in worker processes. Pillow and NumPy release the GIL, but the rest of each image holds
it (base64 alone took 0.43 of 6.1 ms for the bundled photo on the lab's 2-CPU VM; about a tenth in all), which caps
threads near ten cores' worth less the event loop's share; and a thread back from C code waits up to the 5 ms switch
interval for one busy in Python (on that VM a preprocessing thread next to one ran at 7-36 % of its speed alone, a
worker process at 49-63 %). A worker process has its own GIL for ~0.1 ms of pickling: the default where the model runs
on a GPU and the CPUs would otherwise idle. On the CPU, inference needs the cores and the server process would take one
from the workers (on that VM 2 worker processes preprocessed 0.72-0.77x as fast as 2 threads), so threads stay.

A worker process that dies (killed, out of memory, a decoder crash) breaks the whole pool: a new one replaces
it and the requests waiting run again on it, once (``prepare_in_worker``): an image that crashes the decoder
kills two pools, not pool after pool.
"""

import asyncio
import base64
import logging
import multiprocessing
import os
import threading
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from functools import partial
from time import perf_counter

import numpy as np

from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.postprocess import Prediction, top1
from servelab.core.preprocess import ImageError, crop_pixels, prepare_timed, preprocess
from servelab.core.procs import die_with_parent
from servelab.core.settings import ServeSettings
from servelab.servers.fastapi.batcher import BatchResult, MicroBatcher
from servelab.servers.fastapi.errors import WorkerLost
from servelab.servers.fastapi.metrics import Metrics
from servelab.servers.fastapi.runtimes import Backend, model_instances, preprocess_workers

log = logging.getLogger("servelab.servers.fastapi")


@dataclass(frozen=True)
class Prepared:
    x: np.ndarray  # [k, ...]: the request's k images, stacked
    submitted: float  # perf_counter() when the request asked for its workers
    started: float  # when the first worker started on it
    ended: float  # when the last one finished


@dataclass(frozen=True)
class Timing:
    """Where one request's time went, as a standard ``Server-Timing`` header (milliseconds): ``queue`` is time
    waiting (for a preprocessing worker, then for a place in a batch), ``preprocess`` decoding and preprocessing,
    ``infer`` the inference call, ``total`` the whole request inside the service; ``batch;desc=N`` how many images
    that inference held. ``servelab.measure.server_timing`` splits client-side latency with it, as perf_analyzer
    does for Triton."""

    queue_s: float
    preprocess_s: float
    infer_s: float
    batch_size: int

    def header(self, total_s: float) -> str:
        parts = [("queue", self.queue_s), ("preprocess", self.preprocess_s), ("infer", self.infer_s), ("total", total_s)]
        return ", ".join(f"{name};dur={seconds * 1000:.3f}" for name, seconds in parts) + f", batch;desc={self.batch_size}"


PROBE_RUNS = 3  # after the warm-up, each cost's fastest of a few: the start-up log's measured "why"
# Runtimes that keep what a shape needs in the calling thread. PyTorch on a GPU caches its cuDNN execution plans
# per thread (thread-local in ATen: they are not thread-safe) and gives each thread its own cuBLAS handle and
# workspace: on an H200 on 2026-11-28 fastapi-pt's first request after ready took 4.42x its sequential median, its
# warm-up having run in a thread that then served nothing. So the warm-up runs in the batcher's inference threads
# (on a GPU in every one, in turns) and, for these runtimes, runs single images until their times settle. ONNX
# Runtime keeps that state in its sessions, and on the CPU one thread warms what all share.
PER_THREAD_RUNTIMES = ("pytorch",)
SETTLE_TOLERANCE = 0.25  # settled: the last PROBE_RUNS single images each within 25 % of the fastest so far
SETTLE_MAX_RUNS = 40  # bounds on settling, per thread: at most this many single images ...
SETTLE_MAX_S = 1.0  # ... and this many seconds


def settled(ms: list[float], runs: int = PROBE_RUNS, tolerance: float = SETTLE_TOLERANCE) -> bool:
    return len(ms) >= runs and max(ms[-runs:]) <= min(ms) * (1 + tolerance)


def warm_thread(infer, x: np.ndarray, batch_sizes: list[int], settle: bool, turn: threading.Lock) -> list[float]:
    """In one of the batcher's threads, holding ``turn`` (each thread times its own runs): each batch size
    once, then single images until ``settled`` (with ``settle``); the single images' ms, in order."""
    with turn:
        for size in batch_sizes:
            infer(np.stack([x] * size))
        ms: list[float] = []
        ends = perf_counter() + SETTLE_MAX_S
        while len(ms) < PROBE_RUNS or (settle and not settled(ms) and len(ms) < SETTLE_MAX_RUNS
                                       and perf_counter() < ends):
            started = perf_counter()
            infer(x[None])
            ms.append((perf_counter() - started) * 1e3)
        return ms


@dataclass(frozen=True)
class Probe:
    """What one image cost this server at start-up, alone and warm: the start-up log's measured "why"."""

    preprocess_ms: float
    infer_ms: float

    def describe(self, cpus: int, on_gpu: bool) -> str:
        if on_gpu:
            return (f"preprocessing {self.preprocess_ms:.1f} ms, one image's inference on the GPU {self.infer_ms:.1f} ms: "
                    f"{cpus} CPUs can preprocess about {cpus * 1e3 / self.preprocess_ms:.0f} images/s for it")
        share = self.infer_ms / (self.infer_ms + self.preprocess_ms)
        return (f"preprocessing {self.preprocess_ms:.1f} ms, one image's inference {self.infer_ms:.1f} ms: the model is "
                f"{share:.0%} of an image's work, so every CPU runs inferences and the preprocessing threads take "
                f"the cores in between; at best about {cpus * 1e3 / (self.preprocess_ms + self.infer_ms):.0f} images/s")


class Pipeline:
    def __init__(self, backend: Backend, settings: ServeSettings, metrics: Metrics | None = None,
                 batcher: type[MicroBatcher] = MicroBatcher):
        self.backend, self.metrics = backend, metrics
        self.mode, self.workers = preprocess_workers(settings, backend)
        self._pool = self._new_pool()
        m = backend.manifest
        # A model with preprocessing in its graph takes the uint8 crop: no float math here.
        step, kwargs = (crop_pixels, m.crop_kwargs()) if backend.takes_uint8 else (preprocess, m.preprocess_kwargs())
        self._prepare = partial(prepare_timed, step=step, **kwargs, max_pixels=settings.max_image_pixels)
        # ``batcher``: anything with MicroBatcher's interface (Ray Serve's stages pass their @serve.batch one);
        # beside a batcher process (SHARED_BATCHER), the model and its batcher are that process's.
        self.batcher = backend.remote or batcher(
            backend.infer, settings.max_batch_size, settings.batch_timeout_ms / 1000,
            on_batch=metrics.observe_batch if metrics else None, instances=model_instances(settings, backend),
            max_queue_delay_s=settings.max_queue_delay_ms / 1000)

    def _new_pool(self) -> Executor:
        if self.mode == "threads":
            return ThreadPoolExecutor(self.workers, thread_name_prefix="preprocess")
        # spawn, not fork: forking a process that runs threads (uvicorn's, ONNX Runtime's, PyTorch's,
        # CUDA's) can copy a lock held by one of them. The workers import only servelab.core.preprocess.
        pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=die_with_parent, initargs=(os.getpid(),))
        for _ in range(self.workers):  # start them all now; the pool would start one per busy moment
            pool.submit(os.getpid)
        return pool

    def start(self) -> None:
        self.batcher.start()

    async def close(self) -> None:
        await self.batcher.close()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def prepare(self, text: str) -> np.ndarray:
        """base64 text -> model input, in the calling thread."""
        return self._prepare(text)[0]

    async def prepare_in_worker(self, text: str) -> tuple[np.ndarray, float, float]:
        """``prepare`` in a worker: (model input, when the worker started, when it ended). Preprocessing is a
        pure function of the request, so one whose worker process died runs again, once, on a new pool."""
        loop = asyncio.get_running_loop()
        for _ in range(2):
            pool = self._pool
            try:  # a pool whose worker died while idle fails here, at once or once its own thread notices
                return await loop.run_in_executor(pool, self._prepare, text)
            except BrokenProcessPool:
                self._replace(pool)
        raise WorkerLost("preprocessing worker processes died twice while this request waited for them "
                                   "(the pool was restarted each time); retry the request")

    def _replace(self, broken: Executor) -> None:
        """A new pool for one whose worker died (only the first request to notice replaces it)."""
        if broken is self._pool:
            log.error("a preprocessing worker process died; starting a new pool of %d", self.workers)
            # Not cancel_futures: a cancelled future is a CancelledError in the request awaiting it, which
            # this retry cannot tell from the client going away. Left alone, the old pool's manager thread
            # fails every pending request with BrokenProcessPool, and each runs again on the new pool.
            broken.shutdown(wait=False)
            self._pool = self._new_pool()
            if self.metrics is not None:
                self.metrics.preprocess_pool_restarts.inc()

    async def warm_up(self, text: str, batch_sizes: list[int]) -> Probe:
        """Preprocess a real photo once per worker (worker processes start and import here, not on the first
        requests) and infer it at each batch size (CUDA/TensorRT set up kernels per shape) in the inference
        threads that will serve, without touching the metrics; then probe what one image costs, warm."""
        (x, *_), *_ = await asyncio.gather(*(self.prepare_in_worker(text) for _ in range(self.workers)))
        # In the batcher's own inference threads, where requests will run (PER_THREAD_RUNTIMES).
        settle = self.backend.kind in PER_THREAD_RUNTIMES
        every = settle and self.backend.on_gpu
        warm = partial(warm_thread, self.backend.infer, x, batch_sizes, settle, threading.Lock())
        singles = await self.batcher.warm_up(warm, None if every else 1)
        if settle:
            log.info("warm-up: %d inference thread(s), each at batch sizes %s, then single images until their times "
                     "settled: %s runs, the last %s ms", len(singles), batch_sizes,
                     "/".join(str(len(ms)) for ms in singles), "/".join(f"{ms[-1]:.1f}" for ms in singles))
        runs = [await self.prepare_in_worker(text) for _ in range(PROBE_RUNS)]  # one after another: each alone
        preprocess_ms = [(ended - started) * 1e3 for _, started, ended in runs]
        return Probe(min(preprocess_ms), min(min(ms[-PROBE_RUNS:]) for ms in singles))

    async def preprocess(self, images: list[str]) -> Prepared:
        """One request's images -> model input, in workers. The first bad image (by position) fails the
        request before the batcher, so it cannot fail anyone else's."""
        submitted = perf_counter()
        results = await asyncio.gather(*(self.prepare_in_worker(text) for text in images), return_exceptions=True)
        for i, result in enumerate(results):
            if isinstance(result, BaseException):
                if isinstance(result, ImageError) and len(images) > 1:
                    raise type(result)(f"image {i}: {result}") from None
                raise result
        return Prepared(np.stack([r[0] for r in results]), submitted, min(r[1] for r in results),
                        max(r[2] for r in results))

    def postprocess(self, prepared: Prepared, done: BatchResult) -> tuple[list[Prediction], Timing]:
        timing = Timing(queue_s=(prepared.started - prepared.submitted) + done.queue_s,
                        preprocess_s=prepared.ended - prepared.started, infer_s=done.infer_s, batch_size=done.batch_size)
        if self.metrics is not None:
            self.metrics.queue.observe(timing.queue_s)
            self.metrics.preprocess.observe(timing.preprocess_s)
            self.metrics.images.inc(len(prepared.x))
        return top1(done.logits, self.backend.manifest.classes), timing

    async def predict(self, images: list[str]) -> tuple[list[Prediction], Timing]:
        """Base64 photos -> one top-1 Prediction each, in order, and where the time went. ImageError (the handler's
        400) names the first photo that is not one; the batcher's Overloaded and RuntimeError pass through."""
        prepared = await self.preprocess(images)
        return self.postprocess(prepared, await self.batcher.submit(prepared.x))


async def warm(pipeline: Pipeline, settings: ServeSettings) -> tuple[list[int], Probe]:
    sizes = pipeline.backend.warm_up_sizes(settings)
    return sizes, await pipeline.warm_up(photo_text(), sizes)


def photo_text() -> str:  # the bundled photo as a request carries it
    return base64.b64encode(DEFAULT_IMAGE.read_bytes()).decode()
