"""The report's first screen: each lesson of the lab as "what changed → what it did", from the records.

A lesson is one change the notebooks teach, a ratio of two stages' runs (in rounds where the lab alternated them)
and its spread, judged by one rule (``verdict``); ``EXPECT`` says what the notebooks expect, and a measurement that
goes the other way is said plainly."""

import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache

from servelab.core import original_lab
from servelab.core.catalogue import CATALOGUE, FASTAPI, QUEUE_BOUND, QUEUE_WAIT_US, STAGES, TRITON, Lesson, compared
from servelab.core.hardware import int8_compute
from servelab.core.paths import REPO_ROOT
from servelab.core.settings import get_settings
from servelab.core.tables import num
from servelab.core.variants.build import agreements
from servelab.measure import fractions
from servelab.measure.records import Record, RunKind, read_records
from servelab.report import TEMPLATES, compare

ROLLOUT_P99_AIM = 3.0  # p99 during a rollout ÷ the steady p99 before it (issue 35's aim)
ROLLOUT_SWITCH_AIM_S = 1.0  # from the new version ready to its first answer in the records (issue 35's aim)
NOISE = 0.10  # a ratio within 10 % of 1 is no change; without windows, within 10 % of what is expected, no contradiction
HIGHER, LOWER, NO_CHANGE, TOO_NOISY = "higher", "lower", "no measurable change", "this machine was too noisy to tell"
Spread = tuple[float, float]  # the least and the most a ratio took over its rounds (else its runs' windows)
RETRY = "run `servelab lab --full` (more, longer rounds), or on a quieter machine"  # where the rounds disagree
# The lessons whose two stages the lab alternates in rounds (``servelab.run.lab``): each compares capacities (each
# stage at its own capacity's senders), but batching asks for one load where batches can form (both at the larger).
IN_ROUNDS = (Lesson.ONNX, Lesson.BATCHING, Lesson.INSTANCES, *(Lesson.of_variant(v) for v in ("u8", "int8", "fp16")),
             Lesson.SERVER_PREPROCESSING, Lesson.REPLICAS)


# The report's one rule (``verdict``) in one sentence, as the report and docs/benchmarks.md say it (a test holds both).
RULE = (f"a ratio reads *{HIGHER}* or *{LOWER}* only where its whole spread lies more than {NOISE:.0%} beyond 1 on "
        f"that side, *{NO_CHANGE}* where it lies within {NOISE:.0%} of 1, and otherwise *{TOO_NOISY}*, a band "
        f"calibrated on the three tours of issue 65 (one shared 2-CPU VM at 16d9fae), where one run's windows spread "
        f"about {NOISE:.0%} either side of its ratio while a lesson's ratio moved by up to 0.27 from run to run")


def verdict(ratio: float | None, spread: Spread | None = None) -> str:
    """``RULE``: where the spread (over interleaved rounds, else windows) clears the band on one side, the next run
    says the same direction; where it straddles it, "cannot tell" (without a spread: the ratio alone)."""
    low, high = spread or (ratio, ratio)
    if low is None or high is None:
        return TOO_NOISY
    if low > 1 + NOISE or high < 1 - NOISE:
        return HIGHER if low > 1 else LOWER
    return NO_CHANGE if 1 - NOISE <= low and high <= 1 + NOISE else TOO_NOISY


def round_levels(lesson: Lesson, top: int, bottom: int) -> tuple[tuple[int, int], str]:
    """The senders ``top``'s and ``bottom``'s rounds run at (from their capacities'), and what its line compares."""
    if lesson == Lesson.BATCHING:
        return (max(top, bottom),) * 2, f"the same concurrency: both at {max(top, bottom)} senders"
    return (top, bottom), f"capacities: each at its own capacity's senders ({top} and {bottom})"


