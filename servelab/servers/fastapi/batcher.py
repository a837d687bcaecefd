"""An async micro-batcher: FastAPI's counterpart of Triton's dynamic batcher.

One loop takes queued requests in arrival order, stacks up to ``max_batch_size`` images into one inference (in its own
thread, off the event loop) and hands each request its rows. With fewer waiting, it waits until the oldest has waited
``timeout_s`` (Triton's ``max_queue_delay``); while an inference runs, new requests queue, so a busy server forms full
batches with no added delay. A request's images stay together, so one larger than ``max_batch_size`` runs alone.

``instances`` inferences may run at once (Triton's instance count): on a CPU two inferences on one
intra-op thread each cost less CPU per image than one on two threads, and a batch forms only while every
instance is busy, as Triton's scheduler forms one for a free instance.

``max_queue_delay_s`` (MAX_QUEUE_DELAY_MS; 0 = none): a request that would have waited longer when its
inference starts is refused (``Overloaded("queue_timeout")``) rather than served late, as Triton's
``timeout_action: REJECT``; MAX_QUEUE_REQUESTS is ``errors.QueueBoundMiddleware``'s.
"""

import asyncio
import math
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from time import perf_counter
from typing import TypeVar

import numpy as np

from servelab.servers.fastapi.errors import Overloaded


@dataclass(frozen=True)
class BatchResult:
    logits: np.ndarray  # this request's rows
    queue_s: float  # from submit() to the start of the inference that served it
    infer_s: float  # that inference's duration
    batch_size: int  # images in that inference


T = TypeVar("T")
THREADS_START_S = 30.0  # how long the calls of ``MicroBatcher.warm_up`` wait for each other to start


@dataclass
class _Pending:
    x: np.ndarray
    future: asyncio.Future
    submitted: float
    deadline: float  # its inference must start by then (perf_counter), else it is shed


class MicroBatcher:
    def __init__(self, infer: Callable[[np.ndarray], np.ndarray], max_batch_size: int = 1, timeout_s: float = 0.0,
                 on_batch: Callable[[int, float], None] | None = None, instances: int = 1,
                 max_queue_delay_s: float = 0.0):
        self.infer, self.max_batch_size, self.timeout_s = infer, max_batch_size, timeout_s
        self.max_queue_delay_s = max_queue_delay_s
        self.on_batch = on_batch  # called with (images, seconds) after each inference
        self._pending: deque[_Pending] = deque()
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(instances, thread_name_prefix="infer")
        self._free: asyncio.Semaphore | None = None  # instances not inferring (made on the running loop)
        self.instances = instances
        self._running: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._free = asyncio.Semaphore(self.instances)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="micro-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, *self._running, return_exceptions=True)
        while self._pending:
            item = self._pending.popleft()
            if not item.future.done():
                item.future.set_exception(RuntimeError("the service is shutting down"))
        self._executor.shutdown(wait=True)

    async def warm_up(self, fn: Callable[[], T], threads: int | None = None) -> list[T]:
        """``fn()`` once in each of ``threads`` inference threads (default: all; each waits for all to start, so
        no thread runs two): a runtime that keeps per-thread state (PyTorch) is warm only in the threads that ran it."""
        started = threading.Barrier(threads or self.instances)

        def call() -> T:
            started.wait(THREADS_START_S)
            return fn()

        loop = asyncio.get_running_loop()
        return list(await asyncio.gather(*(loop.run_in_executor(self._executor, call) for _ in range(started.parties))))

    async def submit(self, x: np.ndarray) -> BatchResult:
        """One request's images [n, 3, H, W] -> their logits [n, classes], inferred with whatever else is waiting.
        On the event loop that ``start`` ran on, only. Overloaded: shed past MAX_QUEUE_DELAY_MS; RuntimeError: not
        running, or closed meanwhile."""
        if self._task is None or self._task.done():
            raise RuntimeError("the batcher is not running")
        future = asyncio.get_running_loop().create_future()
        now = perf_counter()
        deadline = now + self.max_queue_delay_s if self.max_queue_delay_s else math.inf
        self._pending.append(_Pending(x, future, now, deadline))
        self._arrived.set()
        return await future

    async def _fill(self) -> None:
        deadline = self._pending[0].submitted + self.timeout_s
        while sum(len(p.x) for p in self._pending) < self.max_batch_size:
            if (remaining := deadline - perf_counter()) <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return

    def _take(self) -> list[_Pending]:
        batch, size, now = [], 0, perf_counter()
        while self._pending:
            item = self._pending[0]
            if item.future.done():  # its caller went away; skip the work
                self._pending.popleft()
                continue
            if now > item.deadline:  # served now it would be late: refused, and its inference time saved
                self._pending.popleft()
                item.future.set_exception(Overloaded("queue_timeout", (
                    f"shed: the request waited past MAX_QUEUE_DELAY_MS={self.max_queue_delay_s * 1000:g} for "
                    "its inference; the service is overloaded, retry later")))
                continue
            if batch and size + len(item.x) > self.max_batch_size:
                break
            batch.append(self._pending.popleft())
            size += len(item.x)
        return batch

    async def _run(self) -> None:
        while True:
            if not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            await self._free.acquire()  # an instance is free: while none is, requests queue into a batch
            if self.max_batch_size > 1 and self.timeout_s > 0:
                await self._fill()
            batch = self._take()
            if not batch:
                self._free.release()
                continue
            task = asyncio.create_task(self._infer(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _infer(self, batch: list[_Pending]) -> None:
        try:
            results = await infer_batch(self._executor, self.infer, [(p.x, p.submitted) for p in batch], self.on_batch)
        except Exception as exc:  # noqa: BLE001 - every caller of this batch gets the error
            results = [exc] * len(batch)
        finally:
            self._free.release()
        for item, result in zip(batch, results):
            if not item.future.done():
                (item.future.set_exception if isinstance(result, Exception) else item.future.set_result)(result)


async def infer_batch(executor: ThreadPoolExecutor, infer: Callable[[np.ndarray], np.ndarray],
                      items: list[tuple[np.ndarray, float]], on_batch: Callable[[int, float], None] | None = None
                      ) -> list[BatchResult]:
    """One inference over requests' images ``items`` (each with when it was submitted); each request's rows."""
    x = items[0][0] if len(items) == 1 else np.concatenate([x for x, _ in items])
    started = perf_counter()
    logits = await asyncio.get_running_loop().run_in_executor(executor, infer, x)
    infer_s = perf_counter() - started
    if on_batch is not None:
        on_batch(len(x), infer_s)
    return [BatchResult(logits[end - len(part):end], started - submitted, infer_s, len(x))
            for (part, submitted), end in zip(items, np.cumsum([len(part) for part, _ in items]))]
