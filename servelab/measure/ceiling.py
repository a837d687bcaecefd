"""The model's own ceiling: ONNX Runtime alone, on this machine, at batch 1 to 128, what the serving stages are
measured against (``servelab.measure.fractions``). No server, no HTTP, no image decoding: NumPy in and out (so the
host↔device copies are in every figure on a GPU). Each batch size gets one untimed run (ONNX Runtime picks its
kernels, and cuDNN its algorithms, the first time it meets a shape), then timed runs; a figure is their median.
On a GPU the precisions are fp32 and fp16; on a CPU fp32 and the static INT8 variant, fp16 having no fast CPU
path. Every point names the provider its session really ran on (ONNX Runtime falls back to the CPU silently).
"""

import datetime as dt
import statistics
import time
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from servelab.core.hardware import gpu_count, stack
from servelab.core.inference import onnx_session
from servelab.core.tables import markdown, num
from servelab.core.variants.build import machine, variant_path
from servelab.servers.fastapi.runtimes import CPU, CUDA, GPU_PROVIDERS

BATCHES = (1, 8, 16, 32, 64, 128)
# Each precision is measured on the variant of that name (servelab.core.variants.build).
PRECISIONS = {"gpu": ("fp32", "fp16"), "cpu": ("fp32", "int8")}


class Point(BaseModel):
    """One precision at one batch size."""

    precision: str
    batch: int
    provider: str | None = None  # the execution provider the session really ran on
    runs: int = 0  # timed runs
    ms: float | None = None  # median milliseconds per batch
    images_per_s: float | None = None  # batch / median
    failed: str | None = None  # why nothing was measured


class Ceiling(BaseModel):
    """What ``measure_ceiling`` measured, and where."""

    provider: str  # the provider asked for
    machine: str
    gpu: str | None = None
    onnxruntime: str
    started_at: str = Field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    repeats: int
    max_seconds: float
    points: list[Point] = []

    @property
    def on_gpu(self) -> bool:
        """Whether the fp32 model really ran on a GPU provider."""
        return any(p.provider in GPU_PROVIDERS for p in self.points if p.precision == "fp32" and not p.failed)

    def best(self, precision: str) -> Point | None:
        """The batch size with the most images/s: the precision's ceiling (None: nothing measured)."""
        measured = [p for p in self.points if p.precision == precision and p.images_per_s]
        return max(measured, key=lambda p: p.images_per_s or 0.0, default=None)


def model_feed(sess, batch: int) -> dict[str, np.ndarray]:
    """A batch of the session's input: float32 N(0, 1) (the fp32 model's normalised NCHW tensor) or
    uint8 pixels (the variants' NHWC crops); the values do not change the time."""
    first = sess.get_inputs()[0]
    shape = first.shape[1:]
    if not all(isinstance(d, int) for d in shape):
        raise ValueError(f"input {first.name} {first.shape}: only the batch dimension may be free")
    rng = np.random.default_rng(0)
    if first.type == "tensor(uint8)":
        return {first.name: rng.integers(0, 256, (batch, *shape), dtype=np.uint8)}
    return {first.name: rng.standard_normal((batch, *shape), dtype=np.float32)}


def _time(sess, batch: int, repeats: int, max_seconds: float) -> tuple[int, float]:
    """(timed runs, median ms per batch) on one shape: one untimed run, then at most ``repeats`` runs
    or ``max_seconds``, whichever ends first (at least one)."""
    if batch < 1:
        raise ValueError(f"batch {batch}: a batch holds at least one image")
    feed = model_feed(sess, batch)
    sess.run(None, feed)
    times: list[float] = []
    stop_at = time.perf_counter() + max_seconds
    while len(times) < repeats and (not times or time.perf_counter() < stop_at):
        started = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - started)
    return len(times), statistics.median(times) * 1e3


