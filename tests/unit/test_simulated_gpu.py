"""The GPU-shaped stand-in (servelab.core.simulated_gpu) answers as the model it stands in for does, running it
once per distinct input, and refuses a batch larger than it stands in for; its timing is the benchmark's
(benchmarks/shared_batcher.py --simulated-gpu-ms)."""

import numpy as np
import pytest

from servelab.core.simulated_gpu import SimulatedGPU


class Model:
    """A model: a fixed linear map, counting the rows it ran. Row by row, so that a row's answer does not depend on
    the batch around it (a BLAS may block a 3-row and a 4-row product differently, in the last bit)."""

    def __init__(self):
        self.weights, self.rows = np.random.default_rng(0).normal(size=(12, 11)).astype(np.float32), 0

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.rows += len(batch)
        return np.stack([row.reshape(-1) @ self.weights for row in batch])


def test_the_answers_are_the_models_computed_once_per_distinct_input():
    model, inputs = Model(), np.random.default_rng(1).normal(size=(5, 3, 2, 2)).astype(np.float32)
    gpu = SimulatedGPU(model, 0.1, 8)
    batch = inputs[[0, 1, 0, 2]]
    np.testing.assert_array_equal(gpu(batch), model(batch))
    model.rows = 0
    batch = inputs[[3, 2, 1, 4, 3]]
    np.testing.assert_array_equal(gpu(batch), model(batch))
    assert model.rows == 2 + len(batch)  # inputs 3 and 4 were new to the stand-in; the rest it had kept
    assert gpu.label.startswith("GPU-shaped stand-in: flat 0.1 ms per batch up to 8")


def test_a_batch_larger_than_it_stands_in_for_is_refused():
    with pytest.raises(ValueError, match="larger than the stand-in's largest"):
        SimulatedGPU(Model(), 0.1, 2)(np.zeros((3, 3, 2, 2), np.float32))
