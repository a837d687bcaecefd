"""``servelab benchmark``: what HTTP adds to the FastAPI stages, measured side by side in one run.

For each stage, on this machine, with the same model, photo, threads and settings:

* **sequential**: the in-process pipeline (base64 decode + decode/preprocess + inference + top-1 on one
  thread, no server) and the same photo through the service (batching off, one request at a time over a
  persistent connection), *alternating*, so both see the same machine; compared by median latency (aim: HTTP
  at most 1.15x in-process);
* **throughput at ``--concurrency``**: the in-process batched ceiling (the service's own pipeline with
  ``--max-batch-size``, driven by that many callers, no HTTP) and closed-loop HTTP senders against the service
  with batching off and on, alternating in ``--rounds`` short windows so a neighbour's load or a drift hits all
  three alike (aim with batching: at least 0.9x the ceiling).

``--measure preprocess``: decoding and preprocessing alone through the service's pipeline, in one thread, one
per CPU, and as many worker processes (``PREPROCESS_PROCESSES``), alternating in ``--rounds`` windows (ratio:
images/s over the threads'); then the same photo on one thread, in process CPU time per image, servelab's
``preprocess`` against torchvision's ``Resize``, ``CenterCrop``, ``ToTensor``, ``Normalize`` (or those steps in
Pillow and torch where torchvision does not import; the table says which). Aim: at most torchvision's time.

``--measure variants``: fastapi-onnx's model variants (``ONNX_VARIANT``) against fp32, alternating in each round,
in-process (``--concurrency`` callers, batching off as in the lab) and over HTTP, each divided by fp32's (aims: the
uint8-input model at least 1.15x; the best INT8 model at least 1.5x with top-1 agreement of at least 98 %, as
``servelab models build`` recorded it; INT8 pays only with fast 8-bit instructions, which the header says, from
``servelab.core.hardware.cpu_int8``). A missed aim is explained by the in-process split of each request's time into
preprocessing and inference, and the ceiling that split allows (fp32's CPU time per request over the variant's).

``--measure ray``: Ray Serve against FastAPI (``servelab.run.side_by_side_ray``); ``--measure limit``: this
machine's limit, and the FastAPI stages against it and the simplest app (``servelab.run.reference``);
``--measure ceiling``: the model alone (``servelab.measure.ceiling``) and, with ``--records``, every stage as a
fraction of it (``servelab.measure.fractions``).

The client shares the CPU with the server, as it does in the lab.
"""

import argparse
import asyncio
import base64
import importlib
import io
import statistics
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter, process_time

import numpy as np
from PIL import Image

from servelab.core.catalogue import CATALOGUE, FASTAPI, NO_BATCHING, of_family
from servelab.core.hardware import cpu_int8
from servelab.core.paths import DEFAULT_IMAGE
from servelab.core.postprocess import top1
from servelab.core.preprocess import (
    DEFAULT_CROP,
    DEFAULT_RESIZE,
    IMAGENET_MEAN,
    IMAGENET_STD,
    decode_base64,
    preprocess,
)
from servelab.core.procs import cpu_count
from servelab.core.settings import get_settings
from servelab.core.tables import markdown
from servelab.core.variants.build import agreements, machine
from servelab.measure.ceiling import ceiling_markdown, measure_ceiling
from servelab.measure.fractions import fractions_markdown
from servelab.measure.measure_stage import alternate_windows
from servelab.measure.records import read_records
from servelab.measure.targets import FastAPITarget
from servelab.run.families import serve_fastapi
from servelab.run.reference import FP32_STAGE, benchmark_limit, closed_window
from servelab.run.side_by_side_ray import benchmark_ray
from servelab.servers.fastapi.pipeline import Pipeline
from servelab.servers.fastapi.runtimes import GPUUnavailable

