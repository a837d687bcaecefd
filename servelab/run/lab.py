"""``servelab lab``: the whole lab, locally, one stage after another, on the CPU or the GPU (``--device``), each
server a child process stopped by PID (also on Ctrl-C); a ``Plan`` and a ``Budget`` say how much and how long.

Per stage: its *capacity*, found by saturation (``sweep_capacity``), then Poisson arrivals at fractions of it, where
queueing delay appears well before saturation; then each lesson's two stages alternate in rounds (``Lab.rounds``), at
the senders its question needs. perf_analyzer, where it can feed a stage, measures the same loads right after ours. What
this environment cannot run (``preflight``) is skipped, saying why. Each record names the device and where the stage
really ran (``runs_on``, as the server reports it), never what was asked for."""

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

from servelab.core import catalogue, simulated_gpu
from servelab.core.artifacts import ArtifactPaths, Manifest, ModelSource, build_artifacts, load_manifest, write_atomic
from servelab.core.catalogue import Lesson, Stage
from servelab.core.hardware import Device, NoGpu, describe, gpu_count, stack
from servelab.core.paths import DEFAULT_IMAGE, REPO_ROOT
from servelab.core.settings import get_settings
from servelab.core.variants.build import build_variants
from servelab.measure import fractions
from servelab.measure.limit import LIMIT_FILE, Limit
from servelab.measure.loadgen import overload_load, rollout_load
from servelab.measure.measure_stage import (
    Labels,
    alternate,
    measure_stage,
    model_stand_in,
    perf_analyzer_client,
    servelab_client,
    stand_in_note,
    sweep_capacity,
    windowed,
)
from servelab.measure.monitoring import run_series
from servelab.measure.perf_analyzer import PerfAnalyzerOptions, Windows
from servelab.measure.records import Load, Record, RunKind, append_record
from servelab.measure.targets import PhotoMix
from servelab.report import compare
from servelab.report.lessons import IN_ROUNDS, round_levels, summary
from servelab.report.render import render_report, summary_table
from servelab.run.families import Adapter, Runs, adapter_of
from servelab.run.lab_metrics import LabPrometheus, Scraped
from servelab.run.lab_run import RUN_FILE, LabRun, machine_line
from servelab.run.plan import BATCH, CACHE_CONCURRENCY, PLANS, ROLLOUT_WARMUP, Budget, Plan, select_stages, warm_up
from servelab.run.reference import device_here, limit_here
from servelab.servers.fastapi.cache import LocalRedis, find_redis

RESULTS = REPO_ROOT / "results"


