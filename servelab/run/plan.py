"""What a lab run measures, and for how long: its stages, its ``Plan`` and its ``Budget`` (``--budget``)."""

import time
from dataclasses import dataclass
from typing import Any

from servelab.core.catalogue import CATALOGUE, Lesson, Stage
from servelab.measure.measure_stage import Sweep
from servelab.measure.perf_analyzer import Windows
from servelab.measure.records import Load
from servelab.run.families import adapter_of

LAB_STAGES: tuple[Stage, ...] = tuple(s for s in CATALOGUE if s.in_lab)
TOUR_STAGES: tuple[Stage, ...] = tuple(s for s in LAB_STAGES if s.tour)
GPU_CHECK_STAGES: tuple[Stage, ...] = tuple(s for s in LAB_STAGES if s.gpu_check)


def _each_way_in(stages: tuple[Stage, ...]) -> tuple[str, ...]:
    """The first stage per way perf_analyzer is fed, and every stage with both arrival processes: each of its paths."""
    firsts: dict[tuple, str] = {}
    for s in stages:
        if (way := adapter_of(s).fed(s)) is not None:
            firsts.setdefault(way, s.name)
    return tuple(s.name for s in stages if s.name in firsts.values() or adapter_of(s).both_arrivals(s))


def _teach_batching(stages: tuple[Stage, ...]) -> tuple[str, ...]:
    """The stages among ``stages`` perf_analyzer can measure that teach batching: where it is the second opinion."""
    return tuple(s.name for s in stages if adapter_of(s).fed(s) is not None and s.lesson == Lesson.BATCHING)


def warm_up(seconds: float) -> dict[str, Any]:
    """A run's warm-up window: ``seconds`` of sending at its concurrency, never measured (``Load.warmup_s``)."""
    return {"warmup": 0, "warmup_s": seconds}


@dataclass(frozen=True)
class Plan:
    """How much each stage is measured, in seconds: every closed-loop run is a discarded warm-up of ``warmup_s``,
    then ``Windows.COUNT`` windows (both clients alike), never a count of requests alone."""

    name: str  # "tour", "full", "quick" or "gpu-check", named in the run's record (run.json)
    warmup_s: float = 1.0
    windows: Windows = Windows(stability_pct=1000.0, max_trials=3, window_s=1.0)
    sweep: Sweep = Sweep()
    # Open loop at these fractions of the capacity, each for this long.
    poisson_fractions: tuple[float, ...] = (0.5, 0.9)
    poisson_seconds: float = 3.0
    pa_timeout_s: float = 180.0  # one perf_analyzer run at most
    # Ray Serve: the step load's (low, high, low) seconds, and the node-failure run's length.
    steps_s: tuple[float, float, float] = (10.0, 20.0, 25.0)
    failure_s: float = 20.0
    # The Triton stages perf_analyzer measures too, after servelab's client (None: every one).
    perf_analyzer: tuple[str, ...] | None = None
    # What it measures when no stage is named.
    stages: tuple[Stage, ...] = LAB_STAGES
    # The overload case (``catalogue.OVERLOADED``): seconds of open-loop load above capacity, per run; 0: none.
    overload_s: float = 0.0
    cache: bool = False  # the cache case (``catalogue.CACHED``): a skewed mix of photos without and with a cache
    cache_s: float = 6.0  # the cache case's measured seconds (longer than a run: photos must come round again)
    # The rollout case (``catalogue.ROLLED``): (the swap's start, the load's seconds, seconds after the swap); ().
    rollout_s: tuple[float, ...] = ()
    # Each lesson's two stages alternating in this many rounds (``Lab.rounds``), each run's windows this long.
    rounds: int = 3
    round_window_s: float = 0.5

    @classmethod
    def tour(cls) -> "Plan":
        # `make lab`: each lesson once, in minutes on 2 CPUs (the tour stages): three windows per run (shorter where
        # the rounds judge, which pay for them), the sweep to the knee (2-3 doublings on 2 CPUs); perf_analyzer as the second opinion on the stage that
        # teaches batching, over three windows whatever their spread: a tour compares, it certifies nothing.
        return cls("tour", warmup_s=0.5, windows=Windows(1000.0, 3, 0.6), sweep=Sweep(start=2),
                   poisson_fractions=(0.5, 0.9), poisson_seconds=3.0, pa_timeout_s=90.0, steps_s=(5.0, 10.0, 10.0),
                   failure_s=12.0, perf_analyzer=_teach_batching(TOUR_STAGES), stages=TOUR_STAGES, rounds=3,
                   round_window_s=0.5)

    @classmethod
    def full(cls) -> "Plan":
        # Every load, both clients on every Triton stage; windows of 2 s that must agree within 20 % instead of
        # perf_analyzer's 10 % (two CPUs shared by client and server are noisy), up to 9 windows.
        return cls("full", warmup_s=1.0, windows=Windows(20.0, 9, 2.0), sweep=Sweep(start=2),
                   poisson_fractions=(0.5, 0.8, 0.95), poisson_seconds=6.0, overload_s=10.0, cache=True,
                   cache_s=12.0, rollout_s=(3.0, 10.0, 3.0), rounds=5, round_window_s=1.0)

    @classmethod
    def quick(cls) -> "Plan":
        # A smoke run (tests): every stage with servelab's client, short windows, a sweep of two levels (one at a
        # time, then 2 senders); perf_analyzer, three windows whatever their spread, on one stage per way it is fed
        # (the rest is the same command on another model).
        return cls("quick", warmup_s=0.2, windows=Windows(1000.0, 3, 0.3), sweep=Sweep(start=2, max_levels=2),
                   poisson_fractions=(0.5,), poisson_seconds=1.0, pa_timeout_s=60.0, steps_s=(2.0, 4.0, 4.0),
                   failure_s=6.0, perf_analyzer=_each_way_in(LAB_STAGES), overload_s=1.5, cache=True, cache_s=3.0,
                   rollout_s=(1.0, 2.0, 0.5), rounds=1, round_window_s=0.3)

    @classmethod
    def gpu_check(cls) -> "Plan":
        # `make gpu-check` on a lent GPU (minutes in all, the lab ~2.5 of them): each GPU lesson once; windows of half
        # a second (hundreds of requests each there; three of them span the monitors' samples), the sweep from 8
        # senders (one at a time first) to the knee or 8 x the cores, perf_analyzer beside servelab's client on the
        # stage that teaches batching.
        return cls("gpu-check", warmup_s=0.3, windows=Windows(1000.0, 3, 0.5), sweep=Sweep(start=8),
                   poisson_fractions=(0.5,), poisson_seconds=1.5, pa_timeout_s=60.0,
                   perf_analyzer=_teach_batching(GPU_CHECK_STAGES), stages=GPU_CHECK_STAGES, rounds=2)

    def with_perf_analyzer(self, stage: Stage) -> bool:
        return adapter_of(stage).fed(stage) is not None and (self.perf_analyzer is None or stage.name in self.perf_analyzer)

    def load(self, concurrency: int, window_s: float | None = None) -> Load:
        """One closed-loop run of this plan (one request at a time at 1): its warm-up window, then its windows (of
        ``window_s``, else the plan's)."""
        window = dict(duration_s=Windows.COUNT * (window_s or self.windows.window_s), **warm_up(self.warmup_s))
        if concurrency == 1:
            return Load.sequential(None, **window)
        return Load.closed(concurrency, None, **window)


