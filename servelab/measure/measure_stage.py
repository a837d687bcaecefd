"""One routine that measures a stage, for every runner (``servelab lab``, the notebooks' walkthrough, ``servelab
benchmark``): ``measure_stage`` runs each load with each client in turn (servelab's first, perf_analyzer after it
on the same server state) and hands every record to the runner's ``keep``. ``windowed`` measures in windows of
seconds, as perf_analyzer does, so that both clients measure alike; ``sweep_capacity`` finds a stage's capacity
by saturation and keeps the curve in the last record's ``config["capacity"]``, which the report reads.
"""

import asyncio
import json
import os
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import count, islice, takewhile
from typing import Any

from servelab.core.artifacts import Manifest
from servelab.core.hardware import options_in_force, runs_on_fastapi
from servelab.core.procs import DIRECT
from servelab.measure.fractions import CAPACITY, WINDOWS, curve_point
from servelab.measure.loadgen import ClientOptions, Labels, run_bench
from servelab.measure.perf_analyzer import Windows, run_perf_analyzer
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

    def run(target: Target, load: Load, labels: Labels, earlier: list[Record]) -> Record:
        return run_bench(target, load, labels, client)
    return run


def perf_analyzer_client(**options: Any) -> Client:
    """perf_analyzer on a Triton target (``options``: ``run_perf_analyzer``'s), its time windows stretched to hold
    a few requests at the rate servelab's client just measured of the same load. What it ran is in its command."""
    def run(target: Any, load: Load, labels: Labels, earlier: list[Record]) -> Record:
        kwargs = dict(options)
        ours = next((r for r in reversed(earlier) if r.tool == "servelab" and not r.failed), None)
        if "windows" in kwargs and ours is not None:
            kwargs["windows"] = kwargs["windows"].fitted(ours.stats.throughput_rps)
        return run_perf_analyzer(target, load, stage=labels.stage, stand_in=labels.stand_in,
                                 server_pid=labels.server_pid, **kwargs)
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


async def measure_stage_async(target: Any, loads: Iterable[Load], labels: Labels,
                              clients: Sequence[Client] = (servelab_client(),)) -> list[Record]:
    """``measure_stage`` from inside a running event loop (a notebook's): in a thread, since each
    client starts an event loop of its own."""
    return await asyncio.to_thread(measure_stage, target, list(loads), labels, clients)


def _spread(values: list[float | None]) -> float | None:
    """The largest distance of any value from their mean, as a fraction of it (perf_analyzer's test)."""
    if not values or any(v is None for v in values):
        return None
    mean = statistics.fmean(values)
    return max(abs(v - mean) for v in values) / mean if mean else None


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
    """How a stage's capacity is found: one request at a time, then ``start`` senders, doubling, until a step adds
    less than ``growth`` to the throughput (the knee), the cap (``cap``, else ``CAP_PER_CORE`` × the cores),
    ``max_levels`` levels in all, or a client-bound step. The capacity is the highest throughput on the curve."""

    start: int = 2
    cap: int | None = None
    growth: float = 0.05
    max_levels: int | None = None
    fixed: tuple[int, ...] = ()  # these levels after one at a time, each measured, instead of doubling to the knee

    def most(self) -> int:
        return max(self.fixed) if self.fixed else self.cap or CAP_PER_CORE * (os.cpu_count() or 1)

    def levels(self) -> list[int]:
        """Every level the sweep may try, in order."""
        if self.fixed:
            return [1, *sorted(c for c in set(self.fixed) if c > 1)]
        doubling = takewhile(lambda c: c <= self.most(), (max(2, self.start) * 2**i for i in count()))
        return [1, *islice(doubling, None if self.max_levels is None else max(0, self.max_levels - 1))]

    def stop(self, curve: list[dict[str, Any]]) -> str | None:
        """Why the sweep ends after the last point of ``curve`` (``fractions.curve_point``s), or None to go on."""
        last = curve[-1]
        if not last["throughput_rps"]:
            return f"nothing served at concurrency {last['concurrency']}"
        if last.get("client_bound"):  # more senders would measure the client further, never the server
            return f"client-bound at {last['concurrency']} senders: the client's limit, not the server's"
        if len(curve) > 1 and curve[-2]["throughput_rps"] and not self.fixed:
            grew = last["throughput_rps"] / curve[-2]["throughput_rps"] - 1
            if grew < self.growth:
                return (f"the knee: {curve[-2]['concurrency']} -> {last['concurrency']} senders added "
                        f"{100 * grew:+.1f} % (< {100 * self.growth:g} %)")
        levels = self.levels()
        if last["concurrency"] >= levels[-1]:
            if self.fixed:
                return f"the levels asked: {', '.join(map(str, levels))}"
            if self.max_levels is not None and len(levels) == self.max_levels:
                return f"the plan's {self.max_levels} levels"
            return f"the cap: {self.most()} senders" + ("" if self.cap else f" ({CAP_PER_CORE} × {os.cpu_count() or 1} cores)")
        return None


def sweep_capacity(target: Any, loads: Callable[[int], Load], labels: Labels, sweep: Sweep,
                   ours: Client | None = None, keep: Callable[[Callable[[], Record], Load], Record] = kept,
                   others: Sequence[Client] = ()) -> list[Record]:
    """``sweep``'s levels with servelab's client (``ours``), ``loads(c)`` at each, until it stops (the last record
    keeps the curve in ``config["capacity"]``); then ``others`` measure the sequential load and the capacity's."""
    ours = ours or servelab_client()
    curve: list[dict[str, Any]] = []
    records: list[Record] = []
    for level in sweep.levels():
        def step(target: Any, load: Load, labels: Labels, earlier: list[Record]) -> Record:
            record = ours(target, load, labels, earlier)
            curve.append(curve_point(record))
            if why := sweep.stop(curve) if not record.failed else f"the run at {load.concurrency} senders failed":
                best = max(curve, key=lambda p: p["throughput_rps"] or 0)
                record.config = {**record.config, CAPACITY: {
                    "throughput_rps": best["throughput_rps"], "concurrency": best["concurrency"], "stopped": why,
                    "growth_pct": 100 * sweep.growth, "cap": sweep.most(), "curve": list(curve)}}
            return record

        [record] = measure_stage(target, [loads(level)], labels, [step], keep)
        records.append(record)
        if CAPACITY in record.config:
            break
    if others:
        best = records[[p["concurrency"] for p in curve].index(records[-1].config[CAPACITY]["concurrency"])]
        for mine in [records[0]] + ([best] if best is not records[0] else []):  # one at a time, and the capacity's
            for client in others:
                records.append(keep(lambda client=client, mine=mine: client(target, mine.load, labels, [mine]),
                                    mine.load))
    return records
