"""The run record: one JSON line per measured run, the same for every stage and both tools. Units are in the field
names: ``_ms`` milliseconds, ``_s`` seconds, ``_rps`` requests per second, ``_mib`` MiB.
"""

import datetime as dt
import platform
import socket
from collections.abc import Iterable
from contextlib import suppress
from enum import StrEnum
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, NamedTuple

import psutil
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from servelab.core.hardware import instance_id, recorded_flags, stack

SCHEMA_VERSION = 1
DEFAULT_RECORDS = Path("results") / "records.jsonl"
# Packages whose versions change the numbers; recorded with every run.
_VERSIONED = ("servelab", "aiohttp", "tritonclient", "numpy", "torch", "onnxruntime", "fastapi", "uvicorn")


class RunKind(StrEnum):
    """A run beyond a stage's common loads, as its record's ``config["run"]`` names it (a string in the JSON:
    each member equals its value)."""

    OVERLOAD = "overload"  # open-loop load above the capacity (the shedding lesson)
    CACHE = "cache"  # a skewed mix of photos, with and without a cache
    ROLLOUT = "rollout"  # a new model version under load
    STEP_LOAD = "step load"  # low -> high -> low arrivals, replicas over time (Ray Serve's autoscaling)
    NODE_FAILURE = "node failure"  # a worker node killed mid-run (Ray Serve)
    ROUNDS = "rounds"  # a lesson's two stages alternating in rounds (``measure_stage.alternate``)


class Load(BaseModel):
    """The load a run applies and its measurement window: ``requests`` measured requests and/or ``duration_s``
    seconds of sending, whichever ends first, after a warm-up that is never measured (at least ``warmup`` requests
    and, where set, ``warmup_s`` seconds); ``max_duration_s`` bounds every run. Open loop sends at times fixed in
    advance (``rate``, ``arrivals``, ``seed``), at most ``max_inflight`` outstanding: a send that waits is *late*."""

    model_config = ConfigDict(frozen=True)

    mode: Literal["sequential", "closed", "open"]
    concurrency: int = Field(1, ge=1)
    rate: float | None = Field(None, gt=0)
    arrivals: Literal["constant", "poisson"] | None = None
    requests: int | None = Field(100, ge=1)
    duration_s: float | None = Field(None, gt=0)
    warmup: int = Field(10, ge=0)
    warmup_s: float | None = Field(None, gt=0)  # a warm-up window too: sending goes on until both are met
    max_inflight: int = Field(128, ge=1)
    max_duration_s: float = Field(600.0, gt=0)
    seed: int = 0
    # Open loop in steps: (rate, seconds) after one another (a step load, low -> high -> low); ``rate``
    # is then the mean offered rate and ``requests`` the schedule's total.
    phases: tuple[tuple[float, float], ...] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "Load":
        if self.requests is None and self.duration_s is None:
            raise ValueError("a load needs a window: requests, duration_s or both")
        if self.mode == "open" and (self.rate is None or self.arrivals is None):
            raise ValueError("an open-loop load needs rate and arrivals")
        if self.mode != "open" and self.rate is not None:
            raise ValueError("rate applies to open-loop loads only")
        if self.mode == "sequential" and self.concurrency != 1:
            raise ValueError("a sequential load has concurrency 1")
        return self

    @classmethod
    def sequential(cls, requests: int | None = 100, **window: Any) -> "Load":
        return cls(mode="sequential", requests=requests, **window)

    @classmethod
    def closed(cls, concurrency: int, requests: int | None = 1000, **window: Any) -> "Load":
        return cls(mode="closed", concurrency=concurrency, requests=requests, **window)

    @classmethod
    def open(cls, rate: float, arrivals: str = "poisson", requests: int | None = None, **window: Any) -> "Load":
        if requests is None and window.get("duration_s") is None:
            requests = max(1, round(rate * 10))  # ten seconds' worth by default
        return cls(mode="open", rate=rate, arrivals=arrivals, requests=requests, **window)

    @classmethod
    def steps(cls, phases: list[tuple[float, float]], arrivals: str = "poisson", **window: Any) -> "Load":
        """Open-loop Poisson (or constant) arrivals whose rate changes in steps: [(rate, seconds), ...]."""
        counts = [max(1, round(rate * seconds)) for rate, seconds in phases]
        return cls(mode="open", rate=sum(counts) / sum(s for _, s in phases), arrivals=arrivals, requests=sum(counts),
                   phases=tuple((float(r), float(s)) for r, s in phases), **window)

    @property
    def warmup_senders(self) -> int:
        """The warm-up's senders: the load's, but no more than its requests where it has no window of seconds."""
        return self.concurrency if self.warmup_s else min(self.concurrency, self.warmup)

    def label(self) -> str:
        if self.phases:
            return f"{self.arrivals} steps {' > '.join(f'{r:g}' for r, _ in self.phases)} req/s"
        if self.mode == "open":
            return f"{self.arrivals} {self.rate:g} req/s"
        return "sequential" if self.mode == "sequential" else f"concurrency {self.concurrency}"


