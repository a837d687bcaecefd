"""The lab's stages against the model's own ceiling, and the issue's aims checked as data: pure functions over a
run's records and a ``Ceiling``. A stage's *capacity* is the top of its concurrency sweep, and ratios are capacity ÷
capacity, so that no stage is held to another's number of senders. A run servelab's client could not keep up with
(``Record.client_bound``) measured the client: it carries a note wherever it is read here, and an aim resting on it
is not measured, never met or missed. The aims are GPU aims: judged only where every servelab record ran with
``--device gpu``; elsewhere information only.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servelab.core.catalogue import FASTAPI, STAGES, TRITON, compared
from servelab.core.tables import markdown, num
from servelab.measure.ceiling import Ceiling
from servelab.measure.records import Record

# The lessons whose ratios the ceiling is about -> what the ratio says.
RATIO_LESSONS = {"batching": "dynamic batching ÷ no batching", "instances": "two instances per GPU ÷ one instance"}
# The families whose ratios are shown, in this order: Triton's, then FastAPI's; not Ray Serve's, which
# runs on the CPU only (the GPU environment carries no Ray).
RATIO_FAMILIES = (TRITON.name, FASTAPI.name)
# (what, numerator stage, denominator stage): each stage of those lessons against its catalogue baseline.
RATIOS = tuple((what, top, bottom) for lesson, what in RATIO_LESSONS.items() for family in RATIO_FAMILIES
               for top, bottom in compared(lesson) if STAGES[top].family == family)
RATIO_CONCURRENCY = 16  # latency compared at this many senders, else at the most both stages were measured at
# The aims (issue 24), for a GPU like the H100.
BATCHING_AIM = 2.0  # dynamic batching ÷ no batching at saturation (capacity ÷ capacity), for the ONNX stages:
BATCHING_AIM_PAIRS = tuple((top, bottom) for what, top, bottom in RATIOS
                           if what == RATIO_LESSONS["batching"] and STAGES[top].runtime == "onnx")
IMAGE_IN_AIM, TENSOR_IN_AIM = 0.40, 0.60  # of the fp32 ceiling
FIRST_REQUEST_AIM = 3.0  # first request after ready ÷ the steady sequential median
MET, MISSED, NOT_MEASURED = "met", "**missed**", "not measured"
CLIENT_BOUND = "client-bound"  # a run servelab's client could not keep up with (servelab.measure.senders)
ON_CPU = "information only (GPU aims; this ran on the CPU)"


def closed_run(records: list[Record], stage: str, concurrency: int, batch: int = 1) -> Record | None:
    """servelab's own run of ``stage`` at that closed-loop concurrency (1 = sequential); a run the lab
    made for another purpose (``config["run"]``: a node failure) is never it."""
    return next((r for r in records if r.tool == "servelab" and r.stage == stage and not r.failed and r.batch == batch
                 and r.load.mode in ("sequential", "closed") and r.load.concurrency == concurrency
                 and not r.config.get("run")), None)


# config keys: the record that ended a stage's concurrency sweep (its curve and capacity), and a run's windows.
CAPACITY, WINDOWS = "capacity", "windows"


def curve_point(record: Record) -> dict[str, Any]:
    """One point of a capacity curve: the run's senders, throughput, p50 and p99 (and ``client_bound`` where
    servelab's client, not the server, set that throughput)."""
    lat = record.stats.latency
    return {"concurrency": record.load.concurrency, "throughput_rps": round(record.stats.throughput_rps, 3),
            "p50_ms": None if lat.p50_ms is None else round(lat.p50_ms, 3),
            "p99_ms": None if lat.p99_ms is None else round(lat.p99_ms, 3),
            **({"client_bound": True} if record.client_bound else {})}


def swept(records: list[Record], stage: str) -> Record | None:
    """The record that ended ``stage``'s concurrency sweep (it holds the curve), the latest; None without one."""
    return next((r for r in reversed(records) if r.tool == "servelab" and r.stage == stage and CAPACITY in r.config
                 and not r.config.get("run")), None)