@dataclass(frozen=True)
class Expect:
    """What the notebooks say a change does: a line, and the bound the measured ratio should keep."""

    says: str
    at_least: float | None = None  # the ratio should not fall below this (less NOISE)
    at_most: float | None = None  # nor rise above this (plus NOISE)
    notebook: str = ""  # who says it; "" = the notebook that teaches the changed stage (notebook_of)

    def contradicted(self, ratio: float, spread: Spread | None = None) -> bool:
        """The whole spread lies beyond the bound (without one: the ratio, by more than ``NOISE``)."""
        low, high, noise = (*spread, 0.0) if spread else (ratio, ratio, NOISE)
        return ((self.at_least is not None and high < self.at_least * (1 - noise))
                or (self.at_most is not None and low > self.at_most * (1 + noise)))


# What the notebooks teach, per lesson, on a "cpu" and on a "gpu" run (one Expect: the same on both).
EXPECT: dict[Lesson, Expect | dict[str, Expect]] = {
    Lesson.ONNX: Expect("a faster inference raises the ceiling and lowers every latency", at_least=1.0,
                   notebook="4_fastapi"),
    Lesson.BATCHING: {
        "cpu": Expect("on a CPU an image costs about as much in a batch as alone: batching buys little or "
                      "nothing, but it should not lower throughput", at_least=1.0),
        "gpu": Expect("on a GPU a batch costs much less than its images one by one: throughput rises", at_least=1.0),
    },
    Lesson.INSTANCES: Expect("more copies of the model turn queueing into throughput", at_least=1.0),
    Lesson.VARIANT_U8: Expect("normalization in the graph saves only the float math: about the same, not slower",
                         at_least=1.0),
    Lesson.VARIANT_INT8: {
        "cpu": Expect("INT8 pays only where the CPU has fast 8-bit instructions (x86: VNNI; ARM: dot products): "
                      "each line says whether the CPU that ran it has them, and what to expect there",
                      notebook="4_fastapi"),
        # The line's own bound, from the flags of the CPU that ran it (Int8Compute.expect).
        "cpu, INT8 faster": Expect("on x86 with VNNI INT8 is faster than fp32", at_least=1.0, notebook="4_fastapi"),
        "cpu, INT8 slower": Expect("on x86 with AVX2 alone INT8 is slower than fp32", at_most=1.0,
                                   notebook="4_fastapi"),
        "gpu": Expect("on the P100 INT8 is no faster than fp32, perhaps slower", at_most=1.0, notebook="8_triton_more"),
    },
    Lesson.VARIANT_FP16: Expect("fp16 is the GPU lever, paying mostly at larger batches", at_least=1.0),
    Lesson.SERVER_PREPROCESSING: Expect("the server now decodes and resizes every photo itself: the notebook asks when "
                                   "that is a good trade and promises no direction", notebook="8_triton_more"),
    Lesson.REPLICAS: Expect("replicas turn queueing into throughput until something else is the slowest step (the "
                       "proxy, the network, the CPUs that decode the photos)", at_least=1.0, notebook="10_ray"),
    Lesson.PROXY: Expect("one replica is fastapi-onnx plus the hop through Ray Serve's proxy: never faster",
                    at_least=1.0, notebook="10_ray"),
    Lesson.AUTOSCALING: Expect("Ray Serve adds replicas while requests queue and removes them once the load is gone",
                          notebook="10_ray"),
    Lesson.NODE_FAILURE: Expect("requests fail only while the dead node's replica is replaced; then all succeed",
                           notebook="the lab"),
    Lesson.SHEDDING: Expect(f"above capacity an unbounded queue grows and every request waits longer; a bounded queue "
                       f"refuses the excess (503 + Retry-After) and the accepted requests' p99 falls far below the "
                       f"unbounded queue's (behind FastAPI, which holds at most {QUEUE_BOUND} requests, within "
                       f"{QUEUE_BOUND} service times; behind Triton, which refuses a request that waited "
                       f"{QUEUE_WAIT_US / 1000:g} ms, within that wait and a batch's time)", at_most=1.0,
                       notebook="4_fastapi"),
    Lesson.CACHE: Expect("an answer kept for a photo asked for before costs a lookup instead of an inference: the more "
                    "often photos repeat, the higher the throughput and the lower the median", at_least=1.0,
                    notebook="4_fastapi"),
    Lesson.ROLLOUT: Expect("a new version loads and warms up beside the old one, then takes the new requests: none "
                      "fails, p99 during the swap stays within 3× the steady p99, and the answers show the new "
                      "version within a second of its being ready", at_most=ROLLOUT_P99_AIM, notebook="4_fastapi"),
    Lesson.QUEUEING: Expect("latency climbs as the offered rate nears what the stage can serve; batching keeps it "
                       "flatter", at_least=1.0, notebook="7_triton_onnx"),
}