PLANS = {"tour": Plan.tour, "full": Plan.full, "quick": Plan.quick, "gpu-check": Plan.gpu_check}
BATCH = 16  # images per request in the batched runs (perf_analyzer's -b 16)
ROLLOUT_WARMUP = 16  # the rollout case's warm-up requests (one per sender)
CACHE_CONCURRENCY = 8  # the cache case's senders where the stage has no capacity measured


class Budget:
    """How long a run may take (None: no limit): a stage starts only if the longest so far (or ``first_guess_s``)
    still fits, so that none is half-measured."""

    def __init__(self, seconds: float | None, first_guess_s: float = 30.0, clock=time.monotonic):
        self.seconds, self.first_guess_s, self.clock = seconds, first_guess_s, clock
        self.started = self._since = clock()
        self.longest_s = 0.0

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - (self.clock() - self.started)

    def why_not(self) -> str | None:
        """None when one more stage fits, else why not."""
        need = self.longest_s or self.first_guess_s
        if self.left() >= need:
            return None
        return (f"the time budget ({self.seconds:g} s) has {max(self.left(), 0):.0f} s left and a stage "
                f"{'took up to' if self.longest_s else 'is expected to take'} {need:.0f} s")

    def mark(self) -> None:
        """A stage (or the server it runs on) starts now."""
        self._since = self.clock()

    def took(self) -> None:
        """The stage started at the last ``mark`` is done."""
        self.longest_s = max(self.longest_s, self.clock() - self._since)
        self._since = self.clock()


def select_stages(names: str | None, plan: Plan | None = None) -> list[Stage]:
    """The named stages, or else the plan's (the tour's by default)."""
    if not names:
        return list((plan or Plan.tour()).stages)
    by_name = {s.name: s for s in LAB_STAGES}
    if unknown := [n for n in names.split(",") if n not in by_name]:
        raise SystemExit(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(by_name)}")
    return [by_name[n] for n in names.split(",")]