def curve(records: list[Record], stage: str) -> list[dict[str, Any]]:
    """``stage``'s capacity curve (concurrency, throughput_rps, p50_ms, p99_ms per level), [] without a sweep."""
    return list(found.config[CAPACITY]["curve"]) if (found := swept(records, stage)) else []


def capacity(records: list[Record], stage: str) -> Record | None:
    """The stage's capacity: servelab's run at the top of its concurrency sweep (the highest mean throughput on
    the curve), what the lab takes its open-loop rates as fractions of (``servelab.run.lab``); in records
    made before the sweep, the closed-loop run at the highest concurrency measured; None where it has none."""
    if found := swept(records, stage):  # of the runs at its level (measured twice near a knee), the nearest its mean
        said = found.config[CAPACITY]
        runs = [r for r in records if r.stage == stage and r is closed_run([r], stage, said["concurrency"])]
        return min(runs, key=lambda r: abs(r.stats.throughput_rps - said["throughput_rps"]), default=found)
    levels = sorted(_closed_levels(records, stage), reverse=True)
    return next((run for level in levels if (run := closed_run(records, stage, level))), None)


def senders(record: Record) -> str:
    """"N senders", or "one at a time" where the capacity was one request at a time."""
    return "one at a time" if record.load.mode == "sequential" else f"{record.load.concurrency} senders"


def where(a: Record, b: Record) -> str:
    """Where two capacities were found: "both at 8 senders", "at 32 senders and 4 senders"."""
    x, y = senders(a), senders(b)
    return (f"both at {x}" if x.endswith("senders") else f"both {x}") if x == y else f"at {x} and {y}"


def client_bound_note(*runs: Record | None) -> str:
    """" (client-bound: ...)" where any of ``runs`` was held by servelab's client, not the server
    (``Record.client_bound``): its throughput is the client's limit, never the stage's capacity; "" otherwise."""
    if not any(r is not None and r.client_bound for r in runs):
        return ""
    return f" ({CLIENT_BOUND}: the client's limit, not the server's capacity)"


def _closed_levels(records: list[Record], stage: str) -> set[int]:
    """The closed-loop concurrencies the lab measured ``stage`` at (not those of a run for another purpose)."""
    return {r.load.concurrency for r in records if r.stage == stage and r.load.mode == "closed" and not r.config.get("run")}


def ratio_runs(records: list[Record], top: str, bottom: str,
               concurrency: int = RATIO_CONCURRENCY) -> tuple[int, Record, Record] | None:
    """(concurrency, ``top``'s run, ``bottom``'s run) at ``concurrency``, else at the highest closed-loop
    concurrency both stages were measured at; None where there is none (or ``bottom`` served nothing)."""
    if not (levels := sorted(_closed_levels(records, top) & _closed_levels(records, bottom))):
        return None
    level = concurrency if concurrency in levels else levels[-1]
    a, b = closed_run(records, top, level), closed_run(records, bottom, level)
    return (level, a, b) if a and b and b.stats.throughput_rps else None


def capacity_ratio(records: list[Record], top: str, bottom: str) -> tuple[Record, Record, float] | None:
    """(``top``'s capacity run, ``bottom``'s, the ratio of their req/s); None where either has no capacity."""
    a, b = capacity(records, top), capacity(records, bottom)
    return (a, b, a.stats.throughput_rps / b.stats.throughput_rps) if a and b and b.stats.throughput_rps else None


def ratios(records: list[Record]) -> list[tuple[str, str, float]]:
    """(what, "a ÷ b, capacity at N and M senders", ratio of req/s): each stage's capacity (the top of its
    sweep) over its baseline's."""
    return [(what, f"{top} ÷ {bottom}, capacity {where(a, b)}{client_bound_note(a, b)}", ratio)
            for what, top, bottom in RATIOS if (got := capacity_ratio(records, top, bottom)) for a, b, ratio in [got]]