@dataclass(frozen=True)
class Finding:
    """One measured comparison: the stages or runs compared, the figures shown, their ratio and what it says."""

    pair: str  # "a ÷ b, 16 senders"
    figures: str  # "98.7 vs 77.2 req/s"
    ratio: float | None
    extra: str = ""  # mean batch, agreement, queue share...
    contradicts: str = ""  # "contradicts 4_fastapi: ..." where the measurement goes the other way
    spread: Spread | None = None  # the ratio over its rounds, else the runs' windows (``spread``); None: neither
    over: str = ""  # "rounds" or "windows": what the spread is over


@dataclass(frozen=True)
class LessonReport:
    """How the report writes up one of the catalogue's lessons: its title and how it finds its comparisons."""

    key: Lesson
    title: str  # what changed
    find: Callable[[list[Record], str], Iterator[Finding]]  # (records, device) -> findings

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:  # top ÷ bottom: what "not measured" names
        return compared(self.key)


def _expect(key: Lesson, device: str) -> Expect:
    e = EXPECT.get(key, Expect("the notebooks say nothing of this change yet"))
    return e[device] if isinstance(e, dict) else e


def _needs_gpu(top: str, bottom: str) -> bool:
    """Whether ``top`` runs only on a GPU; a stage derived from ``bottom`` (``catalogue.bounded``) as it does."""
    return STAGES[top if top in STAGES else bottom].needs_gpu


def notebook_of(stage: str) -> str:
    """The notebook that teaches ``stage`` (the catalogue's word)."""
    return STAGES[stage].notebook if stage in STAGES else "the notebooks"


def spread(top: Record, bottom: Record, figure: str) -> Spread | None:
    """The least and the most ``top``'s ``figure`` ÷ ``bottom``'s took over any window of one and any of the other;
    None where either kept fewer than two windows, or ``bottom`` had a window with none (nothing served)."""
    a, b = ([v for v in r.config.get(fractions.WINDOWS, {}).get(figure) or [] if v is not None] for r in (top, bottom))
    return (min(a) / max(b), max(a) / min(b)) if len(a) > 1 and len(b) > 1 and min(b) > 0 else None


def judge(e: Expect, ratio: float | None, spread: Spread | None = None, stage: str = "") -> str:
    """What a lesson's ratio says against the notebooks: a contradiction, else "" (``verdict`` says the rest)."""
    if ratio is None or verdict(ratio, spread) not in (HIGHER, LOWER) or not e.contradicted(ratio, spread):
        return ""
    bounds = " and ".join(f"{word} {bound:g}×" for word, bound in (("≥", e.at_least), ("≤", e.at_most))
                          if bound is not None)
    return f"contradicts {e.notebook or notebook_of(stage)}, which expects {bounds}"


def _finding(pair: str, figures: str, ratio: float, extra: str, e: Expect, top: Record, bottom: Record, figure: str,
             stage: str = "", judged: bool = True, also: str = "", found: Spread | None = None) -> Finding:
    """``top``'s ``figure`` ÷ ``bottom``'s, judged (unless client-bound) with its spread, ``found`` over rounds else
    over windows; ``also``: a contradiction of the caller's own, whatever the ratio."""
    over = "rounds" if found else "windows"
    found = found or spread(top, bottom, figure)
    return Finding(pair, figures, ratio, extra, (judge(e, ratio, found, stage) if judged else "") or also, found,
                   over if found else "")


