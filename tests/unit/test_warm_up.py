"""The FastAPI services' warm-up runs where requests run: in the batcher's own inference threads, and, for a
runtime that keeps per-thread state (PyTorch), until single images settle, within bounds. On an H200 on
2026-11-28 fastapi-pt's first request after ready took 4.42x its sequential median: its warm-up had run in
another thread (servelab/servers/fastapi/pipeline.py, PER_THREAD_RUNTIMES). What a GPU does is checked only
on a GPU (the first-request aim in `make gpu-check`'s record); these hold the mechanism on the CPU."""

import asyncio
import threading
import time

import numpy as np
import pytest

from servelab.servers.fastapi.batcher import MicroBatcher
from servelab.servers.fastapi.pipeline import PROBE_RUNS, SETTLE_MAX_RUNS, SETTLE_MAX_S, settled, warm_thread


class SlowFirst:
    """A model whose first ``slow`` single-image inferences in a thread take 160, 80, 40, ... ms, later ones 10 ms
    (a thread's lazy set-up, as PyTorch's per-thread cuDNN plans on a GPU); it notes each call's batch size and
    thread."""

    def __init__(self, slow: int):
        self.slow, self.calls, self.singles = slow, [], {}

    def __call__(self, x: np.ndarray) -> np.ndarray:
        me = threading.current_thread().name
        self.calls.append((len(x), me))
        if len(x) == 1:
            self.singles[me] = self.singles.get(me, 0) + 1
            k = self.singles[me]
            time.sleep(max(0.16 / 2 ** (k - 1), 0.01) if k <= self.slow else 0.01)
        return x


def test_times_settle_when_the_last_runs_are_near_the_fastest():
    assert settled([50.0, 20.0, 10.0, 10.5, 11.0])
    assert not settled([50.0, 20.0, 10.0])  # the fastest so far, but the runs before it are far off
    assert not settled([10.0, 10.0])  # fewer runs than PROBE_RUNS
    assert not settled([10.0, 10.0, 10.0, 13.0])  # the last is 30 % above the fastest


def test_a_thread_warms_every_batch_size_then_single_images_until_they_settle():
    model = SlowFirst(slow=5)
    x = np.zeros((3, 4, 4), np.float32)
    ms = warm_thread(model, x, [1, 8, 16], settle=True, turn=threading.Lock())
    assert [n for n, _ in model.calls[:3]] == [1, 8, 16]
    # The batch of one above was the first single (160 ms); then 80, 40, 20, 10 ms, and 10 ms from there on.
    assert len(ms) >= 4 + 2 and settled(ms) and max(ms[-PROBE_RUNS:]) < 18, ms
    without = warm_thread(SlowFirst(slow=5), x, [1], settle=False, turn=threading.Lock())
    assert len(without) == PROBE_RUNS and max(without) > 35, without  # a fixed probe stops while still slow


@pytest.mark.parametrize(("fast_s", "slow_s"), [(0.001, 0.01), (0.001, 0.15)])
def test_settling_is_bounded_in_runs_and_seconds(fast_s, slow_s):
    """Times that never settle (every other run ten times or more the one before) stop at SETTLE_MAX_RUNS
    runs or after SETTLE_MAX_S seconds, whichever comes first."""
    runs = []

    def jumpy(x):
        runs.append(len(x))
        time.sleep(slow_s if len(runs) % 2 else fast_s)
        return x

    started = time.perf_counter()
    ms = warm_thread(jumpy, np.zeros((1,), np.float32), [], settle=True, turn=threading.Lock())
    took = time.perf_counter() - started
    assert not settled(ms) and took < SETTLE_MAX_S + 2 * slow_s + 0.5
    assert len(ms) == SETTLE_MAX_RUNS if SETTLE_MAX_RUNS * (fast_s + slow_s) / 2 < SETTLE_MAX_S else len(ms) < SETTLE_MAX_RUNS


@pytest.mark.parametrize("instances", [1, 3])
def test_the_warm_up_runs_in_the_threads_that_serve(instances):
    """Every inference thread of the batcher runs one warm-up call (none runs two), and requests run in
    those same threads."""
    model = SlowFirst(slow=0)

    async def go():
        batcher = MicroBatcher(model, instances=instances)
        batcher.start()
        try:
            warmed = await batcher.warm_up(lambda: threading.current_thread().name)
            one = await batcher.warm_up(lambda: threading.current_thread().name, 1)
            await asyncio.gather(*(batcher.submit(np.zeros((1, 2), np.float32)) for _ in range(20)))
        finally:
            await batcher.close()
        return warmed, one

    warmed, one = asyncio.run(go())
    assert len(warmed) == len(set(warmed)) == instances and all(name.startswith("infer") for name in warmed)
    assert len(one) == 1 and one[0] in warmed
    assert {name for _, name in model.calls} <= set(warmed)
