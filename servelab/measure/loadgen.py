"""The load generator: one asyncio engine for every stage (``run_bench``; ``await run_bench_async`` inside a
running loop, as in Jupyter). ``Labels`` are what a record carries, ``ClientOptions`` how the client runs.

Each run connects one persistent client, sends unmeasured warm-up requests (the first one's latency kept: on a
fresh server, the first request after ready), snapshots the server's statistics and cache counters, runs the
measured window under the monitors, snapshots again and builds a ``Record``. An open loop's send times are fixed
in advance (``schedule.send_times``) and its latency counts from the *scheduled* send, so time a request waited
for the client (at most ``max_inflight`` outstanding) or the server counts: no coordinated omission. The median
from the actual send, perf_analyzer's rule, is kept beside it. The client runs on as many sender processes as its
warm-up says it needs (``servelab.measure.senders``), each this engine on its share, merged into one ``RawRun``.
"""

import asyncio
import contextlib
import gc
import json
import logging
import math
import operator
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from servelab.core.procs import die_with_parent
from servelab.measure.monitor import Monitor
from servelab.measure.records import (
    Breakdown,
    CacheStats,
    ClientSide,
    Labels,
    Load,
    PerRequest,
    Record,
    Rollout,
    RunKind,
    Stats,
    Timeline,
    append_record,
    machine_info,
)
from servelab.measure.schedule import send_times
from servelab.measure.senders import bound_reason, little_rate, plan_processes, planned_rate, pool
from servelab.measure.server_timing import TimingSums
from servelab.measure.stats import latency_summary
from servelab.measure.targets import Client, Outcome, Target
from servelab.measure.triton_stats import stats_delta

log = logging.getLogger("servelab.measure")

LATE_AFTER_S = 0.010  # later than this after its scheduled time, a send is late (timer jitter is ~1 ms)
LATE_WARN_FRACTION = 0.01
OPEN_LOOP_LEAD_S = 0.01  # the schedule starts this far ahead, so the first send is not late
START_AHEAD_S = 0.05  # several sender processes start this far after the parent tells them when (a pipe's latency)
STATS_SETTLE_S, STATS_SETTLE_TRIES = 0.05, 20
clock = time.perf_counter  # monotonic, high resolution (never time.time)
OK, SHED = "ok", "shed:"  # a request's outcome in RawRun.outcomes and PerRequest: ok, shed:<reason>, or the error
OWN_RATE_MIN_PER_SENDER = 4  # warm-up requests per sender before its own cost per request plans the processes
OVERLOAD_MULTIPLE = 1.5  # the overload case's offered rate, times the measured capacity


@dataclass
class RawRun:
    """Per-request results of one measured window (successes in ``index``/``latency_s``)."""

    index: list[int] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    shed: Counter = field(default_factory=Counter)  # reason -> requests the server shed
    send_lag_s: list[float] = field(default_factory=list)
    # open loop: each success's latency from its actual send, perf_analyzer's rule (``latency_s`` counts from the
    # scheduled send, which the lessons use); the cross-check with perf_analyzer compares like with like
    from_send_s: list[float] = field(default_factory=list)
    loop_late: int = 0  # open loop: sends whose task the client's own event loop started late (not a slot's wait)
    loop_cpu_s: list[float] = field(default_factory=list)  # each sender process's event-loop thread: CPU s in the window
    timing: TimingSums = field(default_factory=TimingSums)
    warnings: list[str] = field(default_factory=list)
    started: float = 0.0
    last_done: float = 0.0
    window_s: float = 0.0  # open loop: the schedule's window, the least time the run can take
    offered_rps: float | None = None  # open loop: requests scheduled / window
    # Every request: (completed, seconds from ``started``; latency s; OK, SHED + the reason, or the error kind;
    # the model version that answered, where the response said)
    outcomes: list[tuple[float, float, str, str | None]] = field(default_factory=list)
    scheduled_s: np.ndarray | None = None  # open loop: the send times, from ``started``
    fired: "Fired | None" = None  # the trigger's run, where there was one

    @property
    def wall_s(self) -> float:
        return max(0.0, self.last_done - self.started, self.window_s)

    def add(self, i: int, outcome: Outcome, latency_s: float, done: float) -> None:
        if outcome.ok:
            self.index.append(i)
            self.latency_s.append(latency_s)
            if outcome.timing is not None:
                self.timing.add(outcome.timing)
            kind = OK
        elif outcome.shed:
            self.shed[outcome.error or "unknown"] += 1
            kind = SHED + (outcome.error or "unknown")
        else:
            kind = outcome.error or "unknown"
            self.errors[kind] += 1
        self.outcomes.append((done - self.started, latency_s, kind, outcome.version))
        self.last_done = max(self.last_done, done)

    def stats(self, batch: int) -> Stats:
        """Throughput = successes / wall time; a request shed under load is neither a success nor an error."""
        throughput = len(self.latency_s) / self.wall_s if self.wall_s > 0 else 0.0
        lags = np.asarray(self.send_lag_s, dtype=np.float64)
        return Stats(requests=len(self.latency_s) + sum(self.errors.values()) + sum(self.shed.values()),
                     successes=len(self.latency_s), errors=dict(sorted(self.errors.items())),
                     shed=dict(sorted(self.shed.items())), wall_s=self.wall_s, throughput_rps=throughput,
                     items_per_s=throughput * batch, latency=latency_summary(self.latency_s),
                     late_sends=int((lags > LATE_AFTER_S).sum()), offered_rps=self.offered_rps,
                     max_send_lag_ms=float(lags.max() * 1000) if lags.size else None,
                     p50_from_send_ms=float(np.median(self.from_send_s) * 1000) if self.from_send_s else None)