def rounds(records: list[Record], top: str, bottom: str) -> list[tuple[Record, Record]]:
    """(``top``'s run, ``bottom``'s) of each round the lab alternated them in (``RunKind.ROUNDS``), in order."""
    by_round: dict[int, dict[str, Record]] = {}
    for r in records:
        if r.config.get("run") == RunKind.ROUNDS and r.config.get("pair") == f"{top} ÷ {bottom}" and not r.failed:
            by_round.setdefault(r.config["round"], {})[r.stage] = r
    return [(runs[top], runs[bottom]) for _, runs in sorted(by_round.items())
            if len(runs) == 2 and runs[bottom].stats.throughput_rps]


def _in_rounds(top: str, bottom: str, found: list[tuple[Record, Record]], e: Expect, extra: str) -> Finding:
    """The lesson's finding from its rounds: the median of the rounds' req/s ratios; deciding, the spread over every
    round's windows, any window of one stage over any of the other in the same round. The rounds' own ratios did not
    bound the next tour's (docs/records/lab-tours-2cpu-2026-12-06.md: ray-2 ÷ ray-1 read 0.93–0.99, then 1.18–1.54);
    their windows did, in each of the three quiet tours there. Without windows, the rounds' ratios."""
    ratios = [a.stats.throughput_rps / b.stats.throughput_rps for a, b in found]
    windows = [s for a, b in found if (s := spread(a, b, "throughput_rps"))]
    bounds = (min(s[0] for s in windows), max(s[1] for s in windows)) if windows else (min(ratios), max(ratios))
    a, b = (statistics.fmean(pair[i].stats.throughput_rps for pair in found) for i in (0, 1))
    bound = fractions.client_bound_note(*(r for pair in found for r in pair))
    return _finding(f"{top} ÷ {bottom}, {found[0][0].config['compares']}, {len(found)} round{'s'[:len(found) > 1]} alternating{bound}",
                    f"{num(a)} vs {num(b)} req/s", statistics.median(ratios), extra, e, *found[0], "throughput_rps",
                    top, judged=not bound, found=bounds)


def _throughput(key: Lesson, extra: Callable[[Record, Record], str] = lambda a, b: "",
                expect: Callable[[Record, str], tuple[Expect, str]] | None = None):
    """Findings of the capacity ratios of the lesson's pairs; ``expect``: where the bound is the top record's."""
    def find(records: list[Record], device: str) -> Iterator[Finding]:
        for top, bottom in compared(key):
            if found := rounds(records, top, bottom):
                e, said = expect(found[0][0], device) if expect else (_expect(key, device), "")
                yield _in_rounds(top, bottom, found, e, "; ".join(filter(None, (
                    _latency_at(records, top, bottom), extra(*found[0]), said))))
            elif got := fractions.capacity_ratio(records, top, bottom):  # no rounds: the capacities' ratio
                a, b, ratio = got
                e, said = expect(a, device) if expect else (_expect(key, device), "")
                bound = fractions.client_bound_note(a, b)  # the client's limit: no lesson is read from it
                yield _finding(f"{top} ÷ {bottom}, capacity {fractions.where(a, b)}{bound}",
                               f"{num(a.stats.throughput_rps)} vs {num(b.stats.throughput_rps)} req/s", ratio,
                               "; ".join(filter(None, (_latency_at(records, top, bottom), extra(a, b), said))),
                               e, a, b, "throughput_rps", top, judged=not bound)
    return find


def _latency_at(records: list[Record], top: str, bottom: str) -> str:
    """Both stages' p50 at one stated concurrency (16 senders, else the most both were measured at)."""
    if not (runs := fractions.ratio_runs(records, top, bottom)):
        return ""
    level, a, b = runs
    at = "one at a time" if level == 1 else f"{level} senders"
    return f"p50 at {at} {num(a.stats.latency.p50_ms)} vs {num(b.stats.latency.p50_ms)} ms"


