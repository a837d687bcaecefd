"""Inference over more images than one call may take. A backend under ORT_SHAPE_POLICY=buckets or pad (``auto``
on a GPU) takes at most its largest batch per call and refuses more; the GPU tests check agreement over 64
real photos, so they send them in batches of that size (the 2026-11-28 H200 run sent 64 at once, and failed)."""

from collections.abc import Callable

import numpy as np


def infer_in_batches(infer: Callable[[np.ndarray], np.ndarray], x: np.ndarray, largest: int) -> np.ndarray:
    """``infer`` over every row of ``x``, at most ``largest`` rows per call, the rows in order."""
    if largest < 1:
        raise ValueError(f"largest must be at least 1, not {largest}")
    return np.concatenate([infer(x[i:i + largest]) for i in range(0, len(x), largest)])