@dataclass(frozen=True)
class Trigger:
    """Something done to the server ``at_s`` seconds into the measured window, while the load runs (a rollout);
    what ``action`` returns is kept in the record."""

    name: str
    at_s: float
    action: Callable[[], Awaitable[dict[str, Any] | None]]
    hold_s: float = 0.0  # a closed loop runs on while the action runs, and this long after it returns


@dataclass
class Fired:
    """When a trigger ran (perf_counter), and what it returned or why it failed; a closed loop's senders go on
    until ``hold_until`` at least (infinity while it runs)."""

    started: float = 0.0
    done: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    hold_until: float = 0.0


async def _fire(trigger: Trigger, due: float, fired: Fired) -> Fired:
    await asyncio.sleep(max(0.0, due - clock()))
    fired.started, fired.hold_until = clock(), math.inf
    try:
        fired.result = await trigger.action()
        fired.done = clock()
    except Exception as exc:  # the run goes on, and its record says the rollout failed
        fired.error = f"{type(exc).__name__}: {exc}"
        log.warning("%s failed: %s", trigger.name, fired.error)
    fired.hold_until = clock() + trigger.hold_s
    return fired


@dataclass
class WarmUp:
    """What the warm-up did: requests sent, how many failed, the first one's latency in ms (None where it failed or
    there was no warm-up), and the latencies of the successes after the first (an estimate of the rate to come)."""

    sent: int = 0
    failed: int = 0
    first_ms: float | None = None
    latencies_s: list[float] = field(default_factory=list)
    senders: int = 0
    cpu_s: float = 0.0  # the event loop's thread, on the CPU during the warm-up

    def own_rps(self) -> float | None:
        """Requests per CPU-second of this client itself (tritonclient included), where the warm-up sent enough
        (four per sender) that opening its connections weighs little; None where it did not."""
        enough = self.cpu_s > 0 and self.sent >= OWN_RATE_MIN_PER_SENDER * self.senders > 0
        return self.sent / self.cpu_s if enough else None


async def warm_up(client: Client, load: Load) -> WarmUp:
    """Unmeasured requests, a closed loop at the load's concurrency: at least ``load.warmup`` of them and, where
    ``load.warmup_s`` is set, on until that many seconds have passed (both met; senders finish the one in flight)."""
    done = WarmUp(senders=load.warmup_senders)  # none where neither ``warmup`` nor ``warmup_s`` asks for any
    until = clock() + (load.warmup_s or 0.0)

    async def sender() -> None:
        while done.sent < load.warmup or clock() < until:
            i, done.sent = done.sent, done.sent + 1
            t0 = clock()
            ok = (await client.send()).ok
            done.failed += not ok
            if i == 0 and ok:
                done.first_ms = (clock() - t0) * 1e3
            elif ok:
                done.latencies_s.append(clock() - t0)

    cpu = time.thread_time()
    await asyncio.gather(*(sender() for _ in range(done.senders)))
    done.cpu_s = time.thread_time() - cpu
    return done


async def _start(start_at: float | None) -> float:
    """The measured window's start: ``start_at`` (perf_counter, shared by every sender process), or now."""
    if start_at is None:
        return clock()
    await asyncio.sleep(max(0.0, start_at - clock()))
    return start_at