# The variants the catalogue's stages serve against fp32, in its order (each its own lesson).
VARIANTS = tuple(dict.fromkeys(s.variant for s in CATALOGUE if s.variant and s.lesson == f"variant {s.variant}"))


def int8_on_cpu(record: Record, device: str) -> tuple[Expect, str]:
    """What INT8 is expected to do on the CPU that ran ``record``, and that CPU's line, from the flags its
    record kept (on a GPU run the lesson's bound alone: INT8 ran on the GPU)."""
    key = Lesson.VARIANT_INT8
    if device != "cpu":
        return _expect(key, device), ""
    int8 = int8_compute(record.machine.get("cpu_flags"))
    e = _expect(key, f"cpu, INT8 {int8.expect}" if int8.expect else "cpu")
    return e, int8.sentence("the CPU that ran it", "there")


def _variant(variant: str):
    def agreement(a: Record, b: Record) -> str:
        top1 = agreements(get_settings().model_dir).get(variant)
        return "" if top1 is None else f"top-1 agreement with fp32 {100 * top1:.1f} %"
    return _throughput(Lesson.of_variant(variant), agreement, int8_on_cpu if variant == "int8" else None)


def _proxy(records: list[Record], device: str) -> Iterator[Finding]:
    for top, bottom in compared(Lesson.PROXY):
        a, b = fractions.closed_run(records, top, 1), fractions.closed_run(records, bottom, 1)
        if a and b and a.stats.latency.p50_ms and b.stats.latency.p50_ms:
            ratio = a.stats.latency.p50_ms / b.stats.latency.p50_ms
            yield _finding(f"{top} ÷ {bottom}, one request at a time",
                           f"p50 {num(a.stats.latency.p50_ms)} vs {num(b.stats.latency.p50_ms)} ms", ratio,
                           f"{a.stats.latency.p50_ms - b.stats.latency.p50_ms:+.1f} ms through the proxy",
                           _expect(Lesson.PROXY, device), a, b, "p50_ms")


def _queueing(records: list[Record], device: str) -> Iterator[Finding]:
    # The stage the lab offers both arrival processes, and its baseline: batching on and off, the same load.
    queued = [n for s in CATALOGUE if s.family == TRITON.name and s.triton.both_arrivals for n in (s.baseline, s.name)]
    for stage in queued:
        cap, alone = fractions.capacity(records, stage), fractions.closed_run(records, stage, 1)
        runs = [r for r in records if r.stage == stage and r.tool == "servelab" and r.load.mode == "open"
                and r.load.arrivals == "poisson" and not r.load.phases and not r.failed and r.batch == 1
                and r.stats.latency.p50_ms and not r.config.get("run")]  # not the overload case: above capacity
        if not (cap and alone and alone.stats.latency.p50_ms and runs):
            continue
        top = max(runs, key=lambda r: r.load.rate)
        ratio = top.stats.latency.p50_ms / alone.stats.latency.p50_ms
        share = top.breakdown.queue_share if top.breakdown else None
        yield _finding(f"{stage}, Poisson at {top.load.rate / cap.stats.throughput_rps:.2f} × capacity "
                       f"({top.load.rate:g} of {num(cap.stats.throughput_rps)} req/s{fractions.client_bound_note(cap)}) "
                       "÷ one at a time",
                       f"p50 {num(top.stats.latency.p50_ms)} vs {num(alone.stats.latency.p50_ms)} ms", ratio,
                       "" if share is None else f"queue share {100 * share:.0f} %",
                       _expect(Lesson.QUEUEING, device), top, alone, "p50_ms")


def _runs(records: list[Record], stages: tuple[str, str], kind: RunKind, measured: Callable[[Record], object]):
    """Each of ``stages``' first run made for ``kind`` that measured what ``measured`` reads (else None)."""
    return (next((r for r in records if r.stage == stage and r.config.get("run") == kind and not r.failed
                  and measured(r)), None) for stage in stages)