class Lab:
    def __init__(self, plan: Plan, out_dir: Path, image: Path = DEFAULT_IMAGE, log=print, device: Device = "cpu",
                 budget: Budget | None = None):
        self.plan, self.out_dir, self.log, self.device, self.budget = plan, out_dir, log, device, budget or Budget(None)
        # Prometheus scrapes each server while it runs; absent or down, each record says so.
        self.prometheus = LabPrometheus(out_dir / "prometheus", log)
        self.scraped: Scraped | None = None  # the server being measured now
        self.image, self.image_name = image.read_bytes(), image.name
        self.records_path, self.logs = out_dir / "records.jsonl", out_dir / "logs"
        self.records: list[Record] = []
        self.failures: list[str] = []
        self.skipped: dict[str, str] = {}  # part -> why (``preflight``)
        self.ran: list[str] = []  # the stages measured (those needing a GPU left out on the CPU)
        self.not_run: dict[str, str] = {}  # stage -> why it was not started (the time budget)
        self.overloaded: set[str] = set()  # stages that also get the overload case, and their bounded twin (``run``)
        self.cached: set[str] = set()  # stages that also get the cache case, and their twin with a cache (``run``)
        self.rolled: set[str] = set()  # stages that also get the rollout case (``run``)
        self.redis: LocalRedis | None = None  # the FastAPI cache case's, while the run lasts

    # --- measurements ----------------------------------------------------------------------------

    def labels(self, stage: Stage, manifest: Manifest, pid: int | None, runs_on: str, extra: dict | None = None) -> Labels:
        """What each of the stage's records carries: its settings, where it ran, its server, its stand-ins."""
        config = {"about": stage.about, **adapter_of(stage).settings(stage),
                  **({"variant": stage.variant} if stage.variant else {}),
                  "device": self.device, "runs_on": runs_on, **(extra or {})}
        settings = get_settings()
        simulated = settings.simulated_gpu_ms and simulated_gpu.label(settings.simulated_gpu_ms, settings.max_batch_size)
        return Labels(stage.name, config, stand_in_note(model_stand_in(manifest), adapter_of(stage).stand_in(stage),
                                                        simulated or None), pid)

    @contextmanager
    def on(self, adapter: Adapter, stage: Stage, manifest: Manifest, extra: dict | None = None,
           switch: bool = True) -> Iterator[tuple[Any, Labels]]:
        """``adapter``'s server at ``stage``, its series scraped while the block runs: yields the stage's target and
        its records' labels (``extra`` in their config)."""
        if switch:
            adapter.switch(stage)
        self.scraped = adapter.scraped
        try:
            runs_on, said = adapter.runs_on(stage)
            yield (adapter.target(stage, self.image, self.image_name),
                   self.labels(stage, manifest, adapter.pid, runs_on, {**(said or {}), **(extra or {})}))
        finally:
            self.scraped = None

    def measure(self, stage: Stage, target, labels: Labels) -> float | None:
        """The stage's loads; returns its capacity (the top of its concurrency sweep)."""
        self.log(f"    runs on: {labels.config['runs_on']}")
        p = self.plan
        # Both clients where the plan has perf_analyzer measure the stage, over the same windows, it right after ours.
        ours = windowed(p.windows)
        others = ([perf_analyzer_client(PerfAnalyzerOptions(windows=p.windows, timeout_s=p.pa_timeout_s))]
                  if p.with_perf_analyzer(stage) and "perf_analyzer" not in self.skipped else [])
        clients = [ours, *others]

        def measured(t, loads: list[Load], by: list = clients) -> list[Record]:
            # Records are written by keep, once the server's own series are attached.
            return measure_stage(t, loads, labels, by, self.keep)

        if stage.lesson == Lesson.SHEDDING:  # bounded: its service time, then the load above capacity its baseline had
            measured(target, [p.load(1)], clients[:1])
            self.overload(stage, target, labels, fractions.capacity(self.records, stage.baseline))
            return None
        swept = [r for r in sweep_capacity(target, p.load, labels, p.sweep, ours, self.keep, others)
                 if r.tool == "servelab"]
        top = fractions.capacity(self.records, stage.name)
        capacity = top.stats.throughput_rps if top and top.stats.throughput_rps else None
        if swept and fractions.CAPACITY in swept[-1].config:
            said = swept[-1].config[fractions.CAPACITY]
            self.log(f"    capacity: {said['throughput_rps']:.1f} req/s at {fractions.senders(top)}; sweep ended at "
                     f"{swept[-1].load.concurrency} senders: {said['stopped']}")
        both_arrivals = adapter_of(stage).both_arrivals(stage)
        if adapter_of(stage).batches(stage):
            measured(replace(target, batch=BATCH), [p.load(1)])
        for seed, fraction in enumerate(p.poisson_fractions if capacity else ()):
            rate = round(fraction * capacity, 1)
            window = dict(requests=max(5, round(rate * p.poisson_seconds)), seed=seed, **warm_up(p.warmup_s))
            # perf_analyzer only where both arrival processes are measured: the lab's rate step.
            measured(target, [Load.open(rate, arrivals, **window)
                              for arrivals in (("constant", "poisson") if both_arrivals else ("poisson",))],
                     clients if both_arrivals else clients[:1])
        if stage.name in self.overloaded:
            self.overload(stage, target, labels, top)
        return capacity

    def overload(self, stage: Stage, target, labels: Labels, capacity: Record | None) -> None:
        """The overload case (``overload_load``), unbounded on an ``OVERLOADED`` stage, bounded on its twin."""
        if capacity is None or not capacity.stats.throughput_rps:
            self.log(f"    overload: not run: no capacity measured for {stage.baseline or stage.name} in this run")
            return
        load, config = overload_load(capacity.stats.throughput_rps, self.plan.overload_s)
        over = labels._replace(config={**(labels.config or {}), **config, "bound": catalogue.queue_bound(stage)})
        measure_stage(target, [load], over, [servelab_client(timeline_bin_s=1.0, keep_requests=True)], self.keep)

    def measure_on(self, adapter: Adapter, stage: Stage, manifest: Manifest) -> float | None:
        """Switch ``adapter``'s server to ``stage`` and measure it there; returns its capacity."""
        with self.on(adapter, stage, manifest) as (target, labels):
            return self.measure(stage, target, labels)

    def keep(self, measure: Callable[[], Record], load: Load) -> Record:
        """Run one measurement of ``load`` and keep its record: the server's own series attached, written, logged."""
        started, called = time.monotonic(), time.time()
        before = self.prometheus.before(self.scraped)
        record = measure()
        record.prometheus = self.prometheus.after(record, before, self.scraped, called)
        append_record(self.records_path, record)
        self.records.append(record)
        s = record.stats
        what = f"{record.tool:<13} {load.label() + (f' x{record.batch}' if record.batch > 1 else ''):<26}"
        if record.failed:
            self.log(f"    {what} FAILED: {record.failed.splitlines()[0][:200]}")
            return record
        p50, p99 = (f"{v:7.1f}" if v is not None else "    n/a" for v in (s.latency.p50_ms, s.latency.p99_ms))
        self.log(f"    {what} p50 {p50} ms   p99 {p99} ms   {s.throughput_rps:7.1f} req/s   "
                 f"errors {s.error_count}   ({time.monotonic() - started:.0f} s)")
        return record

    # --- the whole run ---------------------------------------------------------------------------

    def run(self, stages: list[Stage], manifest: Manifest, paths: ArtifactPaths) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.records_path.unlink(missing_ok=True)  # this run's records only
        self.skipped = preflight(stages)
        names = {s.name for s in stages}
        # The overload and cache cases, on the stages of this run that have them (a plan's choice).
        self.overloaded = set(catalogue.OVERLOADED) & names if self.plan.overload_s else set()
        self.cached = set(catalogue.CACHED) & names if self.plan.cache else set()
        self.rolled = set(catalogue.ROLLED) & names if self.plan.rollout_s else set()
        for part, why in self.skipped.items():
            self.log(f"[{part}] skipped: {why}")
        with ExitStack() as stack:
            stack.enter_context(self.prometheus)
            # Soft, as Prometheus is: without redis-server the FastAPI cache case is skipped, saying so.
            if any(adapter_of(s).redis for s in stages if s.name in self.cached) and (binary := find_redis(self.log)):
                self.redis = stack.enter_context(LocalRedis(binary, self.logs / "redis"))
            self._run_stages(stages, manifest, paths)
        self.ran = [name for name in self.ran if name not in self.not_run]

    def _fits(self, stage: Stage) -> bool:
        """Whether the stage fits the time budget; one that does not is named, with why."""
        if why := self.budget.why_not():
            self.not_run[stage.name] = why
            self.log(f"[{stage.name}] not run: {why}")
        return why is None

    def _run_stages(self, stages: list[Stage], manifest: Manifest, paths: ArtifactPaths) -> None:
        if self.device == "cpu":
            why = "nvidia-smi lists none" if gpu_count() == 0 else "the lab runs with --device cpu"
            for stage in (s for s in stages if s.needs_gpu):
                self.log(f"[{stage.name}] skipped: it needs a GPU (float16 has no fast path on a CPU) and {why}")
            stages = [s for s in stages if not s.needs_gpu]
        self.ran = [s.name for s in stages]
        # The families in the catalogue's order, each on one adapter (and its own runs beside the loads).
        for name in catalogue.FAMILIES:
            if (ours := [s for s in stages if s.family == name]) and name not in self.skipped:
                adapter = adapter_of(ours[0]).in_lab(self.logs, self.device, self.prometheus, paths.manifest)
                self._run_family(adapter, ours, manifest, adapter.runs(self, manifest))

    def _run_family(self, adapter: Adapter, stages: list[Stage], manifest: Manifest, runs: Runs) -> None:
        """One family's stages on one adapter, each if it fits the budget; a failed stage is reported and the
        others go on, a server that does not start fails the family."""
        if not stages or not self._fits(stages[0]):
            for stage in stages[1:]:
                self._fits(stage)  # none fits either, and each is named
            return

        def run_all() -> None:
            self.budget.mark()  # the server's start-up counts towards the first stage's time
            with adapter.start(stages[0]):
                runs.started()
                for i, stage in enumerate(stages):
                    if i and not self._fits(stage):  # the first was checked before the server started
                        continue
                    self.log(f"[{stage.name}] {stage.about}")
                    self.guard(stage.name, lambda stage=stage: self._stage(adapter, stage, manifest, runs))
                    self.budget.took()
                runs.finish()

        self.guard(stages[0].family, run_all)

    def _stage(self, adapter: Adapter, stage: Stage, manifest: Manifest, runs: Runs) -> None:
        runs.after(stage, self.measure_on(adapter, stage, manifest))
        if stage.name in self.cached:
            self.guard(stage.name, lambda: self.cache_case(adapter, stage, manifest))
        if stage.name in self.overloaded:  # the same server, its queue bounded, under the same overload
            shed = catalogue.bounded(stage)
            self.log(f"[{shed.name}] {shed.about}")
            self.guard(shed.name, lambda: self.measure_on(adapter, shed, manifest))
        # The rounds before the rollout: a rollout leaves a second version of a Triton model loaded, which
        # switching back to the stage for its round would wait out in vain.
        self.guard(stage.name, lambda: self.rounds(adapter, stage, manifest))
        if stage.name in self.rolled:
            self.guard(stage.name, lambda: self.rollout_case(adapter, stage, manifest))

    def rounds(self, adapter: Adapter, stage: Stage, manifest: Manifest) -> None:
        """Each lesson ``stage`` completes in its family: both stages alternating in the plan's rounds, ``stage`` (served
        now) first, each at the senders the lesson's question needs (``round_levels``)."""
        p = self.plan
        for lesson, pair in ((k, pair) for k in IN_ROUNDS for pair in catalogue.compared(k) if stage.name in pair):
            caps = [fractions.capacity(self.records, name) for name in pair]
            if not all(caps) or any(catalogue.STAGES[name].family != stage.family for name in pair):
                continue
            levels, compares = round_levels(lesson, *(c.load.concurrency for c in caps))
            self.log(f"[{' ÷ '.join(pair)}] {p.rounds} rounds alternating, {compares}")

            def side(name: str, level: int, n: int, pair=pair, compares=compares) -> list[Record]:
                extra = {"run": RunKind.ROUNDS, "pair": " ÷ ".join(pair), "round": n, "compares": compares}
                with self.on(adapter, catalogue.STAGES[name], manifest, extra) as (target, labels):
                    return measure_stage(target, [p.load(level, p.round_window_s)], labels,
                                         [windowed(Windows(1000.0, 3, p.round_window_s))], self.keep)
            sides = [partial(side, name, level) for name, level in zip(pair, levels)]
            alternate(sides if pair[0] == stage.name else sides[::-1], p.rounds)

    def cache_case(self, adapter: Adapter, stage: Stage, manifest: Manifest) -> None:
        """The same skewed mix of photos on ``stage``, then ``with_cache`` (Triton's own cache, or Redis)."""
        if adapter.redis and self.redis is None:
            self.log(f"    cache: {catalogue.cached_name(stage.name)} not run: no redis-server (`make redis`)")
            return
        mix, p = PhotoMix.zipf(seed=0), self.plan
        # Longer than a closed-loop run (a hit ratio needs photos to come round again), at the stage's capacity.
        top = fractions.capacity(self.records, stage.name)
        window = dict(duration_s=p.cache_s, **warm_up(p.warmup_s))
        load = (Load.closed(top.load.concurrency if top else CACHE_CONCURRENCY, None, **window)
                if not top or top.load.mode == "closed" else Load.sequential(None, **window))
        cached = catalogue.with_cache(stage, self.redis.url if adapter.redis else "")
        for s in (stage, cached):
            if s is cached:
                self.log(f"[{s.name}] {s.about}")
            with self.on(adapter, s, manifest, {"run": RunKind.CACHE}, switch=s is cached) as (target, labels):
                measure_stage(replace(target, mix=mix), [load], labels, [servelab_client()], self.keep)

    def rollout_case(self, adapter: Adapter, stage: Stage, manifest: Manifest) -> None:
        """A new version of the stage's model (the ``ROLLED`` variant) rolled out under 16 closed-loop senders."""
        variant = catalogue.ROLLED[stage.name]
        self.log(f"[{stage.name}] rollout under load: a new version serving {variant}")
        at_s, seconds, after_s = self.plan.rollout_s
        load, config, trigger = rollout_load(lambda: adapter.roll_out(stage, variant), at_s, seconds, after_s,
                                             concurrency=16, warmup=ROLLOUT_WARMUP)
        client = servelab_client(timeline_bin_s=0.5, keep_requests=True, trigger=trigger)
        with self.on(adapter, stage, manifest, {**config, "to_variant": variant}) as (target, labels):
            measure_stage(target, [load], labels, [client], self.keep)

    def guard(self, name: str, work) -> None:
        """A failing stage (or family: ``name``) is reported and the lab goes on; Ctrl-C stops everything."""
        try:
            work()
        except Exception as exc:  # not KeyboardInterrupt (a BaseException): Ctrl-C goes on up
            self.failures.append(f"{name}: {type(exc).__name__}: {exc}")
            self.log(f"    FAILED: {type(exc).__name__}: {str(exc).splitlines()[0]} (log in {self.logs})")


