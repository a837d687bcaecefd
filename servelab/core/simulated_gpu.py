"""A GPU-shaped stand-in for the CPU (``SIMULATED_GPU_MS``), so that batching is proven before a GPU.

On a GPU a batch costs about as much as one image, one batch at a time; on a CPU an image costs the same alone or
in a batch, so a design that fills its batches looks no better there. Turned on, every inference costs a fixed wait
per batch (``time.sleep``, which releases the GIL), one batch at a time on the whole machine (a lock file, as CUDA
contexts take turns on a real GPU); its answers are the model's own, computed on the CPU once per distinct input.
"""

import fcntl
import hashlib
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

LOCK_FILE = Path(tempfile.gettempdir()) / "servelab-simulated-gpu.lock"
KEPT_ROWS = 4096  # distinct inputs whose logits are kept (a lab's load sends a few photos)


def label(ms: float, max_batch: int) -> str:
    """The stand-in's name in logs, ``/ready`` and the run records."""
    return (f"GPU-shaped stand-in: flat {ms:g} ms per batch up to {max_batch}, one batch at a time on the machine "
            "(SIMULATED_GPU_MS); logits the model's own, computed on the CPU once per distinct input")


class SimulatedGPU:
    def __init__(self, infer: Callable[[np.ndarray], np.ndarray], ms: float, max_batch: int):
        self.model, self.seconds, self.max_batch, self.label = infer, ms / 1000, max_batch, label(ms, max_batch)
        self._kept: dict[bytes, np.ndarray] = {}
        self._turn = threading.Lock()  # flock excludes other processes, not this one's threads (one open file)
        self._file = LOCK_FILE.open("a")

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        if len(batch) > self.max_batch:
            raise ValueError(f"a batch of {len(batch)} inputs is larger than the stand-in's largest ({self.max_batch})")
        batch = np.ascontiguousarray(batch)
        keys = [hashlib.sha1(row).digest() for row in batch]
        kept = {key: self._kept[key] for key in keys if key in self._kept}
        if new := {key: i for i, key in enumerate(keys) if key not in kept}:  # each new input once
            if len(self._kept) + len(new) > KEPT_ROWS:
                self._kept.clear()
            for key, logits in zip(new, self.model(batch[list(new.values())])):
                kept[key] = self._kept[key] = logits
        with self._turn:
            fcntl.flock(self._file, fcntl.LOCK_EX)
            try:
                time.sleep(self.seconds)
            finally:
                fcntl.flock(self._file, fcntl.LOCK_UN)
        return np.stack([kept[key] for key in keys])