def _shedding(records: list[Record], device: str) -> Iterator[Finding]:
    for top, bottom in compared(Lesson.SHEDDING):
        a, b = _runs(records, (top, bottom), RunKind.OVERLOAD, lambda r: r.stats.latency.p99_ms)
        alone = fractions.closed_run(records, top, 1)
        if not (a and b):
            continue
        ratio, said = a.stats.latency.p99_ms / b.stats.latency.p99_ms, _expect(Lesson.SHEDDING, device)
        shed, asked = sum(a.stats.shed.values()), a.stats.successes + sum(a.stats.shed.values()) + a.stats.error_count
        times = a.stats.latency.p99_ms / alone.stats.latency.p50_ms if alone and alone.stats.latency.p50_ms else None
        extra = [f"{shed} of {asked} shed ({shed / max(asked, 1):.0%}), {a.stats.error_count} failed",
                 *([] if times is None else [f"accepted p99 = {times:.1f}× the service time"])]
        # The stated multiple holds where the bound counts every request inside the server: FastAPI's.
        beyond = (f"contradicts {said.notebook}, which expects at most {QUEUE_BOUND}× the service time behind FastAPI"
                  if STAGES[bottom].family == FASTAPI.name and times is not None and times > QUEUE_BOUND * (1 + NOISE) else "")
        yield _finding(f"{top} ÷ {bottom}, {a.load.label()} ({a.config.get('multiple', '')}× capacity)",
                       f"p99 {num(a.stats.latency.p99_ms)} vs {num(b.stats.latency.p99_ms)} ms", ratio,
                       "; ".join(extra), said, a, b, "p99_ms", top, also=beyond)


def _cached(records: list[Record], device: str) -> Iterator[Finding]:
    for top, bottom in compared(Lesson.CACHE):
        a, b = _runs(records, (top, bottom), RunKind.CACHE, lambda r: r.stats.throughput_rps)
        if not (a and b):
            continue
        ratio = a.stats.throughput_rps / b.stats.throughput_rps
        mix = a.target.get("mix", {})
        hits = f"hit ratio {a.cache.hit_ratio:.0%}" if a.cache and a.cache.hit_ratio is not None else "hit ratio unknown"
        yield _finding(f"{top} ÷ {bottom}, {a.stats.successes} requests drawn from {mix.get('photos', '?')} "
                       f"photos (Zipf, s={mix.get('s', '?')}), {a.load.concurrency} senders",
                       f"{num(a.stats.throughput_rps)} vs {num(b.stats.throughput_rps)} req/s", ratio,
                       f"{hits}; p50 {num(a.stats.latency.p50_ms)} vs {num(b.stats.latency.p50_ms)} ms",
                       _expect(Lesson.CACHE, device), a, b, "throughput_rps", top)


def _rollout(records: list[Record], device: str) -> Iterator[Finding]:
    for r in records:
        if r.config.get("run") != RunKind.ROLLOUT or r.rollout is None or r.failed:
            continue
        o, said = r.rollout, _expect(Lesson.ROLLOUT, device)
        first = "" if o.first_new_s is None else (
            f"the new version answered {o.first_new_s:.2f} s after the trigger"
            + ("" if o.switch_after_ready_s is None else ", as soon as it was ready" if o.switch_after_ready_s <= 0
               else f", {o.switch_after_ready_s:.2f} s after it was ready"))
        late = o.switch_after_ready_s is None or o.switch_after_ready_s > ROLLOUT_SWITCH_AIM_S
        verdict = (f"contradicts {said.notebook}, which expects no failed request" if o.failed or o.error
                   else f"contradicts {said.notebook}, which expects the new version in the answers within "
                        f"{ROLLOUT_SWITCH_AIM_S:g} s of being ready" if late
                   else judge(said, o.p99_ratio, stage=r.stage))
        yield Finding(f"{r.stage}, {', '.join(o.old_versions) or '?'} → {o.new_version or '?'} "
                      f"({r.config.get('to_variant', '')}), {r.load.label()}",
                      f"p99 {num(o.p99_during_ms)} during the swap vs {num(o.p99_before_ms)} ms before", o.p99_ratio,
                      "; ".join(filter(None, (f"{o.failed} of {r.stats.successes + o.failed} failed", first,
                                              o.error and f"the rollout failed: {o.error}"))), verdict)