async def _closed_loop(client: Client, load: Load, hold: Fired, start_at: float | None,
                       part: tuple[int, int]) -> RawRun:
    k, n = part
    run = RawRun(timing=TimingSums(client.batch), started=await _start(start_at))
    stop_at = run.started + min(load.duration_s or math.inf, load.max_duration_s)
    give_up = run.started + load.max_duration_s
    limit = load.requests if load.requests is not None else math.inf
    issued = 0

    async def sender() -> None:
        nonlocal issued
        while issued < limit and clock() < min(give_up, max(stop_at, hold.hold_until)):
            i, issued = issued, issued + 1
            t0 = clock()
            outcome = await client.send()
            t1 = clock()
            run.add(i * n + k, outcome, t1 - t0, t1)  # one index space across the processes, interleaved

    await asyncio.gather(*(sender() for _ in range(load.concurrency)))
    if issued < limit and load.duration_s is None:
        run.warnings.append(f"stopped at max_duration_s={load.max_duration_s:g} after {issued} of {limit} requests"
                            + (f" (sender process {k + 1} of {n})" if n > 1 else ""))
    return run


def _schedule(load: Load, n: int) -> np.ndarray:
    parts, offset = [], 0.0
    for i, (rate, seconds) in enumerate(load.phases or [(load.rate, n / load.rate)]):  # no steps: one phase of n
        parts.append(offset + send_times(max(1, round(rate * seconds)), rate, load.arrivals, load.seed + i))
        offset += seconds
    return np.concatenate(parts)