def preflight(stages: list[Stage]) -> dict[str, str]:
    """The parts of these stages this environment cannot run (each family's ``missing``), with why."""
    return {part: why for family in dict.fromkeys(map(adapter_of, stages)) for part, why in family.missing().items()}


def _model(paths: ArtifactPaths) -> Manifest:
    """The model built from the lab's weights, else the offline stand-in, with its variants (built if needed)."""
    staging = get_settings().triton_model_repository
    manifest = load_manifest(paths.manifest) if paths.manifest.exists() else None
    if manifest is not None and not manifest.stand_in:
        print(f"model: {manifest.name} from {manifest.source['location']}")
    else:
        manifest = build_artifacts(ModelSource("offline"), paths.manifest.parent, staging)
    build_variants(paths.manifest.parent, manifest, staging)
    return manifest


def run_lab(args) -> int:
    """``servelab lab``: the model, every selected stage on the chosen device, the report; 1 if a stage failed."""
    started = time.monotonic()
    budget = Budget(args.budget)  # from the command's start: building the model counts too
    plan = PLANS[args.plan or ("full" if args.full else "quick" if args.quick else "tour")]()
    if args.concurrency:  # these levels instead of the sweep to the knee
        plan = replace(plan, sweep=replace(plan.sweep, fixed=tuple(int(c) for c in args.concurrency.split(","))))
    stages = select_stages(args.stages, plan)
    try:
        device = device_here(args.device or get_settings().lab_device)
    except NoGpu as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    paths = ArtifactPaths.in_dir(get_settings().model_dir)
    manifest = _model(paths)
    if manifest.stand_in:
        print(f"model: {manifest.description}")
    models_s = time.monotonic() - started

    print(f"device: {device}; plan: {plan.name}, {len(stages)} stages; " + "; ".join(describe(stack())))
    lab = Lab(plan, args.out, args.image, device=device, budget=budget)
    lab.run(stages, manifest, paths)
    # The limit is what the stages are set against: with none measured (all cut by --budget), not worth its servers.
    limit = measure_limit(paths, args.image, lab.logs / "limit", device) if lab.records else None
    if limit:
        write_atomic(args.out / LIMIT_FILE, lambda tmp: tmp.write_text(limit.model_dump_json(indent=1) + "\n"))
    report = render_report(lab.records, args.out, sources=[lab.records_path], limit=limit,
                           skipped={**lab.skipped, **{f"{name} (not run)": why for name, why in lab.not_run.items()}})
    print(f"\n{summary_table(lab.records)}")
    if found := compare.pairs(lab.records):
        print(f"\nperf_analyzer vs servelab, same stage and load (ratio = perf_analyzer / servelab; aim "
              f"{1 - compare.TOLERANCE:.1f}-{1 + compare.TOLERANCE:.1f}):")
        print(compare.text(found))
    found = run_series.agreements(lab.records)
    print(f"\nprometheus: {run_series.summary(found)}" if found else
          f"\nprometheus: no server-side series ({lab.prometheus.note or 'nothing read back'})")
    run = LabRun(plan=plan.name, stages=lab.ran, device=device, machine=machine_line(),
                 finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 models_s=round(models_s, 1), total_s=round(time.monotonic() - started, 1), failures=lab.failures,
                 summary=summary(lab.records), not_run=lab.not_run)
    run.write(args.out / RUN_FILE)
    print(f"\n{report} and its plots; raw records in {lab.records_path}; server logs in {lab.logs}")
    print(run.timing())
    for name, why in lab.not_run.items():
        print(f"NOT RUN {name}: {why}")
    for failure in lab.failures:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if lab.failures else 0


def measure_limit(paths: ArtifactPaths, photo: Path, logs: Path, device: Device) -> Limit | None:
    """This machine's limit for the report (``limit_here``), a few seconds; one not measured is said, never fatal."""
    try:
        limit = limit_here(paths.onnx.parent, photo, logs, LIMIT_SECONDS, device)
    except Exception as exc:  # noqa: BLE001 (a measurement that fails is recorded, never fatal)
        print(f"limit: not measured ({type(exc).__name__}: {exc})")
        return None
    print(f"limit: {limit.rps:.1f} req/s, bound by {limit.binds}")
    return limit


LIMIT_SECONDS = 0.5  # of each of the limit's costs in a lab run