class Latency(BaseModel):
    """Latency of successful requests, in milliseconds."""

    mean_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    # Latency at each whole percentile 0..100 (101 values): enough to draw the CDF.
    cdf_ms: list[float] = []


class Stats(BaseModel):
    """Client-side results. Errors are never successes; throughput counts successes only. A request the
    server shed under load (503 + Retry-After, Triton's queue policy) is counted in ``shed``, not ``errors``:
    refusing it was the server doing what it was set to do."""

    requests: int | None = None  # measured requests sent (None where the tool does not say)
    successes: int | None = None
    errors: dict[str, int] = {}  # kind ("http_500", "connection_refused", ...) -> count
    shed: dict[str, int] = {}  # why ("queue_full", "queue_timeout") -> count
    wall_s: float | None = None  # first measured send to last completion (open loop: at least the schedule's window)
    offered_rps: float | None = None  # open loop: requests scheduled per second of the schedule's window
    throughput_rps: float  # successful requests / wall_s
    items_per_s: float  # throughput_rps x images per request (perf_analyzer's "infer/sec")
    latency: Latency
    late_sends: int = 0  # open loop: sends that started behind their scheduled time
    max_send_lag_ms: float | None = None
    p50_from_send_ms: float | None = None  # open loop: the median from the actual send (perf_analyzer's rule)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


class Breakdown(BaseModel):
    """Where the time went on the server, as means per request in milliseconds."""

    source: str  # "server-timing", "triton-stats", "perf_analyzer", or several joined by "+"
    queue_ms: float | None = None
    service_ms: float | None = None  # time being worked on: preprocess+infer, or compute input+infer+output
    parts_ms: dict[str, float] = {}
    batch_sizes: dict[int, int] = {}  # batch size formed on the server -> executions
    mean_batch_size: float | None = None
    server_requests: int | None = None  # successful requests the server counted during the run
    server_failures: int | None = None

    @property
    def queue_share(self) -> float | None:
        if self.queue_ms is None or self.service_ms is None or self.queue_ms + self.service_ms <= 0:
            return None
        return self.queue_ms / (self.queue_ms + self.service_ms)


class CacheStats(BaseModel):
    """What a response cache did in the measured window, by the server's own counters (after - before)."""

    source: str  # "servelab_response_cache" (the FastAPI services' metric) or "triton-stats" (cache_hit/cache_miss)
    hits: int  # answered from the cache
    misses: int  # answered by the model (and kept)
    errors: int = 0  # the cache failed; the model answered

    @property
    def hit_ratio(self) -> float | None:
        return self.hits / lookups if (lookups := self.hits + self.misses + self.errors) else None


class GpuSeries(BaseModel):
    index: int
    name: str
    util_pct: list[float] = []
    mem_used_mib: list[float] = []
    mem_total_mib: float


class Monitors(BaseModel):
    """Utilization sampled during the measured window; ``t_s`` is seconds from its start."""

    interval_s: float
    t_s: list[float] = []
    cpu_pct: list[list[float]] = []  # per sample, per core (the whole machine, client included)
    server_pid: int | None = None
    rss_mib: list[float] = []  # server process and its children
    gpus: list[GpuSeries] = []
    gpu_note: str | None = None  # why there are no GPU samples

    @property
    def cpu_mean_pct(self) -> float | None:
        return sum(flat) / len(flat) if (flat := [v for sample in self.cpu_pct for v in sample]) else None

    @property
    def gpu_util_mean_pct(self) -> float | None:
        return sum(flat) / len(flat) if (flat := [v for g in self.gpus for v in g.util_pct]) else None


class ServerSeries(BaseModel):
    """The server's own metrics over one run, read back from Prometheus: ``requests`` it counted between scrapes just
    before and after the run (warm-up included), beside the ``client_requests`` sent then; ``rate_rps``, its successes
    per second between the first and last scrape in the window (``rate_span_s`` apart); ``series``, name -> [[seconds
    from the window's start, value], ...] (a point per ``step_s``); ``note``: what could not be read, and why."""

    source: str = ""
    start_unix: float | None = None
    end_unix: float | None = None
    step_s: float | None = None
    requests: int | None = None
    client_requests: int | None = None
    rate_rps: float | None = None
    rate_span_s: float | None = None
    series: dict[str, list[list[float]]] = {}
    note: str | None = None


