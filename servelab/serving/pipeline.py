"""base64 text -> prediction, with the event loop only ever waiting.

Decoding and preprocessing run in a bounded pool of worker threads, inference in the
micro-batcher's own thread, so the event loop keeps accepting requests while the CPU works.
The service uses one ``Pipeline``; ``servelab benchmark`` drives the same one in-process to
measure what HTTP adds.
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter

import numpy as np

from servelab.postprocess import Prediction, top1
from servelab.preprocess import ImageError, crop_pixels, decode_base64, preprocess
from servelab.serving.backends import Backend, worker_threads
from servelab.serving.batcher import MicroBatcher
from servelab.serving.metrics import Metrics
from servelab.serving.timing import Timing
from servelab.settings import ServeSettings


class Pipeline:
    def __init__(self, backend: Backend, settings: ServeSettings, metrics: Metrics | None = None,
                 batcher: type[MicroBatcher] = MicroBatcher):
        self.backend, self.metrics = backend, metrics
        self.workers = worker_threads(settings, backend)
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="preprocess")
        m = backend.manifest
        # A model with preprocessing in its graph takes the uint8 crop: no float math here.
        self._preprocess, self._preprocess_kwargs = (
            (crop_pixels, m.crop_kwargs()) if backend.takes_uint8
            else (preprocess, m.preprocess_kwargs()))
        self._preprocess_kwargs["max_pixels"] = settings.max_image_pixels
        # ``batcher``: anything with MicroBatcher's interface (Ray Serve's stages pass their @serve.batch one).
        self.batcher = batcher(backend.infer, settings.max_batch_size, settings.batch_timeout_ms / 1000,
                                    on_batch=metrics.observe_batch if metrics else None)

    def start(self) -> None:
        self.batcher.start()

    async def close(self) -> None:
        await self.batcher.close()
        self._pool.shutdown(wait=True)

    def prepare(self, text: str) -> np.ndarray:
        """base64 text -> model input (float32 [3, H, W] or uint8 [H, W, 3]); raises ImageError (400)
        or ImageTooLarge (413)."""
        return self._preprocess(decode_base64(text), **self._preprocess_kwargs)

    def _prepare_timed(self, text: str) -> tuple[np.ndarray, float, float]:
        started = perf_counter()
        return self.prepare(text), started, perf_counter()

    async def warm_up(self, text: str, batch_sizes: list[int]) -> None:
        """Preprocess a real photo and infer it at each batch size (CUDA/TensorRT set up kernels per
        shape), without touching the metrics."""
        loop = asyncio.get_running_loop()
        x = await loop.run_in_executor(self._pool, self.prepare, text)
        for size in batch_sizes:
            await loop.run_in_executor(self._pool, self.backend.infer, np.stack([x] * size))

    async def predict(self, images: list[str]) -> tuple[list[Prediction], Timing]:
        """One request's images -> one prediction each, in order. The first bad image (by position)
        fails the request; it never reaches the batcher, so it cannot fail anyone else's."""
        loop = asyncio.get_running_loop()
        submitted = perf_counter()
        jobs = [loop.run_in_executor(self._pool, self._prepare_timed, text) for text in images]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        for i, result in enumerate(results):
            if isinstance(result, BaseException):
                if isinstance(result, ImageError) and len(images) > 1:
                    raise type(result)(f"image {i}: {result}") from None
                raise result
        tensors = [r[0] for r in results]
        started, ended = min(r[1] for r in results), max(r[2] for r in results)
        done = await self.batcher.submit(np.stack(tensors))
        timing = Timing(queue_s=(started - submitted) + done.queue_s, preprocess_s=ended - started,
                        infer_s=done.infer_s, batch_size=done.batch_size)
        if self.metrics is not None:
            self.metrics.observe_request(timing, len(images))
        return top1(done.logits, self.backend.manifest.classes), timing