@dataclass(frozen=True)
class StageFraction:
    """A stage's best run (one image per request) against the fp32 ceiling."""

    stage: str
    input: str  # "image", "tensor" or "-" (not in the catalogue)
    load: str  # the best run's load
    images_per_s: float
    fraction: float | None  # of the fp32 ceiling (None: no ceiling measured)
    cpu_pct: float | None  # the whole machine's mean CPU use during that run
    gpu_pct: float | None  # mean GPU utilization during that run (NVML)
    client_bound: bool = False  # servelab's client held that run: its figure is the client's, not the stage's


def input_kind(stage: str, inputs: Mapping[str, str]) -> str:
    """"image" (the server decodes a photo), "tensor" (the client sent the crop) or "-" (unknown)."""
    return "-" if (sent := inputs.get(stage)) is None else "image" if sent == "bytes" else "tensor"


def best_runs(records: list[Record]) -> dict[str, Record]:
    """stage -> its best servelab closed-loop or sequential run (one image per request), in the records' stage order."""
    runs = [r for r in records if r.tool == "servelab" and not r.failed and r.batch == 1
            and r.load.mode in ("sequential", "closed") and r.stats.items_per_s > 0 and not r.config.get("run")]
    return {stage: max((r for r in runs if r.stage == stage), key=lambda r: r.stats.items_per_s)
            for stage in dict.fromkeys(r.stage for r in runs)}


def stage_fractions(records: list[Record], ceiling: Ceiling, inputs: Mapping[str, str]) -> list[StageFraction]:
    """Every stage's best servelab closed-loop or sequential run, in the records' order of stages."""
    best = ceiling.best("fp32")
    return [StageFraction(stage, input_kind(stage, inputs), top.load.label(), top.stats.items_per_s,
                          top.stats.items_per_s / best.images_per_s if best and best.images_per_s else None,
                          top.monitors.cpu_mean_pct if top.monitors else None,
                          top.monitors.gpu_util_mean_pct if top.monitors else None, top.client_bound)
            for stage, top in best_runs(records).items()]


def first_requests(records: list[Record]) -> list[tuple[str, float, float]]:
    """(stage, first request ms, sequential p50 ms) for each stage whose first servelab run kept its
    first request: in the lab, the first request the stage's server saw after it said it was ready."""
    firsts: dict[str, Record] = {}
    for r in (r for r in records if r.tool == "servelab"):
        firsts.setdefault(r.stage, r)
    return [(stage, first.first_request_ms, steady.stats.latency.p50_ms) for stage, first in firsts.items()
            if first.first_request_ms is not None and (steady := closed_run(records, stage, 1))
            and steady.stats.latency.p50_ms]


@dataclass(frozen=True)
class Aim:
    what: str
    verdict: str  # MET, MISSED, NOT_MEASURED or ON_CPU
    figures: str


def device_of(records: list[Record]) -> str:
    """"gpu" where every servelab record ran with ``--device gpu``; "cpu" otherwise."""
    ours = [r for r in records if r.tool == "servelab"]
    return "gpu" if ours and all(r.config.get("device") == "gpu" for r in ours) else "cpu"


def _judge(value: float | None, ok: bool, gpu: bool) -> str:
    return NOT_MEASURED if value is None else ON_CPU if not gpu else MET if ok else MISSED


