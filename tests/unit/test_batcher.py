"""The micro-batcher's instances: how many inferences run at once, and when batches form."""

import asyncio
import threading
import time

import numpy as np
import pytest

from servelab.servers.fastapi.batcher import MicroBatcher
from servelab.servers.fastapi.errors import Overloaded


class Model:
    """An inference that takes 50 ms and notes how many ran at once and what batch sizes it saw."""

    def __init__(self):
        self.lock, self.running, self.most, self.sizes = threading.Lock(), 0, 0, []

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.sizes.append(len(x))
        time.sleep(0.05)
        with self.lock:
            self.running -= 1
        return x * 2


async def _send(batcher: MicroBatcher, requests: int) -> list:
    batcher.start()
    try:
        return await asyncio.gather(*(batcher.submit(np.full((1, 3), i, np.float32)) for i in range(requests)))
    finally:
        await batcher.close()


@pytest.mark.parametrize("instances", [1, 2, 4])
def test_at_most_instances_inferences_run_at_once_and_each_request_gets_its_rows(instances):
    model = Model()
    results = asyncio.run(_send(MicroBatcher(model, max_batch_size=1, instances=instances), 8))
    assert model.most == instances and model.sizes == [1] * 8
    assert [float(r.logits[0, 0]) for r in results] == [2.0 * i for i in range(8)]


def test_a_batch_forms_only_while_every_instance_is_busy():
    model = Model()

    async def run():
        batcher = MicroBatcher(model, max_batch_size=16, instances=2)
        batcher.start()
        try:
            early = []
            for _ in range(2):
                early.append(asyncio.ensure_future(batcher.submit(np.zeros((1, 3)))))
                await asyncio.sleep(0.01)  # it has an instance of its own by now
            await asyncio.gather(*early, *(batcher.submit(np.zeros((1, 3))) for _ in range(8)))
        finally:
            await batcher.close()

    asyncio.run(run())
    # The first two found an instance free each; the other eight waited for one and went together.
    assert model.sizes == [1, 1, 8] and model.most == 2


def test_an_inference_that_fails_fails_only_its_batch_and_frees_its_instance():
    calls = []

    def infer(x):
        calls.append(len(x))
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return x

    async def run():
        batcher = MicroBatcher(infer, max_batch_size=1, instances=1)
        batcher.start()
        try:
            first = await asyncio.gather(batcher.submit(np.zeros((1, 3))), return_exceptions=True)
            second = await batcher.submit(np.ones((1, 3)))
            return first, second
        finally:
            await batcher.close()

    (error,), second = asyncio.run(run())
    assert isinstance(error, RuntimeError) and float(second.logits[0, 0]) == 1.0


def test_requests_waiting_past_the_queue_delay_are_shed_not_served_late():
    """One 50 ms inference at a time, a 20 ms queue delay: of three sent at once the first is served, the two
    behind it would start 50 and 100 ms late and are refused; the next one, alone, is served."""
    model = Model()

    async def main():
        batcher = MicroBatcher(model, instances=1, max_queue_delay_s=0.02)
        batcher.start()
        try:
            burst = await asyncio.gather(*(batcher.submit(np.full((1, 3), i, np.float32)) for i in range(3)),
                                         return_exceptions=True)
            return burst, await batcher.submit(np.ones((1, 3), np.float32))
        finally:
            await batcher.close()

    burst, alone = asyncio.run(main())
    assert not isinstance(burst[0], Exception) and burst[0].logits.tolist() == [[0.0] * 3]
    for result in burst[1:]:
        assert isinstance(result, Overloaded) and result.reason == "queue_timeout", result
    assert alone.logits.tolist() == [[2.0] * 3]
    assert model.sizes == [1, 1]  # the shed requests never reached the model