def _autoscaling(records: list[Record], device: str) -> Iterator[Finding]:
    for r in records:
        if r.config.get("run") == RunKind.STEP_LOAD and r.timeline and r.timeline.replicas:
            low, high, said = min(r.timeline.replicas), max(r.timeline.replicas), _expect(Lesson.AUTOSCALING, device)
            yield Finding(f"{r.stage}, {r.load.label()}", f"running replicas min {low}, max {high}", None,
                          f"p99 {num(r.stats.latency.p99_ms)} ms",
                          "" if high > low else f"contradicts {said.notebook}, which expects more replicas at the "
                          "high step")


def _node_failure(records: list[Record], device: str) -> Iterator[Finding]:
    for r in records:
        if r.config.get("run") == RunKind.NODE_FAILURE and r.timeline:
            t, said = r.timeline, _expect(Lesson.NODE_FAILURE, device)
            recovered = t.recovery_s is not None and bool(r.stats.successes)
            yield Finding(f"{r.stage}, {r.load.label()}, a worker node killed",
                          f"{r.stats.error_count} failed, {r.stats.successes} ok", None,
                          f"recovered in {t.recovery_s:.1f} s" if recovered else "",
                          "" if recovered else f"contradicts {said.notebook}, which expects the requests to "
                          "succeed again")


# The report's lessons, in its order: every one of the catalogue's (a test holds it).
LESSONS: tuple[LessonReport, ...] = (
    LessonReport(Lesson.ONNX, "PyTorch → ONNX Runtime", _throughput(Lesson.ONNX)),
    LessonReport(Lesson.BATCHING, "Dynamic batching", _throughput(Lesson.BATCHING, lambda a, b: (
        f"mean batch {num(a.breakdown.mean_batch_size, 1)}" if a.breakdown and a.breakdown.mean_batch_size else ""))),
    LessonReport(Lesson.INSTANCES, "More instances (Triton)", _throughput(Lesson.INSTANCES)),
    *(LessonReport(Lesson.of_variant(v), f"Model variant {v} instead of fp32", _variant(v)) for v in VARIANTS),
    LessonReport(Lesson.SERVER_PREPROCESSING, "Preprocessing on the server (ensemble)", _throughput(Lesson.SERVER_PREPROCESSING)),
    LessonReport(Lesson.REPLICAS, "More Ray Serve replicas", _throughput(Lesson.REPLICAS)),
    LessonReport(Lesson.PROXY, "Ray Serve's proxy in front of the same service", _proxy),
    LessonReport(Lesson.AUTOSCALING, "Autoscaling under a step load", _autoscaling),
    LessonReport(Lesson.NODE_FAILURE, "A worker node dies mid-run", _node_failure),
    LessonReport(Lesson.QUEUEING, "Open-loop load near capacity", _queueing),
    LessonReport(Lesson.SHEDDING, "A bounded queue under load above capacity", _shedding),
    LessonReport(Lesson.CACHE, "A response cache under a skewed mix of photos", _cached),
    LessonReport(Lesson.ROLLOUT, "A new model version rolled out under load", _rollout),
)


def findings(records: list[Record]) -> list[tuple[LessonReport, list[Finding]]]:
    """Every lesson with what this run measured of it ([]: not measured); a CPU run leaves out the GPU's."""
    device = fractions.device_of(records)
    return [(lesson, list(lesson.find(records, device))) for lesson in LESSONS
            if not (device == "cpu" and lesson.pairs and all(_needs_gpu(t, b) for t, b in lesson.pairs))]