def measure_ceiling(model_dir: Path, *, batches: tuple[int, ...] = BATCHES, precisions: tuple[str, ...] | None = None,
                    repeats: int = 20, max_seconds: float = 5.0, provider: str | None = None, log=print) -> Ceiling:
    """The model alone at each batch size and precision (default: the machine's pair), on ``provider`` (default: CUDA
    where it is built in and nvidia-smi lists a GPU); a point that fails is recorded with its reason, never raised."""
    import onnxruntime as ort  # deferred: an optional extra (onnx), loaded only when this runs

    provider = provider or (CUDA if CUDA in ort.get_available_providers() and gpu_count() > 0 else CPU)
    on_gpu = provider in GPU_PROVIDERS
    gpus = stack().get("gpus") if on_gpu else None
    result = Ceiling(provider=provider, machine=machine(), gpu=gpus[0].split(": ", 1)[-1] if gpus else None,
                     onnxruntime=ort.__version__, repeats=repeats, max_seconds=max_seconds)
    for precision in precisions or PRECISIONS["gpu" if on_gpu else "cpu"]:
        try:
            if not (path := variant_path(model_dir, precision)).exists():
                raise FileNotFoundError(f"no model at {path}: run `servelab models build` first")
            sess = onnx_session(path, [provider, CPU] if provider != CPU else [CPU])
            active, why = sess.get_providers()[0], None
        except Exception as exc:  # noqa: BLE001 (recorded: every batch of this precision fails the same way)
            sess, active, why = None, None, f"{type(exc).__name__}: {exc}"
        for batch in batches:
            point = Point(precision=precision, batch=batch, provider=active, failed=why)
            if sess is not None:
                try:
                    point.runs, point.ms = _time(sess, batch, repeats, max_seconds)
                    point.images_per_s = batch / point.ms * 1e3
                except Exception as exc:  # noqa: BLE001 (recorded, and the other points go on)
                    point.failed = f"{type(exc).__name__}: {exc}"
            result.points.append(point)
            log(f"  {precision} batch {batch:>3}: " + (f"FAILED: {point.failed}" if point.failed else
                f"{point.ms:.2f} ms, {point.images_per_s:.0f} img/s ({point.runs} runs, {active})"))
    return result


def ceiling_markdown(result: Ceiling) -> str:
    """The ceiling table (batch × precision: ms per batch, images/s), each precision's ceiling, each failure and why."""
    precisions = list(dict.fromkeys(p.precision for p in result.points))
    by = {(p.precision, p.batch): p for p in result.points}
    head = ["batch", *(f"{p} {unit}" for p in precisions for unit in ("ms", "img/s"))]
    rows = []
    for batch in dict.fromkeys(p.batch for p in result.points):
        cells = [str(batch)]
        for precision in precisions:
            point = by.get((precision, batch))
            cells += [num(point.ms if point else None, 2), num(point.images_per_s if point else None, 0)]
        rows.append(cells)
    ran = sorted({p.provider for p in result.points if p.provider})  # the caption names them, and the machine
    device = ("GPU" + (f" {result.gpu}" if result.gpu else "")) if result.on_gpu else "CPU"
    where = f"onnxruntime {result.onnxruntime}, {', '.join(ran) or result.provider} ({device} figures); {result.machine}"
    best = [f"{p} {num(b.images_per_s, 0)} img/s at batch {b.batch}" if (b := result.best(p)) else f"{p} not measured"
            for p in precisions]
    lines = [(f"The model alone (ONNX Runtime, NumPy in and out, no server): {where}. Median of up to "
              f"{result.repeats} timed runs per batch size (at most {result.max_seconds:g} s), each after one "
              "untimed run of the same shape."), "", markdown(head, rows, "r" * len(head)), "",
             f"Ceiling (best img/s): {'; '.join(best)}."]
    if failed := [p for p in result.points if p.failed]:
        lines += ["", "Failed:", *(f"- {p.precision} batch {p.batch}: {p.failed.splitlines()[0][:200]}" for p in failed)]
    return "\n".join(lines)
