"""Where one request's time went, as a standard ``Server-Timing`` header (milliseconds).

``queue`` is time waiting (for a preprocessing worker, then for a place in a batch), ``preprocess``
decoding and preprocessing, ``infer`` the inference call, ``total`` the whole request inside the service;
``batch;desc=N`` how many images that inference held. ``servelab.measure.server_timing`` splits
client-side latency with it, as perf_analyzer does for Triton.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    queue_s: float
    preprocess_s: float
    infer_s: float
    batch_size: int

    def header(self, total_s: float) -> str:
        parts = [("queue", self.queue_s), ("preprocess", self.preprocess_s), ("infer", self.infer_s), ("total", total_s)]
        return ", ".join(f"{name};dur={seconds * 1000:.3f}" for name, seconds in parts) + f", batch;desc={self.batch_size}"