def aims(records: list[Record], ceiling: Ceiling, inputs: Mapping[str, str]) -> list[Aim]:
    """The issue's aims (``BATCHING_AIM``, ``IMAGE_IN_AIM``, ``TENSOR_IN_AIM``, ``FIRST_REQUEST_AIM``) against this
    run's records and ceiling; beside a fraction aim, the CPU and GPU use during the run it rests on."""
    stages_gpu = device_of(records) == "gpu"
    found = []
    for top, bottom in BATCHING_AIM_PAIRS:
        got = capacity_ratio(records, top, bottom)
        a, b, ratio = got if got else (None, None, None)
        figures = (f"{top} {num(a.stats.throughput_rps)} ({senders(a)}) ÷ {bottom} {num(b.stats.throughput_rps)} "
                   f"({senders(b)}) req/s = {num(ratio, 2)}{client_bound_note(a, b)}" if got
                   else f"no capacity measured for {top} or {bottom}")
        verdict = (NOT_MEASURED if client_bound_note(a, b) else
                   _judge(ratio, ratio is not None and ratio >= BATCHING_AIM, stages_gpu))
        found.append(Aim(f"{top} ÷ {bottom} ≥ {BATCHING_AIM:g}× at saturation (capacity ÷ capacity)", verdict, figures))
    best = ceiling.best("fp32")
    fractions = stage_fractions(records, ceiling, inputs)
    for kind, aim in (("image", IMAGE_IN_AIM), ("tensor", TENSOR_IN_AIM)):
        top = max((f for f in fractions if f.input == kind), key=lambda f: f.images_per_s, default=None)
        what = f"best {kind}-in stage ≥ {aim:.0%} of the fp32 ceiling"
        if top is None or top.fraction is None or best is None:
            found.append(Aim(what, NOT_MEASURED, "no fp32 ceiling" if best is None else f"no {kind}-in stage measured"))
            continue
        verdict = NOT_MEASURED if top.client_bound else _judge(top.fraction, top.fraction >= aim,
                                                                 stages_gpu and ceiling.on_gpu)
        found.append(Aim(what, verdict, f"{top.stage} ({top.load}) {num(top.images_per_s)} img/s = {top.fraction:.1%} of "
                         f"{num(best.images_per_s, 0)} (batch {best.batch}); "
                         f"CPU {num(top.cpu_pct, 0)} %, GPU {num(top.gpu_pct, 0)} % during that run"
                         + (f"; {CLIENT_BOUND}: the client's limit, not the stage's" if top.client_bound else "")))
    firsts = first_requests(records)
    worst = max(firsts, key=lambda f: f[1] / f[2], default=None)
    ratio = worst[1] / worst[2] if worst else None
    found.append(Aim(f"first request after ready ≤ {FIRST_REQUEST_AIM:g}× the sequential median",
                     _judge(ratio, ratio is not None and ratio <= FIRST_REQUEST_AIM, stages_gpu),
                     f"worst of {len(firsts)} stages: {worst[0]} {num(worst[1])} ms = {ratio:.2f}× its sequential "
                     f"median {num(worst[2])} ms" if worst else "no record holds a first request after ready"))
    return found


def fractions_markdown(records: list[Record], ceiling: Ceiling, inputs: Mapping[str, str]) -> str:
    """Each stage as a fraction of the fp32 ceiling, the ratios, and the aims, for a record or a printout."""
    best = ceiling.best("fp32")
    rows = [(f.stage, f.input, f.load + (f" ({CLIENT_BOUND})" if f.client_bound else ""), num(f.images_per_s),
             num(f.fraction * 100 if f.fraction is not None else None),
             num(f.cpu_pct, 0), num(f.gpu_pct, 0)) for f in stage_fractions(records, ceiling, inputs)]
    lines = [(f"Each stage's best run (servelab's client, one image per request) against the fp32 ceiling "
              f"({num(best.images_per_s, 0) + ' img/s' if best else 'not measured'}; "
              f"{'GPU' if ceiling.on_gpu else 'CPU'}):"), "",
             markdown(("stage", "input", "best run", "img/s", "% of fp32 ceiling", "CPU %", "GPU %"),
                      rows or [("-",) * 7], "lllrrrr"), "",
             markdown(("what", "stages", "ratio (req/s)"),
                      [(what, which, num(v, 2)) for what, which, v in ratios(records)] or [("-", "-", "-")], "llr"),
             "", markdown(("aim", "verdict", "figures"), [(a.what, a.verdict, a.figures) for a in aims(records, ceiling, inputs)])]
    return "\n".join(lines)