def summary(records: list[Record], tables_file: str = "") -> list[str]:
    """The report's first section (``lessons.md.j2``) as Markdown lines."""
    device, found, pairs = fractions.device_of(records), findings(records), compare.pairs(records)
    measured, unmeasured, missing = [], [], []
    for lesson, fs in found:
        e = _expect(lesson.key, device)
        if not fs:
            unmeasured.append(lesson.title)
            continue
        notebooks = e.notebook or ", ".join(dict.fromkeys(notebook_of(t) for t, _ in lesson.pairs))
        measured.append((lesson.title, e.says, notebooks, [(f, verdict(f.ratio, f.spread)) for f in fs]))
        missing += [f"{t} ÷ {b}" for t, b in lesson.pairs if not any(f.pair.startswith(f"{t} ÷ {b},") for f in fs)
                    and not (device == "cpu" and _needs_gpu(t, b))]
    return TEMPLATES.get_template("lessons.md.j2").render(
        device=device, rule=RULE, noise=NOISE, too_noisy=TOO_NOISY, retry=RETRY, flagged=sum(bool(f.contradicts) for _, fs in found for f in fs),
        measured=measured, not_measured="; ".join(filter(None, (", ".join(unmeasured), ", ".join(missing)))),
        pairs=len(pairs), agree=sum(p.verdict == "agree" for p in pairs), tolerance=compare.TOLERANCE,
        failed=sum(bool(r.failed) for r in records), runs=len(records),
        stand_ins=len({r.stage for r in records if r.stand_in}), tables_file=tables_file).split("\n")[:-1]


H200_RUN = REPO_ROOT / "docs/records/gpu-h200-2026-11-28/records.jsonl"  # the one GPU run of the lab's stages here
SLACK = 1.25  # a graded ratio may stray this far beyond its predictions: none was measured on a P100 yet


@dataclass(frozen=True)
class Graded:
    """A ratio of the core path the class rubric grades (docs/class.md): the start of its ``Finding.pair``, its
    lesson, and the original lab's two steps whose throughputs give the P100's figure (``original_lab``), if any."""

    pair: str
    lesson: Lesson
    p100: tuple[str, str] | None = None
    points: int = 6

    def predictions(self) -> dict[str, float]:
        """Its ratio on the original lab's P100 and in the H200 run, where they have it: a P100 run's predictions."""
        said = {}
        if self.p100:
            top, bottom = ([f.value for f in original_lab.step(k).figures if f.measures == "throughput"][0]
                           for k in self.p100)
            said["P100, original lab"] = top / bottom
        if h200 := [f.ratio for _, fs in _h200() for f in fs if f.pair.startswith(self.pair)]:
            said["H200 run"] = h200[0]
        return said

    def bounds(self) -> tuple[float, float]:
        """Its range: the predictions widened by ``SLACK``, never past what the notebooks teach."""
        e, said = _expect(self.lesson, "gpu"), list(self.predictions().values())
        low, high = e.at_least * (1 - NOISE) if e.at_least else 0.0, e.at_most * (1 + NOISE) if e.at_most else 9e9
        return (max(min(said) / SLACK, low), min(max(said) * SLACK, high)) if said else (low, high)

    def points_for(self, ratio: float | None) -> float:
        """All its points in its range; half on the side the notebooks teach (a prediction may be off); else none."""
        (low, high), e = self.bounds(), _expect(self.lesson, "gpu")
        if ratio is None:
            return 0.0
        return self.points * (1.0 if low <= ratio <= high else 0.5 * (not e.contradicted(ratio)))


@cache
def _h200() -> list[tuple[LessonReport, list[Finding]]]:
    return findings(read_records(H200_RUN)) if H200_RUN.is_file() else []


RUBRIC = (
    Graded("fastapi-onnx ÷ fastapi-pt,", Lesson.ONNX, ("fastapi-onnx-sequential", "fastapi-pt-sequential")),
    Graded("onnx-1 ÷ pt-1,", Lesson.ONNX, ("onnx-1-concurrency-1", "pt-1-concurrency-1")),
    Graded("pt-2x2 ÷ pt-1,", Lesson.INSTANCES, ("pt-2x2-concurrency-8", "pt-1-concurrency-8")),
    Graded("onnx-1, Poisson", Lesson.QUEUEING),
)