# The FastAPI stages as the lab's first notebook serves them (one request per inference) -> backend.
STAGES = {s.name: s.fastapi.backend for s in of_family(FASTAPI.name).values() if s.fastapi.env == NO_BATCHING}
VARIANTS_MEASURE = "variants"
RAY_MEASURE = "ray"  # Ray Serve against fastapi-onnx-dyn (servelab.run.side_by_side_ray)
PREPROCESS_MEASURE = "preprocess"  # threads against worker processes, decoding and preprocessing alone
CEILING_MEASURE = "ceiling"  # the model alone (servelab.measure.ceiling), and the lab's records against it
LIMIT_MEASURE = "limit"  # the FastAPI stages against the machine's limit and the simple app (servelab.run.reference)
SEQUENTIAL_AIM, BATCHED_AIM = 1.15, 0.9
U8_AIM, INT8_AIM, INT8_AGREEMENT = 1.15, 1.5, 0.98
CORE_ITERATIONS, CORE_ROUNDS = 200, 4  # images per implementation, in alternating rounds
SEQUENTIAL_BLOCK = 20  # requests in a row of one kind: short enough to share the machine's mood, long enough to keep its caches


@dataclass
class Row:
    """One measurement, summed over its windows."""

    what: str
    successes: int = 0
    seconds: float = 0.0
    medians_ms: list[float] = field(default_factory=list)  # one per window
    batch_sizes: list[float] = field(default_factory=list)  # mean batch size per window
    split_ms: list[tuple[float, float]] = field(default_factory=list)  # in-process: (preprocess, infer) per request
    ratio: float | None = None
    aim: str = ""

    def add(self, successes: int, seconds: float, median_ms: float, mean_batch: float | None) -> None:
        self.successes += successes
        self.seconds += seconds
        self.medians_ms.append(median_ms)
        if mean_batch is not None:
            self.batch_sizes.append(mean_batch)

    @property
    def throughput_rps(self) -> float:
        return self.successes / self.seconds

    @property
    def median_ms(self) -> float:
        return statistics.median(self.medians_ms)