class Timeline(BaseModel):
    """A run over time, in bins of ``bin_s`` from the start of its measured window: what each bin's
    completed requests saw, and samples of the serving side (Ray Serve's running replicas)."""

    bin_s: float
    t_s: list[float] = []  # bin starts
    throughput_rps: list[float] = []  # successes completed in the bin / bin_s
    errors: list[int] = []  # failures completed in the bin (shed requests are not failures)
    shed: list[int] = []  # requests shed by the server, completed in the bin
    p50_ms: list[float | None] = []  # of the bin's successes
    p99_ms: list[float | None] = []
    offered_rps: list[float] = []  # open loop: requests scheduled in the bin / bin_s
    replicas_t_s: list[float] = []
    replicas: list[int] = []
    events: dict[str, float] = {}  # name -> seconds from the start (a node killed)
    first_error_s: float | None = None
    last_error_s: float | None = None
    recovery_s: float | None = None  # from the first event to the last failure after it (0: none failed)


class PerRequest(BaseModel):
    """Every measured request of a run (overload and rollout runs), in the order they completed: when it was sent
    (scheduled, in an open loop; seconds from the window's start), its latency, its outcome (``ok``, ``shed:`` and
    the reason, or the error kind) and the model version that answered, where the response said."""

    sent_s: list[float] = []
    latency_ms: list[float] = []
    outcome: list[str] = []
    version: list[str | None] = []


class Rollout(BaseModel):
    """A new model version rolled out while the load ran (``servelab.measure.loadgen.rollout_load``), in seconds from
    the window's start: *during* runs from the trigger to the later of the rollout call's return and the new
    version's first answer; *before* and *after* are the rest. A request counts where it completed."""

    trigger_s: float  # the rollout call started
    done_s: float | None = None  # it returned (None: it failed, see ``error``)
    result: dict[str, Any] | None = None  # what it returned (the reload's response, Triton's versions...)
    error: str | None = None
    old_versions: list[str] = []  # versions that answered before the trigger
    new_version: str | None = None  # the first other version that answered after it
    first_new_s: float | None = None  # the first answer of the new version completed, seconds after the trigger
    # first_new_s less the moment the new version was ready: the rollout's ``ready_s`` (seconds after the trigger,
    # where its result says), else its return: how long the switch took to show in the answers
    switch_after_ready_s: float | None = None
    old_done_after_new: int = 0  # answers of an old version completed after the first new one (sent before it)
    old_sent_after_new: int = 0  # ... of those, sent after the first new answer: a model that should be gone answered
    old_sent_after_ready: int = 0  # answers of an old version to requests sent after the new one was ready
    failed: int = 0  # requests that failed (errors; shed requests apart), the whole run
    failed_during: int = 0
    shed: int = 0
    requests: list[int] = []  # requests completed before, during, after
    p99_before_ms: float | None = None
    p99_during_ms: float | None = None
    p99_after_ms: float | None = None
    during_s: list[float] = []  # [start, end]

    @property
    def p99_ratio(self) -> float | None:
        """p99 during the swap over the steady p99 (before it)."""
        return self.p99_during_ms / self.p99_before_ms if self.p99_during_ms and self.p99_before_ms else None


class ClientSide(BaseModel):
    """servelab's client in one run: the sender processes it used, what it cost, and whether the run was bound by
    the client rather than by the server (``bound``: then its throughput is the client's, not a capacity)."""

    processes: int = 1
    # the rate planned for: an open loop's offered rate, a closed loop's in its warm-up (Little's law) or last run
    expected_rps: float | None = None
    chosen: str = ""  # how ``processes`` was chosen (from the client's cost, asked for, held to one and why)
    # the warm-up's requests per CPU-second of this client, what the processes are planned with (None: too short)
    warmup_rps_per_cpu: float | None = None
    # the busiest sender's event-loop thread: CPU seconds per second of the window (over half: client-bound)
    busy: float | None = None
    # the sender processes' event-loop threads (tritonclient and aiohttp's work): CPU ms per request answered
    cpu_ms_per_request: float | None = None
    loop_late: int = 0  # open loop: sends the client's own event loop started over 10 ms late (not a slot's wait)
    bound: bool = False
    why: str | None = None  # why the run counts as client-bound