async def _open_loop(client: Client, load: Load, start_at: float | None, part: tuple[int, int]) -> RawRun:
    """The schedule's sends ``k``, ``k + n``, ... of ``part`` = (k, n): one process's share (all of it for (0, 1))."""
    assert load.rate is not None and load.arrivals is not None
    k, n_parts = part
    n = load.requests or math.inf
    if load.duration_s is not None:
        n = min(n, max(1, math.ceil(load.rate * load.duration_s)))
    times = _schedule(load, int(n))
    run = RawRun(timing=TimingSums(client.batch), started=await _start(start_at) + OPEN_LOOP_LEAD_S,
                 window_s=len(times) / load.rate, offered_rps=load.rate, scheduled_s=times[k::n_parts])
    give_up = run.started + load.max_duration_s
    slots = asyncio.Semaphore(load.max_inflight)

    async def one(i: int, due: float) -> None:
        run.loop_late += clock() - due > LATE_AFTER_S  # the loop itself ran this send late: the client was busy
        async with slots:  # waiting here means the client is behind its schedule
            sent = clock()
            if sent > give_up:
                run.errors["not_sent"] += 1
                return
            run.send_lag_s.append(sent - due)
            outcome = await client.send()
        done = clock()
        run.add(i, outcome, done - due, done)  # from the scheduled time: no coordinated omission
        if outcome.ok:
            run.from_send_s.append(done - sent)

    tasks = []
    for i in range(k, len(times), n_parts):
        due = run.started + times[i]
        if due > give_up:
            run.warnings.append(f"schedule cut at max_duration_s={load.max_duration_s:g} after {i} requests")
            run.window_s, run.offered_rps = load.max_duration_s, i / load.max_duration_s
            break
        if (delay := due - clock()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    return run


def _warn_late(run: RawRun, load: Load) -> None:
    lags = np.asarray(run.send_lag_s)
    late = int((lags > LATE_AFTER_S).sum())
    if lags.size and late > LATE_WARN_FRACTION * lags.size:
        run.warnings.append(
            f"client fell behind its schedule: {late} of {lags.size} sends ({100 * late / lags.size:.0f}%) started "
            f"more than {LATE_AFTER_S * 1000:g} ms late (max {lags.max() * 1000:.1f} ms; at most "
            f"{load.max_inflight} requests in flight); latency still counts from the scheduled send time")


async def run_load(client: Client, load: Load, trigger: Trigger | None = None, *, start_at: float | None = None,
                   part: tuple[int, int] = (0, 1)) -> RawRun:
    """The measured window only (no warm-up), ``trigger`` run ``trigger.at_s`` seconds into it. A sender process of
    several runs ``part`` = (k, n), its share, from ``start_at`` (perf_counter, one clock for them all)."""
    # Full garbage collections scan every long-lived object (all imported modules) and stall the
    # event loop for tens of ms; frozen objects are skipped, so the client keeps its schedule.
    gc.collect()
    gc.freeze()
    try:
        hold = Fired()
        fired = asyncio.create_task(_fire(trigger, clock() + trigger.at_s, hold)) if trigger else None
        cpu = time.thread_time()  # this event loop's thread only: how busy the sender was, not the machine
        run = await (_open_loop(client, load, start_at, part) if load.mode == "open"
                     else _closed_loop(client, load, hold, start_at, part))
        run.loop_cpu_s.append(time.thread_time() - cpu)
        if fired is not None:
            run.fired = await fired
        if part[1] == 1:
            _warn_late(run, load)
        return run
    finally:
        gc.unfreeze()


def merge_runs(runs: list[RawRun], load: Load) -> RawRun:
    """One run of several sender processes' shares (started together: one ``started``), each request once."""
    first = runs[0]
    offered = [r.offered_rps for r in runs if r.offered_rps is not None]  # a schedule cut short offered less
    scheduled = [r.scheduled_s for r in runs if r.scheduled_s is not None]
    merged = RawRun(timing=TimingSums(first.timing.images_per_request), started=first.started,
                    window_s=max(r.window_s for r in runs), loop_late=sum(r.loop_late for r in runs),
                    last_done=max(r.last_done for r in runs),
                    offered_rps=min(offered) if first.offered_rps is not None else None,
                    scheduled_s=np.sort(np.concatenate(scheduled)) if scheduled else None)
    for run in runs:
        for name in ("index", "latency_s", "send_lag_s", "from_send_s", "loop_cpu_s"):
            getattr(merged, name).extend(getattr(run, name))
        for counts in ("errors", "shed"):
            getattr(merged, counts).update(getattr(run, counts))
        for counts in ("sums", "counts", "images_by_batch"):
            getattr(merged.timing, counts).update(getattr(run.timing, counts))
        merged.outcomes += [(done + run.started - merged.started, *rest) for done, *rest in run.outcomes]
        merged.warnings += [w for w in run.warnings if w not in merged.warnings]
    merged.outcomes.sort(key=lambda outcome: outcome[0])
    _warn_late(merged, load)
    return merged


async def _extra(read: Callable[[], Awaitable[Any]], what: str, warnings: list[str]) -> Any:
    """``read()``, else None and a warning: the server's statistics and cache counters are extra, and a failure
    costs the breakdown or the hit ratio, not the run."""
    try:
        return await read()
    except Exception as exc:
        warnings.append(f"{what} unavailable ({type(exc).__name__}: {exc})")
        return None


async def _settled(read: Callable[[], Awaitable[Any]], enough: Callable[[Any, Any], bool]) -> Any:
    """``read()``'s first value that ``enough(value, the read before)`` accepts, reading every ``STATS_SETTLE_S``
    (at most ``STATS_SETTLE_TRIES`` times: else the last); None once a read fails. A server updates its counters
    just after it answers."""
    value = None
    for attempt in range(STATS_SETTLE_TRIES):
        if attempt:
            await asyncio.sleep(STATS_SETTLE_S)
        previous, value = value, await read()
        if value is None or enough(value, previous):
            break
    return value


async def _server_breakdown(client: Client, before: dict[str, Any], model: str, successes: int,
                            warnings: list[str]) -> Breakdown | None:
    """Triton's statistics diffed, once they count every success the client saw."""
    async def read() -> Breakdown | None:
        after = await _extra(client.server_stats, "server statistics", warnings)
        try:
            return None if after is None else stats_delta(before, after, model)
        except ValueError as exc:  # a rollout: the version answering changed; statistics are extra
            warnings.append(f"no server breakdown: {exc}")
            return None
    return await _settled(read, lambda delta, _: (delta.server_requests or 0) >= successes)


def cache_delta(before: dict[str, int], after: dict[str, int], source: str) -> CacheStats | None:
    """The cache's counts between two readings; None where nothing was looked up in between."""
    delta = {key: after.get(key, 0) - before.get(key, 0) for key in ("hits", "misses", "errors")}
    if min(delta.values()) < 0:
        raise ValueError("response-cache counters went backwards: was the server restarted during the run?")
    return CacheStats(source=source, **delta) if sum(delta.values()) else None


async def _cache_stats(client: Client, before: dict[str, int] | None, successes: int,
                       warnings: list[str]) -> CacheStats | None:
    """The window's hits and misses by the server's counters, once they count every success the client saw."""
    if before is None:
        return None
    source = "triton-stats" if client.has_server_stats else "servelab_response_cache"

    async def read() -> CacheStats | None:
        after = await _extra(client.cache_counts, "response-cache counters", warnings)
        return None if after is None else cache_delta(before, after, source)  # None too: nothing looked up
    return await _settled(read, lambda delta, _: delta.hits + delta.misses + delta.errors >= successes)


# The last run of each (target, mode, senders) in this process: its throughput and requests per CPU-second, what a
# closed-loop run without a warm-up plans with (measure_stage.windowed measures a window again right after one).
_SEEN: dict[str, tuple[float, float | None]] = {}


def _seen_key(target: Target, load: Load) -> str:
    return f"{json.dumps(target.describe(), sort_keys=True, default=str)} {load.mode} {load.concurrency}"


def share(load: Load, k: int, n: int) -> Load:
    """Sender process ``k``'s share of ``load`` split across ``n``: a closed loop's senders and requests, an open loop's
    requests in flight; a warm-up that only opens its connections (the parent's warmed the server)."""
    if n == 1:
        return load
    if load.mode == "closed":
        senders = load.concurrency // n + (k < load.concurrency % n)
        update: dict[str, Any] = {"concurrency": senders, "warmup": min(senders, load.warmup)}
        if load.requests is not None:
            update["requests"] = load.requests // n + (k < load.requests % n)
    else:
        update = {"max_inflight": math.ceil(load.max_inflight / n), "warmup": math.ceil(load.warmup / n)}
    return load.model_copy(update={**update, "warmup_s": None})


def _sender_main(conn: Connection, parent: int) -> None:
    """A sender process (``senders.SenderPool``): runs the jobs its pipe brings until it reads None."""
    die_with_parent(parent)
    with contextlib.suppress(EOFError):  # the parent's end of the pipe closed
        for job in iter(conn.recv, None):
            try:
                asyncio.run(_sender_job(conn, *job))
            except Exception as exc:  # the parent fails the run with this, and ends the pool
                conn.send(("failed", f"{type(exc).__name__}: {exc}"))


def _mix_share(target: Target, k: int, n: int) -> Target:
    """A target with a ``PhotoMix``: process ``k`` of ``n`` sends every ``n``-th photo of its order from the ``k``-th,
    so that the processes together send the photos the one order says (a cache sees the same popularity)."""
    if (mix := getattr(target, "mix", None)) is None or n == 1:
        return target
    return replace(target, mix=replace(mix, order=mix.order[k::n]))


async def _sender_job(conn: Connection, target: Target, load: Load, timeout_s: float, part: tuple[int, int]) -> None:
    """Connect, warm up (then say so), wait for the shared start time, run this share, send its RawRun back."""
    target = _mix_share(target, *part)
    client = await target.connect(load.max_inflight if load.mode == "open" else load.concurrency, timeout_s)
    try:
        warm = await warm_up(client, load)
        conn.send(("warm", warm.sent, warm.failed))
        start_at = conn.recv()  # blocking: nothing else runs in this process meanwhile
        run = await run_load(client, load, start_at=start_at, part=part)
    finally:
        await client.close()
    conn.send(("done", run))


async def _reply(conn: Connection, wait_s: float) -> tuple[Any, ...]:
    def receive() -> tuple[Any, ...]:
        if not conn.poll(wait_s):
            raise RuntimeError(f"a sender process said nothing for {wait_s:g} s")
        try:
            reply = conn.recv()
        except EOFError:
            raise RuntimeError("a sender process ended during the run") from None
        if reply[0] == "failed":
            raise RuntimeError(f"a sender process failed: {reply[1]}")
        return reply

    return await asyncio.to_thread(receive)


async def _senders_run(conns: list[Connection], load: Load, timeout_s: float) -> RawRun:
    """Start every sender process's share at one time (``START_AHEAD_S`` from now, on the shared clock); merge."""
    start_at = clock() + START_AHEAD_S
    for conn in conns:
        conn.send(start_at)
    replies = await asyncio.gather(*(_reply(c, load.max_duration_s + timeout_s + 60) for c in conns))
    return merge_runs([r[1] for r in replies], load)


@dataclass(frozen=True)
class ClientOptions:
    """How servelab's client runs a load, beside the load itself: built once, passed to every run of a measurement."""

    timeout_s: float = 30.0  # per request
    monitor_interval_s: float = 0.5  # between the monitors' samples
    out: Path | None = None  # each record appended here, one JSON line
    # A ReplicaSampler (servelab.servers.rayserve.serve_state) or a timeline_bin_s: the record gets a timeline,
    # per timeline_bin_s (default 1 s), with the sampler's replicas and events where there is one.
    sampler: Any = None
    timeline_bin_s: float | None = None
    keep_requests: bool = False  # every request in the record's per_request
    trigger: Trigger | None = None  # runs during the measured window (a rollout); the record's rollout says how it went
    # Sender processes (servelab.measure.senders): default planned from the client's cost in its warm-up, at most
    # max_processes (default half the CPUs); one with a trigger, which runs in this process.
    processes: int | None = None
    max_processes: int | None = None


async def _senders_warm(conns: list[Connection], target: Target, load: Load, timeout_s: float,
                        warnings: list[str]) -> int:
    """Hand each sender process its share; once all are connected and warm: the warm-up requests they sent."""
    n = len(conns)
    for k, conn in enumerate(conns):
        conn.send((target, share(load, k, n), timeout_s, (k, n)))
    replies = await asyncio.gather(*(_reply(c, timeout_s * 4 + 60 + (load.warmup_s or 0)) for c in conns))
    sent, failed = sum(r[1] for r in replies), sum(r[2] for r in replies)
    if failed:
        warnings.append(f"{failed} of {sent} of the sender processes' warm-up requests failed")
    return sent


def _client_side(run: RawRun, stats: Any, seen_key: Any, n: int, chosen: str, expected: float | None,
                 own: float | None) -> ClientSide:
    """How the client fared in ``run``: its processes, how busy its busiest loop was, its CPU per request and
    whether it, not the server, bound the throughput. What it served is remembered for the next run's plan."""
    # Rounded as the record keeps it, so that the reason it gives says the record's own figure.
    busy = round(max(run.loop_cpu_s) / run.wall_s, 3) if run.loop_cpu_s and run.wall_s > 0 else None
    cpu_ms = 1000 * sum(run.loop_cpu_s) / stats.requests if run.loop_cpu_s and stats.requests else None
    if stats.throughput_rps > 0:
        _SEEN[seen_key] = (stats.throughput_rps, 1000 / cpu_ms if cpu_ms else None)
    why = bound_reason(stats.throughput_rps, busy)
    return ClientSide(processes=n, expected_rps=round(expected, 1) if expected else None, chosen=chosen,
                      warmup_rps_per_cpu=round(own, 1) if own else None, busy=busy, loop_late=run.loop_late,
                      cpu_ms_per_request=round(cpu_ms, 3) if cpu_ms is not None else None,
                      bound=why is not None, why=why)


async def run_bench_async(target: Target, load: Load, labels: Labels,
                          options: ClientOptions = ClientOptions()) -> Record:
    """One measured run against ``target`` under ``load``, run as ``options`` say; returns (and, with
    ``options.out``, appends) its Record, which carries ``labels``."""
    trigger, timeout_s = options.trigger, options.timeout_s
    warnings: list[str] = []
    senders: list[Connection] = []
    client = await target.connect(load.max_inflight if load.mode == "open" else load.concurrency, timeout_s)
    try:
        warm = await warm_up(client, load)
        if warm.failed:
            warnings.append(f"{warm.failed} of {warm.sent} warm-up requests failed")
        seen_rps, seen_own = _SEEN.get(_seen_key(target, load), (None, None))
        expected = planned_rate(load) or little_rate(load, warm.latencies_s) or seen_rps
        held = f"a trigger ({trigger.name}) runs beside the load in this process" if trigger else None
        own = warm.own_rps()
        n, chosen = plan_processes(load, own or seen_own, expected, options.max_processes, options.processes, held)
        senders = pool(_sender_main).take(n) if n > 1 else []  # none where one, this one, sends alone
        warm_sent = await _senders_warm(senders, target, load, timeout_s, warnings)
        # Statistics once the warm-up has reached them: two reads in a row that agree.
        before = (await _settled(partial(_extra, client.server_stats, "server statistics", warnings), operator.eq)
                  if client.has_server_stats else None)
        cache_before = await _extra(client.cache_counts, "response-cache counters", warnings)
        with Monitor(options.monitor_interval_s, labels.server_pid) as monitor:
            window_start = time.time()  # wall clock, to match server-side time series (Prometheus)
            run = await (run_load(client, load, trigger) if n == 1 else _senders_run(senders, load, timeout_s))
            window_end = time.time()
        breakdown = (run.timing.breakdown() if before is None else
                     await _server_breakdown(client, before, getattr(target, "model", ""), len(run.latency_s), warnings))
        cache = await _cache_stats(client, cache_before, len(run.latency_s), warnings)
    except BaseException:
        if senders:  # no sender process is left mid-job (its warm-up's too): the next run starts fresh ones
            pool(_sender_main).close(wait_s=0)
        raise
    finally:
        await client.close()
    warnings += run.warnings
    stats = run.stats(target.batch)
    client_side = _client_side(run, stats, _seen_key(target, load), n, chosen, expected, own)
    if client_side.why:
        warnings.append(f"client-bound: {client_side.why}; the throughput is the client's limit, not the server's")
    for text in warnings:
        log.warning("%s [%s]: %s", labels.stage, load.label(), text)
    monitors = monitor.result()
    record = Record(
        stage=labels.stage, target=target.describe(), config=labels.config or {}, load=load, batch=target.batch,
        stats=stats, breakdown=breakdown, monitors=monitors, warnings=warnings, stand_in=labels.stand_in,
        machine=machine_info([g.name for g in monitors.gpus] or None), first_request_ms=warm.first_ms,
        warmup_requests=warm.sent + warm_sent, window_unix=[window_start, window_end], cache=cache,
        timeline=(build_timeline(run, options.sampler, options.timeline_bin_s or 1.0)
                  if options.sampler or options.timeline_bin_s else None),
        per_request=per_request(run) if options.keep_requests else None,
        rollout=rollout_summary(run) if run.fired else None, client=client_side,
    )
    if options.out is not None:
        append_record(options.out, record)
    return record


def per_request(run: RawRun) -> PerRequest:
    """Every request of ``run``: sent (its scheduled time in an open loop: completion less latency), latency, outcome."""
    return PerRequest(sent_s=[round(done - latency, 6) for done, latency, *_ in run.outcomes],
                      latency_ms=[round(latency * 1000, 3) for _, latency, *_ in run.outcomes],
                      outcome=[kind for _, _, kind, _ in run.outcomes],
                      version=[version for *_, version in run.outcomes])


def _p99(latencies_s: list[float]) -> float | None:
    return round(float(np.percentile(latencies_s, 99)) * 1000, 3) if latencies_s else None


def rollout_summary(run: RawRun) -> Rollout:
    """How the requests of ``run`` saw its trigger (``Rollout``): the versions before and after, when the new
    one first answered, what failed, and the p99 before, during and after the swap."""
    fired = run.fired
    trigger_s = fired.started - run.started
    done_s = fired.done - run.started if fired.done is not None else None
    old = sorted({v for t, _, kind, v in run.outcomes if kind == OK and v and t < trigger_s})
    new = sorted((t, v) for t, _, kind, v in run.outcomes if kind == OK and v and v not in old and t >= trigger_s)
    first_new_s, new_version = new[0] if new else (None, None)
    ready_s = trigger_s + fired.result["ready_s"] if fired.result and "ready_s" in fired.result else done_s
    end_during = max(s for s in (trigger_s, done_s, first_new_s) if s is not None)
    windows: list[list[float]] = [[], [], []]
    failed = failed_during = shed = old_done = old_sent = old_after_ready = 0
    for t, latency, kind, version in run.outcomes:
        window = 0 if t < trigger_s else 1 if t <= end_during else 2
        if kind == OK:
            windows[window].append(latency)
            old_after_ready += version in old and ready_s is not None and t - latency > ready_s
            if first_new_s is not None and version in old and t > first_new_s:
                old_done += 1
                old_sent += t - latency > first_new_s
        elif kind.startswith(SHED):
            shed += 1
        else:
            failed += 1
            failed_during += window == 1
    return Rollout(
        trigger_s=round(trigger_s, 4), done_s=round(done_s, 4) if done_s is not None else None, result=fired.result,
        error=fired.error, old_versions=old, new_version=new_version,
        first_new_s=round(first_new_s - trigger_s, 4) if first_new_s is not None else None,
        switch_after_ready_s=round(first_new_s - ready_s, 4) if first_new_s is not None and ready_s is not None else None,
        old_done_after_new=old_done, old_sent_after_new=old_sent, old_sent_after_ready=old_after_ready, failed=failed,
        failed_during=failed_during, shed=shed, requests=[len(w) for w in windows], p99_before_ms=_p99(windows[0]),
        p99_during_ms=_p99(windows[1]), p99_after_ms=_p99(windows[2]),
        during_s=[round(trigger_s, 4), round(end_during, 4)],
    )


def build_timeline(run: RawRun, sampler: Any = None, bin_s: float = 1.0) -> Timeline:
    """Per ``bin_s``: throughput, errors, shed requests and latency of the requests completed in it; the sampler's
    replica counts and events (where there is one), on the same clock (seconds from the measured window's start)."""
    bins = max(1, math.ceil(max(run.wall_s, *(t for t, *_ in run.outcomes)) / bin_s))
    ok: list[list[float]] = [[] for _ in range(bins)]
    errors, shed = [0] * bins, [0] * bins
    for done, latency, kind, _ in run.outcomes:
        b = min(bins - 1, max(0, int(done // bin_s)))
        if kind == OK:
            ok[b].append(latency * 1000)
        elif kind.startswith(SHED):
            shed[b] += 1
        else:
            errors[b] += 1
    scheduled = np.minimum(bins - 1, (run.scheduled_s if run.scheduled_s is not None else np.empty(0)) // bin_s)
    offered = (np.bincount(scheduled.astype(int), minlength=bins) / bin_s).tolist()
    samples, sampled_events = (sampler.samples, sampler.events) if sampler is not None else ([], [])
    events = {name: round(t - run.started, 3) for t, name in sampled_events}
    if fired := run.fired:  # a rollout: when it was triggered and when its call returned
        events["rollout_started"] = round(fired.started - run.started, 3)
        if fired.done is not None:
            events["rollout_done"] = round(fired.done - run.started, 3)
    failed_at = sorted(done for done, _, kind, _ in run.outcomes if kind != OK and not kind.startswith(SHED))
    first_event = min(events.values(), default=None)  # recovery: from it to the last failure after it (0: none)
    after = [t for t in failed_at if first_event is not None and t >= first_event]
    recovery = None if first_event is None else round(after[-1] - first_event, 3) if after else 0.0
    return Timeline(
        bin_s=bin_s, t_s=[b * bin_s for b in range(bins)], throughput_rps=[len(v) / bin_s for v in ok], errors=errors,
        shed=shed, p50_ms=[float(np.percentile(v, 50)) if v else None for v in ok],
        p99_ms=[float(np.percentile(v, 99)) if v else None for v in ok], offered_rps=offered,
        replicas_t_s=[round(t - run.started, 3) for t, _ in samples], replicas=[n for _, n in samples],
        events=events, first_error_s=failed_at[0] if failed_at else None,
        last_error_s=failed_at[-1] if failed_at else None, recovery_s=recovery,
    )


def run_bench(target: Target, load: Load, labels: Labels, options: ClientOptions = ClientOptions()) -> Record:
    """``run_bench_async`` in a fresh event loop (not from inside a running loop)."""
    return asyncio.run(run_bench_async(target, load, labels, options))


def overload_load(capacity_rps: float, seconds: float, multiple: float = OVERLOAD_MULTIPLE, arrivals: str = "poisson",
                  warmup: int = 10, max_inflight: int = 512) -> tuple[Load, dict[str, Any]]:
    """The overload case: an open loop at ``multiple`` x the stage's capacity for ``seconds``, long enough for an
    unbounded queue to grow, and its record's ``config``."""
    load = Load.open(multiple * capacity_rps, arrivals, duration_s=seconds, warmup=warmup, max_inflight=max_inflight)
    return load, {"run": RunKind.OVERLOAD, "capacity_rps": round(capacity_rps, 3), "multiple": multiple}


def rollout_load(action: Callable[[], Awaitable[dict[str, Any] | None]], at_s: float = 3.0, seconds: float = 10.0,
                 after_s: float = 3.0, concurrency: int = 16, warmup: int = 32,
                 name: str = "rollout") -> tuple[Load, dict[str, Any], Trigger]:
    """The rollout case: a closed loop for ``seconds``, then on until ``after_s`` after ``action`` (the rollout, started
    ``at_s`` in; it returns what it did, with ``ready_s`` where the new version answered before it returned) returns,
    for a steady state to compare with the one before the swap; its record's ``config``; ``run_bench``'s trigger."""
    if not 0 < at_s < seconds:
        raise ValueError(f"the rollout must start inside the run: at_s={at_s:g} of seconds={seconds:g}")
    load = Load.closed(concurrency, requests=None, duration_s=seconds, warmup=warmup)
    return load, {"run": RunKind.ROLLOUT, "rollout_at_s": at_s, "after_s": after_s}, Trigger(name, at_s, action, after_s)