async def _sequential(backend, url: str, image: bytes, requests: int) -> tuple[Row, Row]:
    """In-process and HTTP in alternating blocks of ``SEQUENTIAL_BLOCK`` requests."""
    text, kwargs = base64.b64encode(image).decode(), backend.manifest.preprocess_kwargs()

    async def in_process() -> None:
        top1(backend.infer(preprocess(decode_base64(text), **kwargs)[None]), backend.manifest.classes)

    async def over_http() -> None:
        outcome = await client.send()
        if not outcome.ok:
            raise RuntimeError(f"HTTP request failed: {outcome.error}")

    latencies: dict = {in_process: [], over_http: []}
    client = await FastAPITarget(url, image).connect(1, 30)
    try:
        for block in range(-1, -(-requests // SEQUENTIAL_BLOCK)):  # block -1 warms both up
            for call, measured in latencies.items():
                for _ in range(SEQUENTIAL_BLOCK):
                    started = perf_counter()
                    await call()
                    if block >= 0:
                        measured.append(perf_counter() - started)
    finally:
        await client.close()
    rows = Row("in-process, sequential"), Row("HTTP, sequential")
    for row, measured in zip(rows, latencies.values()):
        row.add(len(measured), sum(measured), statistics.median(measured) * 1000, 1.0)
    return rows


async def _in_process_window(row: Row, backend, settings, text: str, concurrency: int, seconds: float,
                             preprocess_only: bool = False) -> None:
    pipeline = Pipeline(backend, settings)
    pipeline.start()
    latencies, sizes = [], []

    async def caller(stop_at: float, measured: bool) -> None:
        while perf_counter() < stop_at:
            started = perf_counter()
            if preprocess_only:
                await pipeline.prepare_in_worker(text)
            else:
                _, timing = await pipeline.predict([text])
            if measured:
                latencies.append(perf_counter() - started)
                if not preprocess_only:
                    sizes.append(timing.batch_size)
                    row.split_ms.append((timing.preprocess_s * 1000, timing.infer_s * 1000))

    try:
        await pipeline.warm_up(text, [])  # every worker started (processes spawn and import here)
        await asyncio.gather(*(caller(perf_counter() + 0.5, False) for _ in range(concurrency)))  # warm up
        started = perf_counter()
        await asyncio.gather(*(caller(started + seconds, True) for _ in range(concurrency)))
        wall = perf_counter() - started
    finally:
        await pipeline.close()
    row.add(len(latencies), wall, statistics.median(latencies) * 1000, statistics.mean(sizes) if sizes else None)


def _http_window(row: Row, url: str, image: bytes, concurrency: int, seconds: float, stage: str) -> None:
    record = closed_window(url, image, concurrency, seconds, stage, 2 * concurrency)
    row.add(record.stats.successes, record.stats.wall_s, record.stats.latency.p50_ms,
            record.breakdown.mean_batch_size if record.breakdown else None)


def load_backend(kind: str, settings):
    """The service's model as its app loads it, without HTTP."""
    # Deferred: each app imports FastAPI and its runtime (optional extras) on import.
    return importlib.import_module("fastapi_pt.app" if kind == "pytorch" else "fastapi_onnx.app").load(settings)


def benchmark_stage(stage: str, args: argparse.Namespace, logs: Path) -> list[Row]:
    kind, image, c = STAGES[stage], DEFAULT_IMAGE.read_bytes(), args.concurrency
    text = base64.b64encode(image).decode()
    off = get_settings().model_copy(update={"max_batch_size": 1})
    on = get_settings().model_copy(update={"max_batch_size": args.max_batch_size, "batch_timeout_ms": args.batch_timeout_ms})
    ceiling = Row(f"in-process, {c} callers, batching ≤ {on.max_batch_size} / {on.batch_timeout_ms:g} ms (ceiling)")
    http_off = Row(f"HTTP, {c} senders, batching off")
    http_on = Row(f"HTTP, {c} senders, batching ≤ {on.max_batch_size} / {on.batch_timeout_ms:g} ms")
    with ExitStack() as stack:
        url_off = serve_fastapi(stack, of_family(FASTAPI.name)[stage], logs, {"MAX_BATCH_SIZE": "1"}).url
        url_on = serve_fastapi(stack, of_family(FASTAPI.name)[stage], logs, {"MAX_BATCH_SIZE": str(on.max_batch_size),
                                                                  "BATCH_TIMEOUT_MS": str(on.batch_timeout_ms)}).url
        sequential, http_sequential = asyncio.run(_sequential(load_backend(kind, off), url_off, image, args.requests))
        backend = load_backend(kind, on)
        alternate_windows([lambda w: asyncio.run(_in_process_window(ceiling, backend, on, text, c, w)),
                           lambda w: _http_window(http_off, url_off, image, c, w, stage),
                           lambda w: _http_window(http_on, url_on, image, c, w, stage)], args.rounds, args.duration)
    http_sequential.ratio = http_sequential.median_ms / sequential.median_ms
    http_sequential.aim = f"≤ {SEQUENTIAL_AIM} (median latency)"
    ceiling.ratio = 1.0
    for row in (http_off, http_on):
        row.ratio = row.throughput_rps / ceiling.throughput_rps
    http_on.aim = f"≥ {BATCHED_AIM} (throughput)"
    return [sequential, http_sequential, ceiling, http_off, http_on]


def benchmark_preprocess(args: argparse.Namespace) -> tuple[list[Row], str, str]:
    """One thread, then one thread and one worker process per CPU, how far each scales, and ``core_time_table``."""
    n, c, image = cpu_count(), args.concurrency, DEFAULT_IMAGE.read_bytes()
    text = base64.b64encode(image).decode()
    settings = get_settings()
    backend = load_backend("onnx", settings)  # only for what its input needs; it infers nothing here
    modes = {"1 thread": {"preprocess_processes": 0, "worker_threads": 1},
             f"{n} threads": {"preprocess_processes": 0, "worker_threads": n},
             f"{n} worker processes": {"preprocess_processes": n}}
    runs = [(Row(f"{name}, {c} callers"), settings.model_copy(update=update)) for name, update in modes.items()]
    alternate_windows([lambda w, row=row, mode=mode: asyncio.run(_in_process_window(
        row, backend, mode, text, c, w, preprocess_only=True)) for row, mode in runs], args.rounds, args.duration)
    rows = [row for row, _ in runs]
    one, threads, processes = rows
    for row in rows:
        row.ratio = row.throughput_rps / threads.throughput_rps
    scaling = "; ".join(f"{r.what.split(',')[0]}: {r.throughput_rps / (n * one.throughput_rps):.0%}"
                        for r in (threads, processes))
    width, height = Image.open(DEFAULT_IMAGE).size
    core = core_time_table(image, backend.manifest.preprocess_kwargs(), f"{DEFAULT_IMAGE.name} ({width}x{height})")
    return rows, f"Of {n} x one thread's images/s: {scaling}.", core


def torchvision_steps(resize: int = DEFAULT_RESIZE, crop: int = DEFAULT_CROP, mean=IMAGENET_MEAN,
                      std=IMAGENET_STD) -> tuple[str, Callable[[bytes], object]]:
    """(name, bytes -> tensor): torchvision's ``Resize, CenterCrop, ToTensor, Normalize``; where it does not import
    (beside a torch it was not built for), the same steps in Pillow and torch, as its functional code does them."""
    import torch  # deferred, with torchvision: they load only for this comparison

    def decoded(data: bytes) -> Image.Image:
        return Image.open(io.BytesIO(data)).convert("RGB")

    try:
        from torchvision import transforms  # deferred: an optional extra (torch), only for this comparison
    except (ImportError, RuntimeError):
        pass
    else:
        compose = transforms.Compose([transforms.Resize(resize), transforms.CenterCrop(crop), transforms.ToTensor(),
                                      transforms.Normalize(mean, std)])
        return "torchvision", lambda data: compose(decoded(data))
    mean_t, std_t = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)

    def steps(data: bytes) -> torch.Tensor:
        im = decoded(data)
        w, h = im.size
        im = im.resize((resize, int(resize * h / w)) if w <= h else (int(resize * w / h), resize), Image.BILINEAR)
        left, top = int(round((im.width - crop) / 2.0)), int(round((im.height - crop) / 2.0))
        im = im.crop((left, top, left + crop, top + crop))
        x = torch.from_numpy(np.array(im)).permute(2, 0, 1).contiguous().float().div(255)  # ToTensor
        return x.clone().sub_(mean_t).div_(std_t)  # Normalize, which clones unless told inplace

    return "torchvision's steps without torchvision (it does not import here)", steps


def core_time_table(image: bytes, kwargs: dict, photo: str, iterations: int = CORE_ITERATIONS,
                    rounds: int = CORE_ROUNDS) -> str:
    """servelab's ``preprocess`` against torchvision's steps: CPU time per image on one thread, in ``rounds``."""
    import torch  # deferred, as in torchvision_steps

    name, theirs = torchvision_steps(**kwargs)
    steps = {"servelab (`preprocess`)": lambda data: preprocess(data, **kwargs), name: theirs}
    cpu = dict.fromkeys(steps, 0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step in steps.values():
            step(image)  # the first call loads codecs and kernels
        for _ in range(rounds):
            for what, step in steps.items():
                started = process_time()
                for _ in range(iterations // rounds):
                    step(image)
                cpu[what] += process_time() - started
    finally:
        torch.set_num_threads(threads)
    ours, theirs_ms = (seconds * 1000 / (iterations // rounds * rounds) for seconds in cpu.values())
    verdict = "met" if ours <= theirs_ms else "**missed**"
    return markdown((f"preprocessing core, one thread, {photo}", "CPU ms per image", "ratio", "aim"),
                    [("servelab (`preprocess`)", f"{ours:.2f}", "1.00", f"≤ torchvision's ({verdict})"),
                     (name, f"{theirs_ms:.2f}", f"{theirs_ms / ours:.2f}", "")], "lrrl")


@dataclass
class VariantRows:
    """One variant's two measurements, and its agreement with fp32."""

    variant: str
    agreement: float | None  # top-1 with fp32, as `servelab models build` recorded it
    in_process: Row
    http: Row


def benchmark_variants(args: argparse.Namespace, logs: Path) -> tuple[list[VariantRows], list[str]]:
    """The variants' rows (fp32 first) and the variants left out, with why."""
    image, c = DEFAULT_IMAGE.read_bytes(), args.concurrency
    text = base64.b64encode(image).decode()
    settings = get_settings().model_copy(update={"max_batch_size": 1})
    top1 = agreements(settings.model_dir)
    backends, skipped = {}, []
    for name in ["fp32", *args.variants]:
        try:
            backends[name] = load_backend("onnx", settings.model_copy(update={"onnx_variant": name}))
        except (GPUUnavailable, FileNotFoundError) as exc:
            skipped.append(f"{name}: {exc}")
    rows = [VariantRows(name, top1.get(name),
                        Row(f"{name}, in-process, {c} callers"), Row(f"{name}, HTTP, {c} senders"))
            for name in backends]
    with ExitStack() as stack:
        urls = {row.variant: serve_fastapi(stack, FP32_STAGE, logs, {"MAX_BATCH_SIZE": "1", "ONNX_VARIANT": row.variant}).url
                for row in rows}
        alternate_windows([lambda w, row=row: (  # a variant's side of a round: in-process, then HTTP
            asyncio.run(_in_process_window(row.in_process, backends[row.variant], settings, text, c, w)),
            _http_window(row.http, urls[row.variant], image, c, w, f"{FP32_STAGE.name}-{row.variant}"))
            for row in rows], args.rounds, args.duration)
    for row in rows:  # fp32's first
        row.in_process.ratio = row.in_process.throughput_rps / rows[0].in_process.throughput_rps
        row.http.ratio = row.http.throughput_rps / rows[0].http.throughput_rps
    return rows, skipped


def _split(row: Row) -> tuple[float, float]:
    """Mean preprocessing and inference ms per request of an in-process row."""
    return statistics.mean(p for p, _ in row.split_ms), statistics.mean(i for _, i in row.split_ms)


def variants_table(rows: list[VariantRows]) -> str:
    fp32_ms = sum(_split(rows[0].in_process))
    int8 = [r for r in rows if r.variant.startswith("int8") and (r.agreement or 0) >= INT8_AGREEMENT]
    best_int8 = max(int8, key=lambda r: r.http.ratio, default=None)
    cells = []
    for r in rows:
        pre, infer = _split(r.in_process)
        aim = _verdict(r, U8_AIM, rows[0]) if r.variant == "u8" else ""
        if r is best_int8:
            aim = f"{_verdict(r, INT8_AIM, rows[0])}; agreement ≥ {INT8_AGREEMENT:.0%} (best INT8)"
        cells.append((r.variant, "–" if r.agreement is None else f"{r.agreement:.1%}",
                      f"{r.in_process.throughput_rps:.1f}", f"{r.in_process.ratio:.2f}", f"{r.http.throughput_rps:.1f}",
                      f"{r.http.ratio:.2f}", f"{pre:.2f}", f"{infer:.2f}", f"{fp32_ms / (pre + infer):.2f}", aim))
    table = markdown(("variant", "top-1 agreement", "in-process req/s", "ratio", "HTTP req/s", "ratio", "preprocess ms",
                      "infer ms", "CPU-time ceiling", "aim"), cells, "lrrrrrrrrl")
    if best_int8 is None:
        table += f"\n\nNo INT8 variant measured here agrees with fp32 on ≥ {INT8_AGREEMENT:.0%} of the photos."
    return table


def _verdict(r: VariantRows, aim: float, fp32: VariantRows) -> str:
    """The aim, in-process and over HTTP; where missed, the CPU time per request saved against fp32, by part."""
    if min(r.http.ratio, r.in_process.ratio) >= aim:
        return f"≥ {aim} (met)"
    (pre, infer), (pre0, infer0) = _split(r.in_process), _split(fp32.in_process)
    return (f"≥ {aim} (**missed**: preprocess {pre - pre0:+.2f} ms, infer {infer - infer0:+.2f} ms per request "
            f"against fp32's {pre0:.2f} + {infer0:.2f})")


def table(stage: str, rows: list[Row]) -> str:
    return markdown((stage, "median latency (ms)", "throughput (req/s)", "mean batch", "ratio", "aim"), [
        (r.what, f"{r.median_ms:.1f}", f"{r.throughput_rps:.1f}",
         f"{statistics.mean(r.batch_sizes):.1f}" if r.batch_sizes else "–", "" if r.ratio is None else f"{r.ratio:.2f}",
         r.aim) for r in rows], "lrrrrl")


def stage_inputs() -> dict[str, str]:
    """stage -> what its client sends: "bytes" (a photo), "tensor" or "uint8" (a crop it preprocessed)."""
    return {s.name: s.input for s in CATALOGUE}


def benchmark_ceiling(args: argparse.Namespace) -> str:
    """The ceiling table and, with ``--records``, the stages against it; ``--ceiling-json`` keeps the result."""
    result = measure_ceiling(Path(get_settings().model_dir), repeats=args.ceiling_repeats,
                             max_seconds=args.ceiling_seconds, log=lambda line: print(line, flush=True))
    if args.ceiling_json:
        args.ceiling_json.parent.mkdir(parents=True, exist_ok=True)
        args.ceiling_json.write_text(result.model_dump_json(indent=1) + "\n", encoding="utf-8")
    text = ceiling_markdown(result)
    if args.records:
        text += f"\n\n{fractions_markdown(read_records(args.records), result, stage_inputs())}"
    return text


def run(args: argparse.Namespace) -> int:
    """``servelab benchmark``: each of ``args.measure`` measured and its table printed."""
    started = perf_counter()
    print(f"servelab benchmark: {cpu_count()} CPUs; {args.requests} sequential requests of each kind; "
          f"throughput over {args.rounds} alternating rounds, {args.duration:g} s per measurement", flush=True)
    with tempfile.TemporaryDirectory(prefix="servelab-benchmark-") as tmp:
        for stage in args.measure:
            if stage == CEILING_MEASURE:
                print("\nThe model's own ceiling:", flush=True)
                print(f"\n{benchmark_ceiling(args)}", flush=True)
            elif stage == LIMIT_MEASURE:
                print(f"\nThis machine's limit, and the FastAPI stages against it and against the simplest app "
                      f"({machine()}):\n\n{benchmark_limit(args, Path(tmp))}", flush=True)
            elif stage == RAY_MEASURE:
                print(f"\nRay Serve against FastAPI, same photo, alternating (ratio = req/s ÷ fastapi-onnx-dyn's; "
                      f"outside the app = client mean latency - Server-Timing total):\n\n"
                      f"{benchmark_ray(args, Path(tmp))}", flush=True)
            elif stage == PREPROCESS_MEASURE:
                rows, scaling, core = benchmark_preprocess(args)
                print(f"\nDecoding + preprocessing alone, threads against worker processes (ratio = images/s ÷ the "
                      f"threads'; {machine()}):\n\n{table(stage, rows)}\n\n{scaling}", flush=True)
                print(f"\nThe same photo's decoding + preprocessing against torchvision's steps (ratio = CPU time "
                      f"÷ servelab's):\n\n{core}", flush=True)
            elif stage == VARIANTS_MEASURE:
                rows, skipped = benchmark_variants(args, Path(tmp))
                print(f"\nfastapi-onnx's model variants against fp32 (ratio = req/s ÷ fp32's; {machine()}; "
                      f"{cpu_int8().sentence()}):\n\n{variants_table(rows)}", flush=True)
                for line in skipped:
                    print(f"left out: {line}")
            else:
                print(f"\n{table(stage, benchmark_stage(stage, args, Path(tmp)))}", flush=True)
    print(f"\n({perf_counter() - started:.0f} s in all)")
    return 0