class Labels(NamedTuple):
    """What every record of one stage's measurement carries."""

    stage: str
    config: dict[str, Any] | None = None
    stand_in: str | None = None  # the model is a stand-in, and the reports say so
    server_pid: int | None = None  # the server whose memory (with its children) the monitors sample


class Record(BaseModel):
    """One measured run; serializes to one JSON line."""

    schema_version: int = SCHEMA_VERSION
    tool: Literal["servelab", "perf_analyzer"] = "servelab"
    stage: str
    started_at: str = Field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    target: dict[str, Any] = {}
    config: dict[str, Any] = {}
    load: Load
    batch: int = 1  # images per request
    stats: Stats
    breakdown: Breakdown | None = None
    monitors: Monitors | None = None
    machine: dict[str, Any] = {}
    warnings: list[str] = []
    stand_in: str | None = None
    failed: str | None = None  # the run measured nothing: the tool's own message (stats are empty)
    # The run's first request (its first warm-up request; None without one): the lab's first run of a
    # stage holds the first request its server saw after it said it was ready.
    first_request_ms: float | None = None
    warmup_requests: int | None = None  # warm-up requests sent (``load.warmup``, or more where ``load.warmup_s`` ran on)
    window_unix: list[float] | None = None  # the measured window [start, end] in Unix seconds
    prometheus: ServerSeries | None = None  # the server's own metrics over the run (the local lab)
    timeline: Timeline | None = None  # step-load, node-failure and overload runs
    per_request: PerRequest | None = None  # overload and rollout runs: every request
    cache: CacheStats | None = None  # a response cache's hits and misses (None: the server has none)
    rollout: Rollout | None = None  # rollout runs: the swap, as the requests saw it
    client: ClientSide | None = None  # servelab's client: its sender processes, its cost, whether it bound the run

    @field_validator("machine")
    @classmethod
    def _machine_as_written(cls, machine: dict[str, Any]) -> dict[str, Any]:
        """The fields of ``machine`` that reports and the grader's check read, in the types ``machine_info`` writes
        them: a hand-made record fails here, with its field named, not in the code that reads it."""
        gpus, cpus, stack_ = machine.get("gpus"), machine.get("cpu_logical"), machine.get("stack")
        if gpus is not None and not (isinstance(gpus, list) and all(isinstance(g, str) for g in gpus)):
            raise ValueError(f"machine.gpus must be a list of GPU names, not {str(gpus)[:80]}")
        if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int)):
            raise ValueError(f"machine.cpu_logical must be a whole number, not {cpus!r}")
        if stack_ is not None and not isinstance(stack_, dict):
            raise ValueError(f"machine.stack must be an object, not {str(stack_)[:80]}")
        return machine

    @property
    def client_bound(self) -> bool:
        """The client, not the server, set this run's throughput: never a server's capacity."""
        return self.client is not None and self.client.bound


def append_record(path: Path, record: Record) -> None:
    """Append one JSON line (the file and its folder are created when missing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(record.model_dump_json() + "\n")


def why_not(exc: ValueError | TypeError) -> str:
    """Why a line is not a record, in one line: pydantic's first error with its field, or the exception's first line."""
    if isinstance(exc, ValidationError) and (errors := exc.errors()):
        where = ".".join(map(str, errors[0]["loc"]))
        return f"ValidationError: {where + ': ' if where else ''}{errors[0]['msg']}"[:160]
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:160]


def read_records(paths: Path | Iterable[Path]) -> list[Record]:
    """Every record in one or more JSONL files, in order; a bad line fails loudly, in one line, with its place."""
    records = []
    for path in [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    records.append(Record.model_validate_json(line))
                except ValueError as exc:
                    raise ValueError(f"{path}:{number}: not a servelab record ({why_not(exc)})") from None
    return records


def machine_info(gpu_names: list[str] | None = None) -> dict[str, Any]:
    """Host, CPU, memory, Python and package versions: what a number depends on besides the code."""
    versions = {}
    for name in _VERSIONED:
        with suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return {
        "hostname": socket.gethostname(),
        "instance_id": instance_id(),  # the server that ran it, which the grader's check holds to the student's
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_logical": psutil.cpu_count(logical=True),
        "cpu_physical": psutil.cpu_count(logical=False),
        "cpu_flags": recorded_flags(),  # what says whether it has fast 8-bit instructions (hardware.int8_compute)
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "gpus": gpu_names or [],
        "versions": versions,
        "stack": stack(),  # GPUs, driver, CUDA, cuDNN, ONNX Runtime build and providers, TensorRT
    }
