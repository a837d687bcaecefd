"""One routine that measures a stage, for every runner (``servelab lab``, the notebooks, ``servelab benchmark``):
``measure_stage`` runs each load with each client in turn (servelab's, then perf_analyzer on the same server state),
each record kept by the runner's ``keep``; ``alternate`` runs it on two stages in rounds; ``windowed`` measures in
windows of seconds, as perf_analyzer does; ``sweep_capacity`` finds a capacity, its curve in ``config["capacity"]``."""

import asyncio
import json
import os
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import count, islice, takewhile
from typing import Any

from servelab.core.artifacts import Manifest
from servelab.core.hardware import options_in_force, runs_on_fastapi
from servelab.core.procs import DIRECT
from servelab.measure.fractions import CAPACITY, WINDOWS, curve_point
from servelab.measure.loadgen import ClientOptions, Labels, run_bench
from servelab.measure.perf_analyzer import PerfAnalyzerOptions, Windows, run_perf_analyzer
from servelab.measure.records import Load, Record
from servelab.measure.targets import Target


def model_stand_in(manifest: Manifest) -> str | None:
    """The model's own note where it is the offline stand-in, not the lab's weights."""
    return manifest.description if manifest.stand_in else None


def stand_in_note(*notes: str | None) -> str | None:
    """Why a stage's numbers are not the lab node's own, from every stand-in it runs (None: none)."""
    return "; ".join(note for note in notes if note) or None


def served_runtime(url: str) -> tuple[str, dict[str, Any]]:
    """Where the FastAPI app at ``url`` (a FastAPI stage's, or a Ray Serve replica's) really runs, as its
    /ready says, and the options its ONNX Runtime providers really hold (for its records' config)."""
    runtime = json.loads(DIRECT.open(f"{url}/ready", timeout=30).read())["runtime"]
    return runs_on_fastapi(runtime), options_in_force(runtime)


# A client measures one load: (target, load, labels, the records this load has so far) -> its record.
Client = Callable[[Any, Load, Labels, list[Record]], Record]


def servelab_client(**options: Any) -> Client:
    """servelab's load generator (``run_bench``), its ``ClientOptions`` built once from ``options``."""
    client = ClientOptions(**options)
    return lambda target, load, labels, earlier: run_bench(target, load, labels, client)


def perf_analyzer_client(options: PerfAnalyzerOptions = PerfAnalyzerOptions()) -> Client:
    """perf_analyzer on a Triton target, its time windows (where ``options`` gives some) stretched to hold a few
    requests at the rate servelab's client just measured of the same load. What it ran is in its command."""
    def run(target: Any, load: Load, labels: Labels, earlier: list[Record]) -> Record:
        rps = next((r.stats.throughput_rps for r in reversed(earlier) if r.tool == "servelab" and not r.failed), None)
        fitted = replace(options, windows=options.windows.fitted(rps)) if options.windows is not None else options
        return run_perf_analyzer(target, load, labels, fitted)
    return run


def kept(measure: Callable[[], Record], load: Load) -> Record:
    """Keep a record as it is (a runner with nothing to add to it)."""
    return measure()


def measure_stage(target: Any, loads: Iterable[Load], labels: Labels, clients: Sequence[Client] = (servelab_client(),),
                  keep: Callable[[Callable[[], Record], Load], Record] = kept) -> list[Record]:
    """Each load with each client, in order; ``keep(measure, load)`` runs each measurement (it may read
    the server before and after it) and returns its record. Every record, in the order made."""
    records: list[Record] = []
    for load in loads:
        done: list[Record] = []
        for client in clients:
            done.append(keep(lambda client=client: client(target, load, labels, list(done)), load))
        records += done
    return records


def alternate(sides: Sequence[Callable[[int], list[Record] | None]], rounds: int) -> list[Record]:
    """Stages side by side in time (``side(round)`` measures one; a side that keeps its own tally returns None):
    A B, B A, A B… so that a shared machine's drift falls on all alike, and each turn saves a switch of server."""
    records: list[Record] = []
    for n in range(rounds):
        for side in sides if n % 2 == 0 else sides[::-1]:
            records += side(n) or []
    return records


def alternate_windows(windows: Sequence[Callable[[float], object]], rounds: int, seconds: float) -> None:
    """``alternate`` for the benchmarks' windows (``window(s)`` measures one of ``seconds / rounds`` s, tallied
    by itself): one loop of rounds for every side-by-side measurement, so all share one order."""
    alternate([lambda _, window=window: window(seconds / rounds) and None for window in windows], rounds)


async def measure_stage_async(target: Any, loads: Iterable[Load], labels: Labels,
                              clients: Sequence[Client] = (servelab_client(),)) -> list[Record]:
    """``measure_stage`` from inside a running event loop (a notebook's): in a thread, since each
    client starts an event loop of its own."""
    return await asyncio.to_thread(measure_stage, target, list(loads), labels, clients)


def _spread(values: list[float | None]) -> float | None:
    """The largest distance of any value from their mean, as a fraction of it (perf_analyzer's test)."""
    if not values or any(v is None for v in values):
        return None
    return max(abs(v - mean) for v in values) / mean if (mean := statistics.fmean(values)) else None


def windowed(windows: Windows, **options: Any) -> Client:
    """servelab's client over ``Windows.COUNT`` windows of ``windows.window_s`` in one run after the warm-up, each
    window's throughput, p50 and p99 in the record's ``config["windows"]``. Where they must agree and do not, the
    run is measured again without a warm-up (the run before was one), up to ``max_trials`` windows in all."""
    client = ClientOptions(**options)

    def run(target: Target, load: Load, labels: Labels, earlier: list[Record]) -> Record:
        size = windows.window_s
        if size is not None and load.duration_s is None and load.mode == "open" and load.rate and load.requests:
            # An open loop given as a count of requests: its windows split the time the schedule spans (each
            # lesson's ratio comes with its spread over them), measured once (its rate, not a knee, is the point).
            size = load.requests / load.rate / Windows.COUNT
        elif size is None or load.duration_s is None:
            return run_bench(target, load, labels, client)
        tries = max(1, windows.max_trials // Windows.COUNT) if windows.tested and load.duration_s else 1
        seen: list[float] = []  # every window's throughput, the discarded runs' too
        for attempt in range(tries):
            again = load if attempt == 0 else load.model_copy(update={"warmup": 0, "warmup_s": None})
            record = run_bench(target, again, labels, replace(client, timeline_bin_s=size))
            timeline, record.timeline = record.timeline, None  # per window, kept below; no plot over time
            rps, p50, p99 = ([values[:Windows.COUNT] for values in (timeline.throughput_rps, timeline.p50_ms,
                                                                    timeline.p99_ms)] if timeline else ([], [], []))
            seen += rps
            spread = max((x for x in (_spread(rps), _spread(p50)) if x is not None), default=None)
            stable = spread is not None and spread <= windows.stability_pct / 100
            if not windows.tested or stable or record.failed or attempt == tries - 1:
                break
        record.load = load  # the load as asked (a run again has no warm-up: the run before was one)
        record.config = {**record.config, WINDOWS: {
            "window_s": size, "throughput_rps": rps, "p50_ms": p50, "p99_ms": p99,
            "spread_pct": None if spread is None else round(100 * spread, 1),
            "stability_pct": windows.stability_pct if windows.tested else None,
            "stable": stable if windows.tested else None, "runs": attempt + 1, "discarded_rps": seen[:-len(rps) or None]}}
        return record
    return run


# The most senders a sweep tries, per core of this machine (the client's and the server's, on one machine).
CAP_PER_CORE = 8


@dataclass(frozen=True)
class Sweep:
    """How a capacity is found: one request at a time, then ``start`` senders, doubling, until two levels in a row add
    less than ``growth`` (each measured twice with the last gain: one noisy point cannot end it), the cap (``cap``,
    else ``CAP_PER_CORE`` × the cores), ``max_levels`` levels, or a client-bound step; then the highest mean."""

    start: int = 2
    cap: int | None = None
    growth: float = 0.05
    max_levels: int | None = None
    fixed: tuple[int, ...] = ()  # these levels after one at a time, each measured once, instead of doubling to the knee

    def most(self) -> int:
        return max(self.fixed) if self.fixed else self.cap or CAP_PER_CORE * (os.cpu_count() or 1)

    def levels(self) -> list[int]:
        """Every level the sweep may try, in order."""
        if self.fixed:
            return [1, *sorted(c for c in set(self.fixed) if c > 1)]
        doubling = takewhile(lambda c: c <= self.most(), (max(2, self.start) * 2**i for i in count()))
        return [1, *islice(doubling, None if self.max_levels is None else max(0, self.max_levels - 1))]

    def next(self, curve: list[dict[str, Any]]) -> int | str:
        """The level to measure after ``curve`` (``fractions.curve_point``s, again where measured again), or why not."""
        last = curve[-1]
        if not last["throughput_rps"]:
            return f"nothing served at concurrency {last['concurrency']}"
        if last.get("client_bound"):  # more senders would measure the client further, never the server
            return f"client-bound at {last['concurrency']} senders: the client's limit, not the server's"
        means, runs = mean_curve(curve), Counter(p["concurrency"] for p in curve)
        left = [c for c in self.levels() if c not in means]
        measured = list(means)
        best, behind = measured[0], 0  # the last level that added ``growth`` or more, and how many after it added less
        for c in measured[1:]:
            best, behind = (c, 0) if means[c] >= means[best] * (1 + self.growth) else (best, behind + 1)
        if behind and left and not self.fixed:
            after = measured[measured.index(best) + 1:][:1]
            if again := [c for c in (best, *after) if runs[c] == 1]:
                return again[0]  # measured again before a knee is called
            if behind >= 2:
                return (f"the knee: {behind} levels in a row after {best} senders ({means[best]:.1f} req/s) added "
                        f"less than {100 * self.growth:g} % (each level there measured twice)")
        if left:
            return left[0]
        if self.fixed:
            return f"the levels asked: {', '.join(map(str, self.levels()))}"
        if self.max_levels is not None and len(self.levels()) == self.max_levels:
            return f"the plan's {self.max_levels} levels"
        return f"the cap: {self.most()} senders" + ("" if self.cap else f" ({CAP_PER_CORE} × {os.cpu_count() or 1} cores)")


def mean_curve(curve: list[dict[str, Any]]) -> dict[int, float]:
    """Each level of ``curve`` -> its mean throughput over its runs, in the order the levels were first measured."""
    return {c: statistics.fmean(p["throughput_rps"] or 0.0 for p in curve if p["concurrency"] == c)
            for c in dict.fromkeys(p["concurrency"] for p in curve)}


def sweep_capacity(target: Any, loads: Callable[[int], Load], labels: Labels, sweep: Sweep, ours: Client,
                   keep: Callable[[Callable[[], Record], Load], Record] = kept,
                   others: Sequence[Client] = ()) -> list[Record]:
    """``loads(c)`` at each level ``sweep.next`` names, with servelab's client (``ours``), the last record keeping the
    curve in ``config["capacity"]``; then ``others`` measure the sequential load and the capacity's."""
    curve: list[dict[str, Any]] = []
    records: list[Record] = []
    level: int | str = 1
    while isinstance(level, int):
        def step(target: Any, load: Load, labels: Labels, earlier: list[Record]) -> Record:
            nonlocal level
            record = ours(target, load, labels, earlier)
            curve.append(curve_point(record))
            level = sweep.next(curve) if not record.failed else f"the run at {load.concurrency} senders failed"
            if isinstance(level, str):
                means = mean_curve(curve)
                best = max(means, key=means.get)
                record.config = {**record.config, CAPACITY: {
                    "throughput_rps": round(means[best], 3), "concurrency": best, "stopped": level,
                    "growth_pct": 100 * sweep.growth, "cap": sweep.most(), "curve": list(curve)}}
            return record

        records += measure_stage(target, [loads(level)], labels, [step], keep)
    if others:
        best = records[[p["concurrency"] for p in curve].index(records[-1].config[CAPACITY]["concurrency"])]
        for mine in [records[0]] + ([best] if best is not records[0] else []):  # one at a time, and the capacity's
            for client in others:
                records.append(keep(lambda client=client, mine=mine: client(target, mine.load, labels, [mine]),
                                    mine.load))
    return records
